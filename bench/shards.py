"""4 shards against one rate-limited endpoint: 429s and wall time, with and without a
shared limit, against one process.

    .venv/bin/python bench/shards.py [--prompts 120] [--busy 4] [--concurrency 8]
                                     [--model-concurrency 8] [--rounds 2] [--ray]

Starts ``fanout mock`` (its ``fault/busy:N`` model: a relay's per-model concurrency
limit under one key, 429 with Retry-After while N of its streams are open) and a
``redis-server`` on loopback, each in its own process, and runs the same plan
(PROMPTS prompts x the one model, whose ``[[models]] concurrency`` is
--model-concurrency, under ``[concurrency] max`` --concurrency) as:

  1 process          ``fanout batch`` alone
  4 shards, static   4 ``fanout batch --shard I/4`` processes at once, each its share
  4 shards, Redis    the same with ``--shared-limit redis://...``
  Ray, static        ``fanout.batch.run_sync`` as 4 Ray tasks on 2 CPUs (2 run at once),
                     each its share (--ray)
  Ray, actor         the same with ``shared_limit="ray://..."`` (--ray)

and counts the 429s from the results records' ``rate_limited`` field (every attempt of
every record), the wall time (processes started to all ended), the span (the first
stream sent to the last one ended, from the records: the time the shards' start-up on a
small machine leaves out), and the units not completed (left for a rerun).  Rows run
round-robin, --rounds times; each row's ratios are against the one-process run of the
same round.  Ray listens on every interface: with --ray the whole benchmark re-runs itself
in a network namespace that holds only loopback (``unshare -rn``), where it must be
allowed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import datetime
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 4
CLI = [sys.executable, "-m", "fanout"]
IN_NAMESPACE = "FANOUT_BENCH_NAMESPACE"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def mock() -> Iterator[str]:
    process = subprocess.Popen([*CLI, "mock", "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.kill()
        process.wait(10)


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("needs redis-server (apt-get install redis-server, or make redis)")
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--dir", str(folder)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait(10)


def write_inputs(folder: Path, base_url: str, args: argparse.Namespace) -> None:
    with (folder / "prompts.jsonl").open("w") as file:
        for i in range(args.prompts):
            file.write(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) + "\n")
    (folder / "bench.toml").write_text(
        f'[endpoint]\nbase_url = "{base_url}"\n\n[concurrency]\nmax = {args.concurrency}\n\n'
        f'[[models]]\nname = "busy"\nid = "fault/busy:{args.busy}"\n'
        f"concurrency = {args.model_concurrency}\n")


def tally(files: list[Path]) -> dict[str, int]:
    """429s over every record of ``files``, and the units whose last record is not
    completed."""
    limited = 0
    last: dict[str, str] = {}
    first, end = math.inf, -math.inf
    for path in files:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            limited += record.get("rate_limited", 0)
            last[f"{record['id']}/{record['model']}/{record['sample']}"] = record["outcome"]
            finished = datetime.datetime.fromisoformat(record["finished_at"]).timestamp()
            first = min(first, finished - (record["metrics"]["e2e_latency"] or 0))
            end = max(end, finished)
    return {"rate_limited": limited, "left": sum(o != "completed" for o in last.values()),
            "units": len(last), "span": end - first}


def processes(folder: Path, name: str, shards: int, shared: str | None) -> dict[str, Any]:
    out = folder / name
    out.mkdir()
    commands = []
    for index in range(shards):
        command = [*CLI, "batch", str(folder / "prompts.jsonl"), "-o",
                   str(out / f"results-{index}.jsonl"), "--config", str(folder / "bench.toml")]
        if shards > 1:
            command += ["--shard", f"{index}/{shards}"]
        if shared:
            command += ["--shared-limit", shared]
        commands.append(command)
    started = time.perf_counter()
    running = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for c in commands]
    codes = [p.wait(600) for p in running]
    wall = time.perf_counter() - started
    return {"wall": wall, "codes": codes, **tally(sorted(out.glob("results-*.jsonl")))}


RAY_DRIVER = r"""
import json, sys, time
import ray
import fanout.batch
from fanout.batch import BatchOptions

folder, out, shared = sys.argv[1], sys.argv[2], sys.argv[3] or None
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

@ray.remote
def shard(options):
    return int(fanout.batch.run_sync(options).exit_code)

limits = None
if shared:
    from fanout.sharedlimit.ray import RayLimits
    limits = RayLimits.start(shared.removeprefix("ray://"))
started = time.perf_counter()
codes = ray.get([shard.remote(BatchOptions(
    prompts=f"{folder}/prompts.jsonl", output=f"{out}/results-{i}.jsonl",
    config=f"{folder}/bench.toml", shard=(i, 4), shared_limit=shared)) for i in range(4)])
print(json.dumps({"wall": time.perf_counter() - started, "codes": codes}))
ray.shutdown()
"""


def on_ray(folder: Path, name: str, shared: str | None) -> dict[str, Any]:
    out = folder / name
    out.mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONWARNINGS": "ignore", "RAY_TMPDIR": tempfile.mkdtemp(prefix="ray-")}
    try:
        run = subprocess.run([sys.executable, "-c", RAY_DRIVER, str(folder), str(out),
                              shared or ""], env=env, capture_output=True, text=True,
                             timeout=900, check=False)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    if run.returncode != 0:
        raise SystemExit(f"the Ray driver failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {**result, **tally(sorted(out.glob("results-*.jsonl")))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--busy", type=int, default=4, help="the N of fault/busy:N")
    parser.add_argument("--concurrency", type=int, default=8, help="[concurrency] max")
    parser.add_argument("--model-concurrency", type=int, default=8,
                        help="the model's [[models]] concurrency")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ray", action="store_true", help="the Ray rows too")
    args = parser.parse_args()
    if args.ray and not os.environ.get(IN_NAMESPACE):
        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-rn", "true"], capture_output=True).returncode != 0:
            raise SystemExit("--ray needs `unshare -rn` (Ray listens on every interface)")
        sys.exit(subprocess.run(
            ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
             sys.executable, *sys.argv], env={**os.environ, IN_NAMESPACE: "1"}).returncode)

    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        folder = Path(tmp)
        with mock() as base_url, redis_server(folder) as redis_url:
            write_inputs(folder, base_url, args)
            runs = [("1 process", "processes", 1, None),
                    ("4 shards, static share", "processes", SHARDS, None),
                    ("4 shards, --shared-limit redis", "processes", SHARDS, redis_url)]
            if args.ray:
                runs += [("Ray 4 tasks / 2 CPUs, static share", "ray", SHARDS, None),
                         ("Ray 4 tasks / 2 CPUs, ray:// actor", "ray", SHARDS, "ray://")]
            for round_ in range(args.rounds):
                for number, (name, kind, shards, shared) in enumerate(runs):
                    label = f"r{round_}-{number}"
                    if kind == "ray":
                        shared = f"ray://bench-{label}" if shared else None
                        result = on_ray(folder, label, shared)
                    else:
                        result = processes(folder, label, shards, shared)
                    rows.setdefault(name, []).append(result)
                    print(f"round {round_ + 1}: {name}: {result['rate_limited']} 429s, "
                          f"{result['wall']:.1f} s, span {result['span']:.1f} s, "
                          f"{result['left']} left", file=sys.stderr)
    print(f"\n{args.prompts} units, fault/busy:{args.busy}, [concurrency] max = "
          f"{args.concurrency}, [[models]] concurrency = {args.model_concurrency}, "
          f"{args.rounds} rounds (ratios: against the one-process run of the same round, "
          "median; - where it drew none)\n")
    print("| run | 429s | x 1 process | wall | span | span x 1 process | units left |")
    print("|---|---|---|---|---|---|---|")
    single = rows["1 process"]
    for name, results in rows.items():
        limited = ", ".join(str(r["rate_limited"]) for r in results)
        wall = ", ".join(f"{r['wall']:.1f} s" for r in results)
        pairs = list(zip(results, single, strict=True))
        ratios = [r["rate_limited"] / s["rate_limited"] for r, s in pairs if s["rate_limited"]]
        shown_429 = f"{statistics.median(ratios):.2f}" if ratios else "-"
        span = ", ".join(f"{r['span']:.1f} s" for r in results)
        ratio_span = statistics.median(r["span"] / s["span"] for r, s in pairs)
        left = ", ".join(str(r["left"]) for r in results)
        print(f"| {name} | {limited} | {shown_429} | {wall} | {span} | {ratio_span:.2f} "
              f"| {left} |")


if __name__ == "__main__":
    main()
