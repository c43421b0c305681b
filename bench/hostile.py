"""Peak memory of one hostile stream, with fanout's defaults, against a plain stream.

    .venv/bin/python bench/hostile.py [--rounds 3]

Starts ``fanout mock`` in its own process, then runs each stream below through
``run_fanout`` with NO options (the documented defaults: deadlines, the 64 MiB
response cap, the choice and tool-call caps) in a fresh Python process of its
own, and reads that process's peak RSS (``VmHWM``).  The peer, measured in
the same run, is one ordinary stream (``mock/fast``, 200 tokens): the
interpreter, the imports and a stream's fixed cost.  Each hostile row reports
its outcome, why it ended, how many bytes it read, its peak RSS and the ratio
to the peer.  Rounds run round-robin; the table shows medians.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import statistics
import subprocess
import time

CHILD = r"""
import json, sys, time, trio
from fanout import Endpoint, StreamRequest, run_fanout

async def main():
    endpoint = Endpoint(sys.argv[1])
    request = StreamRequest("s", sys.argv[2], [{"role": "user", "content": "go"}])
    start = time.monotonic()
    result = (await run_fanout(endpoint, [request]))["s"]
    return result, time.monotonic() - start

result, seconds = trio.run(main)
print(json.dumps({
    "outcome": str(result.outcome), "reason": result.reason or "completed",
    "bytes": result.bytes_received, "chars": len(result.text),
    "choices": len(result.choices), "skipped": result.skipped_frames, "seconds": seconds,
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak
    "peak_rss_mb": int(next(line for line in open("/proc/self/status")
                            if line.startswith("VmHWM")).split()[1]) / 1024}))
"""

STREAMS = [
    ("mock/fast", "one ordinary stream (the peer)"),
    ("fault/endless", "valid events forever, as fast as the socket takes them"),
    ("fault/gzip-bomb", "1.8 MB of gzip that inflates to 1 GiB of events"),
    ("fault/huge-event", "one 16 MiB event, sent slowly"),
    ("fault/many-choices", "100,000 distinct choice indexes"),
    ("fault/many-tools", "100,000 distinct tool-call indexes"),
]


def run_child(base_url: str, model: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, base_url, model], capture_output=True,
                         text=True, timeout=600, check=True)
    return dict(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert mock.stdout is not None
        base_url = mock.stdout.readline().strip()
        rows: dict[str, list[dict[str, object]]] = {model: [] for model, _ in STREAMS}
        for _ in range(args.rounds):
            for model, _ in STREAMS:
                rows[model].append(run_child(base_url, model))
    finally:
        mock.terminate()
        mock.wait(10)
    peer = statistics.median(float(str(r["peak_rss_mb"])) for r in rows["mock/fast"])
    print(f"Measured {time.strftime('%Y-%m-%d')}, {args.rounds} rounds, medians; "
          f"Python {sys.version.split()[0]}\n")
    print("| stream | what it does | outcome | why it ended | bytes read | peak RSS | vs peer |")
    print("|---|---|---|---|---:|---:|---:|")
    for model, what in STREAMS:
        last = rows[model][-1]
        rss = statistics.median(float(str(r["peak_rss_mb"])) for r in rows[model])
        print(f"| `{model}` | {what} | {last['outcome']} | {last['reason']} | "
              f"{int(str(last['bytes'])):,} | {rss:.0f} MB | {rss / peer:.2f}x |")


if __name__ == "__main__":
    main()
