"""The Ray run of tests/test_ray.py, inside a network namespace that holds only ``lo``.

    unshare -rn sh -c 'ip link set lo up && exec python tests/ray_harness.py WORKDIR'

Ray's GCS and raylet listen on every interface whatever address they are given; in this
namespace the only one is loopback, so nothing here can listen beyond it or reach out.
WORKDIR holds ``prompts.jsonl``; this script, in order:

1. starts the embedded upstream (``fanout mock``, loopback, port 0) and writes
   ``config.toml`` naming it (its concurrency shared by the shards);
2. runs the plan in one process with ``fanout batch`` into ``single.jsonl``;
3. runs ``examples/ray_batch.py`` (a local Ray of 2 CPUs, 4 shards) into ``merged.jsonl``
   and ``shards/``, and meanwhile SIGKILLs one task's worker once its shard file holds
   ``KILL_AFTER`` records: the worker is the pid in the shard's lock file, and must be a
   Ray worker running ``run_shard``; then it watches that lock file for the retry's pid;
4. runs it on the first ``FEW`` prompts with a model the upstream always refuses (HTTP 400:
   exit 1, not retried) into ``for-good/``, against a loopback port nothing listens on
   (connection refused: exit 75, retried) into ``refused/``, and with a config file that is
   not there (exit 2);
5. runs the plan on ``fault/busy:4`` (429 while 4 of its streams are open; the model's
   concurrency is 4) in one process into ``busy-single.jsonl``, then through the example
   (4 shards on 2 CPUs) with its Ray actor as the shared limit into ``busy/``, and with
   ``--shared-limit off`` (each task its static share) into ``busy-static/``.

The example runs with the actor as its shared limit throughout (its default), with a
``--lease`` of 3 s: the killed worker's slots come back 3 s after it died.

What happened goes to ``WORKDIR/harness.json`` (the test asserts on it and the files).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from fanout.cli.main import main; sys.exit(main())"
#: Records the shard file holds before its worker is killed (its shard has ~20 units):
#: a different point each run.
KILL_AFTER = random.randint(2, 8)
#: The prompts (the first of prompts.jsonl) of the runs that fail.
FEW = 6
CONFIG = """\
[endpoint]
base_url = "{base_url}"

[concurrency]
max = 8
per_model = 4

[deadlines]
connect = 5
first_token = 20
idle = 10
total = 60

[batch]
models = ["slow", "slow-anthropic"]

[[models]]
name = "slow"
id = "mock/slow"
params = {{ max_tokens = 8 }}

[[models]]
name = "slow-anthropic"
id = "mock/slow"
api = "anthropic"
params = {{ max_tokens = 8 }}

[[models]]
name = "bad"
id = "fault/400"

[[models]]
name = "busy"
id = "fault/busy:4"
concurrency = 4
"""


def complete_lines(path: Path) -> list[bytes]:
    """The whole lines of ``path`` (a torn last line left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return data.split(b"\n")[:-1]


def lock_pid(shard: Path) -> int | None:
    """The pid in a shard file's lock file, if it is there and whole."""
    try:
        return int(json.loads(shard.with_name(shard.name + ".lock").read_bytes())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def runs_shard(pid: int) -> bool:
    """Whether ``pid`` is a Ray worker running ``run_shard`` (Ray sets its title)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::run_shard")
    except OSError:
        return False


def kill_one(shards: Path, done: threading.Event, seen: dict[str, Any]) -> None:
    """SIGKILL the worker of the first shard holding ``KILL_AFTER`` records, then record
    the pids that hold its lock after it (the retries)."""
    target: Path | None = None
    while target is None and not done.is_set():
        for shard in sorted(shards.glob("results-*.jsonl")):
            lines = complete_lines(shard)
            pid = lock_pid(shard)
            if len(lines) >= KILL_AFTER and pid is not None and runs_shard(pid):
                os.kill(pid, signal.SIGKILL)
                target = shard
                seen.update(shard=shard.name, pid=pid, kill_after=KILL_AFTER, before=len(complete_lines(shard)),
                            kept=[line.decode() for line in lines], after=[])
                break
        time.sleep(0.01)
    while target is not None and not done.is_set():
        pid = lock_pid(target)
        if pid is not None and pid != seen["pid"] and pid not in seen["after"]:
            seen["after"].append(pid)
        time.sleep(0.01)


def example(workdir: Path, env: dict[str, str], prompts: str, *args: str) -> dict[str, Any]:
    """Run examples/ray_batch.py on ``prompts`` with ``args``; what it said and did."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray_batch.py"), prompts,
         "--num-cpus", "2", *args], cwd=workdir, env=env, capture_output=True, text=True,
        timeout=120)
    return {"exit": run.returncode, "stdout": run.stdout, "stderr": run.stderr[-4000:],
            "seconds": round(time.monotonic() - started, 2)}


def main(workdir: Path) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           # Token auth, the token in the environment only: nothing under ~/.ray.
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "PYTHONWARNINGS": "ignore"}
    ray_tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 bytes
    env["RAY_TMPDIR"] = ray_tmp
    report: dict[str, Any] = {"killed": {}}
    upstream = subprocess.Popen([sys.executable, "-c", CLI, "mock", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    closed = socket.socket()  # bound, never listening: every connection to it is refused
    closed.bind(("127.0.0.1", 0))
    try:
        assert upstream.stdout is not None
        base_url = upstream.stdout.readline().strip()
        lines = (workdir / "prompts.jsonl").read_text().splitlines(keepends=True)
        (workdir / "few.jsonl").write_text("".join(lines[:FEW]))
        (workdir / "config.toml").write_text(CONFIG.format(base_url=base_url))
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        (workdir / "refused.toml").write_text(CONFIG.format(base_url=refused_url))
        started = time.monotonic()
        single = subprocess.run(
            [sys.executable, "-c", CLI, "batch", "prompts.jsonl", "-o", "single.jsonl",
             "--config", "config.toml"], cwd=workdir, capture_output=True, text=True,
            timeout=60)
        report["single"] = {"exit": single.returncode, "stderr": single.stderr[-2000:],
                            "seconds": round(time.monotonic() - started, 2)}

        done = threading.Event()
        killer = threading.Thread(target=kill_one,
                                  args=(workdir / "shards", done, report["killed"]))
        killer.start()
        try:
            report["ray"] = example(workdir, env, "prompts.jsonl", "-o", "merged.jsonl",
                                    "--shard-dir", "shards", "--shards", "4",
                                    "--retries", "2", "--config", "config.toml",
                                    "--lease", "3")
        finally:
            done.set()
            killer.join()
        failing = ("few.jsonl", "--shards", "2", "--retries", "1")
        report["for_good"] = example(workdir, env, *failing, "-o", "for-good.jsonl",
                                     "--shard-dir", "for-good", "--config", "config.toml",
                                     "-m", "bad")
        report["refused"] = example(workdir, env, *failing, "-o", "refused.jsonl",
                                    "--shard-dir", "refused", "--config", "refused.toml",
                                    "-m", "slow")
        report["no_config"] = example(workdir, env, *failing, "-o", "no-config.jsonl",
                                      "--shard-dir", "no-config", "--config", "missing.toml")
        busy = subprocess.run(
            [sys.executable, "-c", CLI, "batch", "prompts.jsonl", "-o", "busy-single.jsonl",
             "--config", "config.toml", "-m", "busy"], cwd=workdir, capture_output=True,
            text=True, timeout=60)
        report["busy_single"] = {"exit": busy.returncode, "stderr": busy.stderr[-2000:]}
        report["busy_shared"] = example(workdir, env, "prompts.jsonl", "-o", "busy.jsonl",
                                        "--shard-dir", "busy", "--shards", "4",
                                        "--config", "config.toml", "-m", "busy")
        report["busy_static"] = example(workdir, env, "prompts.jsonl", "-o",
                                        "busy-static.jsonl", "--shard-dir", "busy-static",
                                        "--shards", "4", "--config", "config.toml", "-m",
                                        "busy", "--shared-limit", "off")
    finally:
        closed.close()
        upstream.terminate()
        upstream.wait(10)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    (workdir / "harness.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
