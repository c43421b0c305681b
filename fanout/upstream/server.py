"""The embedded upstream's HTTP/1.1 server: trio and h11, every write under our control.

``serve_upstream`` runs until cancelled; use it with ``nursery.start`` to
learn the bound address, or ``open_upstream`` as an async context manager.
It binds to loopback unless told otherwise.  Plans (what to send) come from
``plans.py`` and ``models.py``; this module only executes them.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import attrs
import h11
import trio

from .capture import PACKAGED_CAPTURES, find_captures
from .fragment import COALESCE_LIMIT, Fragmenter
from .models import MODELS, Context, plan_chat
from .plans import (
    Abort,
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

__all__ = ["RunningUpstream", "open_upstream", "serve_upstream"]

MAX_REQUEST_BODY = 16 * 1024 * 1024


@attrs.frozen
class RunningUpstream:
    """Where a started upstream listens."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ending in ``/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


@attrs.define
class _Upstream:
    key: str | None
    fragment: str
    context: Context
    started: int = attrs.Factory(lambda: int(time.time()))

    def plan(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Plan:
        path = target.split("?", 1)[0].rstrip("/")
        if self.key is not None and not _authorized(headers.get("authorization", ""), self.key):
            # Never echo what was sent: it may be someone's real key.
            return error_plan(401, "Incorrect API key provided.", "invalid_request_error",
                              code="invalid_api_key")
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
            return plan_chat(request, self.context)
        return error_plan(404, f"No route for {method} {path}.", "invalid_request_error")

    def model_ids(self) -> list[str]:
        return [*MODELS, *(f"replay/{name}" for name in self.context.captures)]

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
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
        except h11.RemoteProtocolError:
            await _send_bad_request(connection, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass  # the client went away, or we already stopped this connection
        finally:
            await trio.aclose_forcefully(stream)

    async def _respond(self, connection: h11.Connection, stream: trio.SocketStream,
                       plan: Plan) -> bool:
        """Execute one plan.  False: the connection must be closed now."""
        headers = [(k.encode(), v.encode()) for k, v in plan.headers]
        headers.append((b"server", b"fanout-mock"))
        if plan.steps is None:
            headers.append((b"content-length", str(len(plan.body)).encode()))
            await stream.send_all(
                connection.send(h11.Response(status_code=plan.status, headers=headers))
                + connection.send(h11.Data(data=plan.body))
                + connection.send(h11.EndOfMessage())
            )
            return True
        fragmenter = Fragmenter(plan.fragment or self.fragment)
        # Pauses are kept against a schedule, not slept one after another: a
        # stream that fell behind (a loaded server) does not sleep, and in the
        # coalescing mode it sends what is due in one write, as a real server's
        # socket buffer would.  So the rate holds and no delay accumulates.
        due = trio.current_time()
        await stream.send_all(connection.send(h11.Response(status_code=plan.status,
                                                           headers=headers)) or b"")
        try:
            return await self._send_steps(connection, stream, plan.steps, fragmenter, due)
        finally:
            close = getattr(plan.steps, "close", None)
            if close is not None:
                close()  # a generator's cleanup runs now, even when the client left early

    async def _send_steps(self, connection: h11.Connection, stream: trio.SocketStream,
                          steps: Iterable[Step], fragmenter: Fragmenter, due: float) -> bool:
        held: list[bytes] = []  # coalesced body bytes, sent as one HTTP chunk
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
                    await stream.send_all(connection.send(h11.Data(data=piece)) or b"")
                    if len(pieces) > 1:
                        await trio.sleep(0)  # let the peer read: separate writes, separate reads
                continue
            if isinstance(step, Pause):
                due += step.seconds
                if due <= trio.current_time():
                    continue  # behind schedule: no sleep, keep coalescing
            if held:
                await stream.send_all(connection.send(h11.Data(data=b"".join(held))) or b"")
                held, held_size = [], 0
            if isinstance(step, Pause):
                await trio.sleep_until(due)
            elif isinstance(step, Hang):
                while await stream.receive_some(65536):
                    pass  # until the client closes
                return False
            elif isinstance(step, Abort):
                if step.partial_chunk is not None:
                    chunk = step.partial_chunk
                    await stream.send_all(b"%x\r\n" % (2 * len(chunk)) + chunk)
                return False
        tail = connection.send(h11.Data(data=b"".join(held))) if held else b""
        await stream.send_all((tail or b"") + (connection.send(h11.EndOfMessage()) or b""))
        return True


def _authorized(header: str, key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


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
    task_status: trio.TaskStatus[RunningUpstream] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the embedded OpenAI-compatible upstream until cancelled.

    ``key``: require ``Authorization: Bearer <key>`` (401 otherwise).
    ``cadence``: seconds between chunks for every model (default: each
    model's own).  ``fragment``: the default fragmenting mode.  ``captures``:
    directories whose captures are served as ``replay/<name>``.
    ``task_status.started`` receives the ``RunningUpstream`` (its port is the
    bound one when ``port`` is 0).
    """
    Fragmenter(fragment)  # fail now on a bad mode, not on the first request
    upstream = _Upstream(key, fragment, Context(cadence=cadence,
                                                captures=find_captures(captures)))
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    task_status.started(RunningUpstream(host, bound[1]))
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
