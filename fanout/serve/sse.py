"""Server-sent events out, and the responses that run a job while watching the client.

The wire format: one ``event:`` line naming the record's type and one
``data:`` line holding the record, written by ``fanout.records.dumps_bytes``
(``dumps``'s fast path: every line break, control, bidi control and lone
surrogate inside a string is an escape, so a record can never end its
``data:`` line early or split an event).  ``: keep-alive`` comments fill
silences; they are never data.

A job (the fan-out behind ``/v1/fanout``, the one stream behind
``/v1/chat/completions``) runs inside the response, because a trio nursery
cannot live across an async generator's ``yield``: the response starts the
job, watches the connection for ``http.disconnect`` meanwhile, and tells the
job at once when the client leaves (which cancels its streams upstream).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..records import dumps_bytes

__all__ = ["DONE", "KEEPALIVE", "SERVER_SEND", "CollectedResponse", "EventStreamResponse", "Job",
           "NullOut", "Out", "SSEOut", "encode_data", "encode_event"]

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"

#: The scope key under which the server's own ``send`` is kept (``serve_app`` puts it
#: there, outside every middleware): a streamed response's body parts go to it straight.
SERVER_SEND = "fanout.server_send"

_EVENT_HEADS: dict[str, bytes] = {}

#: Every streamed response: no caching or transforming proxy, no nginx buffering.
SSE_HEADERS = {"cache-control": "no-cache, no-transform", "x-accel-buffering": "no",
               "x-content-type-options": "nosniff"}


def encode_event(name: str, payload: Mapping[str, Any]) -> bytes:
    """``event: NAME`` and one ``data:`` line with ``payload`` as JSON."""
    head = _EVENT_HEADS.get(name)
    if head is None:
        head = b"event: " + name.encode() + b"\ndata: "
        if len(_EVENT_HEADS) < 64:  # the record types, a handful: never a client's text
            _EVENT_HEADS[name] = head
    return head + dumps_bytes(payload) + b"\n"


def encode_data(payload: Mapping[str, Any]) -> bytes:
    """One ``data:`` event (no name) with ``payload`` as JSON, as OpenAI streams are."""
    return b"data: " + dumps_bytes(payload) + b"\n"


class Out(Protocol):
    """Where a job writes.  ``add_*`` only buffer; ``flush`` sends what was added.

    ``keepalive``: seconds of silence after which the job calls ``idle``
    (``None``: never, for a response that sends nothing until the end);
    ``quiet_since``: when the last write ended (``trio.current_time()``), or
    the response began.
    """

    keepalive: float | None
    quiet_since: float

    def add_event(self, name: str, payload: Mapping[str, Any]) -> None: ...
    def add_data(self, payload: Mapping[str, Any]) -> None: ...
    def add_done(self) -> None: ...
    async def flush(self) -> None: ...
    async def idle(self) -> None: ...


class Job(Protocol):
    """What a response runs: ``run`` writes to an ``Out``; ``client_left`` is called
    (once) as soon as the client disconnects; ``close`` (idempotent) gives back the
    service's slot, also when ``run`` never started."""

    async def run(self, out: Out) -> None: ...
    def client_left(self) -> None: ...
    def close(self) -> None: ...


class SSEOut:
    """An ``Out`` that writes SSE bytes to an ASGI ``send``, nothing once the client left.

    Each ``flush`` is one ``http.response.body`` message: everything added since
    the last one, joined.
    """

    def __init__(self, send: Send, keepalive: float | None) -> None:
        self._send = send
        self.keepalive = keepalive
        self.quiet_since = trio.current_time()
        self._parts: list[bytes] = []
        self._writing = 0  # writes under way (waiting for a slow client, say)
        self.gone = False
        self.sent = 0

    def add_event(self, name: str, payload: Mapping[str, Any]) -> None:
        self._parts.append(encode_event(name, payload))

    def add_data(self, payload: Mapping[str, Any]) -> None:
        self._parts.append(encode_data(payload))

    def add_done(self) -> None:
        self._parts.append(DONE)

    async def flush(self) -> None:
        if not self._parts:
            return
        data = b"".join(self._parts)
        self._parts.clear()
        await self._write(data)

    async def idle(self) -> None:
        """A keep-alive, unless a write is under way: that is no silence."""
        await self.flush()
        if not self._writing:
            await self._write(KEEPALIVE)

    async def end(self) -> None:
        """The body's end (after the last ``flush``)."""
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, data: bytes) -> None:
        if self.gone:
            return
        self._writing += 1
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError:  # the connection broke under the write: as good as gone
            self.gone = True
        else:
            self.sent += len(data)
            self.quiet_since = trio.current_time()
        finally:
            self._writing -= 1


class NullOut:
    """An ``Out`` that keeps nothing: for a job whose response is built at its end."""

    keepalive: float | None = None
    quiet_since = 0.0

    def add_event(self, name: str, payload: Mapping[str, Any]) -> None:
        pass

    def add_data(self, payload: Mapping[str, Any]) -> None:
        pass

    def add_done(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def idle(self) -> None:
        pass


async def _watch_disconnect(receive: Receive, left: Callable[[], None]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            left()
            return


class EventStreamResponse(Response):
    """``text/event-stream``: the job's events as they happen, keep-alives in between.

    A client that disconnects is noticed at once (not at the next write):
    the job's ``client_left`` cancels its streams; the job then ends, its
    writes dropped.
    """

    media_type = "text/event-stream"

    def __init__(self, job: Job, *, keepalive: float | None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.job = job
        self.keepalive = keepalive
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The head goes through the middlewares (they add its headers); the body, which
        # none of them touches, to the server's own send when it is known: a write is
        # then one call, not one a middleware (measured: bench/serve.py).
        out = SSEOut(scope.get(SERVER_SEND, send), self.keepalive)
        job = self.job

        def left() -> None:
            out.gone = True
            job.client_left()

        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, left)
                await job.run(out)
                nursery.cancel_scope.cancel()
        finally:
            job.close()
        if not out.gone:
            await out.end()


class CollectedResponse(Response):
    """One JSON document once the job has ended (``stream: false``).

    ``build`` builds the response from the job's state after ``run``.  A
    client that leaves meanwhile cancels the job's streams as for a stream.
    """

    def __init__(self, job: Job, render: Callable[[], Response]) -> None:
        self.job = job
        self.build = render
        self.status_code = 200
        self.background = None
        self.init_headers({})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        job = self.job
        gone = False

        def left() -> None:
            nonlocal gone
            gone = True
            job.client_left()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, left)
                await job.run(NullOut())
                nursery.cancel_scope.cancel()
        finally:
            job.close()
        if not gone:
            await self.build()(scope, receive, send)
