"""The Anthropic Messages dialect (``/v1/messages``): typed events in, normalized events out.

A Messages stream frames its content in blocks and is complete only with
``message_stop``.  The mapping (one choice, index 0):

- ``message_start``: ``ResponseInfo`` (id, model), the role, ``UsageReported``
  (the input usage; output so far);
- ``content_block_start`` opens block ``index``: ``text``; ``thinking``;
  ``redacted_thinking`` (its opaque ``data`` kept, never shown); ``tool_use``
  (``ToolCallDelta`` with its id and name; tool indexes 0, 1, 2 in order of
  appearance, at most ``max_tool_calls``).  Other block types (server tools'
  use and results, new types) are counted in ``ignored_events``, with their
  deltas.  At most ``max_blocks`` blocks;
- ``content_block_delta``: ``text_delta`` → ``TextDelta``; ``thinking_delta`` →
  ``ReasoningDelta``; ``signature_delta`` → kept on the block;
  ``input_json_delta`` → an arguments fragment (``ToolCallDelta``).  A
  ``text_delta`` or ``thinking_delta`` for an index never started opens that
  block (its text is kept: relays that bridge another API may send no
  ``content_block_start``; counted in ``implicit_blocks``); any other delta
  for a block never started, or after its ``content_block_stop``, or of the
  wrong kind for its block, is skipped (never merged into another block);
  ``citations_delta`` and unknown deltas are counted and ignored;
- ``content_block_stop``: a thinking block is reported whole with its
  signature (``ThinkingBlockFinished``); a tool call whose blocks got no
  ``input_json_delta`` has the input its start gave (``{}`` when empty), given
  when the content ends (``message_delta``, else ``message_stop``): a later
  block may still continue the call;
- ``message_delta``: ``ChoiceFinished`` from ``delta.stop_reason`` mapped by
  ``STOP_REASONS`` (native: the reason; an unknown one, e.g. ``pause_turn``, is
  kept as sent) and ``UsageReported`` (the cumulative output usage merged
  over the input usage);
- ``message_stop``: ``DoneReceived``; ``ping``: nothing (a keep-alive, not counted);
- ``error`` (``event: error`` or ``"type": "error"``): ``ErrorReported`` whose
  ``type`` and ``code`` are the error's type (``overloaded_error``).

A ``tool_use`` block repeating the id of an earlier call (at any index, even
after that call's blocks stopped) continues that call (LiteLLM's bridge splits
one call into a block per fragment): no second call, the same tool index, no
second announcement; arguments concatenate in block order and the call is whole
when its last block stops (``SplitCall``).  The first name is kept (a block
naming the call under another name is a skipped frame that says so; a name
fills a call that had none).  A block that repeats the whole call (its
fragments equal the call's arguments, already JSON) adds nothing and is
counted in ``ignored_events``; so does the very same block started again while
open.  A block continuing a call after ``message_delta`` is skipped.  A
different block on an index already started replaces it (the first keeps
what it had, later deltas go to the new one), so two tools' arguments are
never merged.  A tool ``input`` given whole in
``content_block_start`` is used as its arguments; ``input_json_delta`` for such
a block is then skipped.

Usage: ``prompt_tokens`` = ``input_tokens`` + ``cache_creation_input_tokens`` +
``cache_read_input_tokens`` (the whole prompt, as chat counts it),
``completion_tokens`` = ``output_tokens``, ``total_tokens`` their sum;
``raw`` keeps the merged usage as sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, final

from . import _json
from ._dialect import (
    CallPart,
    DialectInterpreter,
    Handler,
    SplitCall,
    _int_or_none,
    _str_value,
)
from .chat import _compact, _short, _str_or_none
from .events import (
    ChoiceFinished,
    ChoiceRole,
    CoreEvent,
    DoneReceived,
    ErrorReported,
    FrameSkipped,
    ReasoningDelta,
    TextDelta,
    ThinkingBlockFinished,
    ToolCallDelta,
    UsageReported,
)
from .redact import Redactor
from .result import StreamError, ThinkingBlock, Usage
from .sse import ServerSentEvent

if TYPE_CHECKING:
    from .accumulate import Accumulator

__all__ = ["STOP_REASONS", "AnthropicInterpreter", "anthropic_body_events", "anthropic_usage"]

#: ``stop_reason`` → chat finish reason (any other is kept as sent).
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_KINDS = ("text", "thinking", "redacted_thinking", "tool_use")
_DELTA_KINDS = {"text_delta": "text", "thinking_delta": "thinking",
                "signature_delta": "thinking", "input_json_delta": "tool_use"}


class _Block:
    __slots__ = ("call", "data", "id", "index", "kind", "part", "signature", "stopped",
                 "thinking", "whole")

    def __init__(self, index: int, kind: str, block_id: str | None) -> None:
        self.index = index
        self.kind = kind
        self.id = block_id
        self.stopped = False
        self.call: SplitCall | None = None  # a tool_use block's call
        self.part: CallPart | None = None  # and its share of it
        self.whole = False  # the input came whole in content_block_start
        self.thinking: list[str] = []
        self.signature: str | None = None
        self.data: str | None = None


@final
class AnthropicInterpreter(DialectInterpreter):
    """Turns the server-sent events of one Messages stream into normalized events.

    Same keywords and modes as ``ChatChunkInterpreter`` (``max_tool_calls``
    caps the tool_use blocks, ``max_blocks`` all blocks).
    """

    terminal: ClassVar[str] = "message_stop"
    api: ClassVar[str] = "anthropic"
    __slots__ = ("_blocks", "_by_id", "_calls", "_opened", "_role", "_tools", "_usage",
                 "continued_blocks", "implicit_blocks")

    def __init__(self, *, strict: bool = False, stream: str = "", content_key: str = "",
                 redactor: Redactor | None = None, max_tool_calls: int = 128,
                 max_blocks: int = 1024) -> None:
        self._blocks: dict[int, _Block] = {}
        self._calls: list[SplitCall] = []  # every tool call, in order
        self._by_id: dict[str, SplitCall] = {}  # tool calls by their id
        self._opened = 0
        self._tools = 0
        self._role = False
        self._usage: dict[str, Any] = {}
        #: Blocks opened by a text or thinking delta without their ``content_block_start``.
        self.implicit_blocks = 0
        #: ``tool_use`` blocks that continued an earlier call (repeating its id).
        self.continued_blocks = 0
        super().__init__(strict=strict, stream=stream, content_key=content_key,
                         redactor=redactor, max_tool_calls=max_tool_calls,
                         max_blocks=max_blocks)

    def _table(self) -> dict[str, Handler]:
        return _HANDLERS

    def interpret_all(self, events: Sequence[ServerSentEvent | str | bytes | tuple[Any, str]],
                      out: list[CoreEvent], fold: Accumulator | None = None) -> None:
        """``interpret_into`` for each event in order (the parser's hot path): a text
        delta to an open text block, nearly every event, is read without a call."""
        self._fold = fold  # the calls' fragments go into it unbuilt
        if self._redacting:
            super().interpret_all(events, out, fold)
            return
        loads = _json.for_bytes(_json.loads)
        handlers = self._handlers
        blocks = self._blocks
        stream, key = self._stream, self._content_key
        for event in events:
            if type(event) is tuple and not self.done and event[1] != "error" \
                    and type(event[0]) is bytes:
                data = event[0]
                try:
                    chunk = loads(data)
                except (ValueError, RecursionError):
                    chunk = None
                if type(chunk) is dict:
                    kind = chunk.get("type")
                    if kind == "content_block_delta":
                        index = chunk.get("index")
                        block = blocks.get(index) if type(index) is int else None
                        delta = chunk.get("delta")
                        if block is not None and block.kind == "text" and not block.stopped \
                                and type(delta) is dict and delta.get("type") == "text_delta":
                            text = delta.get("text")
                            if text and type(text) is str:
                                if fold is None:
                                    out.append(TextDelta(0, text, stream, key))
                                else:  # no one reads the events: folded unbuilt, in order
                                    if out:
                                        fold.extend(out)
                                        out.clear()
                                    fold.texts(0).append(text)
                                    fold.content_events += 1
                            continue
                    handler = handlers.get(kind) if type(kind) is str else None
                    if handler is not None:
                        handler(self, chunk, data, out)
                        continue
            self.interpret_into(event, out)

    def _delta(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        index = chunk.get("index")
        block = self._blocks.get(index) if type(index) is int else None
        delta = chunk.get("delta")
        if block is None and type(index) is int and index >= 0:
            block = self._implicit(index, delta)
        if block is None or block.stopped:
            self._block(chunk, "content_block_delta", data, out)  # says why it is skipped
            return
        if block.kind == "text" and type(delta) is dict and delta.get("type") == "text_delta":
            text = delta.get("text")  # the hot path
            if text and type(text) is str:
                out.append(TextDelta(0, text, self._stream, self._content_key))
            return
        if type(delta) is not dict:
            self._skip(f"content_block_delta for block {block.index} without a delta object",
                       data, out)
            return
        kind = delta.get("type")
        wanted = _DELTA_KINDS.get(kind) if type(kind) is str else None
        if wanted is None or block.kind not in _KINDS:
            self.ignored_events += 1  # citations_delta, new delta types, server-tool blocks
            return
        if wanted != block.kind:
            self._skip(f"{kind} for block {block.index}, a {block.kind} block", data, out)
            return
        if kind == "text_delta":
            text = delta.get("text")
            if text and type(text) is str:
                out.append(TextDelta(0, text, self._stream, self._content_key))
        elif kind == "thinking_delta":
            text = delta.get("thinking")
            if text and type(text) is str:
                block.thinking.append(text)
                out.append(ReasoningDelta(0, text, self._stream, self._content_key))
        elif kind == "signature_delta":
            signature = delta.get("signature")
            if type(signature) is str:
                block.signature = signature
        else:
            if block.whole:
                self._skip(f"input_json_delta for block {block.index}, whose input came whole "
                           "in content_block_start", data, out)
                return
            fragment = delta.get("partial_json")
            if fragment and type(fragment) is str and block.call and block.part:
                block.call.add(block.part, fragment, out)

    def _implicit(self, index: int, delta: Any) -> _Block | None:
        """The block a text or thinking delta opens when no ``content_block_start`` came
        for its index (a relay bridging another API may never send one: LiteLLM #27442):
        its text is kept, as the Responses dialect keeps text for an item never added.
        A tool's arguments are not: without a start there is no tool name or id."""
        kind = delta.get("type") if type(delta) is dict else None
        wanted = "text" if kind == "text_delta" else "thinking" if kind == "thinking_delta" \
            else None
        if wanted is None or self._opened >= self._max_blocks:
            return None
        block = self._blocks[index] = _Block(index, wanted, None)
        self._opened += 1
        self.implicit_blocks += 1
        return block

    def _block(self, chunk: dict[str, Any], what: str, data: str | bytes,
               out: list[CoreEvent]) -> _Block | None:
        index = self._index(chunk.get("index"), f"{what} index", data, out)
        if index is None:
            return None
        block = self._blocks.get(index)
        if block is None:
            self._skip(f"{what} for block {index}, which was never started", data, out)
            return None
        if block.stopped:
            self._skip(f"{what} for block {index} after its content_block_stop", data, out)
            return None
        return block

    def _start(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        index = self._index(chunk.get("index"), "content_block_start index", data, out)
        if index is None:
            return
        content = chunk.get("content_block")
        if type(content) is not dict:
            self._skip(f"content_block_start for block {index} without a content_block object",
                       data, out)
            return
        kind = content.get("type")
        kind = kind if type(kind) is str else "unknown"
        block_id = _str_value(content.get("id"))
        known = self._blocks.get(index)
        if known is not None and known.kind == kind and known.id == block_id \
                and not known.stopped:
            self.ignored_events += 1  # the same block announced again
            return
        if self._opened >= self._max_blocks:
            self._skip(f"block {index} would be more than {self._max_blocks} content blocks",
                       data, out)
            return
        call = self._by_id.get(block_id) if kind == "tool_use" and block_id else None
        if call is not None:
            self._continue(call, index, content, data, out)
            return
        if kind == "tool_use" and self._tools >= self._max_tool_calls:
            self._skip(f"tool_use block {index} would be more than {self._max_tool_calls} "
                       "tool calls", data, out)
            return
        block = self._blocks[index] = _Block(index, kind, block_id)
        self._opened += 1
        stream, key = self._stream, self._content_key
        if kind == "text":
            text = content.get("text")
            if text and type(text) is str:
                out.append(TextDelta(0, text, stream, key))
        elif kind == "thinking":
            text = content.get("thinking")
            if text and type(text) is str:
                block.thinking.append(text)
                out.append(ReasoningDelta(0, text, stream, key))
            signature = content.get("signature")
            if signature and type(signature) is str:
                block.signature = signature
        elif kind == "redacted_thinking":
            block.data = _str_or_none(content.get("data"))
        elif kind == "tool_use":
            name = _str_or_none(content.get("name"))
            call = block.call = SplitCall(self._tools, name, stream, key, self._fold)
            self._tools += 1
            self._calls.append(call)
            if block_id:
                self._by_id[block_id] = call
            block.part = call.open()
            arguments = _whole_input(content.get("input"))
            if arguments:
                block.whole = True
                call.arguments.append(arguments)
            out.append(ToolCallDelta(0, call.tool_index, block_id, "function", name, arguments,
                                     stream, key))
        else:
            self.ignored_events += 1  # server_tool_use, web_search_tool_result, new types

    def _stop(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        index = self._index(chunk.get("index"), "content_block_stop index", data, out)
        if index is None:
            return
        block = self._blocks.get(index)
        if block is None:
            self._skip(f"content_block_stop for block {index}, which was never started", data,
                       out)
            return
        if block.stopped:
            self.ignored_events += 1  # a repeated stop
            return
        block.stopped = True
        if block.kind == "thinking" or block.kind == "redacted_thinking":
            redacted = block.kind == "redacted_thinking"
            out.append(ThinkingBlockFinished(
                0, ThinkingBlock(index, "".join(block.thinking), block.signature, redacted,
                                 block.data),
                self._stream, self._content_key))
        elif block.call is not None and block.part is not None:
            self.ignored_events += block.call.stop(block.part, out)

    def _continue(self, call: SplitCall, index: int, content: dict[str, Any], data: str | bytes,
                  out: list[CoreEvent]) -> None:
        """A ``tool_use`` block repeating the id of an earlier call continues that call
        (LiteLLM's ``/v1/messages`` splits one call into a block per fragment, each
        naming the call's id and name): no second call; its fragments go on the
        first call's arguments; the first name is kept."""
        if call.closed:
            self._skip(f"tool_use block {index} continues tool call {call.tool_index} after "
                       "message_delta ended the content", data, out)
            return
        name = _str_or_none(content.get("name"))
        if name and call.name and name != call.name:
            self._skip(f"tool_use block {index} repeats the id of tool call {call.tool_index} "
                       f"under another name ({_short(name)}): the call keeps its first name "
                       f"({_short(call.name)})", data, out)
        block = self._blocks[index] = _Block(index, "tool_use", _str_value(content.get("id")))
        self._opened += 1
        self.continued_blocks += 1
        block.call = call
        block.part = call.open()
        if name and not call.name:  # the first block had none: this one names the call
            call.name = name
            out.append(ToolCallDelta(0, call.tool_index, None, None, name, "", self._stream,
                                     self._content_key))
        arguments = _whole_input(content.get("input"))
        if arguments:
            block.whole = True
            call.add(block.part, arguments, out)

    def _close_calls(self, out: list[CoreEvent]) -> None:
        """The content ended (``message_delta``, else ``message_stop``): every call's held
        fragments are given, and a call that got none has the input its start gave
        (``{}``): not before, since a later block may continue it."""
        for call in self._calls:
            if call.closed:
                continue
            call.closed = True
            call.flush(out)
            if not call.arguments:
                call.give("{}", out)

    def _message_start(self, chunk: dict[str, Any], data: str | bytes,
                       out: list[CoreEvent]) -> None:
        message = chunk.get("message")
        if type(message) is not dict:
            self._skip("message_start without a message object", data, out)
            return
        self._info(message.get("id"), message.get("model"), out)
        role = message.get("role")
        if not self._role and role and type(role) is str:
            self._role = True
            out.append(ChoiceRole(0, role, self._stream, self._content_key))
        self._merge_usage(message.get("usage"), out)

    def _message_delta(self, chunk: dict[str, Any], data: str | bytes,
                       out: list[CoreEvent]) -> None:
        if self._calls:
            self._close_calls(out)
        delta = chunk.get("delta")
        if type(delta) is dict:
            reason = delta.get("stop_reason")
            if reason and type(reason) is str:
                out.append(ChoiceFinished(0, STOP_REASONS.get(reason, reason), self._stream,
                                          self._content_key, native_finish_reason=reason))
        self._merge_usage(chunk.get("usage"), out)

    def _merge_usage(self, usage: Any, out: list[CoreEvent]) -> None:
        if not usage or type(usage) is not dict:
            return
        merged = self._usage = {**self._usage,
                                **{k: v for k, v in usage.items() if v is not None}}
        out.append(UsageReported(anthropic_usage(merged), self._stream, self._content_key))

    def _message_stop(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        if self._calls:
            self._close_calls(out)
        self.done = True
        out.append(DoneReceived(self._stream, self._content_key))

    def _report(self, chunk: dict[str, Any], data: str | bytes, out: list[CoreEvent]) -> None:
        self._report_error(chunk, out)

    def _error(self, payload: Any) -> StreamError:
        error = super()._error(payload)
        if error.type and error.type != "error" and error.code is None:
            return StreamError(error.message, error.type, error.type, error.status)
        return error


def _nothing(interpreter: object, chunk: dict[str, Any], data: str | bytes,
             out: list[CoreEvent]) -> None:
    return None


def _whole_input(given: Any) -> str:
    """A tool's ``input`` given whole in ``content_block_start`` as arguments text
    (``""`` for the usual empty ``{}``; some relays send the input as text)."""
    if given and type(given) is dict:
        return json.dumps(given, ensure_ascii=False)
    if given and type(given) is str:
        return given
    return ""


def anthropic_usage(usage: dict[str, Any]) -> Usage:
    """An Anthropic ``usage`` object in fanout's terms; ``raw`` keeps it whole."""
    prompt = _int_or_none(usage.get("input_tokens"))
    if prompt is not None:
        for name in ("cache_creation_input_tokens", "cache_read_input_tokens"):
            cached = _int_or_none(usage.get(name))
            if cached is not None:
                prompt += cached
    completion = _int_or_none(usage.get("output_tokens"))
    total = prompt + completion if prompt is not None and completion is not None else None
    return Usage(prompt, completion, total, usage)


def anthropic_body_events(payload: Any, stream: str = "", content_key: str = "",
                          redactor: Redactor | None = None) -> list[CoreEvent]:
    """The events a non-streamed ``message`` object stands for.

    Its ``content`` blocks are replayed as the stream would have sent them,
    then its ``stop_reason``, usage and ``message_stop``.  An ``error`` body is
    an error; anything else one ``FrameSkipped``.
    """
    if redactor:
        payload = redactor.value(payload)
    interpreter = AnthropicInterpreter(stream=stream, content_key=content_key)
    if type(payload) is not dict or type(payload.get("content")) is not list:
        if type(payload) is dict and payload.get("error"):
            return [ErrorReported(interpreter._error(payload), stream, content_key)]
        return [FrameSkipped("the body is neither a stream nor an Anthropic message object",
                             _compact(payload, 200), stream, content_key)]
    out: list[CoreEvent] = []
    frames: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**payload, "content": []}}]
    for index, block in enumerate(payload["content"]):
        if type(block) is not dict:
            continue
        kind = block.get("type")
        start = dict(block)
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            start["text"] = ""
            deltas.append({"type": "text_delta", "text": block.get("text")})
        elif kind == "thinking":
            start["thinking"], start["signature"] = "", ""
            deltas.append({"type": "thinking_delta", "thinking": block.get("thinking")})
            deltas.append({"type": "signature_delta", "signature": block.get("signature")})
        frames.append({"type": "content_block_start", "index": index, "content_block": start})
        frames.extend({"type": "content_block_delta", "index": index, "delta": d}
                      for d in deltas)
        frames.append({"type": "content_block_stop", "index": index})
    frames.append({"type": "message_delta", "delta": {"stop_reason": payload.get("stop_reason")},
                   "usage": None})
    frames.append({"type": "message_stop"})
    for frame in frames:
        interpreter.interpret_into(ServerSentEvent(json.dumps(frame)), out)
    return out


#: ``AnthropicInterpreter``'s handlers (see ``Handler``).
_HANDLERS: dict[str, Handler] = {
    "content_block_delta": AnthropicInterpreter._delta,
    "content_block_start": AnthropicInterpreter._start,
    "content_block_stop": AnthropicInterpreter._stop,
    "message_start": AnthropicInterpreter._message_start,
    "message_delta": AnthropicInterpreter._message_delta,
    "message_stop": AnthropicInterpreter._message_stop,
    "ping": _nothing,
    "error": AnthropicInterpreter._report,
}
