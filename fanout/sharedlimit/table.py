"""The shared limits' state and rules, with no I/O: what one Ray actor holds, what
``LocalLimits`` holds in a process, and what the Redis scripts do to their keys.

A *space* (one plan on one endpoint) holds named limits (``"endpoint"``,
``"model:NAME"``).  Each limit has a ``maximum``, a current ``cap`` (at most the
maximum), the *holders* of its slots, each with the time its lease runs out, and,
for the 429 back-off, a pause (no new slot until then), the time of the last decrease
and the successes since it.  The rules are ``fanout.ratelimit.AdaptiveLimit``'s: a 429
pauses the limit for its wait and halves the cap (at most once per ``cooldown``, so
one burst of 429s is one signal); ``cap`` successes in a row add one slot back, up to
the maximum.  A slot is granted only when every named limit has one free and none is
paused; a holder keeps it until released or until its lease runs out (a shard that
was killed never releases: its leases expire, and its slots come back).

Times are seconds on one clock, passed in (``now``): the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

__all__ = ["COOLDOWN", "MINIMUM", "LimitState", "LimitTable"]

#: Seconds between two decreases of one limit (``AdaptiveLimit``'s default).
COOLDOWN = 1.0
#: The lowest cap a 429 leaves.
MINIMUM = 1


@attrs.frozen
class LimitState:
    """One limit as it stands: ``held`` slots of ``cap`` (at most ``maximum``),
    ``paused_for`` seconds of pause left, and the 429s and decreases it has seen."""

    maximum: int
    cap: int
    held: int
    paused_for: float = 0.0
    rate_limited: int = 0
    decreases: int = 0


@attrs.define
class _Limit:
    maximum: int
    cap: int
    holders: dict[str, float] = attrs.field(factory=dict)  # holder -> lease ends
    paused_until: float = -math.inf
    last_decrease: float = -math.inf
    successes: int = 0
    rate_limited: int = 0
    decreases: int = 0

    def expire(self, now: float) -> None:
        for holder in [h for h, until in self.holders.items() if until <= now]:
            del self.holders[holder]


class LimitTable:
    """Every space's limits (see the module docstring)."""

    def __init__(self) -> None:
        self._spaces: dict[str, dict[str, _Limit]] = {}

    def _limit(self, space: str, name: str) -> _Limit:
        try:
            return self._spaces[space][name]
        except KeyError:
            raise KeyError(f"limit {name!r} of {space!r} was never set up") from None

    def setup(self, space: str, maxima: Mapping[str, int]) -> None:
        """Each named limit's maximum; a new limit starts at it, one that exists keeps
        its cap (lowered to the maximum if above it)."""
        limits = self._spaces.setdefault(space, {})
        for name, maximum in maxima.items():
            if maximum < 1:
                raise ValueError(f"limit {name!r}: the maximum must be >= 1, not {maximum}")
            limit = limits.get(name)
            if limit is None:
                limits[name] = _Limit(maximum, maximum)
            else:
                limit.maximum = maximum
                limit.cap = min(limit.cap, maximum)

    def try_acquire(self, space: str, names: Iterable[str], holder: str, lease: float,
                    now: float) -> float | None:
        """A slot of every limit of ``names`` for ``holder``, its lease ending at
        ``now + lease``: ``None`` when granted (or already held: renewed); else the
        seconds to wait, ``0.0`` when a limit is full (ask again once one is freed),
        more when one is paused (ask again after that)."""
        limits = [self._limit(space, name) for name in names]
        for limit in limits:
            limit.expire(now)
        paused = max((limit.paused_until - now for limit in limits), default=0.0)
        if paused > 0:
            return paused
        if any(holder not in limit.holders and len(limit.holders) >= limit.cap
               for limit in limits):
            return 0.0
        for limit in limits:
            limit.holders[holder] = now + lease
        return None

    def release(self, space: str, names: Iterable[str], holders: Iterable[str]) -> None:
        """Give the holders' slots of those limits back (one not held is ignored)."""
        limits = [self._limit(space, name) for name in names]
        for holder in holders:
            for limit in limits:
                limit.holders.pop(holder, None)

    def renew(self, space: str, names: Iterable[str], holders: Iterable[str], lease: float,
              now: float) -> None:
        """The holders' leases of those limits end at ``now + lease`` (a lease already
        expired, or a slot not held, is not taken again)."""
        limits = [self._limit(space, name) for name in names]
        for limit in limits:
            limit.expire(now)
        for holder in holders:
            for limit in limits:
                if holder in limit.holders:
                    limit.holders[holder] = now + lease

    def rate_limited(self, space: str, name: str, wait: float | None, now: float, *,
                     cooldown: float = COOLDOWN, minimum: int = MINIMUM) -> None:
        """A 429 on that limit at ``now``, to be retried after ``wait`` seconds: no new
        slot until then, and the cap halved (at most once per ``cooldown``)."""
        limit = self._limit(space, name)
        limit.rate_limited += 1
        if wait:
            limit.paused_until = max(limit.paused_until, now + wait)
        if now - limit.last_decrease >= cooldown:
            limit.last_decrease = now
            limit.successes = 0
            if limit.cap > minimum:
                limit.decreases += 1
                limit.cap = max(minimum, limit.cap // 2)

    def succeeded(self, space: str, name: str, count: int = 1) -> None:
        """``count`` streams of that limit completed: one slot more after ``cap`` of
        them in a row, up to the maximum."""
        limit = self._limit(space, name)
        for _ in range(count):
            if limit.cap >= limit.maximum:
                return
            limit.successes += 1
            if limit.successes >= limit.cap:
                limit.successes = 0
                limit.cap += 1

    def state(self, space: str, name: str, now: float) -> LimitState:
        limit = self._limit(space, name)
        limit.expire(now)
        return LimitState(maximum=limit.maximum, cap=limit.cap, held=len(limit.holders),
                          paused_for=max(0.0, limit.paused_until - now),
                          rate_limited=limit.rate_limited, decreases=limit.decreases)
