"""``examples/haproxy.cfg`` as written, in Debian's haproxy, in front of two replicas of
``fanout serve``: every cancel reaches the replica that runs the fan-out, while everything
else is balanced round-robin.

The test installs haproxy with apt-get when it is missing (as ``make haproxy`` does) and
is skipped, saying why, only when it cannot be installed.  haproxy listens on a Unix socket
in the test's directory and the replicas on loopback ports they pick (0): nothing else on
the machine is touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from fanout.serve.relay import STOP_REASON
from fanout.serve.replica import id_replica

from .helpers import SSEReader

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "haproxy.cfg"
REPLICAS = ("fanout-1", "fanout-2")
KEYS = "svc-key-haproxy-1,svc-key-haproxy-2"
CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
connect = 5
first_token = 10
idle = 5
total = 60

[[models]]
name = "endless"
id = "fault/endless:0.02"

[[models]]
name = "fast"
id = "mock/fast"

[serve]
keys_env = "FANOUT_TEST_KEYS"
replica = "{replica}"
"""


def haproxy() -> str:
    """haproxy's path; installed with apt-get if missing (a skip if that cannot be done)."""
    found = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None)
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("haproxy is not installed and there is no apt-get to install it")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", "haproxy"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    last = ""
    for command in (install, [*sudo, "apt-get", "update", "-q"], install):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"haproxy is not installed and apt-get could not install it: {exc}")
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        if command is install and done.returncode == 0:
            break
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy"
                                        if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if found is None:
        pytest.skip(f"haproxy is not installed and apt-get could not install it: {last}")
    return found


def start_replica(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], int]:
    config = tmp_path / f"{name}.toml"
    config.write_text(CONFIG.format(replica=name))
    with (tmp_path / f"{name}.log").open("w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "fanout.cli.main", "serve", "--config", str(config),
             "--port", "0"], stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
            env={**os.environ, "FANOUT_TEST_KEYS": KEYS})
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), (url, (tmp_path / f"{name}.log")
                                                              .read_text())
    return process, int(url.rstrip("/").rsplit(":", 1)[1])


def haproxy_config(ports: dict[str, int], socket: Path) -> str:
    """The example, with this test's replicas and socket: nothing else changed."""
    text = EXAMPLE.read_text()
    text, binds = re.subn(r"(?m)^(\s*bind )\S+", rf"\g<1>unix@{socket}", text)
    for name, port in ports.items():
        text, servers = re.subn(rf"(?m)^(\s*server {name} )\S+", rf"\g<1>127.0.0.1:{port}", text)
        assert servers == 1, name
        assert re.search(rf"(?m)^\s*use-server {name} if ", text), name
    assert binds == 1
    return text


@pytest.fixture
def balanced(replicas: tuple[Path, dict[str, subprocess.Popen[str]]]) -> Path:
    """Two replicas behind haproxy run with the example config; haproxy's socket."""
    return replicas[0]


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Path, dict[str, subprocess.Popen[str]]]]:
    """Two replicas behind haproxy run with the example config: haproxy's socket, and
    each replica's process by name."""
    binary = haproxy()
    processes: list[subprocess.Popen[str]] = []
    named: dict[str, subprocess.Popen[str]] = {}
    try:
        ports: dict[str, int] = {}
        for name in REPLICAS:
            process, ports[name] = start_replica(tmp_path, name)
            processes.append(process)
            named[name] = process
        socket = tmp_path / "haproxy.sock"
        config = tmp_path / "haproxy.cfg"
        config.write_text(haproxy_config(ports, socket))
        checked = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True,
                                 text=True, timeout=30, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        with (tmp_path / "haproxy.log").open("w") as log:
            processes.append(subprocess.Popen([binary, "-f", str(config), "-db"], stdout=log,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 15
        while not socket.exists():
            assert processes[-1].poll() is None, (tmp_path / "haproxy.log").read_text()
            assert time.monotonic() < deadline, "haproxy did not open its socket"
            time.sleep(0.05)
        yield socket, named
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


async def test_a_cancel_through_haproxy_reaches_the_replica_running_the_fanout(
        balanced: Path) -> None:
    transport = httpx.AsyncHTTPTransport(uds=str(balanced))
    key = KEYS.split(",")[0]
    async with httpx.AsyncClient(transport=transport, base_url="http://fanout",
                                 headers={"authorization": f"Bearer {key}"},
                                 timeout=httpx.Timeout(10, read=None)) as client:
        with trio.fail_after(60):
            # Both replicas answer through haproxy (round-robin), with the same key set.
            statuses = [(await client.get("/v1/status")).json() for _ in range(4)]
            assert {s["replica"] for s in statuses} == set(REPLICAS)
            assert len({s["keys"]["fingerprint"] for s in statuses}) == 1
            owners: list[str] = []
            cancels: list[tuple[str, int, str]] = []
            for round_ in range(6):
                body = {"messages": [{"role": "user", "content": "go"}],
                        "models": ["endless", "fast"], "stream": True}
                async with client.stream("POST", "/v1/fanout", json=body) as response:
                    assert response.status_code == 200
                    fanout_id = response.headers["x-fanout-id"]
                    owner = id_replica(fanout_id)
                    assert owner == response.headers["x-fanout-replica"]
                    owners.append(owner)
                    reader = SSEReader(response)
                    await reader.until(lambda r: r["type"] == "text"
                                       and r["stream"] == "endless")
                    for attempt in range(2 + round_ % 3):  # 2 to 4 cancels in a row
                        cancel = await client.post(f"/v1/fanout/{fanout_id}/cancel")
                        cancels.append((owner, cancel.status_code,
                                        cancel.headers.get("x-fanout-replica", "")))
                        if attempt == 0:
                            assert cancel.status_code == 200, cancel.text
                            assert cancel.json()["cancelled"] == ["endless"]
                    got = await reader.rest()
                results = got.results()
                assert results["endless"]["outcome"] == "cancelled"
                assert results["endless"]["reason"] == STOP_REASON.replace("{id}", fanout_id)
                assert results["fast"]["outcome"] == "completed"
    # Round-robin put the fan-outs on both replicas; each cancel reached the owner.
    assert set(owners) == set(REPLICAS)
    assert [(owner, replica) for owner, _, replica in cancels] == [
        (owner, owner) for owner, _, _ in cancels]
    assert {status for _, status, _ in cancels} <= {200, 404}  # 404: it had already ended


async def test_after_a_replica_dies_every_request_is_sent_to_a_live_one(
        replicas: tuple[Path, dict[str, subprocess.Popen[str]]]) -> None:
    # SIGKILL: its port is closed at once, long before a health check sees it down.  A
    # request haproxy sends there is refused before anything of it reached a replica:
    # haproxy sends it to the other one (retries, option redispatch), never a 503.
    socket, processes = replicas
    transport = httpx.AsyncHTTPTransport(uds=str(socket))
    key = KEYS.split(",")[0]
    async with httpx.AsyncClient(transport=transport, base_url="http://fanout",
                                 headers={"authorization": f"Bearer {key}"},
                                 timeout=httpx.Timeout(30)) as client:
        with trio.fail_after(60):
            statuses = [(await client.get("/v1/status")).json() for _ in range(4)]
            assert {s["replica"] for s in statuses} == set(REPLICAS)  # both are up
            dead = processes["fanout-1"]
            dead.kill()
            dead.wait()
            answers = []
            for _ in range(12):
                body = {"messages": [{"role": "user", "content": "go"}], "models": ["fast"]}
                answer = await client.post("/v1/fanout", json=body)
                answers.append((answer.status_code, answer.headers.get("x-fanout-replica")))
    assert answers == [(200, "fanout-2")] * 12
