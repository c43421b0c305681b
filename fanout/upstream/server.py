"""The embedded upstream's HTTP/1.1 server: trio and h11, every write under our control.

``serve_upstream`` runs until cancelled; use it with ``nursery.start`` to
learn the bound address, or ``open_upstream`` as an async context manager.
It binds to loopback unless told otherwise.  Plans (what to send) come from
``plans.py`` and ``models.py``; this module only executes them.
"""

from __future__ import annotations

import gzip
import hmac
import math
import socket
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import attrs
import h11
import trio

from .capture import PACKAGED_CAPTURES, find_captures
from .catalog import MODELS, plan_chat
from .dialects import anthropic_error_plan, parse_messages_request, parse_responses_request
from .fragment import COALESCE_LIMIT, Fragmenter
from .models import Context
from .plans import (
    Abort,
    CloseAfter,
    Hang,
    Pause,
    Plan,
    RequestError,
    Send,
    Step,
    error_plan,
    json_plan,
    parse_chat_request,
)

__all__ = ["MODELS_FAULTS", "RunningUpstream", "UpstreamStats", "open_upstream", "serve_upstream"]

MAX_REQUEST_BODY = 16 * 1024 * 1024
# Pauses this long or longer watch the socket, so a client that leaves is noticed at once.
# Shorter ones just sleep: a write fails within two of them anyway, and watching costs a
# poller registration per pause, which the paced benchmark would feel.
WATCH_PAUSES = 0.25


@attrs.define(eq=False)
class UpstreamStats:
    """What a running upstream has seen, live: for tests that assert on connections.

    ``connections_open`` counts connections accepted and not yet closed by the
    server; ``requests`` counts model requests (every route) by model id as sent
    (``fault/429:2@byte``), bad requests and other paths not included; ``routes``
    counts them by route (``"chat"``, ``"responses"``, ``"anthropic"``).
    ``unanswered`` counts requests that arrived on a connection the server then
    closed without answering them (``CloseAfter``: a reused keep-alive
    connection the server had given up on); ``reset`` counts those it reset.
    """

    connections_open: int = 0
    connections_opened: int = 0
    connections_closed: int = 0
    requests: dict[str, int] = attrs.Factory(dict)
    routes: dict[str, int] = attrs.Factory(dict)
    unanswered: int = 0
    reset: int = 0
    _changed: trio.Event = attrs.Factory(trio.Event)

    async def wait_for(self, predicate: Callable[[UpstreamStats], bool]) -> None:
        """Return once ``predicate(stats)`` holds (checked now and after every change).

        Bound it yourself: ``with trio.fail_after(1): await stats.wait_for(...)``.
        """
        while not predicate(self):
            await self._changed.wait()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _opened(self) -> None:
        self.connections_open += 1
        self.connections_opened += 1
        self._touch()

    def _closed(self) -> None:
        self.connections_open -= 1
        self.connections_closed += 1
        self._touch()

    def _unanswered(self, reset: bool) -> None:
        self.unanswered += 1
        self.reset += reset
        self._touch()

    def _request(self, model: str, api: str = "chat") -> None:
        self.requests[model] = self.requests.get(model, 0) + 1
        self.routes[api] = self.routes.get(api, 0) + 1
        self._touch()


@attrs.frozen
class RunningUpstream:
    """Where a started upstream listens; its live ``stats``, and the ``context`` its
    plans share (``context.cookies_seen``, ``context.slot``, ...)."""

    host: str
    port: int
    stats: UpstreamStats = attrs.field(factory=UpstreamStats, eq=False, repr=False)
    context: Context = attrs.field(factory=Context, eq=False, repr=False)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ending in ``/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


#: ``models_fault``: how ``GET /v1/models`` fails, as real endpoints' do.
MODELS_FAULTS = {
    "404": "no such route (a relay that lists no models)",
    "401": "401 invalid_api_key, whatever key was sent (a key that may chat but not list)",
    "hang": "reads the request and never answers",
}


@attrs.define
class _Upstream:
    key: str | None
    fragment: str
    context: Context
    models_fault: str | None = None
    stats: UpstreamStats = attrs.Factory(UpstreamStats)
    started: int = attrs.Factory(lambda: int(time.time()))

    def plan(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Plan:
        path = target.split("?", 1)[0].rstrip("/")
        if "cookie" in headers:
            self.context.cookies_seen.append(headers["cookie"])
        if path == "/v1/messages":  # Anthropic's route: its header, its error shape
            if self.key is not None and not _key_matches(headers.get("x-api-key", ""),
                                                         self.key):
                return anthropic_error_plan(401, "invalid x-api-key", "authentication_error")
        elif self.key is not None and not (
                _authorized(headers.get("authorization", ""), self.key)
                or (path == "/v1/models" and _key_matches(headers.get("x-api-key", ""),
                                                          self.key))):
            # Never echo what was sent: it may be someone's real key.
            return error_plan(401, "Incorrect API key provided.", "invalid_request_error",
                              code="invalid_api_key")
        if path == "/v1/models" and self.models_fault is not None:
            if self.models_fault == "hang":
                return Plan(200, raw=True, steps=[Hang()])
            if self.models_fault == "401":
                return error_plan(401, "Incorrect API key provided.", "invalid_request_error",
                                  code="invalid_api_key")
            return error_plan(404, f"No route for {method} {path}.", "invalid_request_error")
        if path == "/v1/models":
            if method != "GET":
                return error_plan(405, f"{method} is not allowed on {path}.",
                                  "invalid_request_error")
            return json_plan(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": self.started, "owned_by": "fanout"}
                for name in self.model_ids()]})
        if path == "/v1/chat/completions":
            if method != "POST":
                return error_plan(405, f"{method} is not allowed on {path}.",
                                  "invalid_request_error")
            try:
                request = parse_chat_request(body, headers)
            except RequestError as exc:
                return error_plan(400, exc.message, "invalid_request_error", param=exc.param)
            self.stats._request(request.model)
            return plan_chat(request, self.context)
        if path in ("/v1/responses", "/v1/messages"):
            anthropic = path == "/v1/messages"
            if method != "POST":
                message = f"{method} is not allowed on {path}."
                return (anthropic_error_plan(405, message, "invalid_request_error") if anthropic
                        else error_plan(405, message, "invalid_request_error"))
            try:
                request = (parse_messages_request if anthropic else parse_responses_request)(
                    body, headers)
            except RequestError as exc:
                if anthropic:
                    return anthropic_error_plan(400, exc.message, "invalid_request_error")
                return error_plan(400, exc.message, "invalid_request_error", param=exc.param)
            self.stats._request(request.model, request.api)
            return plan_chat(request, self.context)
        return error_plan(404, f"No route for {method} {path}.", "invalid_request_error")

    def model_ids(self) -> list[str]:
        return [*MODELS, *(f"replay/{name}" for name in self.context.captures)]

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self.stats._opened()
        try:
            while True:
                received = await _read_request(connection, stream)
                if received is None:
                    return
                request, body = received
                headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                           for k, v in request.headers}
                if body is None:
                    plan = error_plan(413, "The request body is too large.",
                                      "invalid_request_error")
                else:
                    plan = self.plan(request.method.decode(), request.target.decode(
                        "latin-1"), headers, body)
                if not await self._respond(connection, stream, plan):
                    return
                if connection.our_state is h11.MUST_CLOSE:
                    return
                connection.start_next_cycle()
                if plan.close_after is not None:
                    await self._close_after(connection, stream, plan.close_after)
                    return
        except h11.RemoteProtocolError:
            await _send_bad_request(connection, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass  # the client went away, or we already stopped this connection
        finally:
            try:
                await trio.aclose_forcefully(stream)
            finally:
                self.stats._closed()

    async def _close_after(self, connection: h11.Connection, stream: trio.SocketStream,
                           close: CloseAfter) -> None:
        """Wait for the next request (or ``close.within`` idle seconds), then let the
        caller close the connection without answering it: cleanly once the request was
        read whole, or with a TCP reset at its first bytes."""
        with trio.move_on_after(close.within):
            if close.reset:
                if connection.trailing_data[0]:
                    data = b"pipelined"  # the next request already came with the last one
                else:
                    data = await stream.receive_some(65536)
                if data:
                    # SO_LINGER with a zero timeout: close() sends RST, not FIN.
                    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
                    self.stats._unanswered(reset=True)
            elif await _read_request(connection, stream) is not None:
                self.stats._unanswered(reset=False)

    async def _respond(self, connection: h11.Connection, stream: trio.SocketStream,
                       plan: Plan) -> bool:
        """Execute one plan.  False: the connection must be closed now."""
        headers = [(k.encode(), _latin1(v)) for k, v in plan.headers]
        headers.append((b"server", b"fanout-mock"))
        if plan.gzip:
            headers.append((b"content-encoding", b"gzip"))
        if plan.steps is None:
            body = gzip.compress(plan.body, mtime=0) if plan.gzip else plan.body
            headers.append((b"content-length", str(len(body)).encode()))
            await stream.send_all(
                connection.send(h11.Response(status_code=plan.status, headers=headers))
                + connection.send(h11.Data(data=body))
                + connection.send(h11.EndOfMessage())
            )
            return True
        try:
            fragmenter = Fragmenter(plan.fragment or self.fragment)
            writer = _Writer(connection, raw=plan.raw, compress=plan.gzip)
            # Pauses are kept against a schedule, not slept one after another: a
            # stream that fell behind (a loaded server) does not sleep, and in the
            # coalescing mode it sends what is due in one write, as a real server's
            # socket buffer would.  So the rate holds and no delay accumulates.
            due = trio.current_time()
            if not plan.raw:
                await stream.send_all(connection.send(h11.Response(
                    status_code=plan.status, headers=headers)) or b"")
            return await self._send_steps(connection, stream, plan.steps, fragmenter, due,
                                          writer)
        finally:
            close = getattr(plan.steps, "close", None)
            if close is not None:
                close()  # a generator's cleanup runs now, even when the client left early

    async def _send_steps(self, connection: h11.Connection, stream: trio.SocketStream,
                          steps: Iterable[Step], fragmenter: Fragmenter, due: float,
                          writer: _Writer) -> bool:
        held: list[bytes] = []  # coalesced body bytes, sent as one write
        held_size = 0
        for step in steps:
            if isinstance(step, Send):
                if fragmenter.coalesce:
                    held.append(step.data)
                    held_size += len(step.data)
                    if held_size < COALESCE_LIMIT:
                        continue
                    step = Send(b"".join(held))
                    held, held_size = [], 0
                pieces = fragmenter.split(step.data)
                for piece in pieces:
                    await stream.send_all(writer.data(piece))
                    if len(pieces) > 1:
                        await trio.sleep(0)  # let the peer read: separate writes, separate reads
                continue
            if isinstance(step, Pause):
                due += step.seconds
                if due <= trio.current_time():
                    continue  # behind schedule: no sleep, keep coalescing
            if held:
                await stream.send_all(writer.data(b"".join(held)))
                held, held_size = [], 0
            if isinstance(step, Pause):
                if due - trio.current_time() < WATCH_PAUSES:
                    await trio.sleep_until(due)  # a closed peer shows at the next writes
                elif not await _sleep_until(connection, stream, due):
                    return False  # the client went away meanwhile
            elif isinstance(step, Hang):
                await _sleep_until(connection, stream, math.inf)
                return False
            elif isinstance(step, Abort):
                if step.partial_chunk is not None:
                    await stream.send_all(writer.partial(step.partial_chunk))
                return False
        if writer.raw:
            if held:
                await stream.send_all(writer.data(b"".join(held)))
            return False  # a raw response has no end but the connection's
        await stream.send_all(writer.end(b"".join(held)))
        return True


class _Writer:
    """Frames body bytes for the wire: HTTP chunks via h11 (or raw), gzipped if asked.

    Each write is compressed with a sync flush, so a gzipped stream stays a
    stream: the client can inflate every write as it arrives.
    """

    def __init__(self, connection: h11.Connection, *, raw: bool, compress: bool) -> None:
        self.connection = connection
        self.raw = raw
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if compress else None

    def _frame(self, data: bytes) -> bytes:
        if self.raw:
            return data
        return (self.connection.send(h11.Data(data=data)) or b"") if data else b""

    def _compress(self, data: bytes, mode: int = zlib.Z_SYNC_FLUSH) -> bytes:
        if self._gzip is None:
            return data
        return self._gzip.compress(data) + self._gzip.flush(mode)

    def data(self, data: bytes) -> bytes:
        return self._frame(self._compress(data))

    def end(self, held: bytes) -> bytes:
        """The last held bytes, the gzip trailer and the end of the body."""
        tail = self._frame(self._compress(held, zlib.Z_FINISH) if self._gzip else held)
        return tail + (self.connection.send(h11.EndOfMessage()) or b"")

    def partial(self, chunk: bytes) -> bytes:
        """An HTTP chunk that announces twice its length, and only these bytes of it."""
        chunk = self._compress(chunk)
        return chunk if self.raw else b"%x\r\n" % (2 * len(chunk)) + chunk


async def _sleep_until(connection: h11.Connection, stream: trio.SocketStream,
                       deadline: float) -> bool:
    """Sleep until ``deadline`` while watching the socket.  False: the client went away.

    Watching means a client that closes during a long pause (or a hang) is
    noticed at once, not at the next write: its connection closes, and the
    plan's steps are closed (slots and counts given back).  Bytes the client
    sends meanwhile (a pipelined request) go to h11 for the next cycle.  A
    client that half-closes (sends EOF but still reads) counts as gone.
    """
    while trio.current_time() < deadline:
        with trio.move_on_at(deadline):
            data = await stream.receive_some(65536)
            if not data:
                return False
            connection.receive_data(data)
    return True


def _latin1(value: str) -> bytes:
    """A header value as it came (request headers are decoded as latin-1), else UTF-8."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode()


def _authorized(header: str, key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and _key_matches(token, key)


def _key_matches(sent: str, key: str) -> bool:
    return hmac.compare_digest(sent.strip().encode(), key.encode())


async def _read_request(connection: h11.Connection, stream: trio.SocketStream
                        ) -> tuple[h11.Request, bytes | None] | None:
    """The next request and its body (``None`` body: over the limit), or None at close."""
    request: h11.Request | None = None
    parts: list[bytes] = []
    size = 0
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            connection.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size <= MAX_REQUEST_BODY:
                parts.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, (b"".join(parts) if size <= MAX_REQUEST_BODY else None)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _send_bad_request(connection: h11.Connection, stream: trio.SocketStream) -> None:
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    plan = error_plan(400, "Malformed HTTP request.", "invalid_request_error")
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
        await stream.send_all(
            connection.send(h11.Response(status_code=400, headers=[
                *((k.encode(), v.encode()) for k, v in plan.headers),
                (b"content-length", str(len(plan.body)).encode()), (b"connection", b"close")]))
            + connection.send(h11.Data(data=plan.body)) + connection.send(h11.EndOfMessage()))


async def serve_upstream(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    key: str | None = None,
    cadence: float | None = None,
    fragment: str = "auto",
    captures: Sequence[Path] = (PACKAGED_CAPTURES,),
    models_fault: str | None = None,
    task_status: trio.TaskStatus[RunningUpstream] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the embedded upstream until cancelled: ``POST /v1/chat/completions``,
    ``/v1/responses`` and ``/v1/messages`` (Anthropic), from the same models.

    ``key``: require ``Authorization: Bearer <key>`` (``x-api-key: <key>`` on
    ``/v1/messages``), 401 otherwise.
    ``cadence``: seconds between chunks for every model (default: each
    model's own).  ``fragment``: the default fragmenting mode.  ``captures``:
    directories whose captures are served as ``replay/<name>``.  ``models_fault``:
    how ``GET /v1/models`` fails instead of listing the models (``MODELS_FAULTS``:
    ``"404"``, ``"401"``, ``"hang"``); the model routes are unchanged.
    ``task_status.started`` receives the ``RunningUpstream`` (its port is the
    bound one when ``port`` is 0; its ``stats`` count connections and requests
    live).
    """
    Fragmenter(fragment)  # fail now on a bad mode, not on the first request
    if models_fault is not None and models_fault not in MODELS_FAULTS:
        raise ValueError(f"models_fault: {models_fault!r} is not one of "
                         f"{', '.join(MODELS_FAULTS)}")
    upstream = _Upstream(key, fragment, Context(cadence=cadence,
                                                captures=find_captures(captures)),
                         models_fault)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    task_status.started(RunningUpstream(host, bound[1], upstream.stats, upstream.context))
    await trio.serve_listeners(upstream.handle, listeners)


@asynccontextmanager
async def open_upstream(**options: Any) -> AsyncIterator[RunningUpstream]:
    """``async with open_upstream() as upstream:`` - started, and stopped on exit."""
    async with trio.open_nursery() as nursery:
        running: RunningUpstream = await nursery.start(partial(serve_upstream, **options))
        try:
            yield running
        finally:
            nursery.cancel_scope.cancel()
