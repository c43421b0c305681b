"""The embedded upstream on virtual sockets, under trio's autojump ``MockClock``.

For tests of *when* the upstream sends (pacing, pauses, drips, noticing a client that
left): the server's own connection handler runs against in-memory clients that record
every write with its virtual time.  No socket is involved, so the autojump clock is safe,
pauses are exact, and a test neither waits nor depends on how loaded the machine is.
What the bytes look like on a real socket is tested over loopback elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import trio

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
