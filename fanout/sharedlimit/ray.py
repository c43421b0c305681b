"""The shared limit in a Ray actor: the shards of a batch run as Ray tasks share one named
actor of their cluster.

``RayLimits(name)`` finds the actor by its name (``fanout-limits`` by default, in the Ray
namespace ``fanout``); when there is none yet, the first task to ask creates it,
detached (it outlives the task that made it: ``RayLimits.stop(name)`` ends it).  A
driver that creates it first (``RayLimits.start(name)``) owns it: it ends with the
driver.  Its state is a ``fanout.sharedlimit.table.LimitTable`` on the actor's clock;
its methods are async, and ``try_acquire`` waits there (up to the caller's ``wait``)
for a slot to be freed.  Ray's calls block: they run in worker threads
(``trio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

import trio

from .base import DEFAULT_LEASE, SharedLimits, SharedLimitUnavailable
from .table import COOLDOWN, MINIMUM, LimitState, LimitTable

try:
    import ray
    import ray.exceptions
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("a Ray shared limit needs Ray: pip install 'fanout[ray]'") from exc

__all__ = ["DEFAULT_NAME", "NAMESPACE", "RayLimits"]

#: The actor's name unless one is given.
DEFAULT_NAME = "fanout-limits"
#: The Ray namespace the actor is named in (a task's namespace is its job's own).
NAMESPACE = "fanout"


class LimitsActor:
    """The actor: a ``LimitTable`` on ``time.monotonic``, woken when a slot is freed."""

    def __init__(self) -> None:
        self.table = LimitTable()
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def ping(self) -> bool:
        return True

    async def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        self.table.setup(space, maxima)
        self._wake()

    async def try_acquire(self, space: str, names: list[str], holder: str, lease: float,
                          wait: float) -> float | None:
        deadline = time.monotonic() + wait
        while True:
            changed = self._changed
            answer = self.table.try_acquire(space, names, holder, lease, time.monotonic())
            left = deadline - time.monotonic()
            if answer is None or answer > 0 or left <= 0:
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    async def release(self, space: str, names: list[str], holders: list[str]) -> None:
        self.table.release(space, names, holders)
        self._wake()

    async def renew(self, space: str, names: list[str], holders: list[str],
                    lease: float) -> None:
        self.table.renew(space, names, holders, lease, time.monotonic())

    async def rate_limited(self, space: str, name: str, wait: float | None,
                           cooldown: float, minimum: int) -> None:
        self.table.rate_limited(space, name, wait, time.monotonic(), cooldown=cooldown,
                                minimum=minimum)

    async def succeeded(self, space: str, name: str, count: int) -> None:
        self.table.succeeded(space, name, count)
        self._wake()

    async def state(self, space: str, name: str) -> LimitState:
        return self.table.state(space, name, time.monotonic())


_Actor = ray.remote(num_cpus=0)(LimitsActor)


class RayLimits(SharedLimits):
    """The limits in the named actor of the Ray cluster this process is connected to
    (a Ray task's, or a driver's after ``ray.init()``)."""

    waits = True

    def __init__(self, name: str | None = None, *, lease: float = DEFAULT_LEASE) -> None:
        self.name = name or DEFAULT_NAME
        self.lease = lease
        self._handle: Any = None

    def __reduce__(self) -> Any:  # a task gets its own handle, by the name
        return (type(self), (self.name,), {"lease": self.lease})

    @classmethod
    def start(cls, name: str | None = None, *, detached: bool = False,
              lease: float = DEFAULT_LEASE) -> RayLimits:
        """Create the actor now (from a driver, after ``ray.init()``): owned by this
        process (it ends with it) unless ``detached``."""
        options: dict[str, Any] = {"name": name or DEFAULT_NAME, "namespace": NAMESPACE,
                                   "get_if_exists": True}
        if detached:
            options["lifetime"] = "detached"
        limits = cls(name, lease=lease)
        limits._handle = _Actor.options(**options).remote()
        return limits

    @staticmethod
    def stop(name: str | None = None) -> bool:
        """End the named actor (its state with it); whether there was one."""
        try:
            handle = ray.get_actor(name or DEFAULT_NAME, namespace=NAMESPACE)
        except ValueError:
            return False
        ray.kill(handle, no_restart=True)
        return True

    def describe(self) -> str:
        return f"the Ray actor {self.name}"

    def _actor(self) -> Any:
        if self._handle is None:
            if not ray.is_initialized():
                raise SharedLimitUnavailable(
                    f"{self.describe()}: this process is not connected to Ray (ray:// works "
                    "in a Ray task, or after ray.init())")
            self._handle = _Actor.options(name=self.name, namespace=NAMESPACE,
                                          lifetime="detached", get_if_exists=True).remote()
        return self._handle

    def check(self) -> None:
        try:
            ray.get(self._actor().ping.remote(), timeout=60)
        except ray.exceptions.RayError as exc:
            raise SharedLimitUnavailable(f"{self.describe()}: {exc}") from None

    async def _call(self, method: str, *args: Any) -> Any:
        actor = self._actor()
        try:
            return await trio.to_thread.run_sync(
                lambda: ray.get(getattr(actor, method).remote(*args)))
        except ray.exceptions.RayError as exc:  # the actor gone mid-run: said, not raised
            raise SharedLimitUnavailable(f"{self.describe()}: {exc}") from None

    async def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        await self._call("setup", space, dict(maxima))

    async def try_acquire(self, space: str, names: Iterable[str], holder: str,
                          lease: float, wait: float = 0.0) -> float | None:
        answer = await self._call("try_acquire", space, list(names), holder, lease, wait)
        return None if answer is None else float(answer)

    async def release(self, space: str, names: Iterable[str], holders: Iterable[str]) -> None:
        await self._call("release", space, list(names), list(holders))

    async def renew(self, space: str, names: Iterable[str], holders: Iterable[str],
                    lease: float) -> None:
        await self._call("renew", space, list(names), list(holders), lease)

    async def rate_limited(self, space: str, name: str, wait: float | None, *,
                           cooldown: float = COOLDOWN, minimum: int = MINIMUM) -> None:
        await self._call("rate_limited", space, name, wait, cooldown, minimum)

    async def succeeded(self, space: str, name: str, count: int = 1) -> None:
        await self._call("succeeded", space, name, count)

    async def state(self, space: str, name: str) -> LimitState:
        state: LimitState = await self._call("state", space, name)
        return state
