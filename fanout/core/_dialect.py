"""What the Responses and Anthropic interpreters share: one typed event in, events out.

Both dialects send one JSON object per server-sent event, named twice: by the
SSE ``event:`` field and by the object's ``type``.  Servers differ (a relay
may drop the ``event:`` lines, or label every event ``message``), so the
rule is:

- ``event: error`` is an error whatever its data (as for chat);
- otherwise the JSON ``type`` names the event when it is a string, else the
  SSE event name does (when it is not the default ``message``);
- an object named by neither is an error when it has a truthy ``error`` key,
  else a skipped frame;
- a name the interpreter has no handler for is counted in
  ``ignored_events`` and ignored: both vendors add event types over time;
- ``data: [DONE]`` (some relays append it) is counted there too: it ends
  neither dialect's stream;
- after the terminal event every event is counted in ``ignored_after_done``.

Malformed JSON, a non-object, and an event that breaks the dialect's rules
(a delta for a block that was never started, a negative index) are skipped
frames in resilient mode (``FrameSkipped``) and raise ``MalformedFrame`` in
strict mode.  Every string passes the stream's ``Redactor`` first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .._exceptions import MalformedFrame
from . import _json
from .chat import (  # one definition of each, shared with the chat interpreter
    MAX_TOOL_CALLS,
    _first_line,
    _loads_checked,
    _short,
    _str_or_none,
    _unsafe,
    other_dialect,
)
from .events import CoreEvent, ErrorReported, FrameSkipped, ResponseInfo, ToolCallDelta
from .redact import Redactor
from .result import StreamError
from .sse import ServerSentEvent

if TYPE_CHECKING:
    from .accumulate import Accumulator

__all__ = ["MAX_BLOCKS", "CallPart", "DialectInterpreter", "SplitCall"]

#: Distinct content blocks (Anthropic) or output items (Responses) one stream may open.
MAX_BLOCKS = 1024
_EXCERPT = 200
_NO_REDACTION = Redactor()

#: An event type's handler: ``handler(interpreter, chunk, data, out)``.  A dialect's
#: table holds its methods unbound, one table for the class: bound methods kept by an
#: instance would refer back to it, a cycle that only the garbage collector frees.
Handler = Callable[[Any, dict[str, Any], str | bytes, list[CoreEvent]], None]


class DialectInterpreter:
    """The shared machinery; ``ResponsesInterpreter`` and ``AnthropicInterpreter``
    add the handlers.  ``terminal`` names the event that completes a stream."""

    terminal: ClassVar[str] = ""
    #: The dialect's name (``StreamParser(api=...)``).
    api: ClassVar[str] = ""
    __slots__ = (
        "_content_key",
        "_fold",
        "_handlers",
        "_max_blocks",
        "_max_tool_calls",
        "_meta",
        "_redacting",
        "_redactor",
        "_stream",
        "done",
        "ignored_after_done",
        "ignored_events",
        "strict",
    )

    def __init__(self, *, strict: bool = False, stream: str = "", content_key: str = "",
                 redactor: Redactor | None = None, max_tool_calls: int = MAX_TOOL_CALLS,
                 max_blocks: int = MAX_BLOCKS) -> None:
        self.strict = strict
        #: The terminal event arrived: later events are counted, not read.
        self.done = False
        self.ignored_after_done = 0
        #: Events of a type this interpreter does not use (counted, never errors).
        self.ignored_events = 0
        self._stream = stream
        self._content_key = content_key
        self._redactor = redactor if redactor else _NO_REDACTION
        self._redacting = bool(redactor)
        self._max_tool_calls = max_tool_calls
        self._max_blocks = max_blocks
        self._meta: tuple[Any, Any] = (None, None)
        #: The accumulator ``interpret_all`` was given: the calls' argument fragments go
        #: into it unbuilt (no one reads the events).
        self._fold: Accumulator | None = None
        self._handlers: dict[str, Handler] = self._table()

    def _table(self) -> dict[str, Handler]:  # pragma: no cover - every dialect overrides it
        """The dialect's handlers (one dict for the class, built once)."""
        return {}

    def interpret(self, event: ServerSentEvent) -> list[CoreEvent]:
        """Return the normalized events one server-sent event carries."""
        out: list[CoreEvent] = []
        self.interpret_into(event, out)
        return out

    def interpret_into(self, event: ServerSentEvent | str | bytes | tuple[Any, str],
                       out: list[CoreEvent]) -> None:
        """Like ``interpret``, appending to ``out``.

        A plain ``str`` is the data of a ``message`` event, ``bytes`` that data
        not yet decoded; a ``(data, name)`` pair, an event named ``name``
        (``SSEDecoder``'s shortcuts).
        """
        if self.done:
            self.ignored_after_done += 1
            return
        if type(event) is tuple:
            data, event_type = event
            if type(data) is bytes:
                data = data.decode("utf-8", "replace")
        elif type(event) is str:
            data = event
            event_type = "message"
        elif type(event) is bytes:
            data = event.decode("utf-8", "replace")
            event_type = "message"
        else:
            data = event.data  # type: ignore[union-attr]
            event_type = event.event  # type: ignore[union-attr]
        redacting = self._redacting
        if redacting:
            data = self._redactor.text(data)
            event_type = self._redactor.text(event_type)
        if event_type == "error":
            try:
                payload: Any = self._redactor.value(_loads_checked(data))
            except (ValueError, RecursionError):
                payload = data
            self._report_error(payload, out)
            return
        try:
            chunk = _json.loads(data)
        except (ValueError, RecursionError):
            try:
                chunk = _json.loads_stdlib(data)
            except (ValueError, RecursionError) as exc:
                if data.strip() == "[DONE]":
                    self.ignored_events += 1
                    return
                self._skip(f"invalid JSON: {_first_line(exc)}", data, out)
                return
        if type(chunk) is not dict:
            self._skip(f"JSON {type(chunk).__name__}, not an object", data, out)
            return
        if redacting and "\\u00" in data:  # a secret may hide behind JSON escapes
            chunk = self._redactor.value(chunk)
        kind = chunk.get("type")
        try:
            handler = self._handlers.get(kind)
        except TypeError:  # an unhashable type: a list, an object
            handler = None
        if handler is None:
            if type(kind) is not str:
                kind = event_type if event_type != "message" else None
                if kind is None:
                    if chunk.get("error"):
                        self._report_error(chunk, out)
                    elif "choices" in chunk:  # the commonest mistake: the wrong api
                        self._skip('a Chat Completions chunk (choices, no type): is this '
                                   'model\'s api "chat"?', data, out)
                    else:
                        self._skip("an event with neither a type nor an event name", data, out)
                    return
                handler = self._handlers.get(kind)
            if handler is None:
                foreign = other_dialect(kind) if type(kind) is str else None
                if foreign and foreign[0] != self.api:
                    self._skip(foreign[1], data, out)  # another dialect's event: the wrong api
                else:
                    self.ignored_events += 1
                return
        handler(self, chunk, data, out)

    def interpret_all(self, events: Sequence[ServerSentEvent | str | bytes | tuple[Any, str]],
                      out: list[CoreEvent], fold: Accumulator | None = None) -> None:
        """``interpret_into`` for each event in order (the parser's hot path).

        The common case (a ``(data, name)`` pair whose data is a JSON object of
        a known type, undecoded, nothing for the redactor in it: see
        ``ChatChunkInterpreter.interpret_all``) is read here without a call per
        event; every other event goes through ``interpret_into``.  ``fold`` is
        the accumulator when no one reads the events: the tool calls' argument
        fragments go straight into it, unbuilt (the other events are built).
        """
        self._fold = fold
        handlers = self._handlers
        loads = _json.for_bytes(_json.loads)
        secrets = self._redactor.encoded
        for event in events:
            if type(event) is tuple and not self.done:
                data, name = event
                if name != "error" and type(data) is bytes and not (secrets and (
                        _unsafe(data, secrets) or any(s in name.encode() for s in secrets))):
                    try:
                        chunk = loads(data)
                    except (ValueError, RecursionError):
                        pass
                    else:
                        if type(chunk) is dict:
                            kind = chunk.get("type")
                            handler = handlers.get(kind) if type(kind) is str else None
                            if handler is not None:
                                handler(self, chunk, data, out)
                                continue
            self.interpret_into(event, out)

    # -- shared helpers -----------------------------------------------------------------

    def _report_error(self, payload: Any, out: list[CoreEvent]) -> None:
        out.append(ErrorReported(self._error(payload), self._stream, self._content_key))

    def _error(self, payload: Any) -> StreamError:
        """The ``StreamError`` an error event stands for (each dialect spells it its way)."""
        from .chat import error_from_payload

        return error_from_payload(payload)

    def _info(self, response_id: Any, model: Any, out: list[CoreEvent]) -> None:
        """A ``ResponseInfo`` when the id or model is new or changed (``None`` changes nothing)."""
        meta = self._meta
        if response_id is None and model is None:
            return
        if response_id is None:
            response_id = meta[0]
        if model is None:
            model = meta[1]
        if (response_id, model) != meta:
            self._meta = (response_id, model)
            out.append(ResponseInfo(_str_or_none(response_id), _str_or_none(model), None,
                                    self._stream, self._content_key))

    def _skip(self, reason: str, data: str | bytes, out: list[CoreEvent]) -> None:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        if self.strict:
            raise MalformedFrame(reason, text)
        out.append(FrameSkipped(reason, text[:_EXCERPT], self._stream, self._content_key))

    def _index(self, value: Any, what: str, data: str | bytes, out: list[CoreEvent]) -> int | None:
        """``value`` as a non-negative integer index, else a skipped frame and ``None``."""
        if type(value) is not int:
            self._skip(f"{what} {_short(value)} is not an integer" if value is not None
                       else f"{what} is missing", data, out)
            return None
        if value < 0:
            self._skip(f"{what} {value} is negative", data, out)
            return None
        return value

class CallPart:
    """One content block's (Anthropic) or output item's (Responses) share of a tool call."""

    __slots__ = ("check", "held", "settled", "stopped")

    def __init__(self) -> None:
        self.held: list[str] = []  # fragments not yet given (see ``SplitCall``)
        self.stopped = False
        self.settled = False  # given in full: a late fragment is given at once
        self.check = False  # held while it may be a repeat of the whole call


class SplitCall:
    """One tool call, which may come in several parts: a relay bridging another API
    (LiteLLM's ``/v1/messages``) may split one call into several ``tool_use`` blocks
    naming the same id, or several ``function_call`` items naming the same
    ``call_id``, each with a fragment of the arguments.  Every part continues the
    call (one ``ToolCallDelta`` stream under one tool index): arguments concatenate
    in the order the parts were opened, and the call is whole when its last part
    stops.

    A part's fragments are given at once while it is the call's earliest open part;
    a later part's fragments are held until every part before it stopped (so two
    parts open at once never interleave).  A part that opens after the call's
    arguments already form a JSON value is held while its fragments are a prefix
    of those arguments: when it stops repeating them exactly it is a repeat of
    the whole call (``stop`` counts it; nothing is given), otherwise it continues
    the call like any other part.
    """

    __slots__ = ("_fold", "_key", "_parts", "_stream", "arguments", "closed", "name",
                 "tool_index")

    def __init__(self, tool_index: int, name: Any, stream: str, content_key: str,
                 fold: Accumulator | None = None) -> None:
        self.tool_index = tool_index
        #: The first name the call was given (a later part's other name is not used).
        self.name = name
        #: The fragments given so far, in order.
        self.arguments: list[str] = []
        #: The content ended (Anthropic ``message_delta``): later parts are refused.
        self.closed = False
        self._parts: list[CallPart] = []  # the parts not yet settled, in order; [0] is live
        self._stream = stream
        self._key = content_key
        self._fold = fold  # the accumulator fragments go into unbuilt, when no one reads them

    def open(self) -> CallPart:
        """A new part of this call (the first, or a continuation)."""
        part = CallPart()
        self._parts.append(part)
        if len(self._parts) == 1:
            self._promote(part)
        return part

    def add(self, part: CallPart, fragment: str, out: list[CoreEvent]) -> None:
        """A fragment of ``part``'s arguments."""
        parts = self._parts
        if part.settled or (part is parts[0] and not part.check):
            self.give(fragment, out)
            return
        part.held.append(fragment)
        if part is parts[0] and not "".join(self.arguments).startswith(
                "".join(part.held)):
            part.check = False  # not a repeat: a continuation
            self._release(part, out)

    def stop(self, part: CallPart, out: list[CoreEvent]) -> int:
        """``part`` stopped; returns how many parts were dropped as repeats."""
        part.stopped = True
        repeats = 0
        parts = self._parts
        while parts and parts[0].stopped:
            head = parts.pop(0)
            head.settled = True
            if head.check and "".join(head.held) == "".join(self.arguments):
                repeats += 1  # the whole call again: nothing new
            else:
                self._release(head, out)
            if parts:
                self._promote(parts[0])
                if not parts[0].check:
                    self._release(parts[0], out)
        return repeats

    def flush(self, out: list[CoreEvent]) -> None:
        """The content ended: every held fragment is given, in order."""
        for part in self._parts:
            part.settled = True
            self._release(part, out)
        self._parts.clear()

    def _promote(self, part: CallPart) -> None:
        part.check = bool(self.arguments) and _is_json("".join(self.arguments))
        if part.check and not "".join(self.arguments).startswith("".join(part.held)):
            part.check = False

    def _release(self, part: CallPart, out: list[CoreEvent]) -> None:
        if part.held:
            text = "".join(part.held)
            part.held.clear()
            self.give(text, out)

    def give(self, fragment: str, out: list[CoreEvent]) -> None:
        """Give ``fragment`` now, after every fragment given before."""
        self.arguments.append(fragment)
        fold = self._fold
        if fold is None:
            out.append(ToolCallDelta(0, self.tool_index, None, None, None, fragment,
                                     self._stream, self._key))
        else:  # the same fold as that event's, after every event before it
            if out:
                fold.extend(out)
                out.clear()
            fold.arguments(0, self.tool_index, fragment)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _str_value(value: Any) -> str | None:
    """A non-empty string, else ``None``."""
    return value if type(value) is str and value else None


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None
