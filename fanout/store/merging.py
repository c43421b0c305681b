"""The files of a merge: its inputs read (each shard file's reported record per key,
where its line is, a torn tail, a lock a running batch holds; a scores file given as
results refused, or the reverse) and its outputs written whole (a temporary file
beside, renamed over; never through a link).  ``fanout.batch.merge`` is the merge."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs
import orjson

from .._exceptions import ConfigError
from ..files import create_new, identity, kind_of, remove_if_same, temporary_name
from .plan_check import record_plan, record_shard
from .results import (
    Attempt,
    Unreadable,
    attempt_of,
    holder_of,
    lock_path,
    record_problem,
    scan,
    supersedes,
)
from .results import work_key as _work_key
from .scores import answer_key, score_problem, scores_path

SCORE_LINE = "a score record"
RESULTS_LINE = "a results record"


@attrs.frozen
class Torn:
    """A torn last line (a crash mid-write), left out of the merge."""

    path: str
    line: int
    size: int  # bytes


@attrs.define
class Slot:
    """The reported record of one key in one file (its latest, unless
    ``fanout.store.results.supersedes`` keeps an earlier one): where its line is, and
    what the merge compares."""

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
    attempt: Attempt  # what ``supersedes`` compares (``state`` is its state)
    time: datetime.datetime | None = None  # ``finished``, parsed (None: absent or bad)


@attrs.define
class Input:
    path: str
    found_in: str | None = None  # the directory it was found in (None: named itself)
    file: IO[bytes] | None = None
    pair: int | None = None  # scores: the results input beside it
    latest: dict[str, Slot] = attrs.Factory(dict)
    last_plan: str | None = None  # the plan and shard of its last record
    last_shard: tuple[int, int] | None = None
    has_fields: bool = False
    # every plan its records name: plan -> (N, key -> the content key last recorded)
    plans: dict[str, tuple[int, dict[str, str]]] = attrs.Factory(dict)
    included: bool = True


def results_problem(value: object) -> str | None:
    problem = record_problem(value)
    if problem is not None and score_problem(value) is None:
        return SCORE_LINE
    return problem


def scores_problem(value: object) -> str | None:
    problem = score_problem(value)
    if problem is not None and record_problem(value) is None:
        return RESULTS_LINE
    return problem


def open_input(path: str) -> IO[bytes]:
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


def locked_by_a_run(file: IO[bytes], *, hold: bool = True) -> bool:
    """Take a shared lock (held while the merge reads, unless not ``hold``: a check
    that only looks lets go at once, so a shard starting meanwhile is not refused):
    ``True`` when a ``fanout batch`` holds the file (it is being written)."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # a file system without locks: nothing to tell
    if not hold:
        with contextlib.suppress(OSError):
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    return False


def finished_time(value: object) -> datetime.datetime | None:
    """A record's ``finished_at`` as an aware time, or ``None`` (absent or not ISO 8601;
    a time without a zone is taken as UTC)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def refuse_unreadable(path: str, unreadable: Unreadable, records: int, kind: str,
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


def read_results(index: int, source: Input, torn: list[Torn], in_use: list[str], *,
                 hold: bool = True) -> None:
    """Read the results input ``source`` (number ``index``): its reported record per key,
    its torn tail (to ``torn``), whether a run holds it (to ``in_use``; ``hold``: see
    ``locked_by_a_run``); refused (``ConfigError``) when a line is not a results record."""
    assert source.file is not None
    if locked_by_a_run(source.file, hold=hold):
        in_use.append(source.path)
    unreadable, records, scores_like, offset = Unreadable(), 0, 0, 0
    for line in scan(source.file, results_problem):
        if line.record is not None:
            record = line.record
            records += 1
            key = _work_key(record["id"], record["model"], record["sample"])
            status = record.get("status")
            plan, shard = record_plan(record), record_shard(record)
            attempt = attempt_of(record)
            source.last_plan, source.last_shard = plan, shard
            source.has_fields = source.has_fields or plan is not None
            if plan is not None and shard is not None:
                source.plans.setdefault(plan, (shard[1], {}))[1][key] = record["content_key"]
            earlier = source.latest.get(key)
            if earlier is None or supersedes(earlier.attempt, attempt):
                source.latest.pop(key, None)  # else the earlier stays, in its place
                source.latest[key] = Slot(
                    index, offset, line.size, record["content_key"], answer_key(record),
                    attempt.state,
                    status if isinstance(status, int) and not isinstance(status, bool)
                    else None,
                    record["model"], str(record.get("finished_at") or ""), plan, shard,
                    attempt, finished_time(record.get("finished_at")))
        elif line.torn:
            torn.append(Torn(source.path, line.number, line.size))
        elif line.kind is not None:
            unreadable.add(line)
            scores_like += line.problem == SCORE_LINE
        offset += line.size
    if unreadable:
        refuse_unreadable(source.path, unreadable, records, "results", "scores", scores_like)


# ------------------------------------------------------------------------ the inputs


def same_file(one: os.stat_result, other: os.stat_result) -> bool:
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def stat_of(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def find_inputs(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Input], list[Input]]:
    """The results and scores inputs of ``paths`` (files; directories: their
    ``*.jsonl``, hidden ones aside), each once (one file under two names, a link, a
    hard link: once), each scores file with the results file it is beside."""
    if not paths:
        raise ConfigError("no input: name the shard files or their directory")
    taken: list[os.stat_result] = []
    results: list[Input] = []
    scores: list[Input] = []

    def take(path: str, found_in: str | None) -> None:
        mode = stat_of(path)
        if mode is None or any(same_file(mode, seen) for seen in taken):
            return
        taken.append(mode)
        (scores if path.endswith(".scores.jsonl") else results).append(Input(path, found_in))

    names_given = [os.fspath(path) for path in paths]
    for given in names_given:
        if os.path.isdir(given):
            names = sorted(name for name in os.listdir(given)
                           if name.endswith(".jsonl") and not name.startswith("."))
            found = [os.path.join(given, name) for name in names]
            if all(path.endswith(".scores.jsonl") for path in found):
                raise ConfigError(f"{given}: no results file in it (*.jsonl)")
            for path in found:
                take(path, given)
            continue
        if not os.path.lexists(given):
            raise ConfigError(f"{given}: no such file or directory")
        take(given, None)
    for index, source in enumerate(results):  # each results file's scores beside it
        beside = os.fspath(scores_path(source.path))
        mode = stat_of(beside)
        if mode is None:
            continue
        match = next((s for s in scores if (m := stat_of(s.path)) is not None
                      and same_file(m, mode)), None)
        if match is None and not any(same_file(mode, seen) for seen in taken):
            taken.append(mode)
            match = Input(beside, source.found_in or os.path.dirname(beside) or ".")
            scores.append(match)
        if match is not None:
            match.pair = index
    if not results:
        raise ConfigError(f"{', '.join(names_given)}: no results file among them "
                          "(a *.scores.jsonl is merged with its results file)")
    return results, scores


# ------------------------------------------------------------------------ the outputs


def file_kind(path: str) -> str | None:
    """What the regular file at ``path`` holds, by its first line: ``"results"``,
    ``"scores"``, ``"empty"`` (nothing but blank lines), ``"other"``; ``None``: no
    such file."""
    try:
        file = open_input(path)
    except ConfigError:
        return None if not os.path.lexists(path) else "other"
    with file:
        for line in file:
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                return "other"
            if record_problem(value) is None:
                return "results"
            if score_problem(value) is None:
                return "scores"
            return "other"
    return "empty"


def _how_found(source: Input) -> str:
    return f"found in {source.found_in}" if source.found_in is not None else "named"


def guard_outputs(output: str, scores_output: str, results: Sequence[Input],
                  scores: Sequence[Input], *, into: bool) -> None:
    """Refuse (``ConfigError``, one line naming both files; before anything is written)
    an output that would replace an input, or a file of the other kind.

    ``output`` and its scores file ``scores_output`` are compared with every input
    (results and scores, however found: named, in a directory, through a link or a
    hard link) by device and inode; with ``into`` the output is itself the first input
    (its merge replaces it) and its scores file the scores beside it.  A results
    output is never written over a scores file, nor its scores over a results file,
    nor either over a file that is not fanout's (its first line tells)."""
    if output.endswith(".scores.jsonl"):
        raise ConfigError(f"{output}: is named as a scores file (*.scores.jsonl), not a "
                          "results file: name the merged results file (its scores go "
                          "beside it); nothing was written")
    inputs = [(source, "results") for source in results] + [(source, "scores")
                                                            for source in scores]
    for target, kind in ((output, "results"), (scores_output, "scores")):
        mode = stat_of(target)
        if mode is None:
            continue
        for source, its_kind in inputs:
            their = stat_of(source.path)
            if their is None or not same_file(mode, their):
                continue
            if into and kind == its_kind and (source is results[0] if kind == "results"
                                              else source.pair == 0):
                continue  # --into: the output is the first input, its scores beside it
            what = "the output" if kind == "results" else "the output's scores file"
            whose = ""
            if its_kind == "scores" and source.pair is not None:
                whose = f", the scores file of {results[source.pair].path}"
            raise ConfigError(
                f"{target}: is {what} and the input {source.path} ({_how_found(source)}"
                f"{whose}): fanout merge never writes over an input; name an -o that is "
                "none of them (to merge new records into an earlier merge: --into MERGED); "
                "nothing was written")
        found = file_kind(target)
        if found in (None, "empty", kind):
            continue
        if kind == "results" and found == "scores":
            why = ("is a fanout scores file: the merged results would replace it (the "
                   "merged scores go beside MERGED.jsonl, as MERGED.scores.jsonl)")
        elif kind == "scores" and found == "results":
            why = (f"is a fanout results file, and the scores of {output} would replace it: "
                   f"name another -o")
        else:
            why = (f"is not a fanout {kind} file (its first line is no {kind} record): "
                   f"fanout merge replaces only a {kind} file; name another -o")
        raise ConfigError(f"{target}: {why}; nothing was written")


# ------------------------------------------------------------------------ writing


def read_line(file: IO[bytes], offset: int, size: int) -> bytes:
    """The line at ``offset`` of ``file`` (``size`` bytes), with its newline."""
    data = os.pread(file.fileno(), size, offset)
    if len(data) != size:
        raise OSError(errno.EIO, "the file changed while it was merged", file.name)
    return data if data.endswith(b"\n") else data + b"\n"


def check_output(target: str) -> None:
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
        with open_input(target) as file:
            if locked_by_a_run(file):
                raise ConfigError(f"{target}: in use by a running fanout batch "
                                  f"({holder_of(lock_path(target))}); wait for it "
                                  "to end, or name another -o")
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"{target}: cannot read: {exc.strerror or exc}") from None


def write(target: str, chunks: Iterator[bytes]) -> None:
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
        check_output(target)
        os.replace(temporary, target)
    except OSError as exc:
        remove_if_same(temporary, made)
        raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}; it is left as it "
                          "was") from None
    except BaseException:
        remove_if_same(temporary, made)
        raise

