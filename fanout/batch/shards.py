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
import datetime
import hashlib
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import IO

import attrs
import orjson

from .._exceptions import ConfigError
from ..store.merging import (
    RESULTS_LINE,
    Input,
    Slot,
    Torn,
    check_output,
    file_kind,
    find_inputs,
    guard_outputs,
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

__all__ = ["EXIT_COMPLETE", "EXIT_FAILED", "EXIT_UNFINISHED", "Conflict", "FileTally",
           "ForeignShard", "MergeReport", "Newer", "Torn", "check", "merge"]

#: Every planned unit is there and done.
EXIT_COMPLETE = 0
#: Everything is there; some units failed in ways a rerun will not fix.
EXIT_FAILED = 1
#: ``EX_TEMPFAIL``: shards or units missing or unfinished: a rerun may finish them.
EXIT_UNFINISHED = 75
#: States ranked for a conflict: the first is kept.
_RANK = ("completed", "empty", "truncated", "timed_out", "error", "cancelled")
#: Older than any record's ``finished_at``: a record without one (an older fanout).
_NO_TIME = datetime.datetime.min.replace(tzinfo=datetime.UTC)


@attrs.frozen
class Conflict:
    """One key recorded with different content (content key or answer) in several files:
    ``kept`` is the file whose record the merge holds, ``others`` the rest, each with
    the state of its record."""

    key: str
    kept: tuple[str, str]  # (file, state)
    others: tuple[tuple[str, str], ...]
    newer: bool = False  # the kept record finished after every other (a redo, not a clash)


@attrs.frozen
class Newer:
    """``path`` holds ``units`` units whose records finished later than (and differ from)
    those ``than`` holds of them: a redo since (a resumed merged file, a shard run again)."""

    path: str
    than: str
    units: int
    kept: int = 0  # of them, the merge kept ``path``'s (the rest: a later failure, see merge)


@attrs.define
class FileTally:
    """One results input, as ``check`` (``fanout merge --check``) shows it: the units
    whose kept record it holds, by how they stand."""

    path: str
    shard: str | None  # "I/N" as its last record names it
    planned: int | None = None  # the units of its shard in the plan (known with the prompts)
    units: int = 0  # kept records it holds
    done: int = 0
    failed: int = 0  # a rerun will not fix them
    unfinished: int = 0  # a rerun may finish them
    torn: bool = False  # a torn last line (or the line a running batch is writing)
    in_use: bool = False  # a running fanout batch holds it
    included: bool = True  # False: of another plan, left out

    @property
    def left(self) -> int | None:
        """Units of its shard not done nor failed for good (``None``: not known)."""
        if self.planned is None:
            return None
        return max(0, self.planned - self.done - self.failed)


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
    newer: list[Newer] = attrs.Factory(list)  # inputs holding later records than others
    files: list[FileTally] = attrs.Factory(list)  # each results input, for --check
    duplicates: int = 0  # keys recorded alike in several files: kept once
    present_shards: list[int] = attrs.Factory(list)
    missing_shards: list[int] = attrs.Factory(list)
    foreign_shards: list[ForeignShard] = attrs.Factory(list)
    torn: list[Torn] = attrs.Factory(list)
    in_use: list[str] = attrs.Factory(list)  # inputs a running fanout batch holds
    old_files: list[str] = attrs.Factory(list)  # records without shard and plan fields
    not_in_plan: int = 0  # records of units outside the plan: left out
    other_plan: int = 0  # records of another plan, in files of this one, for other content
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


def _when(slot: Slot) -> datetime.datetime:
    return slot.time or _NO_TIME


def _better(one: Slot, other: Slot, planned: str | None) -> bool:
    """Whether ``one`` is to be kept over ``other``: the later (``finished_at``; a record
    without it is the older), as within one file, unless ``supersedes`` says not (of
    the same run, not done, the one with output stays) or the earlier is completed and
    the later not (two files' runs of a unit: a failure in one loses no answer of the
    other); a record of the planned content first.  The same time: completed over the
    rest, then the later input."""
    if not supersedes(other.attempt, one.attempt):
        return False
    if not supersedes(one.attempt, other.attempt):
        return True

    def rank(slot: Slot) -> tuple[bool, bool, datetime.datetime, int]:
        state = _RANK.index(slot.state) if slot.state in _RANK else len(_RANK)
        return slot.content_key == planned, slot.state == "completed", _when(slot), -state
    return rank(one) >= rank(other)


def merge(inputs: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
          prompts: str | os.PathLike[str] | None = None,
          config: str | os.PathLike[str] | None = None, models: Sequence[str] = (),
          samples: int | None = None, accept_empty: bool = False,
          into: bool = False) -> MergeReport:
    """Merge the results files ``inputs`` (files or directories) into ``output`` and
    the scores among or beside them into its scores file; check them (against the
    plan of ``prompts`` and ``config`` when given: see the module docstring).

    ``output`` is never one of the inputs, nor their scores files, and an existing
    ``output`` whose records the merge would lose (units it holds newer records of,
    or that no input holds: it was resumed since it was merged) is refused; with
    ``into`` the output is read as the first input and replaced by the merge (the
    records of every unit it holds kept, unless an input holds a later one).

    Returns the ``MergeReport``; raises ``ConfigError`` (one line, naming the file;
    nothing written) for a bad input, output, prompts file or config."""
    output = os.fspath(output)
    scores_output = os.fspath(scores_path(output))
    if config is not None and prompts is None:
        raise ConfigError("--config: the plan needs the prompts too: give --prompts")
    for target in (output, scores_output):
        check_output(target)
    into = into and os.path.lexists(output)
    results, scores = find_inputs([output, *inputs] if into else inputs)
    guard_outputs(output, scores_output, results, scores, into=into)
    for target in (output, scores_output):
        for name in (prompts, config):
            if name is not None and (one := stat_of(target)) and (two := stat_of(os.fspath(name))) \
                    and same_file(one, two):
                raise ConfigError(f"{target}: is {os.fspath(name)}; name another -o")
    report = MergeReport(output, inputs=[s.path for s in results],
                         scores_inputs=[s.path for s in scores])
    with contextlib.ExitStack() as stack:
        merged, plan = _analyse(stack, results, scores, report, prompts, config, models,
                                samples, accept_empty, hold=True)
        picked = _pick_scores(scores, results, merged, report)
        if not into:
            _refuse_losing(stack, output, scores_output, results, merged, plan, picked)
        write(output, _lines(merged, results))
        report.records = len(merged)
        if scores or os.path.lexists(scores_output):
            write(scores_output, (read_line(file, at, size) for file, at, size in picked[0]))
            report.scores = len(picked[0])
            report.scores_output = scores_output
    return report


def check(inputs: Sequence[str | os.PathLike[str]], *,
          prompts: str | os.PathLike[str] | None = None,
          config: str | os.PathLike[str] | None = None, models: Sequence[str] = (),
          samples: int | None = None, accept_empty: bool = False) -> MergeReport:
    """What ``merge`` would find of ``inputs``, writing nothing (``fanout merge --check``,
    ``fanout report --watch``): the same check, and ``MergeReport.files``, each results
    input's units by how they stand.  It takes no lock a starting shard would trip on."""
    if config is not None and prompts is None:
        raise ConfigError("--config: the plan needs the prompts too: give --prompts")
    results, scores = find_inputs(inputs)
    report = MergeReport("", inputs=[s.path for s in results],
                         scores_inputs=[s.path for s in scores])
    with contextlib.ExitStack() as stack:
        merged, _ = _analyse(stack, results, [], report, prompts, config, models, samples,
                             accept_empty, hold=False)
        report.records = len(merged)
    return report


def _analyse(stack: contextlib.ExitStack, results: list[Input], scores: list[Input],
             report: MergeReport, prompts: str | os.PathLike[str] | None,
             config: str | os.PathLike[str] | None, models: Sequence[str],
             samples: int | None, accept_empty: bool, *, hold: bool
             ) -> tuple[dict[str, Slot], _Plan | None]:
    """Read the inputs (held open on ``stack``), merge their keys and check them."""
    for source in (*results, *scores):
        source.file = stack.enter_context(open_input(source.path))
    for index, source in enumerate(results):
        read_results(index, source, report.torn, report.in_use, hold=hold)
    plan = _choose_plan(results, report, prompts, config, models, samples)
    merged = _merge_keys(results, report, plan)
    _check(merged, results, report, plan, accept_empty)
    return merged, plan


def _refuse_losing(stack: contextlib.ExitStack, output: str, scores_output: str,
                   results: list[Input], merged: dict[str, Slot], plan: _Plan | None,
                   picked: tuple[list[tuple[IO[bytes], int, int]], set[bytes]]) -> None:
    """Refuse to replace an existing ``output`` (or its scores) holding records the merge
    would lose: a unit no input holds, or a later record than the merge keeps of it."""
    if file_kind(output) == "results":
        mine = Input(output)
        mine.file = stack.enter_context(open_input(output))
        read_results(len(results), mine, [], [])
        lost = 0
        for key, slot in mine.latest.items():
            kept = merged.get(key)
            unit = None if plan is None else plan.units.get(key)
            if kept is None:
                lost += unit is not None or plan is None
            elif (kept.content_key, kept.answer) != (slot.content_key, slot.answer) \
                    and _better(slot, kept, None if unit is None else unit[0]):
                lost += 1
        if lost:
            raise ConfigError(
                f"{output}: holds {_units(lost)} the merge would lose (newer records than "
                f"the inputs hold, or units none of them holds: was it resumed since it "
                f"was merged?): merge the inputs into it with --into {output}, or add it "
                "as an input and name another -o; nothing was written")
    if file_kind(scores_output) == "scores":
        with open_input(scores_output) as file:
            lost = 0
            for line in scan(file, scores_problem):
                record = line.record
                if record is None:
                    continue
                held = merged.get(_work_key(record["id"], record["model"], record["sample"]))
                if held is None or (record["answer_key"] == held.answer and hashlib.sha256(
                        orjson.dumps(record, option=orjson.OPT_SORT_KEYS)).digest()
                        not in picked[1]):
                    lost += 1  # (the score of an answer the merge replaced is not lost)
        if lost:
            raise ConfigError(
                f"{scores_output}: holds {lost} score{'s' if lost != 1 else ''} the merge "
                f"would lose (of units it does not hold, or of answers it keeps but no "
                f"input's scores file scores so: scored since it was merged?): merge the "
                f"inputs into it with --into {output}, or name another -o; nothing was "
                "written")


def _units(count: int) -> str:
    return f"{count} unit{'s' if count != 1 else ''}"


def _choose_plan(results: list[Input], report: MergeReport,
                 prompts: str | os.PathLike[str] | None,
                 config: str | os.PathLike[str] | None, models: Sequence[str],
                 samples: int | None) -> _Plan | None:
    """The merge's plan: recomputed from ``prompts`` and ``config``, else the one most
    inputs name; the inputs of another plan are left out."""
    # Each plan by how many files hold records of it (a merged file holds its shards'
    # records, and a resume of it adds records of the unsharded plan of the same units).
    shard_plans = Counter(plan for s in results for plan in s.plans)
    counts = Counter(n for s in results for n, _ in s.plans.values())
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
        report.shards = next(s.plans[report.plan][0] for s in results
                             if report.plan in s.plans)
    for source in results:
        if not source.has_fields:
            report.old_files.append(source.path)
        elif report.plan is not None and report.plan not in source.plans:
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
    newer: Counter[tuple[int, int]] = Counter()  # (newer file, older file) -> units
    newer_kept: Counter[tuple[int, int]] = Counter()  # of those, the newer kept
    for key, slots in candidates.items():
        planned = None
        if plan is not None:
            unit = plan.units.get(key)
            if unit is None:
                report.not_in_plan += 1
                continue
            planned = unit[0]
        if report.plan is not None:
            # A record of another plan in a file of this one's (a merged file resumed
            # unsharded: the same units, another N) counts when it asks what the plan
            # asks of its unit: its content key, as the plan or a record of it has it.
            ours = [s for s in slots if s.plan in (None, report.plan)
                    or _same_question(s, key, planned, results, report.plan)]
            report.other_plan += len(slots) - len(ours)
            if not ours:
                continue
            slots = ours
        kept = slots[0]
        if len(slots) > 1:
            if len({(s.content_key, s.answer) for s in slots}) == 1:
                report.duplicates += 1
            else:
                for slot in slots[1:]:
                    if _better(slot, kept, planned):
                        kept = slot
                others = [s for s in slots if s is not kept]
                newest = max(slots, key=_when)
                later = all(_when(s) < _when(newest) for s in slots if s is not newest)
                for slot in slots:
                    if later and slot is not newest \
                            and (slot.content_key, slot.answer) != (newest.content_key,
                                                                    newest.answer):
                        newer[(newest.file, slot.file)] += 1
                        newer_kept[(newest.file, slot.file)] += kept is newest
                report.conflicts.append(Conflict(
                    key, (results[kept.file].path, kept.state),
                    tuple((results[s.file].path, s.state) for s in others),
                    newer=later and kept is newest))
        merged[key] = kept
    report.newer = [Newer(results[one].path, results[other].path, count,
                          newer_kept[(one, other)])
                    for (one, other), count in sorted(newer.items())]
    return merged


def _same_question(slot: Slot, key: str, planned: str | None, results: list[Input],
                   plan: str) -> bool:
    if planned is not None:
        return slot.content_key == planned
    return any(s.included and s.plans.get(plan, (0, {}))[1].get(key) == slot.content_key
               for s in results)


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
    _tally_files(checked, results, report, plan, done_states)
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


def _tally_files(checked: list[tuple[str, Slot]], results: list[Input], report: MergeReport,
                 plan: _Plan | None, done_states: set[str]) -> None:
    """``report.files``: each results input's kept units by how they stand."""
    failed = set(report.failed_keys)
    torn = {t.path for t in report.torn}
    tallies = [FileTally(source.path, None if source.last_shard is None
                         else f"{source.last_shard[0]}/{source.last_shard[1]}",
                         torn=source.path in torn, in_use=source.path in report.in_use,
                         included=source.included)
               for source in results]
    for key, slot in checked:
        tally = tallies[slot.file]
        tally.units += 1
        if slot.state in done_states:
            tally.done += 1
        elif key in failed:
            tally.failed += 1
        else:
            tally.unfinished += 1
    if plan is not None and report.shards is not None:
        per_shard = Counter(shard_of(key, report.shards) for key in plan.units)
        for source, tally in zip(results, tallies, strict=True):
            if source.included and source.last_shard is not None \
                    and source.last_shard[1] == report.shards:
                tally.planned = per_shard[source.last_shard[0]]
    report.files = tallies


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


def _pick_scores(scores: list[Input], results: list[Input], merged: dict[str, Slot],
                 report: MergeReport) -> tuple[list[tuple[IO[bytes], int, int]], set[bytes]]:
    """The scores of the merged answers, where their lines are (and their digests):
    exact duplicates once, those of a unit not in the merge or of an answer it did not
    keep dropped."""
    seen: set[bytes] = set()
    picked: list[tuple[IO[bytes], int, int]] = []
    for source in scores:
        assert source.file is not None
        unreadable, records, results_like, offset = Unreadable(), 0, 0, 0
        pair = None if source.pair is None else results[source.pair]
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
                        picked.append((source.file, offset, line.size))
            elif line.torn:
                report.torn.append(Torn(source.path, line.number, line.size))
            elif line.kind is not None:
                unreadable.add(line)
                results_like += line.problem == RESULTS_LINE
            offset += line.size
        if unreadable:
            refuse_unreadable(source.path, unreadable, records, "scores", "results",
                               results_like)
    return picked, seen
