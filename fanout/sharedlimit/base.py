"""The interface of a shared limit, its in-process implementation, and the spec that
names one (``--shared-limit``, ``[concurrency] shared``, ``FANOUT_SHARED_LIMIT``)."""

from __future__ import annotations

import abc
import urllib.parse
from collections.abc import Iterable, Mapping

import trio

from .table import COOLDOWN, MINIMUM, LimitState, LimitTable

__all__ = ["DEFAULT_LEASE", "LocalLimits", "SharedLimitUnavailable", "SharedLimits",
           "shown_spec", "spec_problem"]

#: Seconds a slot's lease lasts unless renewed (a holder renews every third of it).
DEFAULT_LEASE = 30.0
#: The schemes of a spec: Redis (a server's URL, as redis-py takes it) and Ray (a
#: named actor of the Ray cluster the process is connected to).
REDIS_SCHEMES = ("redis", "rediss", "unix")
RAY_SCHEME = "ray"


class SharedLimitUnavailable(Exception):
    """The shared limit cannot be reached (its message says why, in one line)."""


class SharedLimits(abc.ABC):
    """Slots of named limits in spaces, shared by every process that names the same
    ones (``fanout.sharedlimit.table`` says the rules).  Every method but ``check``,
    ``close`` and ``describe`` is async; ``describe()`` names it without a password.

    ``lease``: seconds a slot lasts unless renewed.  ``waits``: whether
    ``try_acquire`` itself waits, up to ``wait`` seconds, for a slot to be freed
    (else the caller polls).
    """

    lease: float = DEFAULT_LEASE
    waits: bool = False

    @abc.abstractmethod
    def describe(self) -> str:
        """What it is, for a line of output: never a password."""

    def check(self) -> None:  # noqa: B027 - nothing to reach, by default
        """Raise ``SharedLimitUnavailable`` if it cannot be reached (blocking: before a
        run)."""

    @abc.abstractmethod
    async def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        """Each named limit's maximum (a limit that exists keeps its cap)."""

    @abc.abstractmethod
    async def try_acquire(self, space: str, names: Iterable[str], holder: str,
                          lease: float, wait: float = 0.0) -> float | None:
        """``None``: granted a slot of each named limit; else seconds to wait
        (``0.0``: full)."""

    @abc.abstractmethod
    async def release(self, space: str, names: Iterable[str], holders: Iterable[str]) -> None:
        """Give back the holders' slots of the named limits."""

    @abc.abstractmethod
    async def renew(self, space: str, names: Iterable[str], holders: Iterable[str],
                    lease: float) -> None:
        """Extend the holders' leases of the named limits by ``lease`` from now."""

    @abc.abstractmethod
    async def rate_limited(self, space: str, name: str, wait: float | None, *,
                           cooldown: float = COOLDOWN, minimum: int = MINIMUM) -> None:
        """A 429 on the named limit, retried after ``wait`` seconds."""

    @abc.abstractmethod
    async def succeeded(self, space: str, name: str, count: int = 1) -> None:
        """``count`` streams of the named limit completed."""

    @abc.abstractmethod
    async def state(self, space: str, name: str) -> LimitState:
        """The named limit as it stands."""

    def close(self) -> None:  # noqa: B027 - nothing to close, by default
        """Let go of connections (the limits' state stays where it is)."""


class LocalLimits(SharedLimits):
    """Shared by the batches of one trio program (shards run by ``fanout.batch.run``
    side by side): the state in memory, the program's clock."""

    def __init__(self, *, lease: float = DEFAULT_LEASE) -> None:
        self.table = LimitTable()
        self.lease = lease

    def describe(self) -> str:
        return "in-process limits"

    async def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        self.table.setup(space, maxima)

    async def try_acquire(self, space: str, names: Iterable[str], holder: str,
                          lease: float, wait: float = 0.0) -> float | None:
        return self.table.try_acquire(space, names, holder, lease, trio.current_time())

    async def release(self, space: str, names: Iterable[str], holders: Iterable[str]) -> None:
        self.table.release(space, names, holders)

    async def renew(self, space: str, names: Iterable[str], holders: Iterable[str],
                    lease: float) -> None:
        self.table.renew(space, names, holders, lease, trio.current_time())

    async def rate_limited(self, space: str, name: str, wait: float | None, *,
                           cooldown: float = COOLDOWN, minimum: int = MINIMUM) -> None:
        self.table.rate_limited(space, name, wait, trio.current_time(), cooldown=cooldown,
                                minimum=minimum)

    async def succeeded(self, space: str, name: str, count: int = 1) -> None:
        self.table.succeeded(space, name, count)

    async def state(self, space: str, name: str) -> LimitState:
        return self.table.state(space, name, trio.current_time())


def split_spec(spec: str) -> tuple[urllib.parse.SplitResult, dict[str, list[str]]]:
    parts = urllib.parse.urlsplit(spec)
    return parts, urllib.parse.parse_qs(parts.query, keep_blank_values=True)


def spec_problem(spec: str) -> str | None:
    """Why ``spec`` names no shared limit (a phrase), or ``None`` if it does: ``off``,
    ``redis://``, ``rediss://`` or ``unix://`` URLs, ``ray://`` (optionally
    ``ray://ACTOR-NAME``); ``?lease=SECONDS`` on any of them."""
    if spec == "off":
        return None
    try:
        parts, query = split_spec(spec)
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in (*REDIS_SCHEMES, RAY_SCHEME):
        return ("expected redis://HOST[:PORT][/DB], rediss://..., unix://PATH, ray:// or "
                "ray://ACTOR-NAME (or off)")
    for value in query.get("lease", []):
        try:
            lease = float(value)
        except ValueError:
            lease = -1.0
        if not 0.5 <= lease <= 86400:
            return "lease must be seconds, from 0.5 to 86400"
    return None


def shown_spec(spec: str) -> str:
    """``spec`` as output shows it: any password replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(spec)
        if parts.password is None:
            return spec
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
    except ValueError:
        return "the shared limit"
