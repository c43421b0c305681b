"""A batch as N Ray tasks: one shard each through the library, retried by Ray, then merged.

    pip install 'fanout[ray]'
    python examples/ray_batch.py prompts.jsonl -o merged.jsonl --shards 4        # a local Ray
    python examples/ray_batch.py prompts.jsonl -o merged.jsonl --shards 32 \\
        --config fanout.toml --address auto                                       # a cluster

Each task calls ``fanout.batch.run_sync`` on its shard (``BatchOptions.shard = (i, N)``),
writing ``merged.shards/results-I.jsonl``: no subprocess, no ``fanout`` on the workers'
PATH, only the package installed where they run.  The tasks share the endpoint's limits
through one Ray actor (``fanout.sharedlimit.ray.RayLimits``, named for this run, started
here and ended with this driver): the endpoint's concurrency, each model's, and the 429
back-off, whichever tasks Ray runs at the moment (the tasks that run take what is free).
A slot's lease is renewed while its stream runs, so a killed worker's slots come back after
``--lease`` seconds.  ``--shared-limit redis://...`` shares them through Redis instead, and
``--shared-limit off`` gives each task its static share of ``--concurrency`` (else the
config's ``[concurrency] max``; 1/N of every concurrency, which assumes all N run at once),
unless ``--shard-concurrency`` says how many.  ``--score NAME`` scores every answer as it is
written (each shard's scores file beside its results file, merged with them), and
``--per-model-concurrency``, ``--accept-empty``, ``--retry-failed`` and ``--run-id`` are
``fanout batch``'s.  ``fanout.batch.merge`` then checks every shard and every planned unit,
and writes one results file, as ``fanout merge`` would.

Ray runs a task again when its worker dies (a killed process, a lost node: ``--retries``
times) and when a shard ends with work a rerun may finish (exit 75: connection refused,
5xx or 429 exhausted, a full disk).  A retry resumes its own shard file: what was written
is kept, the units in flight when the worker died are sent again.  A shard that failed for
good (exit 1), that the budget stopped (exit 3), or whose input is wrong (exit 2) is not
retried.  Running the script again with the same arguments resumes every shard.

The shard files must be on storage every node sees (one machine, NFS, a shared volume): the
paths are made absolute here, as the driver sees them.  The exit status is the worst of the
shards' and the merge's, in fanout's table: 2 a shard refused its input, 75 work is left (run
the same command again), 3 the budget stopped a shard, 1 units failed in ways a rerun will
not fix, 0 every unit done.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

import ray
import ray.exceptions

import fanout
import fanout.batch
from fanout.batch import BatchOptions, BatchSummary, merge
from fanout.config import find_config
from fanout.sharedlimit.ray import RayLimits

#: The exit code of work left that a rerun may finish (``EX_TEMPFAIL``).
WORK_LEFT = 75
#: Input or config that is wrong: every retry would fail the same way.
USAGE = 2
#: The budget stopped the run.
BUDGET = 3


class WorkLeft(Exception):
    """A shard ended with work a rerun may finish: Ray runs the task again."""


class Refused(Exception):
    """A shard's input or config is wrong (the library's one-line message)."""


@ray.remote(retry_exceptions=[WorkLeft])
def run_shard(options: BatchOptions) -> BatchSummary:
    """Run one shard to its end; ``WorkLeft`` asks Ray for another attempt (it resumes)."""
    try:
        summary = fanout.batch.run_sync(options)
    except fanout.ConfigError as exc:
        # A plain exception with one string: it crosses back to the driver intact.
        raise Refused(str(exc)) from None
    if summary.exit_code == WORK_LEFT:
        raise WorkLeft(f"{summary.left} of {summary.total} units left")
    return summary


def shard_options(args: argparse.Namespace, index: int) -> BatchOptions:
    """The library options of shard ``index`` of ``args.shards``."""
    output = Path(args.shard_dir).resolve() / f"results-{index}.jsonl"
    return BatchOptions(prompts=str(Path(args.prompts).resolve()), output=str(output),
                        models=tuple(args.models), samples=args.samples,
                        shard=(index, args.shards), concurrency=args.concurrency,
                        per_model_concurrency=args.per_model_concurrency,
                        shard_concurrency=args.shard_concurrency, run_id=args.run_id,
                        config=args.config, accept_empty=args.accept_empty,
                        scorers=tuple(args.scorers), retry_failed=args.retry_failed,
                        shared_limit=args.shared)


def describe(summary: BatchSummary) -> str:
    """One line for a shard's summary."""
    counts = ", ".join(f"{count} {state}" for state, count in sorted(summary.counts.items())
                       if count)
    line = f"exit {int(summary.exit_code)}: {summary.done} of {summary.total} units done"
    return line + (f" ({counts})" if counts else "") + (
        f", {summary.redone} redone" if summary.redone else "")


def run(args: argparse.Namespace) -> int:
    """Run the shards as Ray tasks, wait for each, merge, print; the exit status."""
    Path(args.shard_dir).mkdir(parents=True, exist_ok=True)
    if args.shared_limit == "ray":
        # One actor for this run, owned by this driver (it ends with it); every task
        # finds it by its name.
        name = f"fanout-limits-{secrets.token_hex(4)}"
        RayLimits.start(name, lease=args.lease)
        args.shared = f"ray://{name}?lease={args.lease:g}"
    else:
        args.shared = args.shared_limit  # a Redis URL, or off: the static share
    task = run_shard.options(max_retries=args.retries)
    pending = {task.remote(shard_options(args, i)): i for i in range(args.shards)}
    codes: set[int] = set()  # the shards' exit statuses
    while pending:
        [ready], _ = ray.wait(list(pending), num_returns=1)
        index = pending.pop(ready)
        name = f"shard {index}/{args.shards}"
        try:
            summary = ray.get(ready)
        except ray.exceptions.RayTaskError as exc:  # raised in the task, retries spent
            cause = exc.cause
            codes.add(USAGE if isinstance(cause, Refused) else WORK_LEFT)
            print(f"{name}: {type(cause).__name__}: {cause}", flush=True)
        except ray.exceptions.RayError as exc:  # its workers died more often than retried
            codes.add(WORK_LEFT)
            print(f"{name}: {type(exc).__name__}: its worker died "
                  f"{args.retries + 1} times", flush=True)
        else:
            codes.add(int(summary.exit_code))
            print(f"{name}: {describe(summary)}", flush=True)
    if USAGE in codes:
        print("a shard refused its input: fix it, then run the same command again")
        return USAGE
    report = merge([args.shard_dir], args.output, prompts=args.prompts, config=args.config,
                   accept_empty=args.accept_empty)
    codes.add(int(report.exit_code))
    verdict = {0: "complete", 1: "complete, some units failed"}.get(
        int(report.exit_code), "incomplete")
    print(f"merged {args.shard_dir} into {args.output}: {verdict}", flush=True)
    for what, items in (("missing units", report.missing_keys),
                        ("conflicting units", report.conflicts),
                        ("missing or unfinished shards", report.missing_shards),
                        ("shards of another plan", report.foreign_shards),
                        ("torn lines", report.torn)):
        if items:
            shown = ", ".join(map(str, list(items)[:5]))
            print(f"  {len(items)} {what}: {shown}{', ...' if len(items) > 5 else ''}")
    # The worst of the shards and the merge, in the order of what it asks of the user.
    for code, advice in ((USAGE, "fix the input"),
                         (WORK_LEFT, "work is left: run the same command again "
                                     "(each shard resumes its file)"),
                         (BUDGET, "the budget stopped a shard"),
                         (1, "some units failed in ways a rerun will not fix")):
        if code in codes:
            print(f"exit {code}: {advice}", flush=True)
            return code
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked; the config found and made absolute."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", metavar="PROMPTS.jsonl")
    parser.add_argument("-o", "--output", required=True, metavar="MERGED.jsonl")
    parser.add_argument("--shards", type=int, default=4, metavar="N", help="Ray tasks")
    parser.add_argument("--shard-dir", metavar="DIR",
                        help="where the shards' files go (default: MERGED.shards/)")
    parser.add_argument("-m", "--model", dest="models", action="append", default=[])
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--config", metavar="FILE")
    # As fanout batch takes them; each shard gets them all (BatchOptions).
    parser.add_argument("--concurrency", type=int, metavar="N",
                        help="the endpoint's streams in flight, for all shards together "
                             "(default: the config's [concurrency] max, else 32): each shard "
                             "takes max(1, N // shards)")
    parser.add_argument("--shard-concurrency", type=int, metavar="K",
                        help="streams in flight per shard, over its share")
    parser.add_argument("--per-model-concurrency", type=int, metavar="N")
    parser.add_argument("--score", dest="scorers", action="append", default=[],
                        metavar="NAME", help="score each answer as it is written (repeat); "
                                             "each shard writes results-I.scores.jsonl "
                                             "beside its file, and the merge merges them")
    parser.add_argument("--accept-empty", action="store_true",
                        help="a completed empty answer is done (shards and merge)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="send again the units refused as sent before (HTTP 4xx)")
    parser.add_argument("--run-id", metavar="ID")
    parser.add_argument("--retries", type=int, default=3,
                        help="attempts after the first, per task (default 3)")
    parser.add_argument("--shared-limit", default="ray", metavar="ray|URL|off",
                        help="where the tasks share the endpoint's limits: ray (default: "
                             "an actor of this run), a redis:// URL, or off (each task its "
                             "static share)")
    parser.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                        help="a shared slot's lease, renewed while its stream runs (a "
                             "killed worker's slots come back after it; default 30)")
    parser.add_argument("--address", help="a running Ray cluster (default: start one here)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.retries < 0:
        parser.error("--shards must be >= 1 and --retries >= 0")
    for flag in ("concurrency", "shard_concurrency", "per_model_concurrency"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not 0.5 <= args.lease <= 86400:
        parser.error("--lease must be 0.5 to 86400 seconds")
    # What each task is given: run() names the actor of this run for "ray".
    args.shared = None if args.shared_limit == "ray" else args.shared_limit
    args.shard_dir = args.shard_dir or str(Path(args.output).with_suffix(".shards"))
    # The config the CLI would take here (--config, else ./fanout.toml, ...), by its
    # absolute path: a worker's directory is not the driver's.
    found = find_config(args.config)
    args.config = str(found.resolve()) if found is not None else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry unless asked
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        return run(args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
