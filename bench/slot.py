"""`fanout batch` against a server with one generation slot: what finding the limit costs.

    .venv/bin/python bench/slot.py [--prompts 10] [--models 4] [--concurrency 4]
                                   [--tokens 30] [--cadence 0.02] [--rounds 3]

PROMPTS x MODELS units, every model name on the embedded upstream's one slot
(``slot/clean``, ``slot/broken``, ``slot/relay``: a new request cuts the stream
the slot serves), through ``run_batch`` at --concurrency, in-process.  Per
mode and round: the exit status, the units completed (with their whole answer:
usage says TOKENS), the streams redone after a cut (records beyond one a unit),
the endpoint's concurrency (lowest, and at the end) and the wall time; the
median wall time over --rounds.  The serial floor is units x tokens x cadence.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import io
import json
import statistics
import tempfile
import time
from typing import Any

import fanout.batch.runner as run_module
import fanout.cli.batch as batch_module
from fanout.batch.session import Session

MODES = ("clean", "broken", "relay")


class _Watched(Session):
    """The batch session, keeping its endpoint limit for the report."""

    last: Any = None

    def cut_lines(self) -> list[str]:
        _Watched.last = self.endpoint
        return super().cut_lines()


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="fanout-slot-"))
    (folder / "fanout.toml").write_text(
        '[endpoint]\nbase_url = "embedded"\n[deadlines]\nidle = 10\ntotal = 300\n' + "".join(
            f'[[models]]\nname = "m{i}"\nid = "slot/{mode}:{args.cadence}"\n'
            f"params = {{ max_tokens = {args.tokens} }}\n" for i in range(args.models)))
    with (folder / "prompts.jsonl").open("w") as file:
        for i in range(args.prompts):
            file.write(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) + "\n")
    output = folder / "results.jsonl"
    started = time.monotonic()
    status = batch_module.run_batch(
        batch_module.BatchOptions(prompts=str(folder / "prompts.jsonl"), output=str(output),
                                  config=str(folder / "fanout.toml"),
                                  concurrency=args.concurrency),
        stdout=io.StringIO(), stderr=io.StringIO(), environ={})
    wall = time.monotonic() - started
    rows = [json.loads(line) for line in output.open()]
    latest = {(r["id"], r["model"], r["sample"]): r for r in rows}
    whole = sum(r["outcome"] == "completed" and not r["flags"] and bool(r["usage"])
                and r["usage"]["completion_tokens"] == args.tokens for r in latest.values())
    limit = _Watched.last
    return {"status": status, "completed": whole, "units": len(latest),
            "redone": len(rows) - len(latest), "lowest": limit.lowest, "end": limit.limit,
            "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--cadence", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    run_module.Session = _Watched  # type: ignore[misc]
    units = args.prompts * args.models
    print(f"{units} units at --concurrency {args.concurrency}, {args.tokens} tokens at "
          f"{args.cadence}s a chunk; serial floor {units * args.tokens * args.cadence:.1f}s")
    print("| server | units completed | cuts redone | concurrency (start → lowest, at the end) "
          "| wall time (median) |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES:
        runs = [run(mode, args) for _ in range(args.rounds)]
        for r in runs:
            print(f"  {mode}: exit {r['status']}, {r['completed']} of {r['units']} completed, "
                  f"{r['redone']} redone, {args.concurrency} → {r['lowest']} (end {r['end']}), "
                  f"{r['wall']:.2f}s", file=sys.stderr)
        first = runs[0]
        same = all((r["completed"], r["redone"], r["lowest"], r["end"])
                   == (first["completed"], first["redone"], first["lowest"], first["end"])
                   for r in runs)
        print(f"| `slot/{mode}` | {first['completed']} of {first['units']} | {first['redone']}"
              f"{'' if same else ' (varies)'} | {args.concurrency} → {first['lowest']}, "
              f"{first['end']} | {statistics.median(r['wall'] for r in runs):.1f} s |")


if __name__ == "__main__":
    main()
