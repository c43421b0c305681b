"""Server-sent events, decoded incrementally as the WHATWG HTML standard says.

``SSEDecoder`` is a sans-I/O machine: ``feed(bytes)`` returns the events the
bytes completed, ``close()`` ends the input.  It never blocks and never raises
on bad bytes (invalid UTF-8 becomes U+FFFD); the only exception it raises is
``EventTooLarge``, when one event grows past ``max_event_size`` characters.

Reads, lines and events never line up, so everything is carried across calls:
a UTF-8 character split across reads, a CRLF split between a CR at the end of
one read and an LF at the start of the next (one line end, not two), a BOM
split across the first reads (stripped once, never later).
"""

from __future__ import annotations

import codecs
from typing import Any, Final, final

from .._exceptions import EventTooLarge
from ._sse_event import ServerSentEvent as ServerSentEvent

__all__ = ["DEFAULT_MAX_EVENT_SIZE", "SSEDecoder", "ServerSentEvent"]

DEFAULT_MAX_EVENT_SIZE: Final = 8 * 1024 * 1024
"""8 Mi characters: far above any sane chat chunk, far below running out of memory."""

_BOM: Final = "\ufeff"
#: The byte path splits reads on blank lines in one call while their lines are shorter
#: than this (bytes), and crosses longer lines by their line ends: a ``find`` costs
#: ~900 instructions, a two-byte ``split`` ~3 a byte.
_LONG_LINE: Final = 512


@final
class SSEDecoder:
    """Incremental ``text/event-stream`` decoder for one response body.

    Attributes a caller may read at any time: ``comments`` (comment lines seen:
    keep-alives), ``bytes_fed``, ``last_event_id``, ``retry`` (the last valid
    reconnection time, ``None`` if never set).  After ``close()``:
    ``unterminated`` is true when the input ended inside an event, which was
    therefore not dispatched (a truncated stream).
    """

    __slots__ = (
        "_after_cr",
        "_bom_done",
        "_clean",
        "_closed",
        "_data",
        "_data_size",
        "_decoder",
        "_event_type",
        "_failed",
        "_field_seen",
        "_pairs",
        "_pending",
        "_pending_size",
        "_raw",
        "_raw_lines",
        "_raw_size",
        "_retry_in_block",
        "bytes_fed",
        "comments",
        "last_event_id",
        "max_event_size",
        "retry",
        "unterminated",
    )

    def __init__(self, *, max_event_size: int = DEFAULT_MAX_EVENT_SIZE) -> None:
        if max_event_size <= 0:
            raise ValueError(f"max_event_size must be positive, not {max_event_size!r}")
        self.max_event_size = max_event_size
        #: StreamParser's dialects set it: ``_feed_items`` may then give an
        #: ``event: NAME`` + one ``data:`` line block as the pair ``(data, NAME)``.
        self._pairs = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._bom_done = False
        self._after_cr = False  # the last text ended in CR: a leading LF is its pair
        self._pending: list[str] = []  # text after the last line end, not yet a line
        self._pending_size = 0
        self._data: list[str] = []
        self._data_size = 0
        self._event_type = ""
        self._retry_in_block: int | None = None
        self._field_seen = False  # any field line since the last blank line
        self._failed: EventTooLarge | None = None
        self._closed = False
        #: Between events, nothing held: the next read may take the byte path.
        self._clean = False  # set once the BOM question is settled
        #: The byte path's unfinished event (no CR, no blank line in it), in the pieces
        #: it came in (views of the reads: not copied until the event is whole).
        self._raw: list[bytes | memoryview] = []
        self._raw_size = 0
        self._raw_lines = False  # an LF among the held bytes
        self.comments = 0
        self.bytes_fed = 0
        self.last_event_id = ""
        self.retry: int | None = None
        self.unterminated = False

    def feed(self, data: bytes) -> list[ServerSentEvent]:
        """Decode ``data`` and return the events it completed, oldest first.

        Raises ``EventTooLarge`` (now and on every later call) when the event
        being collected passes ``max_event_size`` characters; the events this
        call completed before that are on the exception's ``events``.
        """
        items = self._feed_items(data)
        return _events(items) if items else []

    def _feed_items(self, data: bytes) -> list[ServerSentEvent | str | bytes | tuple[Any, str]]:
        """``feed()`` for StreamParser, with shortcuts that save building an object
        per event on the hot path: ``bytes`` stands for
        ``ServerSentEvent(that.decode("utf-8", "replace"))`` (the byte path's
        data, not yet decoded: valid UTF-8 goes straight to the JSON parser), a
        ``str`` for ``ServerSentEvent(that)``; with ``_pairs`` set, ``(data, name)``
        (``data`` either) for ``ServerSentEvent(data, name)``."""
        if self._failed is not None:
            raise EventTooLarge(self._failed.size, self._failed.limit)
        if self._closed:
            raise RuntimeError("SSEDecoder.feed() called after close()")
        if not data:
            return []
        self.bytes_fed += len(data)
        # (On bytes, `13 in data` is a memchr; `b"\r" in data` first tries the
        # operand as an integer and clears a TypeError: several times slower.)
        if self._clean and not self._raw:
            # The commonest read: one whole event, `data: ...` (or several `data: `
            # lines, or `event: NAME` then `data: ...`), a blank line, nothing else,
            # with LF or CRLF line ends.  (`find` and `count` parse their arguments
            # the slow way, ~900 instructions a call: a payload's own slice is
            # searched instead.)
            crlf = 13 in data
            end = len(data) - 4 if crlf else len(data) - 2
            if 0 < end <= self.max_event_size \
                    and (data.endswith(b"\r\n\r\n") if crlf else data.endswith(b"\n\n")):
                if data.startswith(b"data: "):
                    value = data[6:end]
                    if 10 not in value and not (crlf and 13 in value):
                        return [value]
                    joined = _data_lines(value, 0, crlf)
                    if joined is not None:
                        return [joined]
                elif self._pairs and data.startswith(b"event: "):
                    head, _, rest = data.partition(b"\n")
                    if crlf:
                        head = head[:-1] if head.endswith(b"\r") else b""
                    if head and rest.startswith(b"data: "):  # (so the slice below is not reversed:
                        # compiled, a bytes slice whose stop is before its start raises SystemError)
                        value = rest[6 : len(rest) - (4 if crlf else 2)]
                        if 10 not in value and not (crlf and (13 in value or 13 in head)):
                            name = _NAMES.get(head)
                            return [(value, name if name is not None else _name(head))]
        items: list[ServerSentEvent | str | bytes | tuple[Any, str]] = []
        try:
            self._feed_bytes(data, items)
        except EventTooLarge as exc:  # the events this call completed come first
            exc.events[:0] = _events(items)
            raise
        return items

    def _feed_bytes(self, data: bytes,
                    items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        if 13 in data:  # CR
            if self._after_cr or data[-1] == 13:  # a CRLF may be split: the text path
                self._slow(data, items)
                return
            lf = data.replace(b"\r\n", b"\n")
            if 13 in lf:  # a lone CR ends a line too: the text path, on the bytes as
                self._slow(data, items)  # sent (CR CR LF is two line ends, CR LF one)
                return
            data = lf
        if self._clean:
            if self._raw:
                self._resume(data, items)
            else:
                self._fast(data, 0, 0, items)
            return
        # Something is held: the text path to the first blank line, then the byte path.
        end = data.find(b"\n\n") + 2
        if end < 2:
            self._slow(data, items)
            return
        self._slow(data[:end], items)
        if end < len(data):
            self._rest(data, end, items)

    def _rest(self, data: bytes, at: int,
              items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """``data[at:]``, after the first blank line of ``data``: the byte path when
        nothing is held."""
        if self._clean:
            self._fast(data, at, 1, items)
        else:
            self._slow(data[at:], items)

    def _fast(self, data: bytes, at: int, skip: int,
              items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """The byte path: ``data[at:]`` starts at an event, no CR in it, nothing held;
        ``data[:at]`` is ``skip`` blocks, each ended by a blank line.

        Whole events of one ``data: `` line (or several), ``event: NAME`` then
        one ``data: `` line (for ``_pairs``) and comment lines are read without
        decoding; any other block goes through the text path, whole.  Short lines
        are split on blank lines in one call (``_split``); a long one is crossed by
        its line ends, found with ``memchr`` (a two-byte ``find`` or ``split`` walks
        the bytes one by one, ~3 instructions a byte).
        """
        size = len(data)
        pairs = self._pairs
        while at < size:
            if size - at < _LONG_LINE:  # no long line here: no need to look
                self._split(data, at, skip, items)
                return
            first = data.find(10, at)
            if first < 0:  # no line end: the start of an event, held
                self._hold(data if at == 0 else memoryview(data)[at:], size - at, False,
                           items)
                return
            if first - at < _LONG_LINE:
                self._split(data, at, skip, items)
                return
            end, passed = _block_end(data, first)  # a long line: to its blank line
            lines = 1 + passed
            if end < 0 or end + 1 == size:  # no blank line yet: held
                self._hold(data if at == 0 else memoryview(data)[at:], size - at, True,
                           items)
                return
            if end - at <= self.max_event_size:  # bytes: at least as many as characters
                if lines == 1 and data[at : at + 6] == b"data: ":
                    items.append(data[at + 6 : end])
                    at = end + 2
                    skip += 1
                    continue
                if pairs and lines == 2 and data[at : at + 7] == b"event: " \
                        and data[first + 1 : first + 7] == b"data: ":
                    head = data[at:first]
                    name = _NAMES.get(head)
                    items.append((data[first + 7 : end],
                                  name if name is not None else _name(head)))
                    at = end + 2
                    skip += 1
                    continue
            # Any other block: alone through `_split` (which sends it on to the text path
            # when it must), and the rest as the state then allows.
            self._split(data[at : end + 2], 0, 0, items)
            at = end + 2
            skip += 1
            if not self._clean:  # an id: events carry it from now on
                if at < size:
                    self._slow(data[at:], items)
                return

    def _split(self, data: bytes, at: int, skip: int,
               items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """``_fast`` for short lines: ``data[at:]`` split on blank lines in one call
        (``data`` whole when the ``skip`` blocks before ``at`` are short: scanning
        them again costs less than copying the rest)."""
        if at > _LONG_LINE:
            blocks = data[at:].split(b"\n\n")
            skip = 0
        else:
            blocks = data.split(b"\n\n")
        rest = blocks.pop()
        limit = self.max_event_size
        pairs = self._pairs
        append = items.append
        for number in range(skip, len(blocks)):
            block = blocks[number]
            if len(block) <= limit:  # bytes: at least as many as characters
                if block.startswith(b"data: "):
                    if 10 not in block:
                        append(block[6:])
                        continue
                    joined = _data_lines(block, 6, False)
                    if joined is not None:
                        append(joined)
                        continue
                elif block.startswith(b"event: "):
                    head, sep, value = block.partition(b"\ndata: ")
                    if pairs and sep and 10 not in value and 10 not in head:
                        name = _NAMES.get(head)
                        append((value, name if name is not None else _name(head)))
                        continue
                elif block.startswith(b":") and 10 not in block:
                    self.comments += 1
                    continue
                elif not block:
                    continue
            # Any other block: the text path, whole (the standard's rules, the size limit).
            self._slow(block + b"\n\n", items)
            if not self._clean:  # an id: events carry it from now on
                tail = b"".join([b + b"\n\n" for b in blocks[number + 1 :]]) + rest
                if tail:
                    self._slow(tail, items)
                return
        if rest:
            self._hold(rest, len(rest), 10 in rest, items)

    def _resume(self, data: bytes,
                items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """The byte path with the start of an event held (``_raw``, no blank line in
        it): its end is searched for in ``data`` alone, and the held pieces are
        joined once, when it comes.  Nothing held is scanned or copied twice."""
        raw = self._raw
        size = len(data)
        last = raw[-1]
        if data[0] == 10 and last[len(last) - 1] == 10:  # the blank line straddles the reads
            raw.append(data)
            joined = b"".join(raw)
            self._clear_raw()
            self._fast(joined, 0, 0, items)
            return
        end, passed = _block_end(data, data.find(10))
        single = not passed  # no LF in data before the blank line
        if end < 0 or end + 1 == size:  # still no blank line: held too
            self._hold(data, size, end >= 0 or not single, items)
            return
        view = memoryview(data)
        first = raw[0]
        if single and not self._raw_lines and self._raw_size + end <= self.max_event_size \
                and len(first) >= 6 and first[:6] == b"data: ":
            # One `data: ` line (a big event): its payload, copied once.
            raw[0] = memoryview(first)[6:]
            raw.append(view[:end])
            items.append(b"".join(raw))
            self._clear_raw()
        else:
            raw.append(view[: end + 2])
            joined = b"".join(raw)
            self._clear_raw()
            self._fast(joined, 0, 0, items)
            if not self._clean:
                if end + 2 < size:
                    self._slow(data[end + 2 :], items)
                return
        if end + 2 < size:
            self._fast(data, end + 2, 1, items)

    def _hold(self, data: bytes | memoryview, size: int, lines: bool,
              items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """Keep the start of an event as bytes (the byte path's pending text):
        ``size`` bytes, ``lines`` when an LF is among them."""
        self._raw.append(data)
        self._raw_size += size
        if lines:
            self._raw_lines = True
        if self._raw_size > self.max_event_size:  # maybe past the limit: the text path counts
            self._slow(b"", items)

    def _clear_raw(self) -> None:
        self._raw.clear()
        self._raw_size = 0
        self._raw_lines = False

    def _slow(self, data: bytes,
              items: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """The text path: decode, then the standard's rules line by line."""
        if self._raw:
            self._raw.append(data)
            data = b"".join(self._raw)
            self._clear_raw()
        items += self._feed_text(self._decoder.decode(data))
        self._clean = (not self._pending and not self._field_seen and not self._after_cr
                       and self._bom_done and not self.last_event_id
                       and not self._decoder.getstate()[0])

    def close(self) -> list[ServerSentEvent]:
        """End the input.  Returns the events it completed (always none, by the spec).

        An event not ended by a blank line is discarded, as the spec says, and
        ``unterminated`` is set so the caller can report a truncation.
        Calling ``close()`` again does nothing.
        """
        if self._failed is not None:
            self._closed = self.unterminated = True
            return []
        if self._closed:
            return []
        raw = b"".join(self._raw)
        self._clear_raw()
        events = _events(self._feed_text(self._decoder.decode(raw, True)))
        self._closed = True
        pending = "".join(self._pending)
        self.unterminated = bool(
            self._data or self._field_seen or (pending and not pending.startswith(":"))
        )
        self._pending.clear()
        self._data.clear()
        return events

    def _feed_text(self, text: str) -> list[ServerSentEvent | str | bytes | tuple[Any, str]]:
        if not text:
            return []
        if not self._bom_done:
            self._bom_done = True
            if text[0] == _BOM:
                text = text[1:]
                if not text:
                    return []
        if self._after_cr:
            self._after_cr = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\r" in text:
            self._after_cr = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            self._pending.append(text)
            self._pending_size += len(text)
            self._check_size([])
            return []
        if self._pending:
            self._pending.append(text)
            text = "".join(self._pending)
            self._pending.clear()
        self._pending_size = 0  # the held text is in `text` now: counted once, as data
        # Split on blank lines first: every piece but the last is a whole block
        # of lines that ends in a dispatch.  A block that is one `data: ` line
        # (nearly every chat chunk) becomes an event without the line loop.
        blocks = text.split("\n\n")
        tail = blocks.pop().split("\n")  # complete lines, then the partial one
        rest = tail.pop()
        events: list[ServerSentEvent | str | bytes | tuple[Any, str]] = []
        limit = self.max_event_size
        plain = not self.last_event_id  # a bare str carries no id
        pairs = self._pairs
        fresh = not self._field_seen  # no field of this block came in an earlier read
        for block in blocks:
            if fresh and len(block) <= limit:
                if block.startswith("data: "):
                    if "\n" not in block:
                        if plain:
                            events.append(block[6:])
                        else:
                            events.append(ServerSentEvent(block[6:], "message",
                                                          self.last_event_id))
                        continue
                elif block.startswith("event: "):
                    # `event: NAME` then one `data: ` line: the Responses and Anthropic events.
                    head, sep, value = block.partition("\ndata: ")
                    if sep and "\n" not in value and "\n" not in head:
                        if pairs and plain:
                            events.append((value, head[7:] or "message"))
                        else:
                            events.append(ServerSentEvent(value, head[7:] or "message",
                                                          self.last_event_id))
                        continue
            lines = block.split("\n")
            lines.append("")
            self._process(lines, events)
            plain = not self.last_event_id
            fresh = not self._field_seen
        if tail:
            self._process(tail, events)
        if rest:
            self._pending.append(rest)
        self._pending_size = len(rest)
        self._check_size(events)
        return events

    def _check_size(self, events: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        size = self._data_size + self._pending_size
        if size > self.max_event_size:
            self._failed = EventTooLarge(size, self.max_event_size, _events(events))
            # Drop what we held: the point of the limit is bounded memory.
            self._pending.clear()
            self._data.clear()
            raise self._failed

    def _process(self, lines: list[str],
                 events: list[ServerSentEvent | str | bytes | tuple[Any, str]]) -> None:
        """The general path: each line as the spec says; a blank line dispatches."""
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(
                        ServerSentEvent(
                            data[0] if len(data) == 1 else "\n".join(data),
                            self._event_type or "message",
                            self.last_event_id,
                            self._retry_in_block,
                        )
                    )
                    data.clear()
                    self._data_size = 0
                self._event_type = ""
                self._retry_in_block = None
                self._field_seen = False
                continue
            if line.startswith("data:"):
                # The hot path: chat chunks are one `data: {...}` line each.
                value = line[6:] if line.startswith("data: ") else line[5:]
                data.append(value)
                self._data_size += len(value) + 1
                self._field_seen = True
                if self._data_size > self.max_event_size:
                    self._check_size(events)
                continue
            if line[0] == ":":
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            self._field_seen = True
            if name == "data":  # only reached for a bare `data` line without a colon
                data.append(value)
                self._data_size += 1
            elif name == "event":
                self._event_type = value
            elif name == "id":
                if "\0" not in value:  # an id with NUL is ignored
                    self.last_event_id = value
            elif name == "retry" and value.isascii() and value.isdigit():
                self.retry = self._retry_in_block = int(value)
            # Any other field name is ignored, as the spec says.


def _block_end(data: bytes, end: int) -> tuple[int, int]:
    """From ``end``, an LF of ``data`` (or -1), to the first LF followed by another: its
    position (-1, or the last byte, when the blank line has not come yet) and how many
    LFs were passed on the way.  Each step is a ``memchr``."""
    size = len(data)
    passed = 0
    while end >= 0 and end + 1 < size and data[end + 1] != 10:
        end = data.find(10, end + 2)
        passed += 1
    return end, passed


def _data_lines(block: bytes, start: int, crlf: bool) -> bytes | None:
    """The data of a block of ``data: `` lines, ``block[start:]`` from after the first
    one's ``data: `` to the blank line: the lines' values joined with LF, or ``None``
    when a line is anything else (the text path reads it then)."""
    lines = block.split(b"\r\ndata: " if crlf else b"\ndata: ")
    for line in lines:
        if 10 in line or (crlf and 13 in line):
            return None
    if start:
        lines[0] = lines[0][start:]
    return b"\n".join(lines)


def _events(items: list[ServerSentEvent | str | bytes | tuple[Any, str]]
            ) -> list[ServerSentEvent]:
    return [item if type(item) is ServerSentEvent
            else ServerSentEvent(item) if type(item) is str
            else ServerSentEvent(item.decode("utf-8", "replace")) if type(item) is bytes
            else _pair(item)  # type: ignore[arg-type]
            for item in items]


def _pair(item: tuple[str | bytes, str]) -> ServerSentEvent:
    data, name = item
    return ServerSentEvent(data if isinstance(data, str) else data.decode("utf-8", "replace"),
                           name)


#: Event names as the byte path meets them (``event: NAME`` lines), decoded once.
_NAMES: dict[bytes, str] = {}


def _name(head: bytes) -> str:
    name = head[7:].decode("utf-8", "replace") or "message"
    if len(_NAMES) < 256:
        _NAMES[head] = name
    return name
