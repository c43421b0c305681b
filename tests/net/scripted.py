"""httpx.MockTransport responses that unfold in (virtual) time, for deadline tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs
import httpx
import trio

SSE = {"content-type": "text/event-stream"}


def event(content: str | None = None, *, role: str | None = None,
          finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class ScriptedBody(httpx.AsyncByteStream, AsyncIterator[bytes]):
    """Yields each (delay, bytes) step after sleeping its delay; an Exception step raises."""

    def __init__(self, steps: Sequence[tuple[float, bytes | Exception]]) -> None:
        self.steps = list(steps)
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self  # a plain iterator, not an async generator: nothing left to finalize

    async def __anext__(self) -> bytes:
        if not self.steps:
            raise StopAsyncIteration
        delay, data = self.steps.pop(0)
        await trio.sleep(delay)
        if isinstance(data, Exception):
            raise data
        return data

    async def aclose(self) -> None:
        self.closed = True


@attrs.define
class Script:
    """Per-call responses for one MockTransport; records every request."""

    responses: list[Callable[[httpx.Request], Any]]
    requests: list[httpx.Request] = attrs.Factory(list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        index = min(len(self.requests), len(self.responses)) - 1
        response = self.responses[index](request)
        if hasattr(response, "__await__"):
            response = await response
        return response  # type: ignore[no-any-return]

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


def stream(*steps: tuple[float, bytes | Exception], status: int = 200,
           headers: dict[str, str] | None = None) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or SSE, stream=ScriptedBody(steps))
    return respond


def delayed(seconds: float, then: Callable[[httpx.Request], httpx.Response]
            ) -> Callable[[httpx.Request], Any]:
    async def respond(request: httpx.Request) -> httpx.Response:
        await trio.sleep(seconds)
        return then(request)
    return respond


def status(code: int, body: dict[str, Any] | None = None,
           headers: dict[str, str] | None = None) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json=body or {"error": {"message": f"status {code}"}},
                              headers=headers)
    return respond


def raises(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc
    return respond
