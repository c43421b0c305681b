"""Fault models that say a normal answer the way real servers and relays get it wrong.

Each takes a scripted answer's stream on ``/v1/responses`` or ``/v1/messages``
and rewrites its events, one write at a time, into what a named server was
seen to send (the issue or pull request is in each docstring).  A write whose
events are all dropped is not sent; pauses are kept.  Without ``"stream":
true`` each answers the dialect's normal whole body: the faults are stream
shapes.

- ``fault/litellm-bare`` (Responses): LiteLLM #22102 — only the deltas and
  ``response.completed``, as bare ``data:`` lines, then ``data: [DONE]``;
- ``fault/fresh-item-ids`` (Responses): GitHub Copilot through LiteLLM
  (#30071) — every event of one output item names a different ``item_id``;
- ``fault/llama-call-ids`` (Responses): llama.cpp's ``server-task.cpp`` — no
  ``output_index``, a call closed (``output_item.done``, ``response.completed``)
  as ``{"call_id": <the id it was announced with>}``, no ``id``;
- ``fault/no-block-start`` (Anthropic): LiteLLM #27442 — text and thinking
  deltas for blocks whose ``content_block_start`` never came;
- ``fault/block-start-per-token`` (Anthropic): llama.cpp before PR #18551 —
  ``content_block_start`` again before every delta of a text or thinking block;
- ``fault/stop-reason-null`` (Anthropic): ``message_delta`` with ``stop_reason:
  null``, then ``message_stop`` (llmgateway PR #1994, a filtered turn);
- ``fault/error-not-stop`` (Anthropic): LiteLLM PR #32159 — the provider's
  stream ended early and the proxy says so with ``event: error`` where
  ``message_delta`` and ``message_stop`` belong;
- ``fault/end-turn-tools`` (Anthropic): LiteLLM #34692 (``ollama_chat``) — tool
  calls closed by ``stop_reason: "end_turn"``, an empty text block before them,
  ``message_delta`` without ``usage``;
- ``fault/split-tool-call`` (both): LiteLLM's ``/v1/messages`` bridge — each tool
  call split into several ``tool_use`` blocks repeating its id and name: the
  first with no input, then one block per arguments fragment (``mock/tools``'s
  two calls); on ``/v1/responses`` the same as ``function_call``
  items (their own item ids and output indexes, one ``call_id``), one per
  fragment, each closed with its fragment as its arguments and listed so in
  ``response.completed``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from .models import Context, ModelSpec, _scripted
from .plans import ChatRequest, Pause, Plan, Send, Step

__all__ = ["RELAY_MODELS", "sse_events"]

#: One event in, the frames (whole SSE events, bytes) to send in its place.
Rewrite = Callable[["_State", str | None, dict[str, Any]], list[bytes]]


@attrs.define
class _State:
    """What a rewrite remembers across one stream's events."""

    counter: Iterator[int] = attrs.Factory(lambda: itertools.count(1))
    started: set[int] = attrs.Factory(set)
    kinds: dict[int, str] = attrs.Factory(dict)
    # fault/split-tool-call: the index (output index) each original block (item) now has,
    # the next free one, and each tool call's parts so far (id, arguments)
    index: dict[int, int] = attrs.Factory(dict)
    free: Iterator[int] = attrs.Factory(itertools.count)
    tools: dict[int, dict[str, Any]] = attrs.Factory(dict)
    parts: dict[int, list[list[str]]] = attrs.Factory(dict)


def sse_events(data: bytes) -> list[tuple[str | None, Any]]:
    """The ``(event name, JSON data)`` of each whole event in ``data`` (the encoders'
    own output: ``event:`` and one ``data:`` line each; a non-JSON data is kept as text)."""
    events: list[tuple[str | None, Any]] = []
    for block in data.split(b"\n\n"):
        name: str | None = None
        payload: Any = None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                text = line[6:].decode()
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = text
        if payload is not None:
            events.append((name, payload))
    return events


def _frame(name: str | None, body: Any) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"),
                                                         ensure_ascii=False)
    return (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()


def _rewritten(kind: str, rewrite: Rewrite, trailer: bytes = b""
               ) -> Callable[[ChatRequest, Context], Plan]:
    """``kind``'s scripted stream with each event passed through ``rewrite``; ``trailer``
    written after the last event."""
    base = _scripted(kind, cadence_arg=False)

    def plan(request: ChatRequest, context: Context) -> Plan:
        normal = base(request, context)
        if normal.steps is None:
            return normal
        return attrs.evolve(normal, steps=_steps(normal.steps, rewrite, trailer))
    return plan


def _steps(steps: Iterable[Step], rewrite: Rewrite, trailer: bytes) -> Iterator[Step]:
    state = _State()
    for step in steps:
        if not isinstance(step, Send):
            yield step
            continue
        out = b"".join(b"".join(rewrite(state, name, body)) if isinstance(body, dict)
                       else _frame(name, body) for name, body in sse_events(step.data))
        if out:
            yield Send(out, terminal=step.terminal)
    if trailer:
        yield Pause(0)
        yield Send(trailer)


# ---------------------------------------------------------------- Responses

_LIFECYCLE = ("response.created", "response.in_progress", "response.output_item.added",
              "response.output_item.done", "response.content_part.added",
              "response.content_part.done", "response.output_text.done",
              "response.reasoning_summary_text.done", "response.reasoning_summary_part.added",
              "response.reasoning_summary_part.done", "response.function_call_arguments.done")


def _litellm_bare(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM #22102: the deltas and ``response.completed`` only, no ``event:`` lines,
    no ``sequence_number``."""
    if body.get("type") in _LIFECYCLE:
        return []
    body = {k: v for k, v in body.items() if k != "sequence_number"}
    return [_frame(None, body)]


def _fresh_item_ids(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM #30071: GitHub Copilot gives each event of an item its own ``item_id``
    (and each announcement of the item its own ``id``); ``call_id`` and
    ``output_index`` stay."""
    body = dict(body)
    if "item_id" in body:
        body["item_id"] = f"{body['item_id']}~{next(state.counter)}"
    item = body.get("item")
    if isinstance(item, dict) and body.get("type", "").startswith("response.output_item."):
        body["item"] = {**item, "id": f"{item.get('id')}~{next(state.counter)}"}
    return [_frame(name, body)]


def _llama_call(item: Any) -> Any:
    """A ``function_call`` item as llama.cpp closes it: no ``id``, its ``call_id`` the id
    it was announced with."""
    if isinstance(item, dict) and item.get("type") == "function_call":
        return {k: v for k, v in item.items() if k not in ("id", "call_id")} | {
            "call_id": item.get("id")}
    return item


def _llama_responses(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """llama.cpp's ``/v1/responses`` (``server-task.cpp``): no ``output_index`` and no
    ``sequence_number``; a call closed (in ``output_item.done`` and in
    ``response.completed``) as ``{"call_id": <its announced id>}``, with no ``id``."""
    body = {k: v for k, v in body.items() if k not in ("output_index", "sequence_number")}
    if body.get("type") == "response.output_item.done":
        body["item"] = _llama_call(body.get("item"))
    response = body.get("response")
    if body.get("type") == "response.completed" and isinstance(response, dict) and \
            isinstance(response.get("output"), list):
        body["response"] = {**response, "output": [_llama_call(i) for i in response["output"]]}
    return [_frame(name, body)]


# ---------------------------------------------------------------- Anthropic

def _no_block_start(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM #27442: no ``content_block_start`` for text and thinking blocks (a tool's
    start is kept: without it no client could know the tool)."""
    if body.get("type") == "content_block_start" and isinstance(
            body.get("content_block"), dict) and body["content_block"].get("type") in (
            "text", "thinking"):
        return []
    return [_frame(name, body)]


def _block_start_per_token(state: _State, name: str | None, body: dict[str, Any]
                           ) -> list[bytes]:
    """llama.cpp before PR #18551: a ``content_block_start`` before every text or
    thinking delta (its block state was reset per chunk)."""
    kind = body.get("type")
    if kind == "content_block_start":
        block = body.get("content_block")
        state.kinds[body["index"]] = str(block.get("type")) if isinstance(block, dict) else ""
        return [_frame(name, body)]
    if kind == "content_block_delta" and state.kinds.get(body["index"]) in ("text", "thinking"):
        block_kind = state.kinds[body["index"]]
        empty = {"type": "text", "text": ""} if block_kind == "text" else {
            "type": "thinking", "thinking": "", "signature": ""}
        again = {"type": "content_block_start", "index": body["index"], "content_block": empty}
        return [_frame("content_block_start", again), _frame(name, body)]
    return [_frame(name, body)]


def _stop_reason_null(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """llmgateway PR #1994: ``stop_reason: null`` in ``message_delta``, then ``message_stop``."""
    if body.get("type") == "message_delta":
        body = {**body, "delta": {**body.get("delta", {}), "stop_reason": None}}
    return [_frame(name, body)]


INCOMPLETE = ("Provider stream ended before emitting a message_stop event; the response is "
              "incomplete and any partial content (e.g. tool_use input JSON) may be truncated.")


def _error_not_stop(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM PR #32159: ``event: error`` (``api_error``) where the stream's end belongs."""
    if body.get("type") == "message_delta":
        return [_frame("error", {"type": "error", "error": {"type": "api_error",
                                                            "message": INCOMPLETE}})]
    if body.get("type") == "message_stop":
        return []
    return [_frame(name, body)]


def _end_turn_tools(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM #34692: an empty text block first (block indexes shift by one), the tool
    calls' ``stop_reason`` ``end_turn``, ``message_delta`` without ``usage``."""
    kind = body.get("type")
    if kind == "message_start":
        empty = [_frame("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}}),
                 _frame("content_block_stop", {"type": "content_block_stop", "index": 0})]
        return [_frame(name, body), *empty]
    if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
        body = {**body, "index": body["index"] + 1}
    elif kind == "message_delta":
        body = {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                   "stop_sequence": None}}
    return [_frame(name, body)]


def _split_blocks(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """LiteLLM's ``/v1/messages``: a ``tool_use`` block per arguments fragment, each
    repeating the call's id and name (the first block has none); indexes renumbered."""
    kind = body.get("type")
    if kind not in ("content_block_start", "content_block_delta", "content_block_stop"):
        return [_frame(name, body)]
    original = body["index"]
    if kind == "content_block_start":
        state.index[original] = next(state.free)
        block = body.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            state.tools[original] = {**block, "input": {}}
        return [_frame(name, {**body, "index": state.index[original]})]
    if kind == "content_block_delta" and original in state.tools:
        before, after = state.index[original], next(state.free)
        state.index[original] = after
        return [_frame("content_block_stop", {"type": "content_block_stop", "index": before}),
                _frame("content_block_start", {"type": "content_block_start", "index": after,
                                               "content_block": state.tools[original]}),
                _frame(name, {**body, "index": after})]
    return [_frame(name, {**body, "index": state.index[original]})]


def _split_items(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    """The same on ``/v1/responses``: a ``function_call`` item per arguments fragment,
    each with its own id and output index and the call's ``call_id`` and name."""
    kind = body.get("type")
    out: list[tuple[str, dict[str, Any]]] = []
    position = body.get("output_index", -1)
    item = body.get("item")
    if kind == "response.output_item.added":
        state.index[position] = next(state.free)
        if isinstance(item, dict) and item.get("type") == "function_call":
            state.tools[position] = dict(item)
            state.parts[position] = [[item["id"], ""]]
        out.append((kind, {**body, "output_index": state.index[position]}))
    elif kind == "response.function_call_arguments.delta" and position in state.tools:
        parts = state.parts[position]
        if parts[-1][1]:  # this item has its fragment: the next one opens the next item
            out.extend(_close_part(state, position))
            state.index[position] = next(state.free)
            parts.append([f"{state.tools[position]['id']}_{len(parts)}", ""])
            out.append(("response.output_item.added", {
                "type": "response.output_item.added", "sequence_number": 0,
                "output_index": state.index[position],
                "item": {**state.tools[position], "id": parts[-1][0]}}))
        parts[-1][1] += body["delta"]
        out.append((kind, {**body, "item_id": parts[-1][0],
                           "output_index": state.index[position]}))
    elif kind in ("response.function_call_arguments.done", "response.output_item.done") \
            and position in state.tools:
        if kind == "response.output_item.done":
            out.extend(_close_part(state, position))
    elif kind == "response.completed" and isinstance(body.get("response"), dict):
        response = body["response"]
        output: list[Any] = []
        for number, entry in enumerate(response.get("output") or []):
            if number in state.parts:
                output.extend({**state.tools[number], "id": ident, "arguments": text,
                               "status": "completed"} for ident, text in state.parts[number])
            else:
                output.append(entry)
        out.append((kind, {**body, "response": {**response, "output": output}}))
    else:
        if "output_index" in body:
            body = {**body, "output_index": state.index.get(position, position)}
        out.append((name or str(kind), body))
    frames = []
    for event, frame in out:  # one sequence, as a relay numbers what it sends
        if "sequence_number" in frame:
            frame = {**frame, "sequence_number": next(state.counter)}
        frames.append(_frame(event, frame))
    return frames


def _close_part(state: _State, position: int) -> list[tuple[str, dict[str, Any]]]:
    """The open part (item) of call ``position`` closed, its own fragment its arguments."""
    ident, text = state.parts[position][-1]
    where = {"item_id": ident, "output_index": state.index[position]}
    item = {**state.tools[position], "id": ident, "arguments": text, "status": "completed"}
    return [("response.function_call_arguments.done",
             {"type": "response.function_call_arguments.done", "sequence_number": 0, **where,
              "arguments": text}),
            ("response.output_item.done",
             {"type": "response.output_item.done", "sequence_number": 0,
              "output_index": state.index[position], "item": item})]


def _split_tool_call(state: _State, name: str | None, body: dict[str, Any]) -> list[bytes]:
    if str(body.get("type", "")).startswith("response."):
        return _split_items(state, name, body)
    return _split_blocks(state, name, body)


RELAY_MODELS: dict[str, ModelSpec] = {spec.id: spec for spec in [
    ModelSpec("fault/litellm-bare", "LiteLLM's /responses: only the deltas and "
              "response.completed, bare data: lines, then [DONE]",
              _rewritten("text", _litellm_bare, b"data: [DONE]\n\n"), ("responses",)),
    ModelSpec("fault/fresh-item-ids", "GitHub Copilot via LiteLLM: a fresh item_id on every "
              "event of an output item (two tool calls)",
              _rewritten("tools", _fresh_item_ids), ("responses",)),
    ModelSpec("fault/llama-call-ids", "llama.cpp's /v1/responses: no output_index, a tool "
              "call closed as {call_id: <its id>} with no id (two tool calls)",
              _rewritten("tools", _llama_responses), ("responses",)),
    ModelSpec("fault/no-block-start", "LiteLLM: text and thinking deltas without their "
              "content_block_start", _rewritten("reasoning", _no_block_start), ("anthropic",)),
    ModelSpec("fault/block-start-per-token", "old llama.cpp: content_block_start again "
              "before every text and thinking delta",
              _rewritten("reasoning", _block_start_per_token), ("anthropic",)),
    ModelSpec("fault/stop-reason-null", "message_delta with stop_reason null, then "
              "message_stop", _rewritten("text", _stop_reason_null), ("anthropic",)),
    ModelSpec("fault/error-not-stop", "LiteLLM: event: error (the provider stream ended "
              "without message_stop) instead of message_delta and message_stop",
              _rewritten("text", _error_not_stop), ("anthropic",)),
    ModelSpec("fault/end-turn-tools", "LiteLLM + Ollama: an empty text block, tool calls, "
              "stop_reason end_turn, message_delta without usage",
              _rewritten("tools", _end_turn_tools), ("anthropic",)),
    ModelSpec("fault/split-tool-call", "LiteLLM's /v1/messages bridge: each tool call split "
              "into tool_use blocks (function_call items) repeating its id, one per "
              "arguments fragment (two tool calls)",
              _rewritten("tools", _split_tool_call), ("responses", "anthropic")),
]}
