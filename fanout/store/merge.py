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
record of a key counts, as on resume.  The same key in two files (a shard run
twice, overlapping shards) is kept once when both have the same content key
and answer, else it is a *conflict*: both are named, the better one kept
(of the plan's content, then completed over the rest, then the later
``finished_at``, then the later input).

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
there, but some units failed in ways a rerun will not fix (HTTP 4xx other
than 408/409/429, or every unit of a model ending the same way); 75 work is
left that running the shards again may finish (shards or units missing,
units unfinished, a torn tail, a shard still running).  Bad input raises
``ConfigError`` with one line naming the file (nothing is written).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs
import orjson

from .._exceptions import ConfigError
from ..files import create_new, identity, kind_of, remove_if_same, temporary_name
from . import _moved
from ._moved import Unreadable, answer_key, record_problem, scan, score_problem, state_of
from ._moved import work_key as _work_key
from .plan_check import plan_fingerprint, record_plan, record_shard

__all__ = ["EXIT_COMPLETE", "EXIT_FAILED", "EXIT_UNFINISHED", "Conflict", "ForeignShard",
           "MergeReport", "Torn", "merge"]

#: Every planned unit is there and done.
EXIT_COMPLETE = 0
#: Everything is there; some units failed in ways a rerun will not fix.
EXIT_FAILED = 1
#: ``EX_TEMPFAIL``: shards or units missing or unfinished: a rerun may finish them.
EXIT_UNFINISHED = 75
#: HTTP statuses that refuse the request as sent: a rerun sends it again, unchanged.
FINAL_STATUSES = frozenset(range(400, 500)) - {408, 409, 429}
#: States ranked for a conflict: the first is kept.
_RANK = ("completed", "empty", "truncated", "timed_out", "error", "cancelled")
_SCORE_LINE = "a score record"
_RESULTS_LINE = "a results record"


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


@attrs.frozen
class Torn:
    """A torn last line (a crash mid-write), left out of the merge."""

    path: str
    line: int
    size: int  # bytes


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


# ------------------------------------------------------------------------ reading


@attrs.define
class _Slot:
    """The latest record of one key in one file: where its line is, and what the
    merge compares."""

    file: int
    offset: int
    size: int
    content_key: str
    answer: str
    state: str
    status: int | None
    model: str
    finished: str
    plan: str | None
    shard: tuple[int, int] | None


@attrs.define
class _Input:
    path: str
    file: IO[bytes] | None = None
    pair: int | None = None  # scores: the results input beside it
    latest: dict[str, _Slot] = attrs.Factory(dict)
    last_plan: str | None = None  # the plan and shard of its last record
    last_shard: tuple[int, int] | None = None
    has_fields: bool = False
    included: bool = True


def _results_problem(value: object) -> str | None:
    problem = record_problem(value)
    if problem is not None and score_problem(value) is None:
        return _SCORE_LINE
    return problem


def _scores_problem(value: object) -> str | None:
    problem = score_problem(value)
    if problem is not None and record_problem(value) is None:
        return _RESULTS_LINE
    return problem


def _open_input(path: str) -> IO[bytes]:
    """``path`` open for reading (a link followed: inputs are only read), refused
    unless a regular file; a pipe never blocks the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd)
        if not stat.S_ISREG(mode.st_mode):
            raise ConfigError(f"{path}: not a regular file ({kind_of(path, mode)})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")  # held open until the merge is written


def _locked_by_a_run(file: IO[bytes]) -> bool:
    """Take a shared lock (held while the merge reads): ``True`` when a ``fanout
    batch`` holds the file (it is being written)."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # a file system without locks: nothing to tell
    return False


def _refuse_unreadable(path: str, unreadable: Unreadable, records: int, kind: str,
                       other: str, wrong: int) -> None:
    total = records + unreadable.total
    if wrong and wrong == unreadable.total:
        hint = ("its scores are merged from beside its results file (RESULTS.scores.jsonl)"
                if kind == "results" else "name it as a results file")
        raise ConfigError(f"{path}: is a fanout {other} file ({wrong} of its {total} lines are "
                          f"{other} records), not a {kind} file: {hint}; nothing was written")
    raise ConfigError(f"{path}: not a fanout {kind} file: {unreadable.total} of its {total} "
                      f"lines are not {kind} records ({unreadable.describe()[0]}); nothing "
                      "was written")


def _read_results(index: int, source: _Input, report: MergeReport) -> None:
    assert source.file is not None
    if _locked_by_a_run(source.file):
        report.in_use.append(source.path)
    unreadable, records, scores_like, offset = Unreadable(), 0, 0, 0
    for line in scan(source.file, _results_problem):
        if line.record is not None:
            record = line.record
            records += 1
            key = _work_key(record["id"], record["model"], record["sample"])
            status = record.get("status")
            plan, shard = record_plan(record), record_shard(record)
            source.latest.pop(key, None)
            source.latest[key] = _Slot(
                index, offset, line.size, record["content_key"], answer_key(record),
                state_of(record),
                status if isinstance(status, int) and not isinstance(status, bool) else None,
                record["model"], str(record.get("finished_at") or ""), plan, shard)
            source.last_plan, source.last_shard = plan, shard
            source.has_fields = source.has_fields or plan is not None
        elif line.torn:
            report.torn.append(Torn(source.path, line.number, line.size))
        elif line.kind is not None:
            unreadable.add(line)
            scores_like += line.problem == _SCORE_LINE
        offset += line.size
    if unreadable:
        _refuse_unreadable(source.path, unreadable, records, "results", "scores", scores_like)


# ------------------------------------------------------------------------ the inputs


def _same_file(one: os.stat_result, other: os.stat_result) -> bool:
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _inputs(paths: Sequence[str | os.PathLike[str]], outputs: Sequence[str]
            ) -> tuple[list[_Input], list[_Input]]:
    """The results and scores inputs of ``paths`` (files; directories: their
    ``*.jsonl``, hidden ones and the outputs aside), each once, each scores file
    with the results file it is beside."""
    if not paths:
        raise ConfigError("no input: name the shard files or their directory")
    taken: list[tuple[str, os.stat_result]] = []
    out_stats = [(name, mode) for name in outputs if (mode := _stat(name)) is not None]
    results: list[_Input] = []
    scores: list[_Input] = []

    def take(path: str, *, listed: bool) -> bool:
        mode = _stat(path)
        if mode is None:
            return False
        for name, out in out_stats:
            if _same_file(mode, out):
                if listed:
                    return False  # the output of an earlier merge into this directory
                raise ConfigError(f"{path}: is the output {name}; name another -o")
        if any(_same_file(mode, seen) for _, seen in taken):
            return False
        taken.append((path, mode))
        return True

    names_given = [os.fspath(path) for path in paths]
    for given in names_given:
        if os.path.isdir(given):
            names = sorted(name for name in os.listdir(given)
                           if name.endswith(".jsonl") and not name.startswith("."))
            found = [os.path.join(given, name) for name in names]
            if all(path.endswith(".scores.jsonl") for path in found):
                raise ConfigError(f"{given}: no results file in it (*.jsonl)")
            kept = [path for path in found if take(path, listed=True)]
            for path in kept:
                (scores if path.endswith(".scores.jsonl") else results).append(_Input(path))
            continue
        if not os.path.lexists(given):
            raise ConfigError(f"{given}: no such file or directory")
        if not take(given, listed=False):
            continue
        (scores if given.endswith(".scores.jsonl") else results).append(_Input(given))
    for index, source in enumerate(results):  # each results file's scores beside it
        beside = os.fspath(_moved.scores_path(source.path))
        mode = _stat(beside)
        match = next((s for s in scores if (m := _stat(s.path)) is not None and mode is not None
                      and _same_file(m, mode)), None)
        if match is None and mode is not None and take(beside, listed=True):
            match = _Input(beside)
            scores.append(match)
        if match is not None:
            match.pair = index
    if not results:
        raise ConfigError(f"{', '.join(names_given)}: no results file among them "
                          "(a *.scores.jsonl is merged with its results file)")
    return results, scores


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
        loaded = _moved.load_prompts(prompts)
    except _moved.PromptFileError as exc:
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
        work = _moved.plan_work(loaded, settings.select(names), count, settings)
        plan = _Plan({unit.key: (unit.content_key, unit.model.name) for unit in work},
                     names, count)
        if shards is not None and plan_fingerprint(
                [(k, c) for k, (c, _) in plan.units.items()], shards) in shard_plans:
            return plan
        plans.append(plan)
    return plans[-1]  # the records' models: the likelier when no plan matches


# ------------------------------------------------------------------------ merging


def _better(one: _Slot, other: _Slot, planned: str | None) -> bool:
    """Whether ``one`` is to be kept over ``other`` (a later input over an earlier one
    when all else is equal)."""
    def rank(slot: _Slot) -> tuple[bool, int, str]:
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
    scores_output = os.fspath(_moved.scores_path(output))
    if config is not None and prompts is None:
        raise ConfigError("--config: the plan needs the prompts too: give --prompts")
    for target in (output, scores_output):
        _check_output(target)
    results, scores = _inputs(inputs, [output, scores_output])
    for target in (output, scores_output):
        for name in (prompts, config):
            if name is not None and (one := _stat(target)) and (two := _stat(os.fspath(name))) \
                    and _same_file(one, two):
                raise ConfigError(f"{target}: is {os.fspath(name)}; name another -o")
    report = MergeReport(output, inputs=[s.path for s in results],
                         scores_inputs=[s.path for s in scores])
    with contextlib.ExitStack() as stack:
        for source in (*results, *scores):
            source.file = stack.enter_context(_open_input(source.path))
        for index, source in enumerate(results):
            _read_results(index, source, report)
        plan = _choose_plan(results, report, prompts, config, models, samples)
        merged = _merge_keys(results, report, plan)
        _check(merged, results, report, plan, accept_empty)
        _write(output, _lines(merged, results))
        report.records = len(merged)
        if scores or os.path.lexists(scores_output):
            _write(scores_output, _score_lines(scores, results, merged, report))
            report.scores_output = scores_output
    return report


def _choose_plan(results: list[_Input], report: MergeReport,
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


def _merge_keys(results: list[_Input], report: MergeReport, plan: _Plan | None
                ) -> dict[str, _Slot]:
    """key -> the record kept of it."""
    candidates: dict[str, list[_Slot]] = {}
    for source in results:
        if source.included:
            for key, slot in source.latest.items():
                candidates.setdefault(key, []).append(slot)
    merged: dict[str, _Slot] = {}
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


def _check(merged: dict[str, _Slot], results: list[_Input], report: MergeReport,
           plan: _Plan | None, accept_empty: bool) -> None:
    done_states = {"completed", "empty"} if accept_empty else {"completed"}
    checked: list[tuple[str, _Slot]] = []
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
    # A model whose every unit (2 or more) is not done, all the same way: a rerun sends
    # the same requests to the same model.
    by_model: dict[str, list[_Slot]] = {}
    for _, slot in checked:
        by_model.setdefault(slot.model, []).append(slot)
    for model, slots in by_model.items():
        ways = {(s.state, s.status) for s in slots}
        if len(slots) >= 2 and len(ways) == 1 and slots[0].state not in done_states:
            state, status = next(iter(ways))
            report.hopeless_models[model] = state + (f" (HTTP {status})" if status else "")
    for key, slot in not_done:
        if slot.status in FINAL_STATUSES or slot.model in report.hopeless_models:
            report.failed_keys.append(key)
        else:
            report.unfinished_keys.append(key)
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
        expected = {_moved.shard_of(key, shards) for key in plan.units}
    else:
        report.fingerprint_matches = plan_fingerprint(
            [(key, slot.content_key) for key, slot in merged.items()], shards) == report.plan
        if report.fingerprint_matches:
            report.planned = len(merged)
        expected = set() if report.fingerprint_matches else set(range(shards))
    report.missing_shards = sorted(expected - present)


# ------------------------------------------------------------------------ writing


def _line(file: IO[bytes], offset: int, size: int) -> bytes:
    data = os.pread(file.fileno(), size, offset)
    if len(data) != size:
        raise OSError(errno.EIO, "the file changed while it was merged", file.name)
    return data if data.endswith(b"\n") else data + b"\n"


def _lines(merged: dict[str, _Slot], results: list[_Input]) -> Iterator[bytes]:
    """The kept records, file by file in input order, each in its file's order."""
    by_file: dict[int, list[_Slot]] = {}
    for slot in merged.values():
        by_file.setdefault(slot.file, []).append(slot)
    for index in sorted(by_file):
        file = results[index].file
        assert file is not None
        for slot in sorted(by_file[index], key=lambda s: s.offset):
            yield _line(file, slot.offset, slot.size)


def _score_lines(scores: list[_Input], results: list[_Input], merged: dict[str, _Slot],
                 report: MergeReport) -> Iterator[bytes]:
    """The scores of the merged answers: exact duplicates once, those of a unit not in
    the merge or of an answer it did not keep dropped."""
    seen: set[bytes] = set()
    for source in scores:
        assert source.file is not None
        unreadable, records, results_like, offset = Unreadable(), 0, 0, 0
        pair = None if source.pair is None else results[source.pair]
        kept: list[tuple[int, int]] = []
        for line in scan(source.file, _scores_problem):
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
                results_like += line.problem == _RESULTS_LINE
            offset += line.size
        if unreadable:
            _refuse_unreadable(source.path, unreadable, records, "scores", "results",
                               results_like)
        for at, size in kept:
            report.scores += 1
            yield _line(source.file, at, size)


def _check_output(target: str) -> None:
    """Refuse what ``target`` cannot be (a link, not a regular file, a results file a
    ``fanout batch`` is appending to), before anything is read or written."""
    try:
        mode = os.lstat(target)
    except FileNotFoundError:
        if not Path(target).parent.is_dir():
            raise ConfigError(f"{target}: cannot write: {Path(target).parent}/ does not "
                              "exist") from None
        return
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode.st_mode):
        raise ConfigError(f"{target}: is {kind_of(target, mode)}: fanout writes no file "
                          "through a link (it is left as it was); name the file itself")
    if not stat.S_ISREG(mode.st_mode):
        raise ConfigError(f"{target}: not a regular file ({kind_of(target, mode)})")
    try:
        with _open_input(target) as file:
            if _locked_by_a_run(file):
                raise ConfigError(f"{target}: in use by a running fanout batch "
                                  f"({_moved.holder(_moved.lock_path(target))}); wait for it "
                                  "to end, or name another -o")
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"{target}: cannot read: {exc.strerror or exc}") from None


def _write(target: str, chunks: Iterator[bytes]) -> None:
    """``chunks`` to ``target`` whole or not at all: a new temporary file beside it,
    flushed to disk, renamed over it; a link put at ``target`` meanwhile is refused."""
    for _ in range(100):
        temporary = temporary_name(target)
        try:
            fd, made = create_new(temporary, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"{target}: cannot write beside it: {exc.strerror or exc}"
                              ) from None
        break
    else:
        raise ConfigError(f"{target}: no free temporary name beside it")
    try:
        try:
            with open(fd, "wb", closefd=False) as file:
                for chunk in chunks:
                    file.write(chunk)
            mask = os.umask(0)
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)
            os.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                made = identity(os.fstat(fd))
            os.close(fd)
        _check_output(target)
        os.replace(temporary, target)
    except OSError as exc:
        remove_if_same(temporary, made)
        raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}; it is left as it "
                          "was") from None
    except BaseException:
        remove_if_same(temporary, made)
        raise

