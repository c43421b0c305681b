"""The results file of ``fanout batch``: JSON Lines, append-only, crash-safe.

One line per finished (prompt id, model, sample), written in one ``write``
and flushed as each stream finishes; ``fsync`` at least once a second and at
the end.  A crash (SIGKILL included) can leave one torn last line: reading
detects it and ignores it, and the next run cuts it off before appending, so
the file stays readable by pandas and duckdb.  A key may have several records
(a redo after a failure, or after the server cut it): the latest one counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

__all__ = ["Existing", "ResultsWriter", "is_empty", "parse_shard", "read_results", "shard_of",
           "state_of", "work_key"]

#: What a record can count as: its outcome, but ``empty`` for a completed record
#: with an empty answer (not done, unless ``--accept-empty``).
STATES = ("completed", "empty", "truncated", "error", "timed_out", "cancelled")


def work_key(prompt_id: str | int, model: str, sample: int) -> str:
    """The identity of one unit of work (ids 1 and "1" are the same prompt)."""
    return json.dumps([str(prompt_id), model, sample], ensure_ascii=False)


def shard_of(key: str, shards: int) -> int:
    """Which of ``shards`` owns ``key``: a hash, the same on every machine and run."""
    digest = hashlib.sha256(key.encode()).digest()
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


@attrs.define
class Existing:
    """What a results file already holds."""

    # key -> its latest record, cut to what resuming needs (a big file stays small here)
    latest: dict[str, dict[str, Any]] = attrs.Factory(dict)
    records: int = 0
    valid_size: int = 0  # bytes up to the end of the last whole line
    torn_bytes: int = 0  # a torn last line (from a crash): ignored, cut before appending
    bad_lines: list[int] = attrs.Factory(list)  # whole lines that are not records


def read_results(path: str | os.PathLike[str]) -> Existing:
    """Read a results file (a missing one is empty); never raises on bad content.

    Streams the file line by line: only each key's outcome is kept.
    """
    existing = Existing()
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed just below; missing is no error)
    except FileNotFoundError:
        return existing
    with file:
        for number, line in enumerate(file, 1):
            if not line.endswith(b"\n"):  # the last line, unterminated
                record = _record(line) if line.strip() else None
                if record is not None:  # whole (not written by us): keep it
                    existing.valid_size += len(line)
                    _keep(existing, record)
                else:
                    existing.torn_bytes = len(line)
                break
            existing.valid_size += len(line)
            if not line.strip():
                continue
            record = _record(line)
            if record is None:
                existing.bad_lines.append(number)
            else:
                _keep(existing, record)
    return existing


def iter_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every readable record of a results file, in order (for reports), streamed."""
    with open(path, "rb") as file:
        for line in file:
            if line.strip():
                record = _record(line)
                if record is not None:
                    yield record


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(record, dict) or not {"id", "model", "sample", "outcome"} <= record.keys():
        return None
    return record


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
    unless the run was interrupted first).
    """
    outcome = str(record.get("outcome"))
    if outcome != "completed":
        return outcome
    if record.get("cut"):
        return "truncated"
    return "empty" if is_empty(record) else "completed"


_KEPT = ("id", "model", "sample", "outcome", "content_key")


def _keep(existing: Existing, record: dict[str, Any]) -> None:
    existing.records += 1
    key = work_key(record["id"], record["model"], record["sample"])
    existing.latest.pop(key, None)  # re-insert: the dict stays in order of latest writes
    kept = {name: record.get(name) for name in _KEPT}
    kept["state"] = state_of(record)
    existing.latest[key] = kept


class ResultsWriter:
    """Appends records to a results file; ``sync()`` makes them durable."""

    def __init__(self, path: str | os.PathLike[str], existing: Existing) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"{self.path.parent}: no such directory")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._dirty = False
        size = os.fstat(self._fd).st_size
        if existing.torn_bytes and size == existing.valid_size + existing.torn_bytes:
            os.ftruncate(self._fd, existing.valid_size)  # the torn line of a crashed run
        elif size and existing.valid_size == size and not self._ends_with_newline():
            self._write(b"\n")  # a whole last record without its newline
        self.written = 0

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as file:
            file.seek(-1, os.SEEK_END)
            return file.read(1) == b"\n"

    def write(self, record: Mapping[str, Any]) -> None:
        """One record, one line, one ``write``: never interleaved, at worst torn."""
        try:
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # what orjson refuses (integers over 64 bits): the stdlib
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        self._write(line)
        self.written += 1

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._dirty = True

    @property
    def fileno(self) -> int:
        return self._fd

    def sync(self) -> None:
        """``fsync`` if anything was written since the last one."""
        if self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sync()
        os.close(self._fd)
