"""One batch's use of a shared limit: a slot of the endpoint's and of its model's limit
per stream, held under a lease renewed while the stream runs.

``SharedSlots.run`` (in the batch's nursery: ``await nursery.start(slots.run)``) sets
the limits' maxima up, then renews the leases of every slot held, every third of the
lease, and sends what the batch reports without waiting for it (``release``,
``rate_limited``, ``succeeded``: called from synchronous code) in order.  When it is
cancelled it sends what is left and gives back every slot still held.  ``acquire``
waits until both slots are granted (and the model's limit is not paused by a 429
someone reported).

A shared limit that stops answering (Redis down, the Ray actor gone) never raises
into the batch: ``lost`` says why, ``on_lost(reason)`` is called once (the batch
stops sending: what runs runs on, its slots' leases run out on their own), and an
``acquire`` then waits until it is cancelled.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
import socket
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import trio

from .base import SharedLimits, SharedLimitUnavailable

__all__ = ["ENDPOINT", "POLL", "SharedSlots", "model_limit"]

#: The endpoint's limit, in a space.
ENDPOINT = "endpoint"
#: Seconds between two asks for a slot while its limit is full (a slot this process
#: gives back wakes its own waiters at once).
POLL = 0.05
#: Seconds the last reports and releases may take when the batch ends.
CLOSING = 5.0


def model_limit(model: str) -> str:
    """The name of a model's limit."""
    return f"model:{model}"


class SharedSlots:
    """Slots of ``limits`` in ``space``: the endpoint's (``endpoint_cap``) and each
    model's (``model_caps``: model name -> its concurrency)."""

    def __init__(self, limits: SharedLimits, space: str, endpoint_cap: int,
                 model_caps: Mapping[str, int], *, poll: float = POLL) -> None:
        self.limits = limits
        self.space = space
        self.lease = limits.lease
        self.maxima = {ENDPOINT: endpoint_cap,
                       **{model_limit(m): cap for m, cap in model_caps.items()}}
        self.poll = poll
        self._client = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._numbers = itertools.count()
        self._held: dict[str, tuple[str, str]] = {}  # key -> (model, holder)
        self._send, self._receive = trio.open_memory_channel[tuple[Any, ...]](math.inf)
        self._freed = trio.Event()  # set (and replaced) when this process frees a slot
        self._outbox: deque[tuple[Any, ...]] = deque()  # reports not sent yet
        self._ready = False
        self.waited = 0.0  # seconds acquires waited, in all
        #: Why the shared limit stopped answering (``None`` while it answers).
        self.lost: str | None = None
        #: Called once when it stops answering, with ``lost``.
        self.on_lost: Callable[[str], None] | None = None

    def _lose(self, exc: SharedLimitUnavailable) -> None:
        if self.lost is None:
            self.lost = str(exc)
            if self.on_lost is not None:
                self.on_lost(self.lost)

    def _names(self, model: str) -> tuple[str, str]:
        return (ENDPOINT, model_limit(model))

    async def acquire(self, model: str, key: str) -> None:
        """A slot of the endpoint's limit and of ``model``'s for the stream ``key``."""
        assert self._ready, "SharedSlots.run must be started first"
        holder = f"{self._client}:{next(self._numbers)}"
        names = self._names(model)
        started = trio.current_time()
        granted = False
        try:
            while True:
                if self.lost is not None:
                    await trio.sleep_forever()  # until the batch, told, cancels it
                freed = self._freed
                try:
                    wait = await self.limits.try_acquire(self.space, names, holder,
                                                         self.lease, self.poll)
                except SharedLimitUnavailable as exc:
                    self._lose(exc)
                    continue
                if wait is None:
                    granted = True
                    break
                if wait > 0:  # paused after a 429: nothing is granted before then
                    await trio.sleep(wait)
                elif not self.limits.waits:
                    with trio.move_on_after(self.poll):
                        await freed.wait()
                else:
                    await trio.sleep(0)  # it waited already; let others run
        finally:
            self.waited += trio.current_time() - started
            if granted:
                self._held[key] = (model, holder)
        # A cancellation after the grant and before this line cannot happen: nothing
        # between them waits.

    def release(self, key: str) -> None:
        """The stream ``key`` ended: its slots go back (sent in the background)."""
        held = self._held.pop(key, None)
        if held is not None:
            model, holder = held
            self._send.send_nowait(("release", model, holder))

    def rate_limited(self, model: str, wait: float | None) -> None:
        """A 429 on ``model``'s stream, retried after ``wait``: every sharer pauses."""
        self._send.send_nowait(("rate_limited", model, wait))

    def succeeded(self, model: str) -> None:
        """A stream of ``model`` completed: its cap grows back, in time."""
        self._send.send_nowait(("succeeded", model))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            await self.limits.setup(self.space, self.maxima)
        except SharedLimitUnavailable as exc:
            self._lose(exc)
        self._ready = True
        task_status.started()
        if self.lost is not None:
            return
        try:
            renew_at = trio.current_time() + self.lease / 3
            while True:
                with trio.move_on_at(renew_at):
                    self._outbox.append(await self._receive.receive())
                if self._outbox:
                    await self._flush()
                if trio.current_time() >= renew_at:
                    await self._renew()
                    renew_at = trio.current_time() + self.lease / 3
        except SharedLimitUnavailable as exc:
            self._lose(exc)  # nothing more is sent: the leases run out on their own
        finally:
            if self.lost is None:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSING):
                    try:
                        await self._flush()
                        await self._give_back()
                    except SharedLimitUnavailable as exc:
                        self._lose(exc)

    async def _flush(self) -> None:
        """Send what is queued, releases together; an item leaves the outbox once sent
        (cancelled half-way, the rest is sent by the next flush)."""
        while True:
            try:
                self._outbox.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        items = list(self._outbox)
        released: dict[str, list[str]] = {}
        successes: dict[str, int] = {}
        for item in items:
            if item[0] == "release":
                released.setdefault(item[1], []).append(item[2])
            elif item[0] == "succeeded":
                successes[item[1]] = successes.get(item[1], 0) + 1
            else:
                _, model, wait = item
                await self.limits.rate_limited(self.space, model_limit(model), wait)
        for model, holders in released.items():
            await self.limits.release(self.space, self._names(model), holders)
        for model, count in successes.items():
            await self.limits.succeeded(self.space, model_limit(model), count)
        for _ in items:
            self._outbox.popleft()
        if released or successes:
            self._freed.set()
            self._freed = trio.Event()

    async def _renew(self) -> None:
        by_model: dict[str, list[str]] = {}
        for model, holder in list(self._held.values()):
            by_model.setdefault(model, []).append(holder)
        for model, holders in by_model.items():
            await self.limits.renew(self.space, self._names(model), holders, self.lease)

    async def _give_back(self) -> None:
        """Every slot still held goes back (a batch that ends holds none)."""
        held, self._held = self._held, {}
        by_model: dict[str, list[str]] = {}
        for model, holder in held.values():
            by_model.setdefault(model, []).append(holder)
        for model, holders in by_model.items():
            await self.limits.release(self.space, self._names(model), holders)
