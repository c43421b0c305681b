"""The embedded upstream on virtual sockets, under trio's autojump ``MockClock``.

For tests of *when* the upstream sends (pacing, pauses, drips, noticing a client that
left): the server's own connection handler runs against in-memory clients that record
every write with its virtual time.  For tests of *when* fanout does something (queueing
in a client's pool, deadlines), ``http_client()`` gives an httpx client whose
connections reach the same handler in memory.  No socket is involved, so the autojump clock is safe,
pauses are exact, and a test neither waits nor depends on how loaded the machine is.
What the bytes look like on a real socket is tested over loopback elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, cast

import httpcore
import httpx
import trio
import trio.testing

from fanout.upstream.capture import PACKAGED_CAPTURES, find_captures
from fanout.upstream.models import Context
from fanout.upstream.server import UpstreamStats, _Upstream
from tests.upstream.wire import Chunks, dechunk, request_bytes


class VirtualClient:
    """One client on a virtual socket: sends its request, then reads everything.

    ``writes`` holds each ``send_all`` of the server as (virtual seconds since the
    request was sent, bytes); ``closed_at`` when the server closed the connection.
    ``leave()`` closes the client's end: the server reads EOF, and its writes fail.
    """

    def __init__(self, request: bytes) -> None:
        self._inbox = [request]
        self._left = trio.Event()
        self._changed = trio.Event()
        self.sent_at = trio.current_time()
        self.writes: list[tuple[float, bytes]] = []
        self.closed_at: float | None = None

    # -- the server's end, the part of trio.SocketStream that the handler uses

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        if self._left.is_set():
            raise trio.BrokenResourceError("the client left")
        self.writes.append((self.now, data))
        self._touch()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._inbox:
            return self._inbox.pop(0)
        await self._left.wait()
        return b""

    async def aclose(self) -> None:
        if self.closed_at is None:
            self.closed_at = self.now
            self._touch()
        await trio.lowlevel.checkpoint()

    # -- the client's end

    @property
    def now(self) -> float:
        """Virtual seconds since the request was sent."""
        return trio.current_time() - self.sent_at

    def leave(self) -> None:
        self._left.set()

    @property
    def data(self) -> bytes:
        return b"".join(data for _, data in self.writes)

    @property
    def body(self) -> Chunks:
        return dechunk(self.data.partition(b"\r\n\r\n")[2])

    async def wait_for(self, predicate: Callable[[VirtualClient], bool]) -> None:
        """Return once ``predicate(self)`` holds (checked after every write and the close)."""
        while not predicate(self):
            await self._changed.wait()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


class VirtualUpstream:
    """The embedded upstream's handler, serving ``VirtualClient`` s in a nursery."""

    def __init__(self, nursery: trio.Nursery, *, cadence: float | None = None,
                 fragment: str = "auto") -> None:
        self._nursery = nursery
        self.server = _Upstream(None, fragment, Context(
            cadence=cadence, captures=find_captures((PACKAGED_CAPTURES,))))

    @property
    def context(self) -> Context:
        return self.server.context

    @property
    def stats(self) -> UpstreamStats:
        return self.server.stats

    def http_client(self, **options: Any) -> httpx.AsyncClient:
        """An httpx client (``options`` as for ``httpx.AsyncClient``: limits, timeout...)
        whose connections reach this upstream over in-memory streams, on virtual time.

        Its transport is httpx's own, pool and traces included; only the network under
        the pool is swapped.  Any host and port reach this upstream.
        """
        client = httpx.AsyncClient(base_url="http://upstream.test/v1", trust_env=False,
                                   **options)
        transport = client._transport  # httpx has no public accessor
        assert isinstance(transport, httpx.AsyncHTTPTransport)
        transport._pool._network_backend = _VirtualNetwork(self)
        return client

    def connect(self, model: str, *, headers: dict[str, str] | None = None,
                **body: Any) -> VirtualClient:
        """Open a connection and send one chat request for ``model``, now."""
        client = VirtualClient(request_bytes(model, headers=headers, **body))
        self._nursery.start_soon(self.server.handle, cast(trio.SocketStream, client))
        return client


@asynccontextmanager
async def virtual_upstream(**options: Any) -> AsyncIterator[VirtualUpstream]:
    """``async with virtual_upstream() as upstream:`` - every connection ends on exit."""
    async with trio.open_nursery() as nursery:
        yield VirtualUpstream(nursery, **options)
        nursery.cancel_scope.cancel()


class _VirtualNetworkStream(httpcore.AsyncNetworkStream):
    """httpcore's side of one in-memory connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                return await self._stream.receive_some(max_bytes)
        except trio.TooSlowError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await self._stream.send_all(buffer)
        except trio.TooSlowError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)

    def get_extra_info(self, info: str) -> Any:
        return None


class _VirtualNetwork(httpcore.AsyncNetworkBackend):
    """Every connection opened is one more connection the upstream handles."""

    def __init__(self, upstream: VirtualUpstream) -> None:
        self._upstream = upstream

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        ours, theirs = trio.testing.memory_stream_pair()
        self._upstream._nursery.start_soon(self._upstream.server.handle,
                                           cast(trio.SocketStream, theirs))
        await trio.lowlevel.checkpoint()
        return _VirtualNetworkStream(ours)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
