"""Reading requests within deadlines, and no more connections read at once than allowed.

A client that sends its request a byte a second holds a connection (a file
descriptor, a task) as long as it likes unless reading is bounded.  Hypercorn
bounds what it can: the head's size (``h11_max_incomplete_size``) and, with its
keep-alive timer, a head that does not come at all.  It has no deadline for a body,
no 408, and no cap on connections being read; this module adds them, at both ends
of Hypercorn:

- ``ReadingStream`` wraps each accepted connection's stream (below Hypercorn): a
  request *head* must be whole within ``head_timeout`` seconds of the connection
  opening, or of the previous response's end on a kept-alive connection, however
  many bytes trickle in.  Past it the connection is closed, after a ``408 Request
  Timeout`` when some of the head had arrived.
- ``ReadDeadlines`` wraps the ASGI app (above Hypercorn): a request *body* gets
  ``body_timeout`` seconds, plus one more for every ``body_min_rate`` bytes
  received.  Past it the app's read of the body raises ``ApiError(408)``: the
  client gets the 408, and Hypercorn closes the connection (the body was not read
  to its end).
- ``Readers`` counts the connections being read (waiting for or reading a head or a
  body: kept-alive idle ones too).  One more than ``max_reading_connections``
  closes the one read the longest, the same way as a deadline would: the slowest
  clients go first, a client that sends its request at once is never the oldest.

A connection is in one of three phases: ``head`` (deadline kept by the stream),
``body`` (deadline kept by the app's reads) and ``busy`` (the app has the whole
request: not being read, not counted).  The phases move with what the two ends
see: the end of a head in the bytes, the app called, the body's last part, the
app's return.  This is for HTTP/1: an HTTP/2 connection (prior knowledge, cleartext)
leaves the count once its first request reaches the app, and is bounded by
Hypercorn's own settings only.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import math
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

import trio

from ..config import ServeConfig
from ..records import dumps
from .errors import ApiError

__all__ = ["Connection", "ReadDeadlines", "Readers", "ReadingStream"]

Phase = Literal["head", "body", "busy"]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The connection the current task serves (set by the server for each connection).
CURRENT: contextvars.ContextVar[Connection | None] = contextvars.ContextVar(
    "fanout_serve_connection", default=None)

TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
               b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class Connection:
    """What is known of reading one connection: its phase, the phase's deadline
    (``trio.current_time()`` based), the bytes of it received, whether anything was
    sent since it began; ``why`` says why it was closed, if it was."""

    def __init__(self, readers: Readers) -> None:
        self.readers = readers
        self.phase: Phase = "busy"
        self.began = 0.0
        self.deadline = math.inf
        self.received = 0
        self.sent = False
        self.why: str | None = None
        self._tail = b""  # the last bytes of the head so far: where its end may start
        #: What ends the task serving the connection (the server sets it).
        self.cancel_scope = trio.CancelScope()
        # The reads waiting now: the server's (of the stream), the app's (of the body).
        self._scopes: dict[Phase, trio.CancelScope] = {}

    def begin(self, phase: Phase) -> None:
        """Start ``phase`` now (its deadline, counts, and the cap)."""
        limits = self.readers.limits
        self.phase = phase
        self.began = trio.current_time()
        self.received = 0
        self.sent = False
        self._tail = b""
        self.deadline = -math.inf if self.why is not None else {
            "head": self.began + limits.head_timeout,
            "body": self.began + limits.body_timeout}.get(phase, math.inf)
        self._move_deadlines()
        if phase == "busy" or self.why is not None:  # closed: not to be read again
            self.readers.done(self)
        else:
            self.readers.reading(self)

    def close_now(self, why: str) -> None:
        """End the reading of this connection at once (``why`` names the reason)."""
        self.why = why
        self.deadline = -math.inf
        self._move_deadlines()

    def _move_deadlines(self) -> None:
        for phase, scope in self._scopes.items():
            scope.deadline = self.deadline if phase == self.phase else math.inf

    def got_body(self, size: int) -> None:
        limits = self.readers.limits
        self.received += size
        self.deadline = max(self.deadline, self.began + limits.body_timeout
                            + self.received / limits.body_min_rate)

    def saw_head(self, data: bytes | bytearray) -> bool:
        """Count ``data`` as head bytes; whether the head's end (a blank line) is in it."""
        self.received += len(data)
        window = self._tail + bytes(data)
        self._tail = window[-3:]
        return b"\n\r\n" in window or b"\n\n" in window

    async def read(self, phase: Phase, receive: Callable[[], Awaitable[Any]]
                   ) -> tuple[bool, Any]:
        """``receive()``, within this connection's deadline while it is in ``phase``
        (``head``: the server's read of the stream; ``body``: the app's read of the
        body): (whether the deadline passed, what it received)."""
        with trio.CancelScope(deadline=self.deadline if self.phase == phase else math.inf
                              ) as scope:
            self._scopes[phase] = scope
            try:
                return False, await receive()
            finally:
                del self._scopes[phase]
        return True, None


class Readers:
    """The connections being read, oldest first; at most ``max_reading_connections``.
    ``closed`` counts those closed for a deadline or the cap, by reason."""

    CLOSED = ("head_timeout", "body_timeout", "too_many")

    def __init__(self, limits: ServeConfig) -> None:
        self.limits = limits
        self._reading: dict[Connection, None] = {}  # in order of their phase's start
        self.closed = dict.fromkeys(self.CLOSED, 0)

    def __len__(self) -> int:
        return len(self._reading)

    def open(self) -> Connection:
        """A new connection, waiting for its first head."""
        connection = Connection(self)
        connection.begin("head")
        return connection

    def reading(self, connection: Connection) -> None:
        self._reading.pop(connection, None)
        self._reading[connection] = None
        while len(self._reading) > self.limits.max_reading_connections:
            oldest = next(iter(self._reading))
            self._reading.pop(oldest)
            self.closed["too_many"] += 1
            oldest.close_now(f"{self.limits.max_reading_connections} connections were being "
                             "read at once (max_reading_connections), and this one the "
                             "longest")

    def done(self, connection: Connection) -> None:
        self._reading.pop(connection, None)


class ReadingStream(trio.abc.HalfCloseableStream):
    """An accepted connection's stream, as Hypercorn reads it: the head's deadline kept
    (a 408 when part of a head came), sending noted, the connection let go of when
    closed."""

    def __init__(self, stream: trio.SocketStream, connection: Connection) -> None:
        self._stream = stream
        self.connection = connection
        self._closed = False  # closed by a deadline or the cap: nothing more is sent

    @property
    def socket(self) -> trio.socket.SocketType:  # what Hypercorn asks for the addresses
        return self._stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        connection = self.connection
        while True:
            timed_out, data = await connection.read(
                "head", lambda: self._stream.receive_some(max_bytes))
            if not timed_out:
                break
            if connection.phase == "head":
                await self._give_up()  # raises
        if connection.phase == "head" and data and connection.saw_head(data):
            connection.begin("body")  # until the app, called, says whether there is one
        return data  # type: ignore[no-any-return]

    async def _give_up(self) -> None:
        connection = self.connection
        why = connection.why
        if why is None:
            connection.readers.closed["head_timeout"] += 1
            why = ("the request head was not whole within "
                   f"{connection.readers.limits.head_timeout:g} s (this service's head_timeout)")
        connection.readers.done(connection)
        if connection.received and not connection.sent:
            text = dumps(ApiError(408, why, code="request_timeout").body()).encode()
            # A second at most for a client that does not read either.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1), \
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._stream.send_all(TIMEOUT_408 % (len(text), text))
        connection.sent = True  # nothing more: what Hypercorn sends now is dropped
        self._closed = True
        # Closed now, and the task serving it ended: Hypercorn would wait for its own
        # keep-alive timer first.
        await self._stream.aclose()
        connection.cancel_scope.cancel()
        raise trio.BrokenResourceError(why)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data``: what the socket takes at once is written here without a
        schedule point (Hypercorn makes one before every write, taking its send lock;
        trio's own send would make a second after it, for every event relayed); the
        rest, if any, through trio's send, which waits until the socket takes it."""
        if self._closed:
            raise trio.BrokenResourceError("closed for reading too slowly")
        self.connection.sent = True
        stream = self._stream
        socket = stream.socket
        descriptor = socket.fileno()
        if data and descriptor != -1 and not socket.did_shutdown_SHUT_WR:
            try:
                written = os.write(descriptor, data)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                    raise trio.ClosedResourceError("this socket was already closed") from None
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            if written == len(data):
                return
            data = memoryview(data)[written:]
        await stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        self.connection.readers.done(self.connection)
        self.connection.phase = "busy"
        await self._stream.aclose()


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        name = bytes(name).lower()
        if name == b"content-length":
            return bytes(value).strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


class ReadDeadlines:
    """The ASGI app ``app`` with the body's deadline kept on its reads (an
    ``ApiError(408)`` past it), and the connection's phases moved as requests come
    and go.  Outside a connection served with ``ReadingStream`` it changes nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = CURRENT.get()
        if connection is not None and (scope["type"] != "http"
                                       or scope.get("http_version") not in ("1.0", "1.1")):
            # HTTP/2 (prior knowledge): requests share the connection, so no one of them
            # may move its phases (Hypercorn's HTTP/2 flow control applies); a WebSocket:
            # not read as a request.
            connection.begin("busy")
            connection = None
        if connection is None:
            await self.app(scope, receive, send)
            return
        connection.begin("body" if _has_body(scope) else "busy")

        async def receive_within() -> Message:
            if connection.phase != "body":
                return await receive()
            timed_out, message = await connection.read("body", receive)
            if timed_out:
                connection.readers.done(connection)
                why = connection.why
                if why is None:
                    connection.readers.closed["body_timeout"] += 1
                    limits = connection.readers.limits
                    why = (f"the request body came too slowly: {connection.received} bytes "
                           f"in {trio.current_time() - connection.began:.3g} s (this service "
                           f"allows body_timeout {limits.body_timeout:g} s plus 1 s per "
                           f"body_min_rate {limits.body_min_rate} bytes)")
                connection.phase = "busy"
                raise ApiError(408, why, code="request_timeout")
            assert isinstance(message, MutableMapping)
            if message.get("type") == "http.request":
                connection.got_body(len(message.get("body", b"")))
                if not message.get("more_body", False):
                    connection.begin("busy")
            elif message.get("type") == "http.disconnect":
                connection.begin("busy")
            return message

        try:
            await self.app(scope, receive_within, send)
        finally:
            if connection.phase != "head":
                connection.begin("head")  # the next request's head, on a kept-alive one
