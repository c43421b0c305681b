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
from h11._readers import ChunkedReader as _ChunkedReader
from httpx._transports.default import AsyncResponseStream

__all__ = ["RECEIVE_SIZE", "body_reader"]

#: Bytes asked of the socket per read.  An SSE event is a few hundred bytes; a burst
#: still drains in few reads (httpcore asks 64 KiB, allocated and shrunk every read).
RECEIVE_SIZE = 16 * 1024


def _broken(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    """The error trio's ``SocketStream`` raises for ``exc``, in its words (so the
    messages downstream are the same)."""
    if exc.errno in (errno.EBADF, errno.ENOTSOCK):
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


_HEX = b"0123456789abcdefABCDEF"


class _H11Body:
    """Reads a response body off an httpcore HTTP/1.1 connection's h11 state machine.

    A chunked body is decoded here between chunk boundaries: h11 costs ~6 µs
    an event (a state machine, a buffer and an event object per chunk), this
    a slice.  Whenever h11 waits for data at a chunk boundary with nothing
    buffered, the reader takes over; whatever it does not read as a plain
    chunk (an incomplete or unusual chunk header, the last chunk and its
    trailers) goes back to h11 at a boundary, which then reads it as ever:
    h11 ends the body (so the connection returns to the pool) and raises
    every error in its own words (the end of the input is handed to it too).
    """

    __slots__ = ("_done", "_error", "_footer", "_h11", "_left", "_own", "_receive", "_socket")

    def __init__(self, state: h11.Connection, receive: Callable[[int], Awaitable[bytes]],
                 socket: trio.socket.SocketType | None = None) -> None:
        self._h11 = state
        self._receive = receive
        self._socket = socket  # a plain TCP socket: read directly (``_read``)
        self._done = False
        self._own = False  # decoding the chunks here
        self._left = 0  # bytes of the current chunk still to come
        self._footer = 0  # bytes of the CRLF after a chunk still to come
        self._error: httpx.RemoteProtocolError | None = None  # after the payload before it

    def __aiter__(self) -> _H11Body:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        if self._error is not None:
            raise self._error
        state = self._h11
        while True:
            if self._own:
                data = await self._read()
                if not data:  # the end of the input: h11 says what that means here
                    self._own = False
                    state.receive_data(b"")
                    continue
                body = self._decode(data)
                if body:
                    return body
                continue
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                if self._at_boundary():
                    self._own = True
                    continue
                state.receive_data(await self._read())
                continue
            if type(event) is h11.Data:
                if event.data:
                    return bytes(event.data)
                continue
            # EndOfMessage (or, read past it, nothing more): the body is complete.
            self._done = True
            raise StopAsyncIteration

    async def _read(self) -> bytes:
        socket = self._socket
        try:
            if socket is None:
                return await self._receive(RECEIVE_SIZE)
            # A plain TCP socket, read here, with one wake-up per read.  trio's own
            # ``receive_some`` first tries to read (at one event per read the data is
            # rarely there yet: a failed system call and its exception), then waits,
            # reads, and yields once more.  This waits, then reads: the same rules on
            # cancellation (a cancelled wait read nothing) and the same errors.  No
            # coroutine in between either: each is work for the cyclic GC.
            while True:
                fd = socket.fileno()
                if fd < 0:
                    raise trio.ClosedResourceError("this socket was already closed")
                await trio.lowlevel.wait_readable(fd)
                try:
                    return os.read(fd, RECEIVE_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise _broken(exc) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpx.ReadError(str(exc)) from exc  # as httpcore and httpx map it

    def _at_boundary(self) -> bool:
        """h11 reads a chunked body, is between two chunks and holds no bytes."""
        reader = getattr(self._h11, "_reader", None)
        return (type(reader) is _ChunkedReader and reader._bytes_in_chunk == 0
                and not reader._bytes_to_discard and not reader._reading_trailer
                and self._h11.trailing_data == (b"", False))

    def _decode(self, data: bytes) -> bytes:
        """The chunks' payload in ``data``; what is not a plain chunk goes back to h11."""
        pieces: list[bytes] = []
        position, size = 0, len(data)
        while position < size:
            if self._footer:
                take = min(self._footer, size - position)
                expected = b"\r\n"[2 - self._footer:]
                if data[position:position + take] != expected[:take]:  # h11's words
                    self._error = httpx.RemoteProtocolError(
                        f"malformed chunk footer: {bytearray(data[position:position + take])!r} "
                        f"(expected {expected!r})")
                    break
                self._footer -= take
                position += take
            elif self._left:
                take = min(self._left, size - position)
                pieces.append(data[position:position + take])
                self._left -= take
                position += take
                if not self._left:
                    self._footer = 2
            else:  # a chunk header, at a boundary
                end = data.find(b"\r\n", position)
                header = data[position:end] if end >= 0 else b""
                if not header or header.strip(_HEX) or header.strip(b"0") == b"":
                    # Incomplete, unusual (extensions, garbage) or the last chunk: h11's.
                    self._own = False
                    self._h11.receive_data(data[position:])
                    break
                self._left = int(header, 16)
                position = end + 2
        if not pieces and self._error is not None:
            raise self._error
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


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
        return _H11Body(state, receive, socket_stream.socket)
    return _H11Body(state, receive)
