"""``POST /v1/chat/completions``: one configured model, passed through honestly.

The upstream's stream is re-emitted as an OpenAI stream built from the
normalized events (so any OpenAI client can point at fanout), never from the
upstream's bytes.  It ends with ``data: [DONE]`` only when the upstream stream
completed; a truncated, errored, timed-out or cancelled stream ends without
it, after an ``event: error`` whose data names the outcome and the reason, so
a client's own truncation check works.  ``stream: false`` gets one
``chat.completion``, or an OpenAI-shaped error with a status that says what
happened (502 for a cut or failed upstream, 504 for a deadline).
"""

from __future__ import annotations

import secrets
import time
from functools import partial
from typing import Any, final

from starlette.responses import Response

from ..core.events import (
    ChoiceFinished,
    ChoiceRole,
    Event,
    ReasoningDelta,
    RefusalDelta,
    ResponseInfo,
    TextDelta,
    ToolCallDelta,
    UsageReported,
)
from ..core.result import Outcome, StreamResult, Usage
from ..fanout import Fanout, open_fanout
from .body import ChatAsk
from .errors import ApiError, error_response, json_response
from .relay import LEFT_REASON, drain
from .service import RunningFanout, Service
from .sse import Out

__all__ = ["ChatJob", "ChunkEncoder", "completion", "stream_error"]


@final
class ChunkEncoder:
    """Normalized events -> ``chat.completion.chunk`` objects (``None``: nothing to send).

    A choice's ``role`` goes with its first delta (an attempt that fails before
    content and is retried never leaves a stray role chunk); a tool-call delta
    without an ``index`` gets the one its ``id`` had, else the choice's last.
    """

    def __init__(self, model: str, *, include_usage: bool) -> None:
        self.id = f"chatcmpl-fanout-{secrets.token_hex(12)}"
        self.model = model
        self.fingerprint: str | None = None
        self.created = int(time.time())
        self.include_usage = include_usage
        self._roles: dict[int, str] = {}
        self._tools: dict[int, dict[str | None, int]] = {}
        self._last_tool: dict[int, int] = {}

    def encode(self, event: Event) -> dict[str, Any] | None:
        if isinstance(event, TextDelta):
            return self._chunk(event.choice, {"content": event.text})
        if isinstance(event, ReasoningDelta):
            return self._chunk(event.choice, {"reasoning_content": event.text})
        if isinstance(event, RefusalDelta):
            return self._chunk(event.choice, {"refusal": event.text})
        if isinstance(event, ToolCallDelta):
            return self._chunk(event.choice, {"tool_calls": [self._tool_call(event)]})
        if isinstance(event, ChoiceFinished):
            return self._chunk(event.choice, {}, event.finish_reason)
        if isinstance(event, ChoiceRole):
            self._roles[event.choice] = event.role
        elif isinstance(event, ResponseInfo):
            self.id = event.id or self.id
            self.model = event.model or self.model
            self.fingerprint = event.system_fingerprint or self.fingerprint
        elif isinstance(event, UsageReported) and self.include_usage:
            return self.envelope([], usage=usage_object(event.usage))
        return None

    def envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                                 "created": self.created, "model": self.model}
        if self.fingerprint is not None:
            chunk["system_fingerprint"] = self.fingerprint
        chunk["choices"] = choices
        chunk.update(extra)
        return chunk

    def _chunk(self, choice: int, delta: dict[str, Any],
               finish_reason: str | None = None) -> dict[str, Any]:
        role = self._roles.pop(choice, None)
        if role is not None:
            delta = {"role": role, **delta}
        return self.envelope([{"index": choice, "delta": delta, "logprobs": None,
                               "finish_reason": finish_reason}])

    def _tool_call(self, event: ToolCallDelta) -> dict[str, Any]:
        by_id = self._tools.setdefault(event.choice, {})
        index = event.tool_index
        if index is None:
            if event.id is not None and event.id in by_id:
                index = by_id[event.id]
            elif event.id is not None:
                index = len(by_id)
            else:
                index = self._last_tool.get(event.choice, 0)
        if event.id is not None:
            by_id.setdefault(event.id, index)
        self._last_tool[event.choice] = index
        call: dict[str, Any] = {"index": index}
        if event.id is not None:
            call["id"] = event.id
        if event.type is not None:
            call["type"] = event.type
        function: dict[str, Any] = {}
        if event.name is not None:
            function["name"] = event.name
        function["arguments"] = event.arguments
        call["function"] = function
        return call


def usage_object(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


def stream_error(result: StreamResult) -> dict[str, Any]:
    """The data of the ``event: error`` that ends a stream which did not complete."""
    outcome = str(result.outcome)
    error = result.error
    return {"error": {"message": f"{outcome}: {result.reason or 'the stream did not complete'}",
                      "type": f"stream_{outcome}", "code": outcome, "param": None,
                      "outcome": outcome, "status": error.status if error else None,
                      "flags": [str(flag) for flag in result.flags]}}


def completion(result: StreamResult, model: str, response_id: str | None = None) -> Response:
    """``stream: false``: the ``chat.completion`` of a completed stream, else an error."""
    if result.outcome != Outcome.COMPLETED:
        return error_response(_failure(result))
    choices = []
    for choice in result.choices:
        message: dict[str, Any] = {"role": choice.role or "assistant",
                                   "content": choice.text if choice.text or not
                                   choice.tool_calls else None,
                                   "refusal": choice.refusal or None}
        if choice.reasoning:
            message["reasoning_content"] = choice.reasoning
        if choice.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": call.type or "function",
                 "function": {"name": call.name, "arguments": call.arguments}}
                for call in choice.tool_calls]
        choices.append({"index": choice.index, "message": message, "logprobs": None,
                        "finish_reason": choice.finish_reason})
    body: dict[str, Any] = {"id": result.response_id or response_id or
                            f"chatcmpl-fanout-{secrets.token_hex(12)}",
                            "object": "chat.completion", "created": int(time.time()),
                            "model": result.model or model, "choices": choices}
    if result.system_fingerprint:
        body["system_fingerprint"] = result.system_fingerprint
    if result.usage is not None:
        body["usage"] = usage_object(result.usage)
    return json_response(body)


def _failure(result: StreamResult) -> ApiError:
    outcome = result.outcome
    error = result.error
    status = 502
    if outcome == Outcome.TIMED_OUT:
        status = 504
    elif outcome == Outcome.CANCELLED:
        status = 503
    elif error is not None and error.status is not None and 400 <= error.status < 500 \
            and error.status not in (401, 403):
        status = error.status  # the request's own fault; 401/403 are fanout's key, not yours
    return ApiError(status, f"{outcome}: {result.reason or 'the stream did not complete'}",
                    type=(error.type if error and error.type else f"stream_{outcome}"),
                    code=(error.code if error and error.code else str(outcome)))


@final
class ChatJob:
    """Runs one ``ChatAsk``: re-emits its stream, or keeps its result for ``completion``."""

    def __init__(self, service: Service, ask: ChatAsk, running: RunningFanout) -> None:
        self.service = service
        self.ask = ask
        self.running = running
        self.result: StreamResult | None = None

    def client_left(self) -> None:
        self.running.cancel(LEFT_REASON)

    def close(self) -> None:
        self.service.release(self.running)

    async def run(self, out: Out) -> None:
        ask = self.ask
        encoder = ChunkEncoder(ask.model.id, include_usage=ask.include_usage)
        fan: Fanout | None = None
        try:
            async with open_fanout(self.service.endpoint, [ask.request],
                                   **self.service.fanout_options([ask.model])) as fan:
                self.running.attach(fan)
                await drain(fan.events, partial(self._event, out, encoder), out)
        finally:
            if fan is not None and ask.request.key in fan.results:
                self.result = fan.results[ask.request.key]
                self.running.finished(self.result)
            self.close()
        assert self.result is not None
        if self.result.outcome == Outcome.COMPLETED:
            out.add_done()
        else:
            out.add_event("error", stream_error(self.result))
        await out.flush()

    def _event(self, out: Out, encoder: ChunkEncoder, event: Event) -> None:
        if not self.ask.stream:
            return
        chunk = encoder.encode(event)
        if chunk is not None:
            out.add_data(chunk)

    def document(self) -> Response:
        assert self.result is not None
        return completion(self.result, self.ask.model.id)
