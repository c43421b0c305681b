"""Concurrency that adapts: per model to rate limits under one shared key, and
per endpoint to a server that cuts streams when others arrive.

Additive increase, multiplicative decrease (TCP's answer to the same
question).  ``AdaptiveLimit``, one per model: a 429 halves the model's
concurrency (once per ``cooldown``, so one burst of 429s is one signal, not
ten), each ``limit`` completed streams add one slot back, up to the cap.  A
429's wait (its Retry-After, or the backoff) also pauses new submissions for
that model.

``EndpointLimit``, one for the whole endpoint: a server with one generation
slot (llama.cpp) cuts the stream it is serving when another request
arrives, whatever model name the request uses and whoever sends it, so the
signal belongs to the endpoint.  One object serves every sender on it (a
batch's answers and its judges): each acquires ``limiter`` before it submits,
and passes ``streams`` to its ``open_fanout`` so that ``others_running`` counts
them all.  A cut halves the endpoint's concurrency, at most once per
generation (only a stream submitted after the last decrease can lower it
again: the streams already in flight when it came down are the same burst);
after a cut, giving a slot back takes more successes each time (a probe that
is cut again doubles the wait for the next one).
"""

from __future__ import annotations

import math

import trio

from .fanout import EndpointStreams

__all__ = ["AdaptiveLimit", "EndpointLimit"]


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


class EndpointLimit:
    """The endpoint's concurrency: ``limiter`` is what every submission acquires.

    ``cut(started, now, running)``: a stream submitted at ``started`` was cut at
    ``now`` while ``running`` streams ran (itself included).  ``succeeded()``:
    a stream completed.  ``reset()``: the cuts were not the server's doing after
    all; back to the maximum.

    ``url``: the endpoint's base URL (what a summary names).  ``streams``: the
    streams running on it, for ``open_fanout(endpoint_streams=...)``.
    ``usage_seen``: the models of which a stream completed with usage on this
    endpoint (so one of theirs that completes without it while others run was cut by
    a relay that drops usage; a model that never sends usage is never judged so).
    ``busiest``: the most streams that ran at once (the cut one included) when a
    cut came.
    """

    def __init__(self, maximum: int, *, probe: int = 8, url: str | None = None) -> None:
        if maximum < 1 or probe < 1:
            raise ValueError(f"need maximum >= 1 and probe >= 1, not {maximum}, {probe}")
        self.maximum = maximum
        self.url = url
        self.limiter = trio.CapacityLimiter(maximum)
        self.streams = EndpointStreams()
        self.usage_seen: set[str] = set()
        self.lowest = maximum
        self.busiest = 0
        self.cuts = 0  # cut signals seen
        self.decreases = 0
        self._first_probe = probe
        self._probe = 0  # successes in a row a slot back takes, at least (after a cut)
        self._last_decrease = -math.inf
        self._successes = 0

    @property
    def limit(self) -> int:
        return int(self.limiter.total_tokens)

    def _set(self, limit: int) -> None:
        self.limiter.total_tokens = limit  # lowering it never takes a slot back early
        self.lowest = min(self.lowest, limit)

    def cut(self, started: float, now: float, running: int) -> bool:
        """A cut; returns whether it lowered the limit (a new generation's cut)."""
        self.cuts += 1
        self.busiest = max(self.busiest, running)
        self._successes = 0
        if started < self._last_decrease:
            return False  # in flight before the last decrease: the same burst
        self._last_decrease = now
        self._probe = self._probe * 2 if self._probe else self._first_probe
        lower = max(1, min(self.limit, running) // 2)
        if lower >= self.limit:
            return False
        self.decreases += 1
        self._set(lower)
        return True

    def succeeded(self) -> None:
        """A stream completed: one more slot after enough of them in a row."""
        if self.limit >= self.maximum:
            return
        self._successes += 1
        if self._successes >= max(self.limit, self._probe):
            self._successes = 0
            self._set(self.limit + 1)

    def reset(self) -> None:
        """Forget the cuts: the maximum again, no probing (``lowest`` stays as it was)."""
        self._probe = 0
        self._successes = 0
        self._last_decrease = -math.inf
        self.limiter.total_tokens = self.maximum
