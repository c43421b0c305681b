"""Per-model concurrency that adapts to rate limits under one shared key.

Additive increase, multiplicative decrease (TCP's answer to the same
question): a 429 halves the model's concurrency (once per ``cooldown``, so
one burst of 429s is one signal, not ten), each ``limit`` completed streams
add one slot back, up to the cap.  A 429's wait (its Retry-After, or the
backoff) also pauses new submissions for that model.
"""

from __future__ import annotations

import math

import trio

__all__ = ["AdaptiveLimit"]


class AdaptiveLimit:
    """One model's concurrency: ``limiter`` is what submissions acquire."""

    def __init__(self, maximum: int, *, minimum: int = 1, cooldown: float = 1.0) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, not {minimum}, {maximum}")
        self.maximum = maximum
        self.minimum = minimum
        self.cooldown = cooldown
        self.limiter = trio.CapacityLimiter(maximum)
        self.lowest = maximum
        self.rate_limited = 0  # 429s seen
        self.decreases = 0
        self.paused = 0.0  # seconds submissions waited on a 429's pause
        self._paused_until = -math.inf
        self._last_decrease = -math.inf
        self._successes = 0

    @property
    def limit(self) -> int:
        return int(self.limiter.total_tokens)

    def _set(self, limit: int) -> None:
        self.limiter.total_tokens = limit  # lowering it never takes a slot back early
        self.lowest = min(self.lowest, limit)

    def rate_limited_now(self, now: float, wait: float | None) -> None:
        """A 429 arrived at ``now``; the engine will wait ``wait`` before retrying."""
        self.rate_limited += 1
        if wait:
            self._paused_until = max(self._paused_until, now + wait)
        if now - self._last_decrease >= self.cooldown:
            self._last_decrease = now
            self._successes = 0
            if self.limit > self.minimum:
                self.decreases += 1
                self._set(max(self.minimum, self.limit // 2))

    def succeeded(self) -> None:
        """A stream completed: one more slot after ``limit`` of them in a row."""
        if self.limit >= self.maximum:
            return
        self._successes += 1
        if self._successes >= self.limit:
            self._successes = 0
            self._set(self.limit + 1)

    async def wait_if_paused(self) -> None:
        """Before a submission: sleep out a 429's pause, if one is running."""
        while True:  # a new 429 may extend the pause while we sleep
            until = self._paused_until
            now = trio.current_time()
            if until <= now:
                return
            await trio.sleep_until(until)
            self.paused += trio.current_time() - now
