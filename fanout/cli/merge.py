"""``fanout merge``: the shard files of a batch into one results file, checked.

The arguments and the rendering only; the merge and its check are
``fanout.batch.merge``.  What it found goes to stderr, a line each; the
closing lines (what was written, the counts, the verdict) to stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from .._exceptions import ConfigError

if TYPE_CHECKING:
    from ..batch.shards import MergeReport

__all__ = ["add_parser", "check_lines", "render", "run_merge"]

#: Keys listed per kind (missing, conflicts...); the rest are counted.
LISTED = 10

DESCRIPTION = (
    "Merge the results files of a batch's shards (files, or directories: their *.jsonl) "
    "into one results file, MERGED, and the scores files among or beside them "
    "(*.scores.jsonl) into MERGED.scores.jsonl; the inputs are not changed. Each unit's "
    "latest record is kept once (a redo of the same run that failed with no output never "
    "replaces one that kept some); the same unit recorded differently in two files is a "
    "conflict (both named, the better kept). Then it checks the merge: with --prompts and "
    "--config it recomputes the plan and names every planned unit missing; from the "
    "records' shard and plan fields, every shard absent or of another plan (left out); a "
    "torn last line is left out and named. The merged file resumes with fanout batch like "
    "any results file. Exit status: 0 every planned unit is there and done; 1 everything "
    "is there but some units failed in ways a rerun will not fix (4xx, a model that always "
    "fails the same way); 2 bad usage or input (nothing written); 75 shards or units are "
    "missing or unfinished: run those shards again, then merge again.")


def add_parser(commands: Any) -> None:
    """The ``merge`` subcommand, on ``commands`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "merge", help="merge shard files into one results file, and check it is complete",
        description=DESCRIPTION)
    parser.add_argument("shards", nargs="+", metavar="SHARD",
                        help="a results file of a shard, or a directory of them")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="MERGED.jsonl",
                       help="the merged results file (written whole, replacing one there "
                            "unless it is an input or holds records the merge would lose); "
                            "its scores go to MERGED.scores.jsonl beside it")
    where.add_argument("--into", metavar="MERGED.jsonl",
                       help="merge the shards into this earlier merged file (after it was "
                            "resumed, say): it is read as an input, and replaced by the merge, "
                            "which keeps the latest record of every unit of all of them")
    where.add_argument("--check", action="store_true",
                       help="write nothing: show each shard file's units (planned, done, "
                            "failed, left), the shards missing and the total, while shards "
                            "run or after; the exit status is the merge's")
    parser.add_argument("--prompts", metavar="PROMPTS.jsonl",
                        help="the batch's prompts file: the plan is recomputed and every "
                             "missing unit named")
    parser.add_argument("--config", metavar="FILE",
                        help="the batch's config (as for batch; needs --prompts)")
    parser.add_argument("-m", "--model", dest="models", action="append", default=[],
                        metavar="NAME", help="a model the batch ran (repeat; default: the "
                        "models the records name, or the config's [batch] models, whichever "
                        "the shards' plan is)")
    parser.add_argument("--samples", type=int, metavar="K",
                        help="the batch's --samples (default: as many as the records hold)")
    parser.add_argument("--accept-empty", action="store_true",
                        help="count a completed empty answer as done (as batch --accept-empty)")


def run_merge(args: argparse.Namespace, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None) -> int:
    """Run ``fanout merge``; returns its exit status."""
    from ..batch.shards import check, merge
    from .render import printable

    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        if args.check:
            report = check(args.shards, prompts=args.prompts, config=args.config,
                           models=tuple(args.models), samples=args.samples,
                           accept_empty=args.accept_empty)
        elif args.output is None and args.into is None:
            raise ConfigError("name the merged file: -o MERGED.jsonl (or --into MERGED.jsonl "
                              "to merge into an earlier merge; --check writes nothing)")
        else:
            report = merge(args.shards, args.into or args.output, prompts=args.prompts,
                           config=args.config, models=tuple(args.models),
                           samples=args.samples, accept_empty=args.accept_empty,
                           into=args.into is not None)
    except ConfigError as exc:
        for line in exc.problems or [str(exc)]:
            print(f"fanout merge: {printable(line)}", file=err)
        return 2
    notes, closing = render(report)
    if args.check:
        closing = check_lines(report) + closing[-1:]
    for line in notes:
        print(f"fanout merge: {printable(line)}", file=err)
    for line in closing:
        print(printable(line), file=out)
    return report.exit_code


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:LISTED])
    return shown + (f", … ({len(keys) - LISTED} more)" if len(keys) > LISTED else "")


def _plural(count: int, one: str, several: str | None = None) -> str:
    return f"{count} {one if count == 1 else several or one + 's'}"


def render(report: MergeReport) -> tuple[list[str], list[str]]:
    """What the merge found (a line each), and its closing lines."""
    from ..batch.shards import EXIT_COMPLETE, EXIT_FAILED

    notes: list[str] = []
    for torn in report.torn:
        notes.append(f"{torn.path}: left out a torn last line (line {torn.line}, "
                     f"{torn.size} bytes: a run stopped mid-write; its unit is not merged)")
    for path in report.in_use:
        notes.append(f"{path}: a running fanout batch holds it: its shard is unfinished "
                     "(what it held so far is merged)")
    for foreign in report.foreign_shards:
        shard = f"shard {foreign.shard}" if foreign.shard else "records"
        notes.append(f"{foreign.path}: {shard} of plan {foreign.plan}, not this merge's "
                     f"plan {report.plan} ({_plural(report.shards or 0, 'shard')}): other "
                     "prompts, config, models, samples or N; left out, with its scores")
    if report.old_files:
        notes.append(f"{_plural(len(report.old_files), 'file')} without shard and plan "
                     f"fields (an older fanout wrote them): {', '.join(report.old_files)}: "
                     "their units are merged and checked, not their shards")
    if not report.keys_checked:
        if report.fingerprint_matches:
            notes.append("the merged units give the plan's fingerprint: every unit of the plan "
                         "is there (--prompts and --config check them against the prompts)")
        elif report.fingerprint_matches is False:
            notes.append("the merged units do not give the plan's fingerprint: some are missing "
                         "(or of another plan); give --prompts and --config to name them")
        else:
            notes.append("the plan's units were not checked (the records name no plan): give "
                         "--prompts and --config to name every missing one")
    if report.not_in_plan:
        notes.append(f"{_plural(report.not_in_plan, 'unit')} not in the plan (other prompts, "
                     "models or samples): left out")
    if report.other_plan:
        notes.append(f"{_plural(report.other_plan, 'record')} of another plan in files of this "
                     "one (asking other content of their units): left out")
    if report.duplicates:
        notes.append(f"{_plural(report.duplicates, 'unit')} recorded alike in several files: "
                     "kept once")
    for newer in report.newer:
        kept = ("kept" if newer.kept == newer.units else
                f"{newer.kept} kept, {newer.units - newer.kept} not (a later failure does not "
                "replace a completed answer of another file)")
        notes.append(f"{newer.path} holds {_plural(newer.units, 'unit')} newer than "
                     f"{newer.than} (finished later, recorded differently: a redo since): "
                     f"{kept}")
    clashes = [c for c in report.conflicts if not c.newer]
    for conflict in clashes[:LISTED]:
        others = ", ".join(f"{path} ({state})" for path, state in conflict.others)
        notes.append(f"conflict: {conflict.key} differs in {conflict.kept[0]} "
                     f"({conflict.kept[1]}) and {others}: kept {conflict.kept[0]}'s")
    if len(clashes) > LISTED:
        notes.append(f"… and {len(clashes) - LISTED} more conflicts")
    if report.missing_keys:
        changed = (f"; {report.changed} of them recorded for other content: the prompt or "
                   "config changed since" if report.changed else "")
        notes.append(f"missing: {_plural(len(report.missing_keys), 'planned unit')}"
                     f"{changed}: {_listed(report.missing_keys)}")
    if report.missing_shards:
        notes.append(_missing_shards(report))
    for model, how in report.hopeless_models.items():
        notes.append(f"{model}: every one of its units ended {how}: running it again will "
                     "not help")
    if report.failed_keys:
        notes.append(f"failed for good: {_listed(report.failed_keys)}")
    if report.unfinished_keys:
        notes.append(f"not finished (running their shards again may finish them): "
                     f"{_listed(report.unfinished_keys)}")
    dropped = [(report.scores_duplicates, "exact duplicates"),
               (report.scores_orphans, "of units not in the merge"),
               (report.scores_other_answer, "of answers the merge did not keep")]
    if any(count for count, _ in dropped):
        notes.append("scores dropped: " + ", ".join(f"{count} {why}" for count, why in dropped
                                                    if count))

    wrote = f"wrote {report.output} ({_plural(report.records, 'record')})"
    if report.scores_output is not None:
        wrote += f" and {report.scores_output} ({_plural(report.scores, 'score')})"
    planned = "?" if report.planned is None else str(report.planned)
    missing = (str(len(report.missing_keys)) if report.keys_checked
               else "0" if report.fingerprint_matches else "?")
    shards = (f"{len(report.present_shards)} of {report.shards}" if report.shards is not None
              else "?")
    redone = sum(c.newer for c in report.conflicts)
    conflicts = f"{len(report.conflicts) - redone}" + (f" (and {redone} newer records kept)"
                                                       if redone else "")
    counts = (f"units planned {planned}, present {report.present}, missing {missing}, failed "
              f"{len(report.failed_keys)}, unfinished {len(report.unfinished_keys)}, conflicts "
              f"{conflicts}, torn tails cut {len(report.torn)}; shards present "
              f"{shards}")
    code = report.exit_code
    unchecked = not report.keys_checked and report.fingerprint_matches is None
    if code == EXIT_COMPLETE and unchecked:
        verdict = ("every merged unit is done; whether any is missing could not be checked "
                   "(the records name no plan: give --prompts and --config) (exit 0)")
    elif code == EXIT_COMPLETE:
        verdict = "complete: every planned unit is there and done (exit 0)"
    elif code == EXIT_FAILED:
        verdict = (f"finished, but {_plural(len(report.failed_keys), 'unit')} failed in ways "
                   "a rerun will not fix (exit 1)")
    else:
        verdict = ("not complete: shards or units are missing or unfinished; run those shards "
                   "again (the same fanout batch --shard I/N, which resumes its file) and "
                   "merge again, or resume the merged file with fanout batch (exit 75)")
    return notes, [wrote, counts, verdict]


def _missing_shards(report: MergeReport) -> str:
    """Which shards no input holds, by number (0-based), and how many are there."""
    missing, total = report.missing_shards, report.shards or 0
    which = (f"shard {missing[0]}" if len(missing) == 1
             else f"shards {', '.join(map(str, missing))}")
    return (f"missing {which} of {total} (numbered 0 to {total - 1}; "
            f"{total - len(missing)} of {total} present): no input holds a record of "
            f"{'it' if len(missing) == 1 else 'them'}")


def check_lines(report: MergeReport) -> list[str]:
    """``fanout merge --check``'s lines (``fanout report --watch``'s too): each results
    input's units, each shard no input holds, the total."""
    lines = []
    for tally in report.files:
        shard = f"shard {tally.shard}" if tally.shard else "no shard named"
        if not tally.included:
            lines.append(f"{tally.path}: {shard}: of another plan, left out")
            continue
        if tally.planned is not None:
            counts = (f"planned {tally.planned}, done {tally.done}, failed {tally.failed}, "
                      f"left {tally.left}")
        else:
            counts = (f"units {tally.units}: done {tally.done}, failed {tally.failed}, "
                      f"unfinished {tally.unfinished}")
        states = []
        if tally.in_use:
            states.append("a running fanout batch is writing it")
        if tally.torn:
            states.append("a torn last line (a record being written, or a run stopped "
                          "mid-write)")
        lines.append(f"{tally.path}: {shard}: {counts}" + "".join(f"; {s}" for s in states))
    for index in report.missing_shards:
        lines.append(f"shard {index}/{report.shards}: no file holds a record of it")
    failed = len(report.failed_keys)
    if report.planned is not None:
        left = f"left {max(0, report.planned - report.done - failed)}"
    else:
        left = f"left at least {len(report.unfinished_keys)} (the plan is not known)"
    planned = "?" if report.planned is None else str(report.planned)
    shards = (f"; shards present {len(report.present_shards)} of {report.shards}"
              if report.shards is not None else "")
    running = f"; {_plural(len(report.in_use), 'file')} being written" if report.in_use else ""
    lines.append(f"total: units planned {planned}, done {report.done}, failed {failed}, "
                 f"{left}{shards}{running}")
    return lines
