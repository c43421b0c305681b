"""A streamed response body's bytes, read with as few layers as the connection allows.

``httpx`` hands a streamed body through six nested async generators
(``aiter_raw``, its client's, its transport's, httpcore's pool's and
connection's, and the connection's body reader), each with its own exception
mapping or trace, and httpcore opens a cancel scope around every socket read:
at one SSE event per read, that was about half of a fan-out's client CPU
(py-spy, 1,000 streams).  When the response came over an HTTP/1.1
connection of httpcore's own pool (an ``httpx.AsyncHTTPTransport``, as
``make_client`` builds, or yours), ``read_body`` reads the same connection's
h11 state machine and socket stream directly, exactly as httpcore's reader
would (the same events, the same end-of-body rules), and maps errors to the
same httpx exceptions with the same messages and causes.  Closing the response
(``response.aclose()``) then works as it always does: a body read to its end
leaves the connection to the pool, anything else closes it.

Any other response (HTTP/2, a proxy, a test double, a transport of your own)
is read through ``aiter_raw`` as before.  Neither path is an async generator
of ours: a read cancelled mid-way leaves nothing unfinished.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import h11
import httpx
import trio
from httpx._transports.default import AsyncResponseStream

__all__ = ["RECEIVE_SIZE", "body_reader"]

#: Bytes asked of the socket per read.  An SSE event is a few hundred bytes; a burst
#: still drains in few reads (httpcore asks 64 KiB, allocated and shrunk every read).
RECEIVE_SIZE = 16 * 1024


class _SocketReader:
    """``receive_some`` of a plain ``trio.SocketStream``, with one wake-up per read.

    trio's own first tries ``recv`` (at one event per read the data is rarely
    there yet: a failed system call and its exception), then waits, reads, and
    yields once more on the way out.  This waits for the socket, then reads:
    the same cancellation rules (a cancelled wait read nothing), the same
    errors (``BrokenResourceError`` from the ``OSError``, ``ClosedResourceError``
    once the socket is closed).
    """

    __slots__ = ("_socket",)

    def __init__(self, socket: trio.socket.SocketType) -> None:
        self._socket = socket

    async def __call__(self, size: int) -> bytes:
        socket = self._socket
        while True:
            fd = socket.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("this socket was already closed")
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, size)
            except BlockingIOError:
                continue  # woken without data (it happens): wait again
            except OSError as exc:  # in trio's words, for the same messages downstream
                if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                    raise trio.ClosedResourceError("this socket was already closed") from None
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


class _H11Body:
    """Reads a response body off an httpcore HTTP/1.1 connection's h11 state machine."""

    __slots__ = ("_done", "_h11", "_receive")

    def __init__(self, state: h11.Connection, receive: Callable[[int], Awaitable[bytes]]
                 ) -> None:
        self._h11 = state
        self._receive = receive
        self._done = False

    def __aiter__(self) -> _H11Body:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        state = self._h11
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self._receive(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise httpx.ReadError(str(exc)) from exc  # as httpcore and httpx map it
                state.receive_data(data)
                continue
            if type(event) is h11.Data:
                if event.data:
                    return bytes(event.data)
                continue
            # EndOfMessage (or, read past it, nothing more): the body is complete.
            self._done = True
            raise StopAsyncIteration


def body_reader(response: httpx.Response) -> AsyncIterator[bytes] | None:
    """The direct reader of ``response``'s body, or ``None`` where there is none (then
    read ``response.aiter_raw()``).  Call before anything else read the body."""
    try:
        stream: Any = response.stream
        if type(stream).__name__ == "BoundAsyncStream":  # the client's wrapper
            stream = stream._stream
        if not isinstance(stream, AsyncResponseStream):
            return None
        pooled = stream._httpcore_stream  # httpcore's PoolByteStream
        inner: Any = getattr(pooled, "_stream", None)  # its connection's byte stream
        if type(inner).__name__ != "HTTP11ConnectionByteStream":
            return None
        connection = inner._connection
        state = connection._h11_state
        network = connection._network_stream
        socket_stream = getattr(network, "_stream", None)  # httpcore's TrioStream's own
        receive = getattr(socket_stream, "receive_some", None)
    except AttributeError:  # another httpx/httpcore layout: the ordinary path
        return None
    if (not isinstance(state, h11.Connection) or receive is None
            or type(network).__name__ != "TrioStream" or state.their_state is not h11.SEND_BODY):
        return None
    response.is_stream_consumed = True  # as aiter_raw marks it: no second reader
    if type(socket_stream) is trio.SocketStream:  # plain TCP: TLS goes through its stream
        return _H11Body(state, _SocketReader(socket_stream.socket))
    return _H11Body(state, receive)
