"""The OpenAI chat-completions dialect: one server-sent event in, normalized events out.

``ChatChunkInterpreter`` knows what a ``chat.completion.chunk`` looks like and
nothing about bytes or sockets.  Its rules:

- ``[DONE]`` is recognised before any JSON parsing; every event after it is
  ignored and counted (``ignored_after_done``).
- ``event: error``, or a chunk with an ``error`` key, is an error, whatever
  its shape: ``{"error": {...}}``, ``{"error": "text"}``, ``{"message": ...}``.
- Per ``choices[i]``: ``delta.content`` is reported only when it is a non-empty
  string, exactly as sent; ``reasoning_content`` / ``reasoning`` and
  ``refusal`` likewise; each ``tool_calls[j]`` as a fragment; ``finish_reason``
  as sent.  Role-only and empty deltas report nothing but the first role.
- ``usage`` is reported when it is an object (``null`` never erases it).
- A frame that is not a JSON object is skipped and reported as
  ``FrameSkipped`` (resilient mode), or raises ``MalformedFrame`` (strict mode).
  So is a choice or tool-call index that is negative, not an integer, or new
  past ``max_choices`` distinct choices (``max_tool_calls`` calls a choice):
  a hostile server cannot make fanout keep a million choices.
- ``"error": null`` (or ``false``, ``{}``, ``""``) in a chunk is no error.
- Numbers: integers outside the 64-bit range become floats (infinite past
  the double range), with orjson and with the standard library alike.
- Every string passes the stream's ``Redactor`` before anything is built
  from it (see ``redact.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

from .._exceptions import EventTooLarge, MalformedFrame
from . import _json
from .events import (
    ChoiceFinished,
    ChoiceRole,
    CoreEvent,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    TextDelta,
    ToolCallDelta,
    UsageReported,
)
from .redact import Redactor
from .result import StreamError, Usage
from .sse import ServerSentEvent, SSEDecoder

if TYPE_CHECKING:
    from .accumulate import Accumulator

__all__ = [
    "MAX_CHOICES",
    "MAX_TOOL_CALLS",
    "ChatChunkInterpreter",
    "completion_events",
    "error_from_payload",
    "error_from_response",
]

_EXCERPT = 200
#: Distinct choice indexes one stream may open (the OpenAI API allows n <= 128).
MAX_CHOICES = 128
#: Distinct tool calls one choice may open.
MAX_TOOL_CALLS = 128
_NO_REDACTION = Redactor()


@final
class ChatChunkInterpreter:
    """Turns the server-sent events of one chat-completion stream into normalized events.

    ``stream`` and ``content_key`` are copied onto every event.  In strict mode
    a malformed frame raises ``MalformedFrame``; in resilient mode (the
    default) it becomes a ``FrameSkipped`` event and interpretation goes on.
    """

    __slots__ = (
        "_appends",
        "_bytes_loads",
        "_choices",
        "_content_key",
        "_fold",
        "_loads",
        "_max_choices",
        "_max_tool_calls",
        "_meta",
        "_redactor",
        "_roles",
        "_stream",
        "_text_loads",
        "_tools",
        "done",
        "ignored_after_done",
        "strict",
    )

    def __init__(self, *, strict: bool = False, stream: str = "", content_key: str = "",
                 redactor: Redactor | None = None, max_choices: int = MAX_CHOICES,
                 max_tool_calls: int = MAX_TOOL_CALLS) -> None:
        self.strict = strict
        self.done = False
        self.ignored_after_done = 0
        self._stream = stream
        self._content_key = content_key
        self._redactor = redactor if redactor else _NO_REDACTION
        self._max_choices = max_choices
        self._max_tool_calls = max_tool_calls
        self._roles: set[int] = set()
        self._choices: set[int] = set()
        self._tools: dict[int, set[int | str]] = {}
        self._meta: tuple[Any, Any, Any] = (None, None, None)
        self._loads = _json.loads
        self._text_loads = self._loads
        self._bytes_loads = _json.for_bytes(self._loads)
        # interpret_all's fold: each choice's text list's append, for that accumulator
        self._fold: Accumulator | None = None
        self._appends: dict[int, Callable[[str], None]] = {}

    def interpret(self, event: ServerSentEvent) -> list[CoreEvent]:
        """Return the normalized events one server-sent event carries."""
        out: list[CoreEvent] = []
        self.interpret_into(event, out)
        return out

    def interpret_into(self, event: ServerSentEvent | str | bytes, out: list[CoreEvent]) -> None:
        """Like ``interpret``, appending to ``out``.

        A plain ``str`` is the data of a ``message`` event; ``bytes``, that data
        not yet decoded (``SSEDecoder``'s shortcuts).
        """
        if self.done:
            self.ignored_after_done += 1
            return
        if type(event) is str:
            data = event
            event_type = "message"
        elif type(event) is bytes:
            data = event.decode("utf-8", "replace")
            event_type = "message"
        else:
            data = event.data  # type: ignore[union-attr]
            event_type = event.event  # type: ignore[union-attr]
        stream = self._stream
        key = self._content_key
        if data == "[DONE]" or (data[:1] != "{" and data.strip() == "[DONE]"):
            self.done = True
            out.append(DoneReceived(stream, key))
            return
        redactor = self._redactor
        if redactor:
            data = redactor.text(data)
            event_type = redactor.text(event_type)
        if event_type == "error":
            try:
                payload = redactor.value(_loads_checked(data))
            except (ValueError, RecursionError):
                payload = data
            out.append(ErrorReported(error_from_payload(payload), stream, key))
            return
        try:
            chunk = self._loads(data)
        except (ValueError, RecursionError):
            try:  # the standard library is the referee of what is JSON
                chunk = _json.loads_stdlib(data)
            except (ValueError, RecursionError) as exc:
                self._skip(f"invalid JSON: {_first_line(exc)}", data, out)
                return
        if type(chunk) is not dict:
            self._skip(f"JSON {type(chunk).__name__}, not an object", data, out)
            return
        if redactor and "\\u00" in data:  # a secret may hide behind JSON escapes
            chunk = redactor.value(chunk)
        self._chunk(chunk, data, out)

    def interpret_all(self, events: Sequence[ServerSentEvent | str | bytes], out: list[CoreEvent],
                      fold: Accumulator | None = None) -> None:
        """``interpret_into`` for each event in order (the parser's hot path).

        An undecoded payload (``bytes``: valid UTF-8 parses straight from them)
        of the commonest shape, one choice whose delta is only ``content`` or
        only one tool call's ``arguments`` fragment, is read here without a
        call.  With ``fold`` (no consumer wants the events: ``parse_stream``)
        its text or fragment goes straight into that accumulator, and the
        events of ``out`` are folded first, so the order is kept; the caller
        folds what is left in ``out``.  Anything else goes through
        ``interpret_into`` / ``_chunk``, as do payloads where the redactor may
        have work (a secret's bytes in them, or a ``\\u00`` escape).
        """
        if self._loads is not self._text_loads:  # a test swapped the JSON parser
            self._text_loads = self._loads
            self._bytes_loads = _json.for_bytes(self._loads)
        loads = self._bytes_loads
        secrets = self._redactor.encoded
        seen = self._choices
        stream, key = self._stream, self._content_key
        if fold is not None and fold is not self._fold:
            self._fold = fold
            self._appends.clear()
        for event in events:
            if type(event) is not bytes or self.done or (secrets and _unsafe(event, secrets)):
                self.interpret_into(event, out)
                continue
            try:
                chunk = loads(event)  # [DONE] is no JSON: it fails here
            except (ValueError, RecursionError):
                chunk = None
            if type(chunk) is not dict:  # not UTF-8, not JSON, not an object: the referee
                self.interpret_into(event, out)
                continue
            meta = self._meta
            choices = chunk.get("choices")
            if (chunk.get("error") or type(choices) is not list or len(choices) != 1
                    or chunk.get("id") != meta[0] or chunk.get("model") != meta[1]
                    or chunk.get("system_fingerprint") != meta[2]):
                self._chunk(chunk, event, out)
                continue
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            index = choice.get("index", 0) if type(delta) is dict else None
            if type(index) is not int or index not in seen or len(delta) != 1:  # type: ignore[arg-type]
                self._chunk(chunk, event, out)
                continue
            content = delta.get("content")  # type: ignore[union-attr]
            if type(content) is str:
                if content:
                    if fold is None:
                        out.append(TextDelta(index, content, stream, key))
                    else:
                        if out:  # keep the order: what came before is folded first
                            fold.extend(out)
                            out.clear()
                        append = self._appends.get(index)
                        if append is None:
                            append = self._appends[index] = fold.texts(index).append
                        append(content)
                        fold.content_events += 1
            else:
                calls = delta.get("tool_calls")  # type: ignore[union-attr]
                call = calls[0] if type(calls) is list and len(calls) == 1 else None
                function = call.get("function") if type(call) is dict and len(call) == 2 \
                    else None
                arguments = function.get("arguments") if type(function) is dict \
                    and len(function) == 1 else None
                tool_index = call.get("index") if type(arguments) is str else None  # type: ignore[union-attr]
                if type(tool_index) is not int or tool_index not in self._tools.get(index, ()):
                    self._chunk(chunk, event, out)
                    continue
                if fold is None:
                    out.append(ToolCallDelta(index, tool_index, None, None, None,
                                             arguments, stream, key))  # type: ignore[arg-type]
                else:
                    if out:
                        fold.extend(out)
                        out.clear()
                    fold.arguments(index, tool_index, arguments)  # type: ignore[arg-type]
            finish_reason = choice.get("finish_reason")
            if finish_reason is not None and finish_reason != "":
                out.append(ChoiceFinished(index, str(finish_reason), stream, key))
            usage = chunk.get("usage")
            if usage and type(usage) is dict:
                out.append(UsageReported(Usage.from_dict(usage), stream, key))

    def _chunk(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        """The events of one parsed chunk (``data``: its text, for skipped frames)."""
        stream = self._stream
        key = self._content_key
        if chunk.get("error"):  # null, false, {} and "" are no error
            out.append(ErrorReported(error_from_payload(chunk), stream, key))
            return

        meta = self._meta
        response_id = chunk.get("id")
        model = chunk.get("model")
        fingerprint = chunk.get("system_fingerprint")
        if response_id != meta[0] or model != meta[1] or fingerprint != meta[2]:
            self._meta = (response_id, model, fingerprint)
            out.append(ResponseInfo(_str_or_none(response_id), _str_or_none(model),
                                    _str_or_none(fingerprint), stream, key))

        choices = chunk.get("choices")
        if choices and type(choices) is list:
            for choice in choices:
                if type(choice) is not dict:
                    self._skip("a choice is not an object", data, out)
                    continue
                index = choice.get("index", 0)
                if type(index) is not int:
                    if index is not None:
                        self._skip(f"choice index {_short(index)} is not an integer", data,
                                   out)
                        continue
                    index = 0
                if index not in self._choices and not self._new_choice(index, data, out):
                    continue
                delta = choice.get("delta")
                if delta and type(delta) is dict:
                    content = delta.get("content")
                    if len(delta) == 1 and content is not None:
                        # The hot path: `{"content": "..."}` and nothing else.
                        if content and type(content) is str:
                            out.append(TextDelta(index, content, stream, key))
                    else:
                        self._delta(index, delta, content, data, out)
                finish_reason = choice.get("finish_reason")
                if finish_reason is not None and finish_reason != "":
                    out.append(ChoiceFinished(index, str(finish_reason), stream, key))

        elif choices is None and type(chunk.get("type")) is str:
            foreign = other_dialect(chunk["type"])
            if foreign:  # no chat chunk at all: say what it looks like (the wrong api)
                self._skip(foreign[1], data, out)
                return

        usage = chunk.get("usage")
        if usage and type(usage) is dict:
            out.append(UsageReported(Usage.from_dict(usage), stream, key))

    def _delta(
        self, index: int, delta: dict[str, Any], content: Any, data: str | bytes,
        out: list[CoreEvent]
    ) -> None:
        stream = self._stream
        key = self._content_key
        role = delta.get("role")
        if role and index not in self._roles and type(role) is str:
            self._roles.add(index)
            out.append(ChoiceRole(index, role, stream, key))
        reasoning = delta.get("reasoning_content")
        if not reasoning or type(reasoning) is not str:
            reasoning = delta.get("reasoning")
        if reasoning and type(reasoning) is str:
            out.append(ReasoningDelta(index, reasoning, stream, key))
        if content and type(content) is str:
            out.append(TextDelta(index, content, stream, key))
        refusal = delta.get("refusal")
        if refusal and type(refusal) is str:
            out.append(RefusalDelta(index, refusal, stream, key))
        tool_calls = delta.get("tool_calls")
        if tool_calls and type(tool_calls) is list:
            for call in tool_calls:
                if type(call) is not dict:
                    self._skip("a tool call is not an object", data, out)
                    continue
                self._tool_call(index, call, data, out)

    def _new_choice(self, index: int, data: str | bytes, out: list[CoreEvent]) -> bool:
        if index < 0:
            self._skip(f"choice index {index} is negative", data, out)
            return False
        if len(self._choices) >= self._max_choices:
            self._skip(f"choice index {index} would be more than {self._max_choices} "
                       "distinct choices", data, out)
            return False
        self._choices.add(index)
        return True

    def _tool_call(self, index: int, call: dict[str, Any], data: str | bytes,
                   out: list[CoreEvent]) -> None:
        tool_index = call.get("index")
        if tool_index is not None and type(tool_index) is not int:
            self._skip(f"tool call index {_short(tool_index)} is not an integer", data, out)
            return
        seen = self._tools.get(index)
        if seen is None:
            seen = self._tools[index] = set()
        call_id = call.get("id")
        tool_key: int | str | None = tool_index if tool_index is not None else (
            call_id if call_id and type(call_id) is str else None)
        if tool_key is not None and tool_key not in seen:
            if type(tool_key) is int and tool_key < 0:
                self._skip(f"tool call index {tool_key} is negative", data, out)
                return
            if len(seen) >= self._max_tool_calls:
                self._skip(f"tool call {_short(tool_key)} would be more than "
                           f"{self._max_tool_calls} tool calls in choice {index}", data, out)
                return
            seen.add(tool_key)
        function = call.get("function")
        name = arguments = None
        if type(function) is dict:
            name = function.get("name")
            arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif type(arguments) is not str:
            # Some relays send the arguments as a JSON value, not a string.
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(ToolCallDelta(index, tool_index, _str_or_none(call.get("id")),
                                 _str_or_none(call.get("type")), _str_or_none(name), arguments,
                                 self._stream, self._content_key))

    def _skip(self, reason: str, data: str | bytes, out: list[CoreEvent]) -> None:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        if self.strict:
            raise MalformedFrame(reason, text)
        out.append(FrameSkipped(reason, text[:_EXCERPT], self._stream, self._content_key))


#: Event types no chat chunk has, that only the other dialects' streams carry.
_ANTHROPIC_TYPES = frozenset(("message_start", "content_block_start", "content_block_delta",
                              "content_block_stop", "message_delta", "message_stop"))


_IS_IT = "is this model's api \"%s\"?"


def _unsafe(payload: bytes, secrets: tuple[bytes, ...]) -> bool:
    """The redactor may have work in ``payload``: a secret's bytes, or a ``\\u00``
    escape (a secret spelt with escapes) are in it."""
    if b"\\u00" in payload:
        return True
    for secret in secrets:  # noqa: SIM110 - a loop, not any(): no generator per chunk
        if secret in payload:
            return True
    return False


def other_dialect(kind: str) -> tuple[str, str] | None:
    """``(api, why)`` for an event type only that dialect's streams carry, else ``None``:
    seen in a stream of another dialect, the model's ``api`` is likely wrong."""
    if kind in _ANTHROPIC_TYPES:
        return "anthropic", f"an Anthropic Messages event ({kind}): {_IS_IT % 'anthropic'}"
    if kind.startswith("response.") and len(kind) < 80:
        return "responses", f"a Responses API event ({kind}): {_IS_IT % 'responses'}"
    return None


def completion_events(payload: Any, stream: str = "", content_key: str = "",
                      redactor: Redactor | None = None) -> list[CoreEvent]:
    """The events a non-streaming ``chat.completion`` body stands for.

    A relay may answer a streaming request with one JSON completion; its
    ``message`` becomes one delta per field, then its finish reason, usage,
    and ``DoneReceived`` (the answer is whole).  An ``error`` body becomes an
    error; anything else a ``FrameSkipped`` and no ``DoneReceived``.
    """
    out: list[CoreEvent] = []
    if redactor:
        payload = redactor.value(payload)
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        if isinstance(payload, dict) and payload.get("error"):
            return [ErrorReported(error_from_payload(payload), stream, content_key)]
        text = payload if isinstance(payload, str) else _compact(payload)
        return [FrameSkipped("the body is neither a stream nor a chat completion",
                             text[:_EXCERPT], stream, content_key)]
    out.append(ResponseInfo(_str_or_none(payload.get("id")), _str_or_none(payload.get("model")),
                            _str_or_none(payload.get("system_fingerprint")), stream, content_key))
    chunk_choices = []
    for choice in payload["choices"]:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        delta: dict[str, Any] = dict(message) if isinstance(message, dict) else {}
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(calls)
                                   if isinstance(c, dict)]
        chunk_choices.append({"index": choice.get("index", 0), "delta": delta,
                              "finish_reason": choice.get("finish_reason")})
    interpreter = ChatChunkInterpreter(stream=stream, content_key=content_key)
    interpreter._meta = (payload.get("id"), payload.get("model"), payload.get("system_fingerprint"))
    chunk = {"choices": chunk_choices, "usage": payload.get("usage"), "id": payload.get("id"),
             "model": payload.get("model"), "system_fingerprint": payload.get("system_fingerprint")}
    interpreter.interpret_into(ServerSentEvent(json.dumps(chunk)), out)
    out.append(DoneReceived(stream, content_key))
    return out


def error_from_payload(payload: Any, status: int | None = None) -> StreamError:
    """Build a ``StreamError`` from whatever an upstream sent as an error.

    Understands ``{"error": {"message", "type", "code"}}``, ``{"error": "text"}``,
    ``{"message": ..., "type": ..., "code": ...}``, ``{"detail": ...}`` and plain
    text; anything else is kept as compact JSON so no detail is lost.
    """
    if isinstance(payload, Mapping):
        inner = payload.get("error")
        if isinstance(inner, Mapping):
            source: Mapping[str, Any] = inner
        elif isinstance(inner, str) and inner:
            return StreamError(inner, _str_or_none(payload.get("type")),
                               _code(payload.get("code")), status)
        else:
            source = payload
        message = source.get("message")
        if not isinstance(message, str) or not message:
            detail = source.get("detail", payload.get("detail"))
            message = detail if isinstance(detail, str) and detail else _compact(payload)
        return StreamError(message, _str_or_none(source.get("type")),
                           _code(source.get("code")), status)
    if isinstance(payload, str):
        text = payload.strip()
        return StreamError(text or "empty error payload", None, None, status)
    return StreamError(_compact(payload), None, None, status)


def error_from_response(status: int, body: bytes, reason: str = "") -> StreamError:
    """Build a ``StreamError`` for a non-2xx HTTP response from its (bounded) body.

    The body is read as JSON; failing that, as an event stream (a relay that
    streams its error: ``data: {"error": ...}``, Anthropic's ``event: error``),
    whose error event (else its first event) is the payload, read as JSON when it
    is; failing that, as text.
    """
    text = body.decode("utf-8", "replace").strip()
    if text:
        try:
            payload: Any = _loads_checked(text)
        except (ValueError, RecursionError):
            payload = _event_stream_payload(body)
            if payload is None:
                payload = text[:2000]
    else:
        payload = f"HTTP {status} {reason}".strip()
    return error_from_payload(payload, status)


def _event_stream_payload(body: bytes) -> Any:
    """The error an event-stream body holds, or None when it holds no event."""
    decoder = SSEDecoder()
    try:
        events = decoder.feed(body + b"\n\n")  # the whole body: its last event ends here
    except EventTooLarge:
        return None
    first: Any = None
    for event in events:
        data = event.data.strip()
        if not data or data == "[DONE]":
            continue
        try:
            value: Any = _loads_checked(data)
        except (ValueError, RecursionError):
            value = data[:2000]
        if event.event == "error" or (isinstance(value, Mapping) and value.get("error")):
            return value
        if first is None:
            first = value
    return first


def _loads_checked(text: str) -> Any:
    try:
        return _json.loads(text)
    except (ValueError, RecursionError):
        return _json.loads_stdlib(text)


def _str_or_none(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    return str(value)


def _code(value: Any) -> str | None:
    return None if value is None else str(value)


def _compact(value: Any, limit: int = 2000) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))[:limit]
    except (TypeError, ValueError):
        return repr(value)[:limit]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
