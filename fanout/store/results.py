"""The results file of ``fanout batch``: JSON Lines, append-only, crash-safe, one writer.

One line per finished (prompt id, model, sample), written in one ``write``
and flushed as each stream finishes; ``fsync`` at least once a second and at
the end.  A key may have several records (a redo after a failure, or after
the server cut it): the latest one counts, but for one case (``supersedes``): a
redo of the same run that failed with no output does not replace an earlier
attempt that kept some.  That is the unit's *reported* record, wherever a
results file is read (resume, ``fanout report``, ``fanout score``, ``fanout
merge``, the evaluation).

**What a results file is**: every whole line a *record*, a JSON object with
``id`` (a non-empty string or an integer), ``model`` (a non-empty string),
``sample`` (an integer >= 0), ``outcome`` (one of the engine's outcomes) and
``content_key`` (a string); blank lines are allowed, and so is an empty file
(a new results file).  ``fanout batch`` appends only to such a file and
refuses anything else without touching it (random bytes, its prompts file,
another tool's JSONL, a results file with a damaged line in it).  The one
defect it repairs is a crash's: a torn last line (no newline, not JSON, and
the start of a record as the writer writes them: ``{"id":...,"model":...``),
which reading ignores and the next run cuts off before appending, so the file
stays readable by pandas and duckdb.

**One run at a time**: the file is locked (``flock``, exclusive, for the
whole run); a second ``fanout batch`` on it is refused with who holds it,
read from ``RESULTS.jsonl.lock`` beside it (the results file's name and
``.lock``: pid, host, start time, command; written when the lock is taken,
removed at the end).

**A write that fails** (a full disk) is undone (the file is cut back to its
last whole line, so a later run can resume it); the record is kept and tried
again before the next one and at the end; ``unwritten`` counts what never
made it.
"""

from __future__ import annotations

import codecs
import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn

import attrs
import orjson

from ..core.result import Outcome
from ..files import (
    FileIdentity,
    NotRegularFile,
    create_new,
    identity,
    open_append,
    read_small,
    remove_if_same,
)
from ..records import dumps_bytes

__all__ = ["OUTCOMES", "STATES", "Attempt", "Existing", "Line", "RecordReader",
           "ResultsFile", "ResultsFileError", "Unreadable", "attempt_of", "has_output",
           "is_empty", "latest_records", "parse_shard", "read_results",
           "record_problem", "scan", "shard_of", "state_of", "supersedes", "unit_problem",
           "work_key"]

#: The outcomes a record can name: the engine's.
OUTCOMES = tuple(str(outcome) for outcome in Outcome)
#: What a record can count as: its outcome, but ``empty`` for a completed record
#: with an empty answer (not done, unless ``--accept-empty``).
STATES = ("completed", "empty", "truncated", "error", "timed_out", "cancelled")
#: Line numbers listed per kind of unreadable line; the rest are counted.
LISTED_LINES = 10


def work_key(prompt_id: str | int, model: str, sample: int) -> str:
    """The identity of one unit of work (ids 1 and "1" are the same prompt)."""
    return json.dumps([str(prompt_id), model, sample], ensure_ascii=False)


def shard_of(key: str, shards: int) -> int:
    """Which of ``shards`` owns ``key``: a hash, the same on every machine and run."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (0 <= I < N) -> (I, N); ``ValueError`` with a one-line reason."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, like 0/4") from None
    if not sep or n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: I must be in 0..N-1 and N >= 1")
    return i, n


# ------------------------------------------------------------------ the record shape

def record_problem(value: object) -> str | None:
    """Why ``value`` is not a results record (one short phrase), or ``None`` if it is."""
    problem = unit_problem(value, ("id", "model", "sample", "outcome", "content_key"))
    if problem is not None:
        return problem
    assert isinstance(value, dict)
    if value["outcome"] not in OUTCOMES:
        return f"outcome is {_json_kind(value['outcome'])}, not one of {', '.join(OUTCOMES)}"
    if not isinstance(value["content_key"], str):
        return f"content_key is {_json_kind(value['content_key'])}, not a string"
    return None


def unit_problem(value: object, required: tuple[str, ...],
                 names: tuple[str, ...] = ("model",)) -> str | None:
    """Why ``value`` is not a record of one unit of work (an object holding ``required``,
    with an ``id``, non-empty string ``names`` and a ``sample``), or ``None``: the checks
    a results record and a score record share."""
    if not isinstance(value, dict):
        return f"a JSON {_json_kind(value)}, not an object"
    missing = [name for name in required if name not in value]
    if missing:
        return f"no {', '.join(missing)}"
    prompt_id = value["id"]
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or (
            isinstance(prompt_id, str) and not prompt_id):
        return f"id is {_json_kind(prompt_id)}, not a non-empty string or an integer"
    for name in names:
        if not isinstance(value[name], str) or not value[name]:
            return f"{name} is {_json_kind(value[name])}, not a non-empty string"
    sample = value["sample"]
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        return f"sample is {_json_kind(sample)}, not an integer >= 0"
    return None


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "an empty string" if not value else repr(value) if len(value) <= 20 \
            else "a string"
    if isinstance(value, int | float):
        return "a number"
    return "an object" if isinstance(value, dict) else "a list"


# --------------------------------------------------------------------------- reading

#: Kinds of whole lines that are not records, as (one line is, several lines are).
_KINDS = {
    "utf8": ("is not UTF-8 text", "are not UTF-8 text"),
    "json": ("is not JSON", "are not JSON"),
    "shape": ("is not a fanout record", "are not fanout records"),
}


@attrs.frozen
class Line:
    """One line of a results file, as ``scan`` reads it."""

    number: int
    size: int  # bytes, with the newline
    record: dict[str, Any] | None = None  # a record (None: blank, bad or torn)
    kind: str | None = None  # why a whole line is not a record: a key of _KINDS
    problem: str | None = None  # the details, for "shape"
    torn: bool = False  # the unterminated last line: the start of a record


def scan(file: IO[bytes], problem: Callable[[object], str | None] = record_problem
         ) -> Iterator[Line]:
    """Every line of ``file`` classified, streamed (a big file stays small in memory);
    ``problem`` says why a JSON value is not a record (``record_problem``: a results
    record; the scores file passes its own)."""
    for number, data in enumerate(file, 1):
        whole = data.endswith(b"\n")
        if not data.strip():
            yield Line(number, len(data))
            continue
        value, kind = _parse(data)
        if kind is None:
            why = problem(value)
            if why is None:
                yield Line(number, len(data), record=value)
            else:
                yield Line(number, len(data), kind="shape", problem=why)
        elif not whole and _starts_a_record(data):
            yield Line(number, len(data), torn=True)
        else:
            yield Line(number, len(data), kind=kind)


def _parse(data: bytes) -> tuple[Any, str | None]:
    try:
        return orjson.loads(data), None
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses but JSON allows: lone surrogate escapes, huge integers
        return json.loads(data.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "utf8"
    except (ValueError, RecursionError):
        return None, "json"


_HEAD = b'{"id":'
_ID = re.compile(rb'-?\d+|"(?:[^"\\]|\\.)*"')
_ID_TORN = re.compile(rb'-?\d*|"(?:[^"\\]|\\.)*\\?')
_MODEL = b',"model":'


def _starts_a_record(data: bytes) -> bool:
    """Whether ``data`` (a last line without its newline, not JSON) is a torn record:
    how ``ResultsFile.write`` starts every line (``{"id":ID,"model":``, or the stdlib's
    spacing), valid UTF-8 as far as it goes, no raw control character."""
    if len(data) <= len(_HEAD):
        return _HEAD.startswith(data)
    if not data.startswith(_HEAD) or any(byte < 0x20 for byte in data):
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    rest = data[len(_HEAD):].removeprefix(b" ")
    match = _ID.match(rest)
    if match is None:
        return _ID_TORN.fullmatch(rest) is not None
    rest = rest[match.end():]
    if rest.startswith(b", "):
        rest = b"," + rest[2:]
    if rest.startswith(b',"model": '):
        rest = _MODEL + rest[len(_MODEL) + 1:]
    return _MODEL.startswith(rest) if len(rest) <= len(_MODEL) else rest.startswith(_MODEL)


@attrs.define
class Unreadable:
    """The whole lines that are not records, by kind: counts and the first line numbers."""

    counts: dict[str, int] = attrs.Factory(dict)
    lines: dict[str, list[int]] = attrs.Factory(dict)
    first_problem: dict[int, str] = attrs.Factory(dict)  # line -> what is wrong ("shape")

    def add(self, line: Line) -> None:
        assert line.kind is not None
        self.counts[line.kind] = self.counts.get(line.kind, 0) + 1
        listed = self.lines.setdefault(line.kind, [])
        if len(listed) < LISTED_LINES:
            listed.append(line.number)
        if line.problem and not any(n in self.first_problem for n in listed[:-1]):
            self.first_problem[line.number] = line.problem

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return bool(self.counts)

    def describe(self) -> list[str]:
        """One line per kind: ``3 lines are not JSON (lines 2, 5, 9)``."""
        out = []
        for kind, count in self.counts.items():
            one, several = _KINDS[kind]
            listed = self.lines[kind]
            numbers = ", ".join(map(str, listed)) + (", …" if count > len(listed) else "")
            detail = next((f" ({'' if len(listed) == 1 else f'line {n}: '}"
                           f"{self.first_problem[n]})" for n in listed
                           if n in self.first_problem), "")
            out.append(f"{count} line{'s' if count != 1 else ''} "
                       f"{several if count != 1 else one}: "
                       f"{'lines' if len(listed) > 1 else 'line'} {numbers}{detail}")
        return out


class RecordReader:
    """The records of a results file in order (what ``fanout report`` reads), streamed;
    afterwards ``unreadable``, ``torn_bytes`` and ``records`` say what else it held."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.unreadable = Unreadable()
        self.records = 0
        self.lines = 0  # lines that are not blank
        self.size = 0  # bytes read
        self.torn_bytes = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for line in scan(self._file):
            self.size += line.size
            if line.record is not None:
                self.records += 1
                self.lines += 1
                yield line.record
            elif line.torn:
                self.torn_bytes = line.size
                self.lines += 1
            elif line.kind is not None:
                self.unreadable.add(line)
                self.lines += 1


@attrs.define
class Existing:
    """What a results file already holds."""

    # key -> its reported record (``supersedes``), cut to what resuming needs (a big
    # file stays small here): id, model, sample, outcome, content_key, state, attempt
    latest: dict[str, dict[str, Any]] = attrs.Factory(dict)
    records: int = 0
    valid_size: int = 0  # bytes up to the end of the last whole line (or whole record)
    torn_bytes: int = 0  # a torn last line (from a crash): ignored, cut before appending
    unreadable: Unreadable = attrs.Factory(Unreadable)  # whole lines that are not records


def read_existing(file: IO[bytes], problem: Callable[[object], str | None] = record_problem,
                  keep: Callable[[Existing, dict[str, Any]], None] | None = None) -> Existing:
    """What ``file`` holds (from its start), never raising on its content.

    ``problem`` and ``keep`` (what ``latest`` holds of a record) default to a
    results file's; the scores file passes its own."""
    existing = Existing()
    keep = keep or _keep
    for line in scan(file, problem):
        if line.torn:
            existing.torn_bytes = line.size
            break
        existing.valid_size += line.size
        if line.record is not None:
            keep(existing, line.record)
        elif line.kind is not None:
            existing.unreadable.add(line)
    return existing


def read_results(path: str | os.PathLike[str]) -> Existing:
    """What the results file at ``path`` holds (a missing one is empty)."""
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed just below; missing is no error)
    except FileNotFoundError:
        return Existing()
    with file:
        return read_existing(file)


def latest_records(path: str | os.PathLike[str]
                   ) -> tuple[dict[str, dict[str, Any]], RecordReader]:
    """key -> the reported record of each unit of a results file (its latest, unless
    ``supersedes`` keeps an earlier one), in file order of those records, and the
    reader (what else the file held); ``OSError`` if it cannot be read."""
    latest: dict[str, dict[str, Any]] = {}
    with open(path, "rb") as file:
        reader = RecordReader(file)
        for record in reader:
            key = work_key(record["id"], record["model"], record["sample"])
            kept = latest.get(key)
            if kept is not None and not supersedes(kept, record):
                continue  # the earlier record stays, in its place
            latest.pop(key, None)
            latest[key] = record
    return latest, reader


def is_empty(record: Mapping[str, Any]) -> bool:
    """A completed record whose answer is empty: flagged ``empty_answer``, or (a record
    written before flags existed) no text, reasoning, refusal or tool call anywhere."""
    flags = record.get("flags")
    if isinstance(flags, list):
        return "empty_answer" in flags
    choices = record.get("choices")
    if not isinstance(choices, list):
        return False  # not a record of ours: nothing to go by
    return not any(_answers(choice) for choice in choices)


def _answers(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    return bool(choice.get("tool_calls")) or any(
        isinstance(choice.get(part), str) and choice[part].strip()
        for part in ("text", "reasoning", "refusal"))


def state_of(record: Mapping[str, Any]) -> str:
    """What a record counts as (one of ``STATES``, or whatever outcome it names).

    ``completed`` only for a completed record with an answer that was not cut;
    ``empty`` for a completed empty answer; ``truncated`` for a completed record
    that ``fanout batch`` judged cut by the server (``"cut": true``: a redo follows it,
    unless the run was interrupted first), or one of whose choices ended without its
    finish reason (flagged ``unfinished_choice``: that choice was cut, so the unit is
    not done).
    """
    outcome = str(record.get("outcome"))
    if outcome != "completed":
        return outcome
    if record.get("cut") is True:
        return "truncated"
    flags = record.get("flags")
    if isinstance(flags, list) and "unfinished_choice" in flags:
        return "truncated"
    return "empty" if is_empty(record) else "completed"


# --------------------------------------------------------------- the reported record

#: The states of a unit that is done (``empty`` with ``--accept-empty``).
_DONE = frozenset({"completed", "empty"})


class Attempt(NamedTuple):
    """What ``supersedes`` reads of a record (``attempt_of``): a big file's records
    can be cut to this and still be compared."""

    state: str  # state_of
    run: str | None  # the record's non-empty "run", else None
    content_key: object  # what was asked
    output: bool  # has_output


def has_output(record: Mapping[str, Any]) -> bool:
    """Whether a record kept any output: text, reasoning, refusal or a tool call in
    a choice (or, a record without choices, a non-blank ``text``)."""
    choices = record.get("choices")
    if isinstance(choices, list) and any(_answers(choice) for choice in choices):
        return True
    text = record.get("text")
    return isinstance(text, str) and bool(text.strip())


def attempt_of(record: Mapping[str, Any]) -> Attempt:
    """The ``Attempt`` of a record."""
    run = record.get("run")
    return Attempt(state_of(record), run if isinstance(run, str) and run else None,
                   record.get("content_key"), has_output(record))


def supersedes(old: Attempt | Mapping[str, Any], new: Attempt | Mapping[str, Any]) -> bool:
    """Whether ``new``, a later record of the same unit, replaces ``old`` as the unit's
    reported record (records, or their ``attempt_of``).

    It does, always, but in one case: neither is done (``state_of``: not
    ``completed`` nor ``empty``), both name the same non-empty ``run`` and the same
    ``content_key`` (one run of ``fanout batch`` asking the same thing; the run is
    ``--run-id``, by default the plan, so a resume of the same plan is the same
    run), ``old`` has output (``has_output``) and ``new`` has none.  A redo of a cut
    stream that then fails against a dead server must not turn the text the run
    had into an error without text: the unit is not done either way (resume
    redoes it, as it would have), and what is reported is what was got.

    Only *no* output keeps the earlier record, never *less*: a later attempt with
    some text (5 characters after 300) is another answer, not a loss of this one,
    and lengths are not comparable (text against reasoning or a tool call, a
    refusal, another finish); the latest answer is the honest one to report.  A
    completed record is always replaced by a later redo, a later completed one
    always wins, and records of different runs (or without ``run``, older files)
    go by order alone, as before.  Where records of a unit are compared without an
    order (the same unit in two merged files), this reads: of the same run, not
    done, the one with output is kept.
    """
    old = old if isinstance(old, Attempt) else attempt_of(old)
    new = new if isinstance(new, Attempt) else attempt_of(new)
    return not (old.state not in _DONE and new.state not in _DONE
                and old.run is not None and old.run == new.run
                and old.content_key == new.content_key
                and old.output and not new.output)


_KEPT = ("id", "model", "sample", "outcome", "content_key")


def _keep(existing: Existing, record: dict[str, Any]) -> None:
    existing.records += 1
    key = work_key(record["id"], record["model"], record["sample"])
    attempt = attempt_of(record)
    earlier = existing.latest.get(key)
    if earlier is not None and not supersedes(earlier["attempt"], attempt):
        return  # the earlier record stays the reported one, in its place
    existing.latest.pop(key, None)  # re-insert: the dict stays in order of the writes
    kept: dict[str, Any] = {name: record.get(name) for name in _KEPT}
    kept["state"] = attempt.state
    kept["attempt"] = attempt
    existing.latest[key] = kept


# --------------------------------------------------------------------------- writing

class ResultsFileError(Exception):
    """The results file cannot be used as asked; the message is one line that names it.

    ``temporary``: a later run may well use it as it is (another run holds its lock, the
    disk is full): work is left, not refused."""

    def __init__(self, message: str, *, temporary: bool = False, why: str = "") -> None:
        super().__init__(message)
        self.temporary = temporary
        #: The cause in a few words (``locked by another run``), for a summary line.
        self.why = why or message


def lock_path(path: str | os.PathLike[str]) -> Path:
    """Where the holder of a results file's lock says who it is."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


#: Write errors a later run may not meet: a full disk or quota, an I/O error, a busy file.
_PASSING = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EBUSY,
                      errno.EINTR})


def _passing(exc: OSError) -> bool:
    return exc.errno in _PASSING


class ResultsFile:
    """A results file open for one run: locked, checked, appended to.

    ``ResultsFile(path)`` opens ``path`` (creating an empty one) and refuses it
    with ``ResultsFileError`` when it is not a regular file, is ``not_same_as``
    the given file (the prompts), is locked by another run, or is not a results
    file; otherwise ``existing`` says what it holds, and a torn last line has
    been cut off.

    A subclass may hold other records (the scores file does): ``WHAT`` names
    the kind of file in messages, ``USER`` the command that locks it, and
    ``_read_existing`` reads what it holds.
    """

    WHAT = "fanout results file"
    USER = "fanout batch"

    def __init__(self, path: str | os.PathLike[str], *,
                 not_same_as: tuple[str, os.stat_result] | None = None) -> None:
        self.path = Path(path)
        self.error: OSError | None = None  # the first write or fsync that failed
        self.unwritten: list[tuple[str, bytes]] = []  # (key, line) not written (yet)
        self.written = 0
        self._dirty = False
        self._lock_identity: FileIdentity | None = None  # the lock file this run made
        self._broken = False  # a failed write could not be undone: no more writes
        self._size = -1  # the file's size, as far as this run wrote it
        self._fd = self._open(not_same_as)
        try:
            self._check(not_same_as)
            self._lock()
            self._say_who()
            with open(os.dup(self._fd), "rb") as file:
                self.existing = self._read_existing(file)
            self._accept()
        except BaseException:
            self.close()
            raise

    def _read_existing(self, file: IO[bytes]) -> Existing:
        return read_existing(file)

    def _open(self, not_same_as: tuple[str, os.stat_result] | None) -> int:
        if not_same_as is not None:  # a link to it, too, is best called what it is
            with contextlib.suppress(OSError):
                self._refuse_same(os.stat(self.path), not_same_as)
        try:
            return open_append(self.path)
        except NotRegularFile as exc:
            if exc.is_link:
                raise ResultsFileError(
                    f"{self.path}: is {exc.kind}: fanout writes no file through a link "
                    "(it is left as it was); name the file itself") from None
            raise ResultsFileError(f"{self.path}: not a regular file ({exc.kind}): a "
                                   f"{self._what} is read back, locked and appended to"
                                   ) from None
        except OSError as exc:
            hint = ""
            if isinstance(exc, FileNotFoundError) and not self.path.parent.is_dir():
                hint = f" ({self.path.parent}/ does not exist)"
            raise ResultsFileError(f"{self.path}: cannot open for writing: {_why(exc)}{hint}",
                                   temporary=_passing(exc)) from None

    @property
    def _what(self) -> str:
        return self.WHAT.removeprefix("fanout ")

    def _refuse_same(self, mode: os.stat_result,
                     not_same_as: tuple[str, os.stat_result]) -> None:
        name, other = not_same_as
        if (mode.st_dev, mode.st_ino) == (other.st_dev, other.st_ino):
            raise ResultsFileError(f"{self.path}: is {name} (the same file); name "
                                   "another output")

    def _check(self, not_same_as: tuple[str, os.stat_result] | None) -> None:
        if not_same_as is not None:  # a hard link to it, or a name given since
            self._refuse_same(os.fstat(self._fd), not_same_as)

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResultsFileError(f"{self.path}: in use by another {self.USER} "
                                   f"({holder_of(lock_path(self.path))}); wait for it to end, "
                                   "or name another output", temporary=True,
                                   why=f"{self.path.name} is locked by another run") from None
        except OSError as exc:  # a file system without locks: say so, do not run unlocked
            raise ResultsFileError(f"{self.path}: cannot lock: {_why(exc)}") from None

    def _accept(self) -> None:
        existing = self.existing
        if existing.unreadable:
            total = existing.records + existing.unreadable.total
            first = existing.unreadable.describe()[0]
            raise ResultsFileError(
                f"{self.path}: not a {self.WHAT}: {existing.unreadable.total} of its "
                f"{total} lines are not records ({first}); it is left as it was: name "
                "another output, or fix or remove those lines")
        try:
            size = os.fstat(self._fd).st_size
            if existing.torn_bytes and size == existing.valid_size + existing.torn_bytes:
                os.ftruncate(self._fd, existing.valid_size)  # the torn line of a crashed run
            self._size = os.fstat(self._fd).st_size
            if self._size and existing.valid_size == self._size \
                    and not self._ends_with_newline():
                self._append(b"\n")  # a whole last record without its newline
        except OSError as exc:
            raise ResultsFileError(f"{self.path}: cannot write: {_why(exc)}",
                                   temporary=_passing(exc)) from None

    def _ends_with_newline(self) -> bool:
        return os.pread(self._fd, 1, self._size - 1) == b"\n"

    def _say_who(self) -> None:
        # Who holds the lock, for a second run to tell its user: the lock file, made by
        # this run (O_EXCL, no link followed) and removed at close only while it is
        # still the one made.  Writing it is best effort (the flock is what keeps a
        # second run out), but something planted at its name is refused, untouched.
        where = lock_path(self.path)
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": datetime.datetime.now(datetime.UTC).isoformat(
                               timespec="seconds"),
                           "argv": sys.argv})
        for attempt in range(2):
            try:
                fd, made = create_new(where)
            except FileExistsError:
                if attempt == 0 and self._remove_stale(where):
                    continue
                return
            except OSError:
                return  # a directory this run cannot create files in: nobody is told
            self._lock_identity = made  # removed at close, even if half written
            with contextlib.suppress(OSError), open(fd, "wb") as file:
                file.write(text.encode("utf-8", "backslashreplace") + b"\n")
                file.flush()
                self._lock_identity = identity(os.fstat(fd))
            return

    def _remove_stale(self, where: Path) -> bool:
        """Remove the lock file of a run that ended without removing it (this run holds
        the lock, so its writer is gone); refuse anything else there, untouched."""
        def refuse(what: str) -> NoReturn:
            raise ResultsFileError(
                f"{self.path}: its lock file {where} is {what} (it is left as it was): "
                f"fanout writes no file through a link and removes only its own; remove "
                f"it, or name another output")
        try:
            data, found = read_small(where, _LOCK_LIMIT + 1)
        except NotRegularFile as exc:
            refuse(exc.kind)
        except OSError:
            return False
        if data and _lock_record(data) is None:
            refuse("not a lock file of fanout's")
        return remove_if_same(where, found)

    # ------------------------------------------------------------------ appending

    def write(self, record: Mapping[str, Any]) -> bool:
        """One record, one line, one ``write`` (never interleaved, at worst undone);
        whether it is in the file (if not, ``error`` says why; it is tried again)."""
        try:
            key = work_key(record["id"], record["model"], record["sample"])
        except KeyError:
            key = ""
        self.unwritten.append((key, dumps_bytes(record)))
        return self._flush_unwritten()

    def _flush_unwritten(self) -> bool:
        while self.unwritten:
            try:
                self._append(self.unwritten[0][1])
            except OSError as exc:
                if self.error is None:
                    self.error = exc
                return False
            self.unwritten.pop(0)
            self.written += 1
        return True

    def _append(self, data: bytes) -> None:
        if self._broken:
            raise OSError(errno.EIO, "a failed write could not be undone: no more writes")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            if view.nbytes != len(data):
                # Part of the line went in: cut it off again, or the next record would be
                # glued to it (a bad line in the middle of the file, refused on resume).
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    self._broken = True
            raise
        finally:
            self._dirty = True
        self._size += len(data)

    @property
    def fileno(self) -> int:
        return self._fd

    def sync(self) -> None:
        """``fsync`` if anything was written since the last one (a failure: ``error``)."""
        if self._dirty and self._fd >= 0:
            self._dirty = False
            try:
                os.fsync(self._fd)
            except OSError as exc:
                if self.error is None:
                    self.error = exc

    def close(self) -> None:
        """Try the unwritten records once more, ``fsync``, unlock, close."""
        if self._fd < 0:
            return
        if self.unwritten:
            self._flush_unwritten()
        self.sync()
        if self._lock_identity is not None:  # before unlocking: a next holder writes its own
            remove_if_same(lock_path(self.path), self._lock_identity)
            self._lock_identity = None
        os.close(self._fd)
        self._fd = -1


_LOCK_LIMIT = 65536  # a lock file holds one short line (argv can be long)


def _lock_record(data: bytes) -> dict[str, Any] | None:
    """The lock file's record (pid, host, started, argv), or ``None`` if ``data`` is
    not one."""
    if len(data) > _LOCK_LIMIT:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    if not isinstance(record, dict) or not {"pid", "host", "started"} <= record.keys():
        return None
    return record


def holder_of(where: Path) -> str:
    """Who holds a results file's lock, from its lock file (never followed if a link,
    never waited on if a pipe)."""
    try:
        data, _ = read_small(where, _LOCK_LIMIT + 1)
    except FileNotFoundError:
        return f"who holds it is not known yet: {where} is not there"
    except NotRegularFile as exc:
        return f"who holds it is not known: {where} is {exc.kind}"
    except OSError:
        return f"who holds it is not known: {where} is unreadable"
    record = _lock_record(data)
    with contextlib.suppress(ValueError, TypeError):
        if record is not None:
            return f"pid {int(record['pid'])} on {record['host']}, since {record['started']}"
    return f"who holds it is not known: {where} is unreadable"
