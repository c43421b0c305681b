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
from typing import Final, final

from .._exceptions import EventTooLarge
from ._sse_event import ServerSentEvent as ServerSentEvent

__all__ = ["DEFAULT_MAX_EVENT_SIZE", "SSEDecoder", "ServerSentEvent"]

DEFAULT_MAX_EVENT_SIZE: Final = 8 * 1024 * 1024
"""8 Mi characters: far above any sane chat chunk, far below running out of memory."""

_BOM: Final = "\ufeff"


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

    def _feed_items(self, data: bytes) -> list[ServerSentEvent | str | tuple[str, str]]:
        """``feed()`` for StreamParser: a plain ``str`` stands for
        ``ServerSentEvent(that, "message", "", None)``, which saves building an
        object per chunk on the hot path; with ``_pairs`` set, ``(data, name)``
        stands for ``ServerSentEvent(data, name, "", None)``."""
        if self._failed is not None:
            raise EventTooLarge(self._failed.size, self._failed.limit)
        if self._closed:
            raise RuntimeError("SSEDecoder.feed() called after close()")
        self.bytes_fed += len(data)
        return self._feed_text(self._decoder.decode(data))

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
        events = _events(self._feed_text(self._decoder.decode(b"", True)))
        self._closed = True
        pending = "".join(self._pending)
        self.unterminated = bool(
            self._data or self._field_seen or (pending and not pending.startswith(":"))
        )
        self._pending.clear()
        self._data.clear()
        return events

    def _feed_text(self, text: str) -> list[ServerSentEvent | str | tuple[str, str]]:
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
        # Split on blank lines first: every piece but the last is a whole block
        # of lines that ends in a dispatch.  A block that is one `data: ` line
        # (nearly every chat chunk) becomes an event without the line loop.
        blocks = text.split("\n\n")
        tail = blocks.pop().split("\n")  # complete lines, then the partial one
        rest = tail.pop()
        events: list[ServerSentEvent | str | tuple[str, str]] = []
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

    def _check_size(self, events: list[ServerSentEvent | str | tuple[str, str]]) -> None:
        size = self._data_size + self._pending_size
        if size > self.max_event_size:
            self._failed = EventTooLarge(size, self.max_event_size, _events(events))
            # Drop what we held: the point of the limit is bounded memory.
            self._pending.clear()
            self._data.clear()
            raise self._failed

    def _process(self, lines: list[str],
                 events: list[ServerSentEvent | str | tuple[str, str]]) -> None:
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


def _events(items: list[ServerSentEvent | str | tuple[str, str]]) -> list[ServerSentEvent]:
    return [item if type(item) is ServerSentEvent
            else ServerSentEvent(item) if type(item) is str
            else ServerSentEvent(*item)  # type: ignore[misc]
            for item in items]
