"""The embedded upstream's other two dialects: OpenAI Responses and Anthropic Messages.

Requests in: ``parse_responses_request`` (``POST /v1/responses``) and
``parse_messages_request`` (``POST /v1/messages``) check a body as the real
API would (unknown parameters refused, Anthropic's ``max_tokens`` and
``anthropic-version`` required, roles user/assistant only) and turn it into
the same ``ChatRequest`` the chat route makes, with ``api`` set: so every
model plans the same answer whichever route asked.

Answers out: an encoder per dialect renders a planned answer (its parts, in
order: reasoning, content, refusal, tool-call fragments; its finish reason
and usage) as that dialect's events.  ``ResponsesEncoder``: ``response.created``,
``response.in_progress``, per output item ``output_item.added`` /
``content_part.added`` / deltas / ``*.done`` / ``output_item.done``, and
``response.completed`` (``response.incomplete`` for a length or content
filter finish) with the usage.  ``AnthropicEncoder``: ``message_start`` (input
usage) and a ``ping``, per block ``content_block_start`` / deltas
(``thinking_delta`` then a ``signature_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop
reason, output usage) and ``message_stop``.  Each part is one write, so a
fault's ``:N`` (chunks) means the same in every dialect; the terminal event is
its own write, marked ``terminal`` for the faults that drop it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import orjson

from .corpus import rng_for
from .plans import (
    ChatRequest,
    Plan,
    RequestError,
    Send,
    _bearer,
    _header_float,
    _header_int,
    json_plan,
)

__all__ = ["AnthropicEncoder", "ResponsesEncoder", "anthropic_error_plan", "chat_stream_parts",
           "grouped", "parse_messages_request", "parse_responses_request"]

SSE_COMMENT = b": keep-alive\n\n"


class Answer(Protocol):
    """What an encoder renders: a choice's parts in sending order and its finish."""

    parts: list[tuple[Any, ...]]
    finish_reason: str | None  # None: never finished (chat only)


def _dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # a lone surrogate to echo: JSON escapes it, orjson refuses it
        return json.dumps(body).encode()


def _named(name: str, body: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _dumps(body) + b"\n\n"


def grouped(answers: Sequence[Answer]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """(0, part) in sending order with each item's parts together, as these APIs send
    them (one output item or content block at a time), in order of first appearance."""
    if not answers:
        return
    order: list[Any] = []
    groups: dict[Any, list[tuple[Any, ...]]] = {}
    for part in answers[0].parts:
        key = ("tool", part[1]) if part[0] == "tool" else part[0]
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(part)
    for key in order:
        for part in groups[key]:
            yield 0, part


def _usage_counts(usage: Mapping[str, Any] | None) -> tuple[int, int, int]:
    if not usage:
        return 0, 0, 0
    details = usage.get("completion_tokens_details") or {}
    return (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
            int(details.get("reasoning_tokens", 0)))


# ---------------------------------------------------------------- Responses

class ResponsesEncoder:
    """One ``/v1/responses`` stream's events (``sequence_number`` on each)."""

    api = "responses"

    def __init__(self, request: ChatRequest, ident: str | None = None) -> None:
        rng = rng_for(request.seed, request.model, request.prompt, "id")
        self.id = ident or f"resp_mock{rng.getrandbits(64):016x}"
        self.model = ident or request.model
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items, done or open
        self._key: Any = None  # the open item's key
        self._kind = ""  # the kind of part it was opened for
        self._text = ""  # what the open item holds so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _named(kind, body)

    def response(self, status: str, usage: Mapping[str, Any] | None = None,
                 finish: str = "stop", error: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
        incomplete = None
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens" if finish == "length"
                          else "content_filter"}
        prompt, completion, reasoning = _usage_counts(usage)
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": dict(error) if error else None, "incomplete_details": incomplete,
            "model": self.model, "output": [dict(item) for item in self.items],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": None if usage is None else {
                "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": prompt + completion},
        }

    def start(self, count: int) -> bytes:
        head = self.response("in_progress")
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head))

    def order(self, answers: Sequence[Answer]) -> Iterator[tuple[int, tuple[Any, ...]]]:
        return grouped(answers)

    def part(self, index: int, part: tuple[Any, ...]) -> bytes:
        kind = part[0]
        key = ("tool", part[1]) if kind == "tool" else kind
        out = b""
        if key != self._key:
            out += self._close() + self._open(key, part)
        piece = part[4] if kind == "tool" else part[1]
        if not piece:
            return out
        self._text += piece
        item = self.items[-1]
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if kind == "tool":
            return out + self._event("response.function_call_arguments.delta", **where,
                                     delta=piece)
        if kind == "reasoning":
            return out + self._event("response.reasoning_summary_text.delta", **where,
                                     summary_index=0, delta=piece)
        if kind == "refusal":
            return out + self._event("response.refusal.delta", **where, content_index=0,
                                     delta=piece)
        return out + self._event("response.output_text.delta", **where, content_index=0,
                                 delta=piece, logprobs=[])

    def _open(self, key: Any, part: tuple[Any, ...]) -> bytes:
        self._key, self._kind, self._text = key, part[0], ""
        number = len(self.items)
        suffix = f"{number:02d}{self.id[-12:]}"
        if part[0] == "tool":
            item: dict[str, Any] = {"id": f"fc_{suffix}", "type": "function_call",
                                    "status": "in_progress", "arguments": "",
                                    "call_id": part[2] or f"call_{suffix}",
                                    "name": part[3] or "tool"}
        elif part[0] == "reasoning":
            item = {"id": f"rs_{suffix}", "type": "reasoning", "summary": []}
        else:
            item = {"id": f"msg_{suffix}", "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
        self.items.append(item)
        where = {"output_index": number}
        out = self._event("response.output_item.added", **where, item=dict(item))
        ids = {"item_id": item["id"], **where}
        if part[0] == "reasoning":
            out += self._event("response.reasoning_summary_part.added", **ids, summary_index=0,
                               part={"type": "summary_text", "text": ""})
        elif part[0] == "refusal":
            out += self._event("response.content_part.added", **ids, content_index=0,
                               part={"type": "refusal", "refusal": ""})
        elif part[0] != "tool":
            out += self._event("response.content_part.added", **ids, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": []})
        return out

    def _close(self) -> bytes:
        if self._key is None:
            return b""
        item = self.items[-1]
        ids = {"item_id": item["id"], "output_index": len(self.items) - 1}
        text, kind = self._text, item["type"]
        self._key = None
        if kind == "function_call":
            item.update(status="completed", arguments=text)
            out = self._event("response.function_call_arguments.done", **ids, arguments=text)
        elif kind == "reasoning":
            summary = {"type": "summary_text", "text": text}
            item["summary"] = [summary]
            out = (self._event("response.reasoning_summary_text.done", **ids, summary_index=0,
                               text=text)
                   + self._event("response.reasoning_summary_part.done", **ids,
                                 summary_index=0, part=summary))
        elif self._kind == "refusal":
            part: dict[str, Any] = {"type": "refusal", "refusal": text}
            item.update(status="completed", content=[part])
            out = (self._event("response.refusal.done", **ids, content_index=0, refusal=text)
                   + self._event("response.content_part.done", **ids, content_index=0,
                                 part=part))
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            item.update(status="completed", content=[part])
            out = (self._event("response.output_text.done", **ids, content_index=0, text=text,
                               logprobs=[])
                   + self._event("response.content_part.done", **ids, content_index=0,
                                 part=part))
        return out + self._event("response.output_item.done",
                                 output_index=len(self.items) - 1, item=dict(item))

    def closing(self, answers: Sequence[Answer], usage: Mapping[str, Any] | None
                ) -> list[Send]:
        out: list[Send] = []
        closed = self._close()
        if closed:
            out.append(Send(closed))
        finish = (answers[0].finish_reason if answers else None) or "stop"
        if finish in ("length", "content_filter"):
            terminal = self._event("response.incomplete",
                                   response=self.response("incomplete", usage, finish))
        else:
            terminal = self._event("response.completed",
                                   response=self.response("completed", usage, finish))
        out.append(Send(terminal, terminal=True))
        return out

    def error_event(self, error: Mapping[str, Any], *, failed: bool = False) -> bytes:
        """An ``error`` event (or, ``failed``, a ``response.failed`` carrying it)."""
        if failed:
            return self._event("response.failed", response=self.response(
                "failed", error={"code": error.get("code") or error.get("type"),
                                 "message": error.get("message")}))
        return self._event("error", code=error.get("code") or error.get("type"),
                           message=error.get("message"), param=error.get("param"))

    def overloaded(self) -> bytes:
        return self._event("error", code="overloaded",
                           message="The server is overloaded (fanout mock).", param=None)

    def ping(self) -> bytes:
        return SSE_COMMENT

    def completion(self, answers: Sequence[Answer], usage: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
        """The non-streamed ``response`` object of the same answer."""
        self.start(len(answers))
        for index, part in self.order(answers):
            self.part(index, part)
        self._close()
        finish = (answers[0].finish_reason if answers else None) or "stop"
        status = "incomplete" if finish in ("length", "content_filter") else "completed"
        return self.response(status, usage, finish)


# ---------------------------------------------------------------- Anthropic

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "content_filter": "refusal"}


class AnthropicEncoder:
    """One ``/v1/messages`` stream's events, one content block at a time."""

    api = "anthropic"

    def __init__(self, request: ChatRequest, ident: str | None = None) -> None:
        rng = rng_for(request.seed, request.model, request.prompt, "id")
        self.id = ident or f"msg_mock{rng.getrandbits(64):016x}"
        self.model = ident or request.model
        self.prompt_tokens = request.prompt_tokens
        self.blocks: list[dict[str, Any]] = []
        self._key: Any = None
        self._text = ""
        self._refused = False

    def start(self, count: int) -> bytes:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        return (_named("message_start", {"type": "message_start", "message": message})
                + self.ping())

    def order(self, answers: Sequence[Answer]) -> Iterator[tuple[int, tuple[Any, ...]]]:
        return grouped(answers)

    def part(self, index: int, part: tuple[Any, ...]) -> bytes:
        kind = part[0]
        if kind == "refusal":
            self._refused = True
        key = ("tool", part[1]) if kind == "tool" else ("thinking" if kind == "reasoning"
                                                         else "text")
        out = b""
        if key != self._key:
            out += self._close() + self._open(key, part)
        piece = part[4] if kind == "tool" else part[1]
        if not piece:
            return out
        self._text += piece
        if kind == "tool":
            delta = {"type": "input_json_delta", "partial_json": piece}
        elif kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": piece}
        else:
            delta = {"type": "text_delta", "text": piece}
        return out + _named("content_block_delta", {"type": "content_block_delta",
                                                    "index": len(self.blocks) - 1,
                                                    "delta": delta})

    def _open(self, key: Any, part: tuple[Any, ...]) -> bytes:
        self._key, self._text = key, ""
        if part[0] == "tool":
            call = str(part[2] or f"call_{len(self.blocks):012x}")
            block: dict[str, Any] = {"type": "tool_use",
                                     "id": "toolu_" + call.removeprefix("call_"),
                                     "name": part[3] or "tool", "input": {}}
        elif part[0] == "reasoning":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "text", "text": ""}
        self.blocks.append(block)
        return _named("content_block_start", {"type": "content_block_start",
                                              "index": len(self.blocks) - 1,
                                              "content_block": dict(block)})

    def _close(self) -> bytes:
        if self._key is None:
            return b""
        index = len(self.blocks) - 1
        block = self.blocks[index]
        out = b""
        if block["type"] == "thinking":
            signature = _signature(self.id, self._text)
            block.update(thinking=self._text, signature=signature)
            out += _named("content_block_delta", {"type": "content_block_delta", "index": index,
                                                  "delta": {"type": "signature_delta",
                                                            "signature": signature}})
        elif block["type"] == "tool_use":
            try:
                block["input"] = json.loads(self._text or "{}")
            except ValueError:
                block["input"] = {}
        else:
            block["text"] = self._text
        self._key = None
        return out + _named("content_block_stop", {"type": "content_block_stop", "index": index})

    def stop_reason(self, answers: Sequence[Answer]) -> str:
        finish = (answers[0].finish_reason if answers else None) or "stop"
        if self._refused and finish == "stop":
            return "refusal"
        return _STOP_REASONS.get(finish, "end_turn")

    def closing(self, answers: Sequence[Answer], usage: Mapping[str, Any] | None
                ) -> list[Send]:
        out: list[Send] = []
        closed = self._close()
        if closed:
            out.append(Send(closed))
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason(answers), "stop_sequence": None}}
        if usage is not None:  # none known (a replayed capture without): none invented
            delta["usage"] = {"output_tokens": _usage_counts(usage)[1]}
        out.append(Send(_named("message_delta", delta)))
        out.append(Send(_named("message_stop", {"type": "message_stop"}), terminal=True))
        return out

    def error_event(self, error: Mapping[str, Any], *, failed: bool = False) -> bytes:
        return _named("error", {"type": "error", "error": {
            "type": _anthropic_type(str(error.get("type") or "api_error")),
            "message": error.get("message")}})

    def overloaded(self) -> bytes:
        return _named("error", {"type": "error", "error": {"type": "overloaded_error",
                                                           "message": "Overloaded"}})

    def ping(self) -> bytes:
        return _named("ping", {"type": "ping"})

    def completion(self, answers: Sequence[Answer], usage: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
        """The non-streamed ``message`` object of the same answer."""
        for index, part in self.order(answers):
            self.part(index, part)
        self._close()
        prompt, completion, _ = _usage_counts(usage)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [dict(b) for b in self.blocks],
                "stop_reason": self.stop_reason(answers), "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion}}


def _signature(ident: str, thinking: str) -> str:
    """A stand-in for the opaque signature of a thinking block: stable for its text."""
    import base64
    import hashlib

    digest = hashlib.sha256(f"{ident}\0{thinking}".encode()).digest()
    return base64.b64encode(digest * 2).decode()


_ANTHROPIC_TYPES = {"server_error": "api_error", "internal_server_error": "api_error",
                    "upstream_error": "api_error", "invalid_request_error":
                    "invalid_request_error", "rate_limit_error": "rate_limit_error"}


def _anthropic_type(kind: str) -> str:
    return _ANTHROPIC_TYPES.get(kind, kind)


def anthropic_error_plan(status: int, message: str, type_: str,
                         headers: tuple[tuple[str, str], ...] = ()) -> Plan:
    """An Anthropic-style JSON error response (``{"type": "error", "error": ...}``)."""
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error"}.get(status) if type_ in (
        "invalid_request_error", "server_error", "rate_limit_error") else None
    if kind is None:
        kind = _anthropic_type(type_)
    return json_plan(status, {"type": "error", "error": {"type": kind, "message": message}},
                     (("request-id", "req_fanout_mock"), *headers))


# ---------------------------------------------------------------- requests in

RESPONSES_PARAMS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
    "tool_choice", "parallel_tool_calls", "previous_response_id", "reasoning", "text",
    "truncation", "metadata", "store", "stream", "user", "service_tier", "include",
    "top_logprobs", "max_tool_calls", "background", "prompt", "prompt_cache_key",
    "safety_identifier", "conversation", "stream_options",
})
MESSAGES_PARAMS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
    "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking", "service_tier",
    "container", "mcp_servers", "context_management",
})


def _object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise RequestError("We could not parse the JSON body of your request.", None) from None
    if not isinstance(data, dict):
        raise RequestError("The request body must be a JSON object.", None)
    return data


def _common(data: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The fields every route reads the same way (model, stream, fanout's controls)."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model: Field required", "model")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream: Input should be a valid boolean, not {stream!r}", "stream")
    for name in ("temperature", "top_p"):
        value = data.get(name)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise RequestError(f"{name}: Input should be a valid number, not {value!r}", name)
    tools = data.get("tools")
    if tools is not None and (not isinstance(tools, list)
                              or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools: Input should be a valid list of objects", "tools")
    base, _, fragment = model.partition("@")
    name, *args = base.split(":")
    return {"model": model, "name": name, "args": tuple(args), "stream": stream,
            "fragment": headers.get("x-fanout-fragment") or fragment or None,
            "cadence": _header_float(headers, "x-fanout-cadence"),
            "tokens": _header_int(headers, "x-fanout-tokens"),
            "delay": _header_float(headers, "x-fanout-delay"),
            "retry_after": _header_float(headers, "x-fanout-retry-after") or 1.0,
            "include_usage": True}


def _unknown(data: Mapping[str, Any], known: Iterable[str]) -> None:
    allowed = frozenset(known)
    for key in data:
        if key not in allowed:
            raise RequestError(f"Unknown parameter: '{key}'.", key)


def _max(data: Mapping[str, Any], name: str, *, required: bool) -> int | None:
    value = data.get(name)
    if value is None:
        if required:
            raise RequestError(f"{name}: Field required", name)
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(f"{name}: Input should be an integer >= 1, not {value!r}", name)
    return value


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content
                        if isinstance(p, Mapping) and p.get("type") in (
                            "text", "input_text", "output_text"))
    return ""


def parse_responses_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
    """Validate a ``POST /v1/responses`` body; ``RequestError`` naming the bad field."""
    data = _object(body)
    _unknown(data, RESPONSES_PARAMS)
    common = _common(data, headers)
    if "input" not in data:
        raise RequestError("Missing required parameter: 'input'.", "input")
    raw = data["input"]
    messages: list[dict[str, Any]] = []
    if isinstance(data.get("instructions"), str) and data["instructions"]:
        messages.append({"role": "system", "content": data["instructions"]})
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        for index, item in enumerate(raw):
            if not isinstance(item, dict):
                raise RequestError(f"Invalid 'input[{index}]': expected an object.",
                                   f"input[{index}]")
            kind = item.get("type")
            if kind is None and item.get("role") == "assistant":
                # llama.cpp's server refuses it so (OpenAI takes it): fanout names the type
                raise RequestError("Cannot determine type of 'item'", f"input[{index}]")
            if kind is None or kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise RequestError(f"Invalid value for 'input[{index}].role': {role!r}.",
                                       f"input[{index}].role")
                messages.append({"role": role, "content": _text_of(item.get("content"))})
            elif kind == "function_call":
                messages.append({"role": "assistant", "content": ""})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "content": str(item.get("output", ""))})
            else:
                messages.append({"role": "user", "content": ""})
    else:
        raise RequestError("Invalid 'input': expected a string or a non-empty array.", "input")
    tools = []
    for index, tool in enumerate(data.get("tools") or ()):
        if tool.get("type") == "function":
            if not isinstance(tool.get("name"), str):
                raise RequestError(f"Missing required parameter: 'tools[{index}].name'.",
                                   f"tools[{index}].name")
            if "function" in tool:
                raise RequestError(f"Unknown parameter: 'tools[{index}].function'.",
                                   f"tools[{index}].function")
            tools.append({"type": "function", "function": {
                "name": tool["name"], "parameters": tool.get("parameters") or {}}})
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return ChatRequest(
        **common, messages=tuple(messages), n=1,
        max_tokens=_max(data, "max_output_tokens", required=False), tools=tuple(tools),
        tool_choice=choice, seed=None, api_key=_bearer(headers.get("authorization")),
        api="responses", body=data)


def parse_messages_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
    """Validate a ``POST /v1/messages`` body; ``RequestError`` naming the bad field."""
    if not headers.get("anthropic-version"):
        raise RequestError("anthropic-version: header is required", "anthropic-version")
    data = _object(body)
    for key in data:
        if key not in MESSAGES_PARAMS:
            raise RequestError(f"{key}: Extra inputs are not permitted", key)
    common = _common(data, headers)
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages: Field required (a non-empty list)", "messages")
    messages: list[dict[str, Any]] = []
    system = data.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(f"messages.{index}.role: Input should be 'user' or 'assistant'",
                               f"messages.{index}.role")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise RequestError(f"messages.{index}.content: Input should be a valid string or "
                               "list of content blocks", f"messages.{index}.content")
        messages.append({"role": message["role"], "content": _text_of(content)})
    tools = []
    for index, tool in enumerate(data.get("tools") or ()):
        if "type" in tool and tool["type"] not in ("custom", None):
            continue  # a server tool: nothing for the mock to call
        if not isinstance(tool.get("name"), str):
            raise RequestError(f"tools.{index}.name: Field required", f"tools.{index}.name")
        if not isinstance(tool.get("input_schema"), dict):
            raise RequestError(f"tools.{index}.input_schema: Field required",
                               f"tools.{index}.input_schema")
        tools.append({"type": "function", "function": {
            "name": tool["name"], "parameters": tool["input_schema"]}})
    choice = data.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        choice = ({"type": "function", "function": {"name": choice.get("name")}}
                  if kind == "tool" else {"any": "required"}.get(str(kind), kind))
    sent = headers.get("x-api-key")
    return ChatRequest(
        **common, messages=tuple(messages), n=1,
        max_tokens=_max(data, "max_tokens", required=True), tools=tuple(tools),
        tool_choice=choice, seed=None, api_key=sent.strip() if sent else None, api="anthropic",
        body=data)


# ---------------------------------------------------------------- replay in a dialect

def chat_stream_parts(body_pieces: Iterable[tuple[float, bytes]]
                      ) -> Iterator[tuple[float, str, Any]]:
    """A recorded chat stream read back as what it said, with when: ``(ms, kind, value)``
    with kind ``part`` (a part of choice 0, as the scripted models plan them),
    ``finish`` (its finish reason), ``usage`` (a usage object) or ``done`` ([DONE]).

    Frames that are no chat chunk are passed over: a replay in another dialect
    carries what the capture's model said, not how its relay misbehaved.
    """
    from ..core.sse import SSEDecoder

    decoder = SSEDecoder()
    for at_ms, piece in body_pieces:
        for event in decoder.feed(piece):
            if event.data.strip() == "[DONE]":
                yield at_ms, "done", None
                continue
            try:
                chunk = json.loads(event.data)
            except (ValueError, RecursionError):
                continue
            if not isinstance(chunk, dict):
                continue
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                for name, kind in (("reasoning_content", "reasoning"), ("reasoning", "reasoning"),
                                   ("content", "content"), ("refusal", "refusal")):
                    value = delta.get(name)
                    if isinstance(value, str) and value:
                        yield at_ms, "part", (kind, value)
                for call in delta.get("tool_calls") or ():
                    if not isinstance(call, dict):
                        continue
                    function = call.get("function") or {}
                    yield at_ms, "part", ("tool", call.get("index", 0), call.get("id"),
                                          function.get("name"),
                                          str(function.get("arguments") or ""))
                if choice.get("finish_reason"):
                    yield at_ms, "finish", str(choice["finish_reason"])
            if isinstance(chunk.get("usage"), dict):
                yield at_ms, "usage", chunk["usage"]
