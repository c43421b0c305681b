"""``fanout serve`` as a user runs it: the default config (embedded upstream, no key, no
network), the URL on stdout, and a graceful end on SIGTERM or Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fanout.serve.replica import default_replica, id_replica
from tests.helpers import interrupt, sigint_default

ROOT = Path(__file__).resolve().parents[2]
FANOUT = [sys.executable, "-m", "fanout.cli.main"]


@pytest.fixture
def serving() -> Iterator[tuple[subprocess.Popen[str], str]]:
    # --grace 0: SIGTERM cancels the running fan-outs at once, as Ctrl-C does (the drain:
    # tests/serve/test_drain.py).
    process = subprocess.Popen([*FANOUT, "serve", "--config", str(ROOT / "config/default.toml"),
                                "--port", "0", "--grace", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               preexec_fn=sigint_default)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/"), url
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_default_config_serves_and_stops_gracefully(
        serving: tuple[subprocess.Popen[str], str], stop: signal.Signals) -> None:
    process, url = serving
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        names = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert {"writer", "thinker", "tools", "smollm2", "echo", "flaky"} <= set(names)
        echoed = client.post("/v1/fanout", json={
            "messages": [{"role": "user", "content": "ping"}], "models": ["echo"]}).json()
        assert echoed["results"][0]["text"] == "ping"
        body = {"messages": [{"role": "user", "content": "hi"}],
                "models": ["writer", "thinker"], "stream": True}
        records = []
        with client.stream("POST", "/v1/fanout", json=body) as response:
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: {") and '"type":"text"' in line:
                    interrupt(process, stop)
                    break
            rest = list(lines)
        records = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert rest[-2:] == ["data: [DONE]", ""]
    results = [r for r in records if r["type"] == "result"]
    assert {r["stream"] for r in results} == {"writer", "thinker"}
    assert {(r["outcome"], r["reason"]) for r in results} == {
        ("cancelled", "cancelled: the service is shutting down")}
    assert any(r["text"] or r["choices"][0]["reasoning"] for r in results)  # kept
    assert records[-1]["type"] == "summary"
    _, err = process.communicate(timeout=15)
    assert process.returncode == 0, err
    assert "stopping: 1 running fan-out cancelled" in err
    assert "Traceback" not in err


def test_binding_a_taken_port_is_one_line_and_status_1(
        serving: tuple[subprocess.Popen[str], str]) -> None:
    _, url = serving
    port = url.rstrip("/").rsplit(":", 1)[1]
    taken = subprocess.run([*FANOUT, "serve", "--port", port], capture_output=True, text=True,
                           timeout=30, cwd=ROOT, check=False)
    assert taken.returncode == 1
    assert f"fanout serve: cannot listen on 127.0.0.1:{port}: " in taken.stderr
    assert "Traceback" not in taken.stderr


def test_without_a_name_the_replica_is_the_host_name_and_the_port_bound(
        serving: tuple[subprocess.Popen[str], str]) -> None:
    _, url = serving
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    name = default_replica(port)
    assert name.endswith(f"-{port}")  # the port bound, not the 0 asked for
    with httpx.Client(base_url=url, timeout=10) as client:
        health = client.get("/healthz")
        status = client.get("/v1/status").json()
        done = client.post("/v1/fanout", json={
            "messages": [{"role": "user", "content": "ping"}], "models": ["echo"]})
    assert health.headers["x-fanout-replica"] == status["replica"] == name
    assert id_replica(done.json()["id"]) == name
