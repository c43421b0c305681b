"""Merging the shard files of one batch into one results file, and checking it.

``merge(inputs, output)`` reads results files (a directory: its ``*.jsonl``),
writes one results file at ``output`` holding the latest record of every unit,
and the scores found among or beside the inputs (``*.scores.jsonl``) into
``output``'s scores file; ``MergeReport`` says what it found.  The inputs are
never written to.  A scores file is never read as results nor the reverse:
one given as the other is refused, naming it.

The merged file is a results file like any other (``fanout batch`` resumes
it, ``fanout report`` and ``fanout score`` read it): each record is copied
byte for byte from its shard file, one a key.  Within one file the latest
record of a key counts, as on resume (``fanout.store.results.supersedes``: its
latest, unless it is a redo of the same run that failed with no output after an
attempt that kept some).  The same key in two files (a shard run twice,
overlapping shards) is kept once when both have the same content key and
answer, else it is a *conflict*: both are named, the better one kept (of the
same run and not done, the one with output, as within a file; else of the
plan's content, then completed over the rest, then the later ``finished_at``,
then the later input).

**The check.**  With the prompts and config (``prompts``, ``config``; the
models and samples as ``fanout batch`` took them: ``models``, else those the
records name or the config's ``[batch]`` models, whichever is the shards'
plan; ``samples``, else as many as the records hold) the plan is recomputed:
every planned unit missing (or recorded for other content: the prompt or
config changed since) is named, records of units not in the plan are left
out.  From the records' ``shard``/``plan`` fields (``plan_check``): the
shards of the plan present and absent, each file of another plan (other
prompts, config, models, samples or N: left out, with its scores), and,
without the prompts, whether the merged keys are exactly the plan's (its
fingerprint).  Records without those fields (older files) are checked by key
only.  A torn last line (a crash mid-write) is left out and named; a file a
``fanout batch`` holds locked is still being written.

``MergeReport.exit_code``: 0 every planned unit is there and done; 1 all is
there, but some units failed in ways a rerun will not fix (as ``fanout batch``
judges it, ``summary.judge``: HTTP 4xx other than 408/409/429, or every unit of
a model ending the same way of its own, on 2 samples at least); 75 work is
left that running the shards again may finish (shards or units missing,
units unfinished, a torn tail, a shard still running).  Bad input raises
``ConfigError`` with one line naming the file (nothing is written).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Iterator, Sequence

import attrs
import orjson

from .._exceptions import ConfigError
from ..store.merging import (
    RESULTS_LINE,
    Input,
    Slot,
    Torn,
    check_output,
    find_inputs,
    open_input,
    read_line,
    read_results,
    refuse_unreadable,
    same_file,
    scores_problem,
    stat_of,
    write,
)
from ..store.plan_check import plan_fingerprint
from ..store.prompts import PromptFileError, load_prompts
from ..store.results import Unreadable, scan, shard_of, supersedes
from ..store.results import work_key as _work_key
from ..store.scores import scores_path
from .plan import plan_work
from .summary import Final, file_evidence, judge

__all__ = ["EXIT_COMPLETE", "EXIT_FAILED", "EXIT_UNFINISHED", "Conflict", "ForeignShard",
           "MergeReport", "Torn", "merge"]

#: Every planned unit is there and done.
EXIT_COMPLETE = 0
#: Everything is there; some units failed in ways a rerun will not fix.
EXIT_FAILED = 1
#: ``EX_TEMPFAIL``: shards or units missing or unfinished: a rerun may finish them.
EXIT_UNFINISHED = 75
#: States ranked for a conflict: the first is kept.
_RANK = ("completed", "empty", "truncated", "timed_out", "error", "cancelled")


@attrs.frozen
class Conflict:
    """One key recorded with different content (content key or answer) in several files:
    ``kept`` is the file whose record the merge holds, ``others`` the rest, each with
    the state of its record."""

    key: str
    kept: tuple[str, str]  # (file, state)
    others: tuple[tuple[str, str], ...]


@attrs.frozen
class ForeignShard:
    """An input whose records are of another plan than the merge's: left out."""

    path: str
    shard: str | None  # "I/N" as its last record names it
    plan: str | None


@attrs.define
class MergeReport:
    """What ``merge`` wrote and found (the counts in units of work, keys as
    ``work_key`` gives them)."""

    output: str
    scores_output: str | None = None  # None: no scores found, none written
    inputs: list[str] = attrs.Factory(list)
    scores_inputs: list[str] = attrs.Factory(list)
    plan: str | None = None  # the plan's fingerprint, when records name one
    shards: int | None = None  # its N
    keys_checked: bool = False  # the plan's units were recomputed (prompts and config)
    fingerprint_matches: bool | None = None  # the merged keys are exactly the plan's
    planned: int | None = None
    present: int = 0  # planned units with a record of the planned content
    done: int = 0
    missing_keys: list[str] = attrs.Factory(list)  # no record, or one of other content
    changed: int = 0  # of the missing: recorded for other content
    failed_keys: list[str] = attrs.Factory(list)  # a rerun will not fix them
    unfinished_keys: list[str] = attrs.Factory(list)  # a rerun may finish them
    not_done: dict[str, int] = attrs.Factory(dict)  # state -> units not done
    conflicts: list[Conflict] = attrs.Factory(list)
    duplicates: int = 0  # keys recorded alike in several files: kept once
    present_shards: list[int] = attrs.Factory(list)
    missing_shards: list[int] = attrs.Factory(list)
    foreign_shards: list[ForeignShard] = attrs.Factory(list)
    torn: list[Torn] = attrs.Factory(list)
    in_use: list[str] = attrs.Factory(list)  # inputs a running fanout batch holds
    old_files: list[str] = attrs.Factory(list)  # records without shard and plan fields
    not_in_plan: int = 0  # records of units outside the plan: left out
    records: int = 0  # written to the merged file
    scores: int = 0  # written to the merged scores file
    scores_duplicates: int = 0  # exact duplicates dropped
    scores_orphans: int = 0  # of a unit not in the merged file: dropped
    scores_other_answer: int = 0  # of an answer the merge did not keep: dropped
    hopeless_models: dict[str, str] = attrs.Factory(dict)  # model -> how all its units ended

    @property
    def complete(self) -> bool:
        return self.exit_code == EXIT_COMPLETE

    @property
    def exit_code(self) -> int:
        """0 complete, 1 some units failed for good, 75 work left that a rerun may
        finish (see the module docstring)."""
        if (self.missing_keys or self.missing_shards or self.unfinished_keys or self.torn
                or self.in_use or self.fingerprint_matches is False
                or (not self.records and not self.keys_checked)):
            return EXIT_UNFINISHED
        return EXIT_FAILED if self.failed_keys else EXIT_COMPLETE


# ------------------------------------------------------------------------ the plan


@attrs.frozen
class _Plan:
    units: dict[str, tuple[str, str]]  # key -> (content key, model)
    models: tuple[str, ...]
    samples: int


def _load_plan(prompts: str, config: str | None, models: Sequence[str],
               samples: int | None, seen_models: Sequence[str], seen_samples: int,
               shards: int | None, shard_plans: Counter[str]) -> _Plan:
    from ..config import load_config

    try:
        loaded = load_prompts(prompts)
    except PromptFileError as exc:
        more = f" ({exc.total} bad lines)" if exc.total > 1 else ""
        raise ConfigError(f"--prompts {exc.problems[0]}{more}") from None
    settings = load_config(config)
    count = samples if samples is not None else max(1, seen_samples)
    if samples is not None and samples < 1:
        raise ConfigError(f"--samples must be >= 1, not {samples}")
    if models:
        choices = [tuple(models)]
    else:
        default = tuple(m.name for m in settings.select((), default=settings.batch))
        defined = {m.name for m in settings.models}
        named = tuple(m.name for m in settings.models if m.name in set(seen_models))
        choices = [default] + ([named] if named and set(seen_models) <= defined
                               and named != default else [])
    plans = []
    for names in choices:
        work = plan_work(loaded, settings.select(names), count, settings)
        plan = _Plan({unit.key: (unit.content_key, unit.model.name) for unit in work},
                     names, count)
        if shards is not None and plan_fingerprint(
                [(k, c) for k, (c, _) in plan.units.items()], shards) in shard_plans:
            return plan
        plans.append(plan)
    return plans[-1]  # the records' models: the likelier when no plan matches


# ------------------------------------------------------------------------ merging


def _better(one: Slot, other: Slot, planned: str | None) -> bool:
    """Whether ``one`` is to be kept over ``other`` (a later input over an earlier one
    when all else is equal)."""
    # The rule of one file's records, read without an order: whichever came later, a
    # record of the same run, not done and without output, never displaces one with.
    if not supersedes(other.attempt, one.attempt):
        return False
    if not supersedes(one.attempt, other.attempt):
        return True

    def rank(slot: Slot) -> tuple[bool, int, str]:
        state = _RANK.index(slot.state) if slot.state in _RANK else len(_RANK)
        return slot.content_key == planned, -state, slot.finished
    return rank(one) >= rank(other)


def merge(inputs: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
          prompts: str | os.PathLike[str] | None = None,
          config: str | os.PathLike[str] | None = None, models: Sequence[str] = (),
          samples: int | None = None, accept_empty: bool = False) -> MergeReport:
    """Merge the results files ``inputs`` (files or directories) into ``output`` and
    the scores among or beside them into its scores file; check them (against the
    plan of ``prompts`` and ``config`` when given: see the module docstring).

    Returns the ``MergeReport``; raises ``ConfigError`` (one line, naming the file;
    nothing written) for a bad input, output, prompts file or config."""
    output = os.fspath(output)
    scores_output = os.fspath(scores_path(output))
    if config is not None and prompts is None:
        raise ConfigError("--config: the plan needs the prompts too: give --prompts")
    for target in (output, scores_output):
        check_output(target)
    results, scores = find_inputs(inputs, [output, scores_output])
    for target in (output, scores_output):
        for name in (prompts, config):
            if name is not None and (one := stat_of(target)) and (two := stat_of(os.fspath(name))) \
                    and same_file(one, two):
                raise ConfigError(f"{target}: is {os.fspath(name)}; name another -o")
    report = MergeReport(output, inputs=[s.path for s in results],
                         scores_inputs=[s.path for s in scores])
    with contextlib.ExitStack() as stack:
        for source in (*results, *scores):
            source.file = stack.enter_context(open_input(source.path))
        for index, source in enumerate(results):
            read_results(index, source, report.torn, report.in_use)
        plan = _choose_plan(results, report, prompts, config, models, samples)
        merged = _merge_keys(results, report, plan)
        _check(merged, results, report, plan, accept_empty)
        write(output, _lines(merged, results))
        report.records = len(merged)
        if scores or os.path.lexists(scores_output):
            write(scores_output, _score_lines(scores, results, merged, report))
            report.scores_output = scores_output
    return report


def _choose_plan(results: list[Input], report: MergeReport,
                 prompts: str | os.PathLike[str] | None,
                 config: str | os.PathLike[str] | None, models: Sequence[str],
                 samples: int | None) -> _Plan | None:
    """The merge's plan: recomputed from ``prompts`` and ``config``, else the one most
    inputs name; the inputs of another plan are left out."""
    shard_plans = Counter(s.last_plan for s in results
                          if s.last_plan is not None and s.last_shard is not None)
    counts = Counter(s.last_shard[1] for s in results
                     if s.last_plan is not None and s.last_shard is not None)
    report.shards = counts.most_common(1)[0][0] if counts else None
    plan = None
    if prompts is not None:
        seen_models = list(dict.fromkeys(slot.model for s in results
                                         for slot in s.latest.values()))
        seen_samples = 1 + max((_sample(key) for s in results for key in s.latest),
                               default=0)
        plan = _load_plan(os.fspath(prompts), None if config is None else os.fspath(config),
                          models, samples, seen_models, seen_samples, report.shards,
                          shard_plans)
        report.keys_checked = True
        report.planned = len(plan.units)
        if report.shards is not None:
            report.plan = plan_fingerprint([(k, c) for k, (c, _) in plan.units.items()],
                                           report.shards)
    elif shard_plans:
        report.plan = shard_plans.most_common(1)[0][0]
        report.shards = next(s.last_shard[1] for s in results
                             if s.last_plan == report.plan and s.last_shard is not None)
    for source in results:
        if not source.has_fields:
            report.old_files.append(source.path)
        elif report.plan is not None and source.last_plan != report.plan:
            source.included = False
            shard = source.last_shard
            report.foreign_shards.append(ForeignShard(
                source.path, None if shard is None else f"{shard[0]}/{shard[1]}",
                source.last_plan))
    return plan


def _sample(key: str) -> int:
    sample = orjson.loads(key)[2]
    return sample if isinstance(sample, int) else 0


def _merge_keys(results: list[Input], report: MergeReport, plan: _Plan | None
                ) -> dict[str, Slot]:
    """key -> the record kept of it."""
    candidates: dict[str, list[Slot]] = {}
    for source in results:
        if source.included:
            for key, slot in source.latest.items():
                candidates.setdefault(key, []).append(slot)
    merged: dict[str, Slot] = {}
    for key, slots in candidates.items():
        planned = None
        if plan is not None:
            unit = plan.units.get(key)
            if unit is None:
                report.not_in_plan += 1
                continue
            planned = unit[0]
        kept = slots[0]
        if len(slots) > 1:
            if len({(s.content_key, s.answer) for s in slots}) == 1:
                report.duplicates += 1
            else:
                for slot in slots[1:]:
                    if _better(slot, kept, planned):
                        kept = slot
                report.conflicts.append(Conflict(
                    key, (results[kept.file].path, kept.state),
                    tuple((results[s.file].path, s.state) for s in slots if s is not kept)))
        merged[key] = kept
    return merged


def _check(merged: dict[str, Slot], results: list[Input], report: MergeReport,
           plan: _Plan | None, accept_empty: bool) -> None:
    done_states = {"completed", "empty"} if accept_empty else {"completed"}
    checked: list[tuple[str, Slot]] = []
    if plan is not None:
        for key, (content, _) in plan.units.items():
            slot = merged.get(key)
            if slot is None or slot.content_key != content:
                report.missing_keys.append(key)
                report.changed += slot is not None
            else:
                checked.append((key, slot))
    else:
        checked = list(merged.items())
    report.present = len(checked)
    not_done = [(key, slot) for key, slot in checked if slot.state not in done_states]
    report.done = len(checked) - len(not_done)
    report.not_done = dict(Counter(slot.state for _, slot in not_done))
    # Which of them failed for good: the same judgement as fanout batch's at the end of
    # a run (``summary.judge``), over the whole merge's evidence.
    failed = {key: Final(slot.model, slot.state, slot.status, None) for key, slot in not_done}
    units = Counter(slot.model for _, slot in checked)
    slots = dict(not_done)
    verdict = judge(failed, units, samples=lambda key: _samples(results, slots[key], key))
    for model, keys in verdict.same_way.items():
        state, status = slots[keys[0]].state, slots[keys[0]].status
        report.hopeless_models[model] = state + (f" (HTTP {status})" if status else "")
    for model, keys in verdict.refused.items():  # every unit refused, the same way
        if units[model] == len(keys) >= 2 and len({slots[k].status for k in keys}) == 1:
            report.hopeless_models[model] = f"error (HTTP {slots[keys[0]].status})"
    permanent = verdict.permanent
    for key, _ in not_done:
        (report.failed_keys if key in permanent else report.unfinished_keys).append(key)
    # The shards.
    if report.plan is None or report.shards is None:
        return
    shards = report.shards
    present = {slot.shard[0] for slot in merged.values()
               if slot.plan == report.plan and slot.shard is not None and slot.shard[1] == shards}
    present |= {s.last_shard[0] for s in results if s.included and s.last_shard is not None
                and s.last_plan == report.plan}
    report.present_shards = sorted(present)
    if plan is not None:
        expected = {shard_of(key, shards) for key in plan.units}
    else:
        report.fingerprint_matches = plan_fingerprint(
            [(key, slot.content_key) for key, slot in merged.items()], shards) == report.plan
        if report.fingerprint_matches:
            report.planned = len(merged)
        expected = set() if report.fingerprint_matches else set(range(shards))
    report.missing_shards = sorted(expected - present)


def _samples(results: list[Input], slot: Slot, key: str) -> int:
    """How many records of ``key`` in the file its kept ``slot`` is from ended that way
    (``summary.file_evidence``): a unit that is all its model's evidence."""
    try:
        seen = file_evidence(results[slot.file].path).get(key)
    except OSError:
        return 1
    return seen.samples if seen is not None and (seen.state, seen.status) == (
        slot.state, slot.status) else 1


# ------------------------------------------------------------------------ writing


def _lines(merged: dict[str, Slot], results: list[Input]) -> Iterator[bytes]:
    """The kept records, file by file in input order, each in its file's order."""
    by_file: dict[int, list[Slot]] = {}
    for slot in merged.values():
        by_file.setdefault(slot.file, []).append(slot)
    for index in sorted(by_file):
        file = results[index].file
        assert file is not None
        for slot in sorted(by_file[index], key=lambda s: s.offset):
            yield read_line(file, slot.offset, slot.size)


def _score_lines(scores: list[Input], results: list[Input], merged: dict[str, Slot],
                 report: MergeReport) -> Iterator[bytes]:
    """The scores of the merged answers: exact duplicates once, those of a unit not in
    the merge or of an answer it did not keep dropped."""
    seen: set[bytes] = set()
    for source in scores:
        assert source.file is not None
        unreadable, records, results_like, offset = Unreadable(), 0, 0, 0
        pair = None if source.pair is None else results[source.pair]
        kept: list[tuple[int, int]] = []
        for line in scan(source.file, scores_problem):
            if line.record is not None:
                records += 1
                record = line.record
                key = _work_key(record["id"], record["model"], record["sample"])
                slot = merged.get(key)
                if slot is None or (pair is not None and not pair.included):
                    report.scores_orphans += 1
                elif not ((pair is not None and (mine := pair.latest.get(key)) is not None
                           and (mine.content_key, mine.answer)
                           == (slot.content_key, slot.answer))
                          or record["answer_key"] == slot.answer):
                    report.scores_other_answer += 1
                else:
                    digest = hashlib.sha256(orjson.dumps(
                        record, option=orjson.OPT_SORT_KEYS)).digest()
                    if digest in seen:
                        report.scores_duplicates += 1
                    else:
                        seen.add(digest)
                        kept.append((offset, line.size))
            elif line.torn:
                report.torn.append(Torn(source.path, line.number, line.size))
            elif line.kind is not None:
                unreadable.add(line)
                results_like += line.problem == RESULTS_LINE
            offset += line.size
        if unreadable:
            refuse_unreadable(source.path, unreadable, records, "scores", "results",
                               results_like)
        for at, size in kept:
            report.scores += 1
            yield read_line(source.file, at, size)
