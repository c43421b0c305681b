"""What ``fanout compare`` shows: per-model column state, and its rich renderables.

``Column`` folds one stream's events (plain data, no I/O); ``CompareView``
turns the columns into rich renderables, live (each column shows the tail
of its text) or final (everything).  Model output is untrusted: it only ever
reaches rich as ``Text`` (never parsed as markup), after ``inert()`` removed
control characters and escape sequences.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..core.events import (
    ChoiceFinished,
    ErrorReported,
    Event,
    ReasoningDelta,
    RefusalDelta,
    StreamFinished,
    StreamRetrying,
    StreamStarted,
    TextDelta,
    ToolCallDelta,
    UsageReported,
)
from ..core.result import Flag, Outcome, StreamResult
from .common import format_seconds
from .records import tokens_per_second

__all__ = ["Column", "CompareView", "cut_advice", "cut_line", "inert"]

# Escape sequences: CSI, OSC (ended by BEL or ST), DCS/SOS/PM/APC strings, two-byte ESC x,
# and the 8-bit CSI.  Removed whole, so no parameter residue is left behind.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# Every other control character (C0 but tab and newline, DEL, C1) and the bidi
# overrides that can make text display in another order than it reads.
_DROP = dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0),
                       *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def inert(text: str) -> str:
    """``text`` safe for a terminal: no escape sequences, no control characters
    (tab and newline stay; CRLF and lone CR become newlines)."""
    if text.isprintable():
        return text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _ESCAPES.sub("", text).translate(_DROP)


#: How each status looks.  Failures are loud; ``length``/``content_filter`` too.
STATUS_STYLES = {
    "queued": "dim",
    "connecting": "dim",
    "waiting": "yellow",
    "streaming": "cyan",
    "retrying": "yellow",
    "done": "bold green",
    "truncated": "bold white on red",
    "error": "bold white on red",
    "timed out": "bold black on yellow",
    "cancelled": "bold black on yellow",
}
FINISH_STYLES = {
    "stop": "green",
    "tool_calls": "green",
    "length": "bold black on yellow",
    "content_filter": "bold white on red",
}
#: How a flag reads on a completed column ("⚠ " before it); unfinished_choice and
#: missing_choices and skipped_frames are spelled out with their numbers.
FLAG_LABELS = {
    Flag.EMPTY_ANSWER: "empty answer",
    Flag.UNFINISHED_CHOICE: "a choice unfinished",
    Flag.MISSING_CHOICES: "fewer choices than asked",
    Flag.MISSING_USAGE: "no usage",
    Flag.NO_FINISH_REASON: "no finish reason",
    Flag.NOT_STREAMED: "not streamed",
    Flag.SKIPPED_FRAMES: "frames skipped",
}
#: Flags that are only informational: shown, but quietly.
QUIET_FLAGS = frozenset({Flag.MISSING_USAGE})
NOTE_STYLES = {"reason": "bold red", "flag": "bold yellow", "quiet": "dim", "cut": "yellow"}
_FINAL_STATUS = {
    Outcome.COMPLETED: "done",
    Outcome.TRUNCATED: "truncated",
    Outcome.ERROR: "error",
    Outcome.TIMED_OUT: "timed out",
    Outcome.CANCELLED: "cancelled",
}


@attrs.define
class _Tool:
    name: str | None = None
    arguments: str = ""


@attrs.define
class _Choice:
    text: list[str] = attrs.Factory(list)
    reasoning: list[str] = attrs.Factory(list)
    refusal: list[str] = attrs.Factory(list)
    tools: dict[int, _Tool] = attrs.Factory(dict)
    finish_reason: str | None = None
    # What arrived, in order, so the view interleaves as the model did.
    order: list[str] = attrs.Factory(list)


@attrs.define
class Column:
    """One model's column: what arrived so far, and its live status."""

    key: str
    model: str
    started: float
    status: str = "queued"
    first_content: float | None = None
    last_event: float | None = None
    finished: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None
    retries: int = 0
    error: str | None = None
    choices: dict[int, _Choice] = attrs.Factory(dict)
    result: StreamResult | None = None
    expected_choices: int = 1  # the request's n

    def slot_taken(self) -> None:
        """The stream got its concurrency slot: it is connecting, no longer queued."""
        if self.status == "queued":
            self.status = "connecting"

    def apply(self, event: Event, now: float) -> None:
        """Fold one event of this stream, received at ``now``."""
        if isinstance(event, StreamStarted):
            self.status = "waiting"
            return
        if isinstance(event, StreamRetrying):
            self.status, self.retries = "retrying", self.retries + 1
            self.error = event.error.message
            return
        if isinstance(event, StreamFinished):
            self.finish(event.result, now)
            return
        self.last_event = now
        if isinstance(event, TextDelta | ReasoningDelta | RefusalDelta | ToolCallDelta):
            self.chunks += 1
            if self.first_content is None:
                self.first_content = now
            self.status = "streaming"
            choice = self._choice(event.choice)
            if isinstance(event, ToolCallDelta):
                index = event.tool_index if event.tool_index is not None else len(choice.tools)
                tool = choice.tools.get(index)
                if tool is None:
                    tool = choice.tools[index] = _Tool()
                    choice.order.append(f"tool:{index}")
                tool.name = tool.name or event.name
                tool.arguments += event.arguments
                return
            kind = {TextDelta: "text", ReasoningDelta: "reasoning",
                    RefusalDelta: "refusal"}[type(event)]
            getattr(choice, kind).append(event.text)
            if not choice.order or choice.order[-1] != kind:
                choice.order.append(kind)
        elif isinstance(event, ChoiceFinished):
            self._choice(event.choice).finish_reason = event.finish_reason
        elif isinstance(event, UsageReported):
            self.completion_tokens = event.usage.completion_tokens
        elif isinstance(event, ErrorReported):
            self.error = event.error.message

    def finish(self, result: StreamResult, now: float) -> None:
        self.result = result
        self.finished = now
        self.status = _FINAL_STATUS[result.outcome]
        if result.timed_out:
            self.status = f"timed out ({result.timed_out})"
        if result.error is not None:
            self.error = result.error.message
        for choice in result.choices:  # the result is the truth (e.g. after a reconnect)
            mine = self._choice(choice.index)
            mine.finish_reason = choice.finish_reason
            for call in choice.tool_calls:
                tool = mine.tools.setdefault(call.index, _Tool())
                if f"tool:{call.index}" not in mine.order:
                    mine.order.append(f"tool:{call.index}")
                tool.name, tool.arguments = call.name, call.arguments

    def _choice(self, index: int) -> _Choice:
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = _Choice()
        return choice

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def cut_while_others_ran(self) -> int:
        """How many other streams ran when the server cut this one (0: not a cut).

        A cut: the stream ended ``truncated``, or ``completed`` with an empty
        answer (what a relay makes of a cut), while other streams of the same
        fan-out held a slot: what a server that serves one stream at a time
        (llama.cpp's single slot) does to the stream it was serving.
        """
        result = self.result
        if result is None or result.others_running <= 0:
            return 0
        if result.outcome == Outcome.TRUNCATED or (
                result.outcome == Outcome.COMPLETED and Flag.EMPTY_ANSWER in result.flags):
            return result.others_running
        return 0

    @property
    def cut_kind(self) -> str:
        """How a cut stream ended: ``cut`` when that says the server cut it (``[DONE]``
        without a finish reason: llama.cpp's cut), ``empty`` (a completed empty answer:
        what a relay makes of a cut, or a model that answered nothing), ``broke`` (any
        other truncation)."""
        result = self.result
        if result is not None and result.outcome == Outcome.COMPLETED:
            return "empty"
        if result is not None and (result.reason or "").startswith("[DONE]"):
            return "cut"
        return "broke"

    def notes(self) -> list[tuple[str, str]]:
        """What a finished column says beyond its status: ``(text, kind)`` pairs, kind
        one of ``reason`` (why it did not complete), ``flag``, ``quiet`` (informational
        flags) and ``cut``.  Server text is made inert here."""
        result = self.result
        if result is None:
            return []
        notes: list[tuple[str, str]] = []
        if result.outcome != Outcome.COMPLETED:
            reason = result.reason or (self.error and inert(self.error)) or self.status
            notes.append((" ".join(inert(reason).split()), "reason"))
        for flag in result.flags:
            notes.append((self._flag_label(flag, result), "quiet" if flag in QUIET_FLAGS
                          else "flag"))
        others = self.cut_while_others_ran
        if others:
            streams = f"{others} other stream{'s' if others != 1 else ''}"
            notes.append(({"cut": f"cut while {streams} ran", "empty": f"{streams} ran",
                           "broke": f"broke off while {streams} ran"}[self.cut_kind], "cut"))
        return notes

    def _flag_label(self, flag: Flag, result: StreamResult) -> str:
        if flag == Flag.UNFINISHED_CHOICE:
            unfinished = [str(c.index) for c in result.choices if c.finish_reason is None]
            if unfinished:
                return (f"⚠ choice{'s' if len(unfinished) > 1 else ''} "
                        f"{', '.join(unfinished)} unfinished")
        elif flag == Flag.MISSING_CHOICES:
            return f"⚠ {len(result.choices)} of {self.expected_choices} choices"
        elif flag == Flag.SKIPPED_FRAMES:
            count = result.skipped_frames
            return f"⚠ {count} frame{'s' if count != 1 else ''} skipped"
        elif flag in QUIET_FLAGS:
            return FLAG_LABELS.get(flag, str(flag))
        return f"⚠ {FLAG_LABELS.get(flag, str(flag).replace('_', ' '))}"

    def finish_reasons(self) -> list[str | None]:
        return [self.choices[i].finish_reason for i in sorted(self.choices)]

    def ttft(self) -> float | None:
        if self.result is not None and self.result.timings is not None:
            return self.result.timings.ttft
        return None if self.first_content is None else self.first_content - self.started

    def rate(self, now: float) -> tuple[float | None, bool]:
        """Tokens per second and whether estimated (live: chunks; final: usage if any)."""
        if self.result is not None:
            return tokens_per_second(self.result)
        if self.first_content is None or self.chunks < 2:
            return None, True
        end = self.last_event if self.last_event is not None else now
        seconds = end - self.first_content
        return ((self.chunks - 1) / seconds if seconds > 0 else None), True

    def elapsed(self, now: float) -> float:
        return (self.finished if self.finished is not None else now) - self.started


class CompareView:
    """Columns side by side: ``live()`` for the timer redraw, ``final()`` for the end."""

    min_width = 28

    def __init__(self, columns: Sequence[Column], *, reasoning: bool = True) -> None:
        self.columns = list(columns)
        self.reasoning = reasoning
        # key -> (what the column looked like, its wrapped tail): a column that did
        # not change since the last frame is not joined, cleaned and wrapped again.
        self._tails: dict[str, tuple[tuple[object, ...], Text]] = {}

    def live(self, console: Console, now: float) -> RenderableType:
        rows = self._rows(console)
        # Per row: top border, header (3 lines, 4 with a note), header rule, bottom border.
        spare = console.height - 1 - sum(
            6 + any(column.notes() for column in row) for row in rows)
        body_lines = max(3, spare // max(len(rows), 1))
        tables = [self._table(row, console, now, body_lines) for row in rows]
        return Group(*tables, self.footer(now))

    def final(self, console: Console, now: float) -> RenderableType:
        return Group(*(self._table(row, console, now, None) for row in self._rows(console)))

    def footer(self, now: float) -> Text:
        counts: dict[str, int] = {}
        for column in self.columns:
            label = column.status.split(" (")[0]
            counts[label] = counts.get(label, 0) + 1
        parts = [f"{n} {label}" for label, n in counts.items()]
        elapsed = max((c.elapsed(now) for c in self.columns), default=0.0)
        return Text(f" {' · '.join(parts)} · {elapsed:.1f}s · Ctrl-C stops all", style="dim")

    def _rows(self, console: Console) -> list[list[Column]]:
        fit = max(1, min(len(self.columns), console.width // self.min_width))
        rows = -(-len(self.columns) // fit)
        per_row = -(-len(self.columns) // rows)  # balanced: 4 columns that need 2 rows are 2+2
        return [self.columns[i:i + per_row] for i in range(0, len(self.columns), per_row)]

    def _table(self, row: list[Column], console: Console, now: float,
               body_lines: int | None) -> Table:
        table = Table(box=box.ROUNDED, expand=True, show_lines=False, padding=(0, 1))
        inner = (console.width - len(row) - 1) // len(row) - 2
        for column in row:
            table.add_column(self.header(column, now), ratio=1, overflow="fold",
                             vertical="top")
        bodies: list[RenderableType] = []
        for column in row:
            if body_lines is None:
                bodies.append(self.body(column))
                continue
            width = max(inner, 1)
            seen = (column.chunks, column.status, column.error, column.retries,
                    tuple(column.finish_reasons()), column.done, width, body_lines)
            cached = self._tails.get(column.key)
            if cached is None or cached[0] != seen:
                cached = self._tails[column.key] = (
                    seen, _tail(self.body(column), console, width, body_lines))
            bodies.append(cached[1])
        table.add_row(*bodies)
        return table

    def header(self, column: Column, now: float, *, one_line: bool = False) -> Text:
        """Model, status, TTFT, tokens/s, elapsed, finish reason(s): three lines, or
        one (``== name  id  status · ...``) for the labelled blocks of plain output."""
        header = Text(no_wrap=not one_line, overflow="ellipsis")
        if one_line:
            header.append("== ")
        header.append(inert(column.key), "bold")
        if column.model != column.key:
            header.append(f"  {inert(column.model)}", "dim")
        header.append("  " if one_line else "\n")
        status = column.status if one_line else f" {column.status} "  # padded for the colour
        header.append(status, STATUS_STYLES.get(column.status.split(" (")[0], ""))
        if column.retries:
            header.append(f" retried {column.retries}x", "yellow")
        reasons = column.finish_reasons()
        if column.done or any(r is not None for r in reasons):
            header.append(" finish ")
            if not reasons:
                header.append("none", "dim")
            for i, reason in enumerate(reasons):
                if i:
                    header.append(",")
                label = reason if reason is not None else "none"
                header.append(inert(label), FINISH_STYLES.get(label, "bold magenta"))
        header.append(" · " if one_line else "\n")
        ttft = column.ttft()
        rate, estimated = column.rate(now)
        header.append(f"TTFT {format_seconds(ttft)}", "")
        header.append(f" · {'≈' if estimated and rate is not None else ''}"
                      f"{'-' if rate is None else f'{rate:.0f}'} tok/s")
        header.append(f" · {column.elapsed(now):.1f}s")
        notes = column.notes()
        for i, (note, kind) in enumerate(notes):
            # One line: the table cuts it to the column's width (no_wrap, ellipsis).
            header.append(" · " if i or one_line else "\n")
            header.append(note, NOTE_STYLES[kind])
        return header

    def body(self, column: Column) -> Text:
        body = Text()
        many = len(column.choices) > 1
        for index in sorted(column.choices):
            choice = column.choices[index]
            if many:
                body.append(f"── choice {index} ──\n", "dim")
            for part in choice.order:
                if part == "reasoning":
                    if self.reasoning:
                        body.append(inert("".join(choice.reasoning)), "dim italic")
                        body.append("\n")
                elif part == "text":
                    body.append(inert("".join(choice.text)))
                elif part == "refusal":
                    body.append(inert("".join(choice.refusal)), "red")
                else:
                    body.append_text(_tool(choice.tools[int(part.split(":")[1])],
                                           finished=choice.finish_reason is not None
                                           or column.done))
            if many and index != max(column.choices):
                body.append("\n")
        others = column.cut_while_others_ran
        if others:
            if body:
                body.append("\n")
            body.append(cut_advice(others, column.cut_kind), NOTE_STYLES["cut"])
        elif column.status == "retrying" and column.error:
            body.append(f"retrying: {cut_line(inert(column.error), 200)}", "yellow")
        return body


def cut_advice(others: int, how: str) -> str:
    """What to do about a stream that ended ``how`` (``Column.cut_kind``) while
    ``others`` other streams ran."""
    streams = f"{others} other stream{'s' if others != 1 else ''}"
    fix = "compare fewer models at once, or set [concurrency] max = 1"
    if how == "cut":
        return (f"the server cut this stream while {streams} ran: a server like that "
                f"(llama.cpp with one slot) serves one stream at a time; {fix}")
    what = ("the answer came back empty" if how == "empty"
            else "this stream broke off")
    relay = (", and a relay may report the cut as an empty answer"
             if how == "empty" else "")
    return (f"{what} while {streams} ran: a server that serves one stream at a time "
            f"(llama.cpp with one slot) cuts the running stream when another arrives{relay}; "
            f"if yours does, {fix}")


def _tool(tool: _Tool, *, finished: bool) -> Text:
    text = Text()
    text.append(f"\n→ {inert(tool.name or '?')}", "bold cyan")
    arguments = tool.arguments
    if finished:
        try:
            parsed: Any = json.loads(arguments)
        except ValueError:
            pass
        else:
            arguments = json.dumps(parsed, indent=2, ensure_ascii=False)
    text.append(f"({inert(arguments)})\n", "cyan")
    return text


def _tail(text: Text, console: Console, width: int, lines: int) -> Text:
    """The last ``lines`` lines of ``text`` wrapped at ``width``: a column that scrolls."""
    # A wrapped line holds at most ``width`` characters (plus the spaces a wrap
    # drops), so this many from the end always fill the column.
    limit = width * lines * 5 // 4 + width
    if len(text) > limit:
        text = text[len(text) - limit:]
    wrapped = text.wrap(console, width, overflow="fold")
    tail = Text("\n").join(wrapped[max(len(wrapped) - lines, 0):])
    tail.no_wrap = True  # already wrapped to fit: the table need not wrap it again
    tail.overflow = "crop"
    return tail


def cut_line(text: str, limit: int) -> str:
    """``text`` on one line (runs of whitespace become one space), at most ``limit`` long."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def summary_table(columns: Iterable[Column], now: float) -> Table:
    """One line per model: outcome, finish reason, TTFT, tokens/s, tokens, time."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for name, justify in (("model", "left"), ("outcome", "left"), ("finish", "left"),
                          ("TTFT", "right"), ("tok/s", "right"), ("tokens", "right"),
                          ("chars", "right"), ("time", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    columns = list(columns)
    if any(column.notes() for column in columns):
        table.add_column("note", overflow="fold", min_width=24)
    for column in columns:
        rate, estimated = column.rate(now)
        reasons = ",".join(r or "none" for r in column.finish_reasons()) or "none"
        tokens = column.completion_tokens
        chars = sum(len("".join(c.text)) for c in column.choices.values())
        table.add_row(
            Text(inert(column.key)), Text(column.status, STATUS_STYLES.get(
                column.status.split(" (")[0], "")),
            Text(inert(reasons), FINISH_STYLES.get(reasons, "bold magenta")),
            format_seconds(column.ttft()),
            "-" if rate is None else f"{'≈' if estimated else ''}{rate:.0f}",
            "-" if tokens is None else str(tokens), str(chars),
            f"{column.elapsed(now):.2f}s", *_note_cell(column, len(table.columns) > 8))
    return table


def _note_cell(column: Column, shown: bool) -> list[Text]:
    if not shown:
        return []
    cell = Text()
    for i, (note, kind) in enumerate(column.notes()):
        if i:
            cell.append(" · ")
        cell.append(cut_line(note, 200), NOTE_STYLES[kind])
    return [cell]
