"""What ``fanout compare`` shows: per-model column state, and its rich renderables.

``Column`` folds one stream's events (plain data, no I/O); ``CompareView``
turns the columns into rich renderables, live (each column shows the tail
of its text) or final (everything).  Model output is untrusted: it only ever
reaches rich as ``Text`` (never parsed as markup), after ``inert()`` removed
control characters and escape sequences.
"""

from __future__ import annotations

import itertools
import json
import re
import textwrap
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import attrs
from rich import box
from rich.cells import get_character_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.control import Control
from rich.segment import Segment
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
from ..core.result import Flag, Outcome, StreamResult, relayed_cut
from ..records import (
    MIN_RATE_EVENTS,
    MIN_RATE_SPAN,
    flag_label,
    output_chars,
    tokens_per_second,
)
from .common import format_seconds

__all__ = ["Column", "CompareView", "cut_advice", "cut_line", "inert", "pair_lines", "printable"]

# Escape sequences: CSI, OSC (ended by BEL or ST), DCS/SOS/PM/APC strings, two-byte ESC x,
# and the 8-bit CSI.  Removed whole, so no parameter residue is left behind.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
#: Invisible characters removed from the terminal views (``--json`` keeps them): the
#: zero-width space, the left-to-right, right-to-left and Arabic letter marks, the
#: byte order mark (zero-width no-break space), the word joiner and the invisible
#: operators, the Mongolian vowel separator, the soft hyphen, the interlinear
#: annotation controls and the tag characters (invisible ASCII).  Terminals disagree
#: on their width and a reader cannot see them.  Kept: the zero-width joiner and
#: non-joiner and the variation selectors, which shape emoji and scripts.
INVISIBLE = frozenset([0x200B, 0x200E, 0x200F, 0x061C, 0xFEFF, 0x2060, 0x2061, 0x2062,
                       0x2063, 0x2064, 0x180E, 0x00AD, 0xFFF9, 0xFFFA, 0xFFFB,
                       *range(0xE0000, 0xE0080)])
# Every other control character (C0 but tab and newline, DEL, C1), the bidi controls
# that can make text display in another order than it reads, and the invisible ones.
_DROP: dict[int, int | str | None] = dict.fromkeys(
    [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0),
     *range(0x202A, 0x202F), *range(0x2066, 0x206A), *INVISIBLE])
_DROP.update({0x2028: "\n", 0x2029: "\n"})  # line and paragraph separators break lines
_SURROGATE = re.compile("[\ud800-\udfff]")
_BLANK_RUN = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


def inert(text: str) -> str:
    """``text`` safe for a terminal and for any encoder: no escape sequences, no
    control characters (tab and newline stay; CRLF, lone CR and the line and
    paragraph separators become newlines), no bidi controls, none of the
    ``INVISIBLE`` characters, and every lone surrogate (valid in JSON, but no
    UTF-8 encoder takes it) replaced by U+FFFD; a surrogate pair split across
    deltas is joined back into its character."""
    if text.isprintable():
        return text
    if _SURROGATE.search(text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _ESCAPES.sub("", text).translate(_DROP)


_SURROGATES_ALONE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` safe for a terminal and for any encoder: escape sequences and control
    characters removed (``inert``), lone surrogates replaced by U+FFFD."""
    return inert(_SURROGATES_ALONE.sub("\ufffd", text))


def pair_lines(pairs: Sequence[tuple[str, Text]], width: int) -> list[Text]:
    """``label value`` pairs, indented, as many a line as fit in ``width`` (a pair is
    never split): the body of a block when a table does not fit."""
    lines = []
    line = Text("  ")
    for label, value in pairs:
        pair = Text.assemble((f"{label} ", "dim"), value)
        if line.cell_len > 2 and line.cell_len + 2 + pair.cell_len > width:
            lines.append(line)
            line = Text("  ")
        elif line.cell_len > 2:
            line.append("  ")
        line.append_text(pair)
    lines.append(line)
    return lines


def collapse_blank_lines(text: str) -> str:
    """Runs of blank lines become one blank line (the terminal views: 10,000
    newlines are not 10,000 lines)."""
    return _BLANK_RUN.sub("\n\n", text) if "\n" in text else text


# -------------------------------------------------------------- width, as terminals draw it
#
# rich measures text by its own tables, and terminals do not all agree with it:
# a Devanagari vowel sign (a spacing mark, Mc) takes no cell for rich and one for
# wcwidth terminals (glibc, xterm, tmux); an emoji with VS16 takes two for rich and
# for terminals with emoji presentation, one for wcwidth terminals.  A line rich
# thinks fits can wrap on the terminal, and every such wrap of the live view leaves
# a stray line in scrollback.  So the views measure every character by the larger
# of the two (``cells``), wrap and pad by that, and put every border of a line that
# is not plain ASCII at its column with a cursor move: a terminal that draws the
# line narrower still lines the borders up, and none draws it wider.

def _wcwidth(character: str) -> int:
    code = ord(character)
    if unicodedata.category(character) in ("Mn", "Me", "Cf") or 0x1160 <= code <= 0x11FF:
        return 0
    return 2 if unicodedata.east_asian_width(character) in ("W", "F") else 1


@lru_cache(maxsize=8192)
def _char_cells(character: str) -> int:
    return max(get_character_cell_size(character), _wcwidth(character))


def _widths(text: str) -> list[int]:
    """Each character's cells: a VS16 after a one-cell character counts one more
    (the emoji may be drawn two wide)."""
    widths = []
    previous = 0
    for character in text:
        width = (1 if previous == 1 else 0) if character == "\ufe0f" else _char_cells(character)
        widths.append(width)
        previous = width if character != "\ufe0f" else 0
    return widths


def cells(text: str) -> int:
    """The most cells ``text`` (one line, made inert) takes on a common terminal."""
    if text.isascii():
        return len(text)
    return sum(_widths(text))


def _fits(text: str, width: int) -> int:
    """How many characters of ``text`` fit in ``width`` cells (zero-width characters
    stay with the character before them)."""
    if text.isascii():
        return min(len(text), width)
    used = 0
    for index, size in enumerate(_widths(text)):
        if size and used + size > width:
            return index
        used += size
    return len(text)


def crop(text: Text, width: int) -> Text:
    """``text`` (one line) cut to ``width`` cells, with ``…`` when it was cut."""
    if cells(text.plain) <= width:
        return text
    if width <= 0:
        return Text()
    cut = text[:_fits(text.plain, width - 1)]
    cut.append("…")
    return cut


def crop_left(text: Text, width: int) -> Text:
    """The end of ``text`` (one line) in ``width`` cells, ``…`` first when it was cut."""
    plain = text.plain
    if cells(plain) <= width:
        return text
    if width <= 0:
        return Text()
    widths = _widths(plain)
    used, start = 0, len(plain)
    while start > 0 and used + widths[start - 1] <= width - 1:
        start -= 1
        used += widths[start]
    while start < len(plain) and widths[start] == 0:
        start += 1  # no mark without the character it belongs to
    return Text("…") + text[start:]


def _breaks(line: str, width: int) -> list[tuple[int, int]]:
    """Where ``line`` (no newline) wraps at ``width`` cells: (start, end) of each
    wrapped line; spaces at a break are dropped, a word longer than a line folds."""
    if cells(line) <= width:
        return [(0, len(line))]
    widths = [1] * len(line) if line.isascii() else _widths(line)
    cum = list(itertools.accumulate(widths, initial=0))
    out: list[tuple[int, int]] = []
    start, space_at, word_at = 0, -1, -1
    index, end = 0, len(line)
    while index < end:
        if line[index] == " ":
            after = index
            while after < end and line[after] == " ":
                after += 1
            if cum[after] - cum[start] > width:  # the spaces end this line
                out.append((start, index))
                start, space_at, word_at = after, -1, -1
            else:
                space_at, word_at = index, after
            index = after
            continue
        size = widths[index]
        if size and cum[index + 1] - cum[start] > width:
            if word_at > start:  # break before this word
                out.append((start, space_at))
                start, space_at, word_at = word_at, -1, -1
            elif index > start:  # a word longer than the line: fold it
                out.append((start, index))
                start = index
            else:  # one character wider than the line
                out.append((start, index + 1))
                start = index = index + 1
            continue
        index += 1
    if start < end or not out:
        out.append((start, end))
    return out


def wrap(text: Text, width: int) -> list[Text]:
    """``text`` wrapped at ``width`` cells as terminals draw it (tabs expanded)."""
    if "\t" in text.plain:
        text = text.copy()
        text.expand_tabs(8)
    plain = text.plain
    spans: list[tuple[int, int]] = []
    offset = 0
    for line in plain.split("\n"):
        spans.extend((offset + a, offset + b) for a, b in _breaks(line, max(width, 1)))
        offset += len(line) + 1
    if spans == [(0, len(plain))]:
        return [text]
    points = sorted({point for span in spans for point in span})
    pieces = text.divide(points)
    by_start: dict[int, Text] = {}
    position = 0
    for piece in pieces:
        by_start[position] = piece
        position += len(piece)
    out = []
    for a, b in spans:
        found = by_start.get(a) if a < b else None
        out.append(found if found is not None and len(found) == b - a else text[a:b])
    return out


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
    """One model's column: what arrived so far, and its live status.

    Times are the consumer's clock (``trio.current_time()``), measured as the
    engine measures them (``Timings``): TTFT, tokens/s and ``time`` from the
    request being sent (``sent``: the stream took its concurrency slot, or a
    retry's wait ended), queueing apart (from ``started`` to the first request).
    Once the stream has finished, every number is the engine's own, from its
    result.
    """

    key: str
    model: str
    started: float  # the fan-out began: time queued counts from here
    status: str = "queued"
    sent: float | None = None  # this attempt's request went out
    first_sent: float | None = None  # the first attempt's
    first_content: float | None = None
    last_event: float | None = None
    finished: float | None = None
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retries: int = 0
    error: str | None = None
    choices: dict[int, _Choice] = attrs.Factory(dict)
    result: StreamResult | None = None
    expected_choices: int = 1  # the request's n

    def slot_taken(self, now: float | None = None) -> None:
        """The stream got its concurrency slot (at ``now``): it is connecting, and its
        request is on its way."""
        if self.status == "queued":
            self.status = "connecting"
        if now is not None and self.sent is None and self.result is None:
            self.sent = self.first_sent = now

    def apply(self, event: Event, now: float) -> None:
        """Fold one event of this stream, received at ``now``."""
        if isinstance(event, StreamStarted):
            self.status = "waiting"
            if self.sent is None:  # not seen leaving the queue: the response is the bound
                self.sent = self.first_sent = now
            return
        if isinstance(event, StreamRetrying):
            self.status, self.retries = "retrying", self.retries + 1
            self.error = event.error.message
            self.sent = now + event.wait  # the next attempt goes out after the wait
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
            self.prompt_tokens = event.usage.prompt_tokens
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
        if result.usage is not None:
            self.prompt_tokens = result.usage.prompt_tokens
            self.completion_tokens = result.usage.completion_tokens
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
        answer (what a relay makes of a cut), or with a relay's in-band report of the
        cut after some output (``relayed_cut``), while other streams of the same
        fan-out held a slot: what a server that serves one stream at a time
        (llama.cpp's single slot) does to the stream it was serving.
        """
        result = self.result
        if result is None or result.others_running <= 0:
            return 0
        if result.outcome == Outcome.TRUNCATED or relayed_cut(result) or (
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
        # The words are fanout.records' (every view's); "⚠ " marks the loud ones.
        label = flag_label(flag, result)
        return label if flag in QUIET_FLAGS else f"⚠ {label}"

    def finish_reasons(self) -> list[str | None]:
        return [self.choices[i].finish_reason for i in sorted(self.choices)]

    def ttft(self) -> float | None:
        """Time to first token, from the request being sent (the engine's, once finished)."""
        if self.result is not None:
            return self.result.timings.ttft if self.result.timings is not None else None
        if self.first_content is None or self.sent is None:
            return None
        return max(0.0, self.first_content - self.sent)

    def rate(self, now: float) -> tuple[float | None, bool]:
        """Tokens per second and whether estimated (live: content events; final: the
        usage if any), ``None`` until ``MIN_RATE_EVENTS`` content events arrived over
        ``MIN_RATE_SPAN`` seconds."""
        result = self.result
        if result is not None:
            return tokens_per_second(result)
        if self.first_content is None or self.chunks < MIN_RATE_EVENTS:
            return None, True
        end = self.last_event if self.last_event is not None else now
        seconds = end - self.first_content
        if seconds < MIN_RATE_SPAN:
            return None, True
        return (self.chunks - 1) / seconds, True

    def time(self, now: float) -> float | None:
        """From the first request being sent to the end (or ``now``), retries included:
        the engine's ``Timings.e2e`` once finished; ``None`` before any request."""
        if self.result is not None:
            return self.result.timings.e2e if self.result.timings is not None else None
        return None if self.first_sent is None else max(0.0, now - self.first_sent)

    def output_chars(self) -> int:
        """Characters produced: ``fanout.records.output_chars`` once finished (text,
        reasoning, refusal and tool arguments), the same count of what arrived before."""
        if self.result is not None:
            return output_chars(self.result)
        return sum(len("".join(c.text)) + len("".join(c.reasoning)) + len("".join(c.refusal))
                   + sum(len(tool.arguments) for tool in c.tools.values())
                   for c in self.choices.values())

    def queued(self, now: float) -> float:
        """Time spent waiting for a concurrency slot (the engine's ``Timings.queued``
        once finished)."""
        if self.result is not None:
            return self.result.timings.queued if self.result.timings is not None else 0.0
        end = self.first_sent if self.first_sent is not None else now
        return max(0.0, end - self.started)

    def elapsed(self, now: float) -> float:
        """Wall-clock time since the fan-out began, queueing included."""
        return (self.finished if self.finished is not None else now) - self.started


#: The final screen shows at most this many lines of a column (``full``: all of them).
FINAL_LINES = 100
#: What the compact layout shows of a column at most: its line and its text's tail.
COMPACT_LINES = 4


class CompareView:
    """Columns side by side: ``live()`` for the timer redraw, ``final()`` for the end.

    Live, each model gets a box (rows of them when the terminal is narrow) if
    every box fits with ``MIN_BODY`` lines of text; otherwise the compact
    layout: a line per model (its status, finish reason, TTFT, tokens/s and the
    tail of its text, or its note), and the lines of its tail under it when
    there is room.  Every stream stays visible on any terminal of at least
    40x12.  Text is wrapped and cut as terminals draw it (``cells``).
    """

    min_width = 28
    MIN_BODY = 3

    def __init__(self, columns: Sequence[Column], *, reasoning: bool = True,
                 full: bool = False) -> None:
        self.columns = list(columns)
        self.reasoning = reasoning
        self.full = full
        # key -> (what the column looked like, its wrapped tail): a column that did
        # not change since the last frame is not joined, cleaned and wrapped again.
        self._tails: dict[str, tuple[tuple[object, ...], list[Text]]] = {}

    # -- layouts ---------------------------------------------------------------

    def layout(self, width: int, height: int) -> str:
        """``boxes`` or ``compact``: what the live view draws at this size."""
        if width // self.min_width < 1:
            return "compact"
        rows = len(self._rows(width))
        # Per row: top border, header (3 lines, and room for a note), rule, bottom.
        return "boxes" if rows * (7 + self.MIN_BODY) + 1 <= height else "compact"

    def live(self, console: Console, now: float) -> RenderableType:
        # One line of the screen stays free: when the live view stops, rich draws the
        # last frame and a newline after it; a frame as tall as the screen would
        # scroll its top line into scrollback, where no redraw can erase it.
        width, height = console.width, console.height - 1
        footer = crop(self.footer(now), width)
        if self.layout(width, height) == "compact":
            return Group(*self._compact(width, height, now), footer)
        rows = self._rows(width)
        chrome = sum(6 + any(column.notes() for column in row) for row in rows)
        body_lines = max(1, (height - 1 - chrome) // len(rows))
        drawn = [self._row(row, width, now, lambda c, w: self._live_tail(c, w, body_lines))
                 for row in rows]
        return Group(_Boxes(drawn), footer)

    def final(self, console: Console, now: float) -> RenderableType:
        width = console.width
        drawn = [self._row(row, width, now, self._final_body) for row in self._rows(width)]
        return _Boxes(drawn)

    def _row(self, row: list[Column], width: int, now: float,
             body: Callable[[Column, int], list[Text]]
             ) -> tuple[list[int], list[list[Text]], list[list[Text]]]:
        widths = _split(width, len(row))
        pairs = list(zip(row, widths, strict=True))
        return (widths, [self.header_lines(c, now, w) for c, w in pairs],
                [body(c, w) for c, w in pairs])

    def footer(self, now: float) -> Text:
        counts: dict[str, int] = {}
        for column in self.columns:
            label = column.status.split(" (")[0]
            counts[label] = counts.get(label, 0) + 1
        parts = [f"{n} {label}" for label, n in counts.items()]
        elapsed = max((c.elapsed(now) for c in self.columns), default=0.0)
        return Text(f" {' · '.join(parts)} · {elapsed:.1f}s · Ctrl-C stops all", style="dim")

    def _rows(self, width: int) -> list[list[Column]]:
        fit = max(1, min(len(self.columns), width // self.min_width))
        rows = -(-len(self.columns) // fit)
        per_row = -(-len(self.columns) // rows)  # balanced: 4 columns that need 2 rows are 2+2
        return [self.columns[i:i + per_row] for i in range(0, len(self.columns), per_row)]

    def _live_tail(self, column: Column, width: int, lines: int) -> list[Text]:
        seen = (column.chunks, column.status, column.error, column.retries,
                tuple(column.finish_reasons()), column.done, width, lines)
        cached = self._tails.get(column.key)
        if cached is None or cached[0] != seen:
            cached = self._tails[column.key] = (
                seen, _tail(self.body(column, collapse=True), width, lines))
        return cached[1]

    def _final_body(self, column: Column, width: int) -> list[Text]:
        lines = wrap(self.body(column, collapse=True), width)
        if self.full or len(lines) <= FINAL_LINES:
            return lines
        hidden = len(lines) - FINAL_LINES + 1
        return [*lines[:FINAL_LINES - 1],
                crop(Text(f"⋯ {hidden} more lines (--full shows everything)", "dim"), width)]

    def _compact(self, width: int, height: int, now: float) -> list[Text]:
        columns = self.columns
        room = max(1, height - 1)  # the footer's line
        shown = columns if len(columns) <= room else columns[:room - 1]
        per = max(1, min(COMPACT_LINES, room // max(len(shown), 1)))
        fields = [self._fields(column, now) for column in shown]
        sizes = [max((cells(f[i].plain) for f in fields), default=0) for i in range(5)]
        sizes[0] = min(sizes[0], 16)
        lines: list[Text] = []
        for column, parts in zip(shown, fields, strict=True):
            line = Text(no_wrap=True, overflow="ignore")
            for i, part in enumerate(parts):
                if i:
                    line.append(" ")
                part = crop(part, sizes[i])
                pad = " " * (sizes[i] - cells(part.plain))
                if i >= 3:  # numbers: right-aligned
                    line.append(pad)
                    line.append_text(part)
                else:
                    line.append_text(part)
                    line.append(pad)
            tail = self._note_text(column)
            if not tail.plain and per == 1:
                tail = _flat_tail(self.body(column, collapse=True))
            rest = width - cells(line.plain) - 2
            if tail.plain and rest >= 4:
                line.append("  ")
                line.append_text(crop_left(tail, rest) if not column.notes()
                                 else crop(tail, rest))
            lines.append(crop(line, width))
            if per > 1:
                lines.extend(Text("  ") + text for text in
                             _padded(_tail(self.body(column, collapse=True), width - 2,
                                           per - 1), per - 1))
        if len(shown) < len(columns):
            more = columns[len(shown):]
            done = sum(column.done for column in more)
            lines.append(crop(Text(f"… {len(more)} more ({done} done): a taller terminal "
                                   "shows them", "dim"), width))
        return lines

    def _fields(self, column: Column, now: float) -> list[Text]:
        reasons = column.finish_reasons()
        finish = Text()
        if column.done or any(r is not None for r in reasons):
            for i, reason in enumerate(reasons or [None]):
                if i:
                    finish.append(",")
                label = inert(reason) if reason is not None else "none"
                finish.append(label, FINISH_STYLES.get(label, "bold magenta"))
        rate, estimated = column.rate(now)
        return [Text(inert(column.key), "bold"),
                Text(column.status, STATUS_STYLES.get(column.status.split(" (")[0], "")),
                finish, Text(format_seconds(column.ttft())),
                Text(f"{'≈' if estimated and rate is not None else ''}"
                     f"{'-' if rate is None else f'{rate:.0f}'} tok/s")]

    def _note_text(self, column: Column) -> Text:
        text = Text()
        for i, (note, kind) in enumerate(column.notes()):
            if i:
                text.append(" · ")
            text.append(note, NOTE_STYLES[kind])
        return text

    # -- the parts of a column -------------------------------------------------

    def header(self, column: Column, now: float, *, one_line: bool = False) -> Text:
        """Model, status, finish reason(s), TTFT, tokens/s, time (and queued): three
        lines and a line of notes, or one (``== name  id  status · ...``) for the
        labelled blocks of plain output."""
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
        rate, estimated = column.rate(now)
        header.append(f"TTFT {format_seconds(column.ttft())}")
        header.append(f" · {'≈' if estimated and rate is not None else ''}"
                      f"{'-' if rate is None else f'{rate:.0f}'} tok/s")
        header.append(f" · {format_seconds(column.time(now))}")
        queued = column.queued(now)
        if queued >= 0.05:
            header.append(f" · queued {format_seconds(queued)}", "dim")
        notes = column.notes()
        for i, (note, kind) in enumerate(notes):
            # One line: the view cuts it to the column's width.
            header.append(" · " if i or one_line else "\n")
            header.append(note, NOTE_STYLES[kind])
        return header

    def header_lines(self, column: Column, now: float, width: int) -> list[Text]:
        """The header's lines, each cut to ``width`` cells."""
        return [crop(line, width) for line in self.header(column, now).split("\n")]

    def body(self, column: Column, *, collapse: bool = False, plain: bool = False) -> Text:
        """What the column shows under its header.  ``collapse``: runs of blank lines
        become one (the terminal views).  ``plain``: off a terminal, where there are no
        styles, reasoning and refusals are marked (``[reasoning]``, ``[answer]``,
        ``[refusal]``) as the live view marks them with dim and red."""
        body = Text()
        many = len(column.choices) > 1

        def clean(text: str) -> str:
            text = inert(text)
            return collapse_blank_lines(text) if collapse else text

        for index in sorted(column.choices):
            choice = column.choices[index]
            if many:
                body.append(f"── choice {index} ──\n", "dim")
            marked = plain and (bool(choice.refusal) or (self.reasoning and bool(choice.reasoning)))
            for part in choice.order:
                if marked and part in ("reasoning", "text", "refusal") and (
                        part != "reasoning" or self.reasoning):
                    if body.plain and not body.plain.endswith("\n"):
                        body.append("\n")
                    body.append(f"[{'answer' if part == 'text' else part}]\n", "dim")
                if part == "reasoning":
                    if self.reasoning:
                        body.append(clean("".join(choice.reasoning)), "dim italic")
                        body.append("\n")
                elif part == "text":
                    body.append(clean("".join(choice.text)))
                elif part == "refusal":
                    body.append(clean("".join(choice.refusal)), "red")
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


class _Boxes:
    """Rows of boxes, drawn line by line: ``(content widths, header lines per column,
    body lines per column)`` a row, every line already cut or wrapped to its width.

    Each line is padded by ``cells`` (the most a terminal draws); after a line that
    is not plain ASCII, a cursor-to-column move puts the border where it belongs,
    so a terminal that draws the line narrower still lines the borders up.  No
    line is ever wider than the terminal: a redraw never wraps.
    """

    def __init__(self, rows: list[tuple[list[int], list[list[Text]], list[list[Text]]]]
                 ) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions
                         ) -> Iterator[Segment]:
        for widths, headers, bodies in self.rows:
            yield from _border("╭", "┬", "╮", widths)
            yield from _lines(console, headers, widths)
            yield from _border("├", "┼", "┤", widths)
            yield from _lines(console, bodies, widths)
            yield from _border("╰", "┴", "╯", widths)


def _split(width: int, count: int) -> list[int]:
    """The content widths of ``count`` boxes side by side in ``width`` cells (each box
    has a border and a space either side)."""
    content = max(width - 3 * count - 1, count)
    return [content // count + (i < content % count) for i in range(count)]


def _border(left: str, middle: str, right: str, widths: list[int]) -> Iterator[Segment]:
    yield Segment(left + middle.join("─" * (width + 2) for width in widths) + right)
    yield Segment.line()


def _lines(console: Console, columns: list[list[Text]], widths: list[int]
           ) -> Iterator[Segment]:
    for index in range(max((len(lines) for lines in columns), default=0)):
        x = 2
        yield Segment("│ ")
        for i, (lines, width) in enumerate(zip(columns, widths, strict=True)):
            text = lines[index] if index < len(lines) else None
            plain = text.plain if text is not None else ""
            if text is not None and plain:
                yield from text.render(console)
            yield Segment(" " * max(0, width - cells(plain)))
            if not plain.isascii():
                yield Control.move_to_column(x + width).segment
            x += width + 3
            yield Segment(" │ " if i < len(widths) - 1 else " │")
        yield Segment.line()


def _padded(lines: list[Text], count: int) -> list[Text]:
    return [*lines, *(Text() for _ in range(count - len(lines)))]


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


def _tail(text: Text, width: int, lines: int) -> list[Text]:
    """The last ``lines`` lines of ``text`` wrapped at ``width``: a column that scrolls."""
    # A wrapped line holds about ``width`` characters (more with combining marks,
    # plus the spaces a wrap drops), so this many from the end fill the column.
    limit = 2 * width * (lines + 1)
    text = text[max(0, len(text) - limit):]  # a copy
    text.rstrip()  # the last lines are text, not the newline after it
    wrapped = wrap(text, width)
    return wrapped[max(len(wrapped) - lines, 0):]


def _flat_tail(text: Text, limit: int = 400) -> Text:
    """The end of ``text`` on one line (newlines become spaces)."""
    if len(text) > limit:
        text = text[len(text) - limit:]
    return Text(" ").join(line for line in text.split("\n") if line.plain.strip())


def cut_line(text: str, limit: int) -> str:
    """``text`` on one line (runs of whitespace become one space), at most ``limit`` long."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ------------------------------------------------------------------- the summary

_SUMMARY_TEXT = ("model", "outcome", "finish")
#: The summary's numbers: never folded or cut, so a table that would not fit splits.
_SUMMARY_NUMBERS = ("TTFT", "tok/s", "in", "out", "chars", "queued", "time")


def summary_table(columns: Iterable[Column], now: float, width: int | None = None
                  ) -> RenderableType:
    """One line per model: outcome, finish reason, TTFT, tokens/s, tokens in and out
    (``-``: the server sent no usage), characters produced (``output_chars``), time
    queued for a slot, and time from the first request being sent to the end,
    retries included (TTFT, tokens/s and time leave queueing out; every number is
    ``fanout.records.metrics``' once the stream finished), with a ``note`` column
    when any stream has notes.

    ``width``: the table is made to fit it with every number whole: past what one
    table can hold, it splits into an outcomes table and tables of numbers.
    """
    columns = list(columns)
    rows = [_summary_row(column, now) for column in columns]
    notes = any(column.notes() for column in columns)
    names = [*_SUMMARY_TEXT, *_SUMMARY_NUMBERS, *(["note"] if notes else [])]
    need = {name: max([len(name), *(cells(row[name].plain) for row in rows)])
            for name in names}
    need["model"] = min(need["model"], 20)

    def fits(group: Sequence[str], note_room: int = 0) -> bool:
        # Each column: a space of padding either side, shared between two columns.
        return sum(need[name] + 2 for name in group) + note_room <= (width or 10**6)

    every = [name for name in names if name != "note"]
    if fits(every, (2 + min(need["note"], 24)) if notes else 0):
        return _summary(names, rows)
    tables = [_summary(["model", "outcome", "finish", *(["note"] if notes else [])], rows)]
    group: list[str] = ["model"]
    for name in _SUMMARY_NUMBERS:
        if len(group) > 1 and not fits([*group, name]):
            tables.append(_summary(group, rows))
            group = ["model"]
        group.append(name)
    tables.append(_summary(group, rows))
    return Group(*tables)


def _summary(names: Sequence[str], rows: list[dict[str, Text]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for name in names:
        if name in _SUMMARY_NUMBERS:
            table.add_column(name, justify="right", no_wrap=True)
        elif name == "note":
            table.add_column(name, overflow="fold", min_width=12)
        elif name == "model":
            table.add_column(name, overflow="ellipsis", no_wrap=True)
        else:
            table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(row[name] for name in names))
    return table


def _summary_row(column: Column, now: float) -> dict[str, Text]:
    rate, estimated = column.rate(now)
    reasons = ",".join(r or "none" for r in column.finish_reasons()) or "none"
    chars = column.output_chars()
    note = Text()
    for i, (text, kind) in enumerate(column.notes()):
        if i:
            note.append(" · ")
        note.append(cut_line(text, 200), NOTE_STYLES[kind])
    return {
        "model": Text(inert(column.key)),
        "outcome": Text(column.status, STATUS_STYLES.get(column.status.split(" (")[0], "")),
        "finish": Text(inert(reasons), FINISH_STYLES.get(reasons, "bold magenta")),
        "TTFT": Text(format_seconds(column.ttft())),
        "tok/s": Text("-" if rate is None else f"{'≈' if estimated else ''}{rate:.0f}"),
        "in": Text(_count(column.prompt_tokens)),
        "out": Text(_count(column.completion_tokens)),
        "chars": Text(str(chars)),
        "queued": Text(format_seconds(column.queued(now))),
        "time": Text(format_seconds(column.time(now))),
        "note": note,
    }


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def hanging(label: str, text: str, *, width: int, indent: int) -> list[str]:
    """``label`` padded to ``indent`` columns, then ``text`` wrapped at word boundaries to
    ``width`` columns, its later lines indented under its first (a word longer than a line
    stays whole: never cut inside a word)."""
    first = f"{label:{indent - 1}} " if len(label) < indent else f"{label} "
    return textwrap.wrap(text, width=max(width, indent + 20), initial_indent=first,
                         subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False) or [first.rstrip()]
