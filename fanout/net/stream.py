"""One stream: its HTTP attempts, deadlines and retries, and exactly one final event.

Cancel scopes, from the outside in:

- the stream's scope: ``cancel()`` (the caller), the ``total`` deadline and
  the fan-out's deadline; it also covers the wait for a concurrency slot;
- one scope per attempt whose deadline is the earliest of ``first_byte``,
  ``first_token`` and ``idle`` (moved by every event, never by keep-alive
  comments); the name of the one that fired is recorded.

Every expected failure ends as data on the ``StreamResult``; only bugs
propagate.  The final ``StreamFinished`` is sent even when the stream is
cancelled from outside (shielded; the fan-out closes its receiving end
before waiting for its streams, so that send cannot block forever).
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import attrs
import httpx
import trio

from .._exceptions import ProtocolError
from ..core.chat import error_from_response
from ..core.events import (
    CONTENT_EVENTS,
    Event,
    StreamFinished,
    StreamRetrying,
    StreamStarted,
    TextDelta,
)
from ..core.parser import StreamParser
from ..core.result import Attempt, Outcome, StreamError, StreamResult, Timings
from ..core.sse import DEFAULT_MAX_EVENT_SIZE
from ..request import Deadlines, Endpoint, RetryPolicy, StreamRequest

__all__ = ["DEFAULT_RETRY", "StreamRunner"]

DEFAULT_RETRY = RetryPolicy()

MAX_ERROR_BODY = 64 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024
INTERESTING_HEADERS = ("content-type", "x-request-id", "request-id", "openai-processing-ms",
                       "retry-after", "retry-after-ms", "openai-model")
_CONTENT = frozenset(CONTENT_EVENTS)


@attrs.define
class _AttemptEnd:
    status: int | None = None
    error: StreamError | None = None
    retryable: bool = False
    retry_after: float | None = None
    delivered: bool = False  # content of any kind was delivered
    answered: bool = False  # answer text was delivered
    timed_out: str | None = None
    body_started: bool = False
    broken: bool = False  # a transport error after a 2xx response began


class StreamRunner:
    """Runs one ``StreamRequest``; ``cancel()`` may be called at any time, from any task."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: Endpoint,
        request: StreamRequest,
        channel: trio.MemorySendChannel[Event],
        *,
        deadlines: Deadlines | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        fanout_deadline: float = math.inf,
        strict: bool = False,
        max_event_size: int = DEFAULT_MAX_EVENT_SIZE,
        max_response_bytes: int | None = None,
        rng: random.Random | None = None,
        on_result: Callable[[StreamRunner, StreamResult], None] | None = None,
        others_running: Callable[[StreamRunner], int] | None = None,
        on_slot: Callable[[StreamRunner], None] | None = None,
    ) -> None:
        self.on_slot = on_slot  # called once the stream holds its concurrency slots
        self.client = client
        self.others_running = others_running  # how many other streams hold a slot now
        self.on_result = on_result  # called with the result just before StreamFinished
        self.endpoint = endpoint
        self.request = request
        self.channel = channel
        self._deaf = False  # the consumer closed its end: events go nowhere, results stay
        self.deadlines = request.deadlines or deadlines or Deadlines()
        self.retry = retry
        self.fanout_deadline = fanout_deadline
        self.strict = strict
        self.max_event_size = max_event_size
        self.max_response_bytes = max_response_bytes
        self.rng = rng or random.Random()
        self.key = request.key
        self.content_key = request.content_key(endpoint)
        self.scope = trio.CancelScope()
        self.cancel_requested = False
        self.result: StreamResult | None = None
        self._origin: float | None = None  # when the stream got its slot
        self._points: dict[str, float] = {}
        self._gaps: list[float] = []
        self._attempt_deadlines: dict[str, float] = {}
        self._attempt_scope: trio.CancelScope | None = None
        self._stop_reading = False
        self._parser = self._new_parser()  # the current attempt's: it holds the output
        self._last: _AttemptEnd | None = None
        self._current = (0, 0.0)  # the attempt under way: its number and the wait before it

    async def emit(self, event: Event) -> None:
        """Send one event, waiting for buffer space (backpressure)."""
        if self._deaf:
            return
        try:
            await self.channel.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._deaf = True

    def cancel(self) -> None:
        """Cancel the stream: it ends ``cancelled``, keeping what arrived."""
        self.cancel_requested = True
        self.scope.cancel()

    @property
    def has_slot(self) -> bool:
        """True once the stream got its concurrency slot (it may have finished since)."""
        return self._origin is not None

    async def run(self, slots: list[trio.CapacityLimiter],
                  barrier: Callable[[], Awaitable[None]] | None = None) -> StreamResult:
        """Wait for the slots, run the attempts, send the final event; return the result."""
        submitted = trio.current_time()
        attempts: list[Attempt] = []
        timed_out: str | None = None
        try:
            with self.scope:
                async with AsyncExitStack() as stack:
                    for slot in slots:
                        await stack.enter_async_context(slot)
                    self._origin = trio.current_time()
                    if self.on_slot is not None:
                        self.on_slot(self)
                    total = self.deadlines.total
                    stream_deadline = self._origin + total if total else math.inf
                    self.scope.deadline = min(stream_deadline, self.fanout_deadline)
                    if barrier is not None:
                        await barrier()
                    await self._attempts(attempts)
            if self._last is not None:
                timed_out = self._last.timed_out
            if self.scope.cancelled_caught and not self.cancel_requested:
                timed_out = ("total" if self.scope.deadline < self.fanout_deadline
                             else "fanout")
        except trio.Cancelled:
            # Cancelled from outside (the fan-out is closing, or Ctrl-C):
            # still exactly one final event, then let the cancellation go on.
            result = self._finish(attempts, submitted, None, cancelled=True)
            with trio.CancelScope(shield=True):
                await self._send_final(result)
            raise
        result = self._finish(attempts, submitted, timed_out, cancelled=self.cancel_requested)
        with trio.CancelScope(shield=True):  # the one final event is never lost
            await self._send_final(result)
        return result

    # -- attempts ----------------------------------------------------------------

    def _new_parser(self) -> StreamParser:
        return StreamParser(strict=self.strict, tools=self.request.tools,
                            max_event_size=self.max_event_size,
                            max_response_bytes=self.max_response_bytes,
                            stream=self.key, content_key=self.content_key)

    async def _attempts(self, attempts: list[Attempt]) -> None:
        waited = 0.0
        number = 0
        while True:
            number += 1
            self._parser = parser = self._new_parser()
            self._last = end = _AttemptEnd()
            self._current = (number, waited)
            await self._attempt(number, parser, end)
            attempts.append(Attempt(number, end.status, end.error, waited, end.delivered))
            if not (end.retryable and not end.delivered and number < self.retry.attempts):
                return
            wait = end.retry_after
            if wait is None:
                wait = self.retry.backoff(number, self.rng)
            elif self.retry.retry_after_spread:
                wait *= 1 + self.rng.uniform(0, self.retry.retry_after_spread)
            if trio.current_time() + wait >= self.scope.deadline:
                return  # no time left for another attempt
            assert end.error is not None
            await self.emit(StreamRetrying(number, wait, end.error, self.key, self.content_key))
            await trio.sleep(wait)
            waited = wait

    def _mark(self, point: str) -> None:
        assert self._origin is not None
        self._points[point] = trio.current_time() - self._origin

    def _set_deadlines(self) -> None:
        assert self._attempt_scope is not None
        self._attempt_scope.deadline = min(self._attempt_deadlines.values(), default=math.inf)

    async def _attempt(self, number: int, parser: StreamParser, end: _AttemptEnd) -> None:
        deadlines = self.deadlines
        self._points = {}
        self._gaps = []
        self._stop_reading = False
        self._mark("request_sent")
        sent = trio.current_time()
        self._attempt_deadlines = {}
        if deadlines.first_byte:
            self._attempt_deadlines["first_byte"] = sent + deadlines.first_byte
        if deadlines.first_token:
            self._attempt_deadlines["first_token"] = sent + deadlines.first_token
        headers = {**self.endpoint.headers, "accept": "text/event-stream",
                   "accept-encoding": "identity"}
        if self.endpoint.api_key:
            headers["authorization"] = f"Bearer {self.endpoint.api_key}"
        timeout = httpx.Timeout(connect=deadlines.connect or 30.0, read=None, write=30.0,
                                pool=None)
        with trio.CancelScope() as scope:
            self._attempt_scope = scope
            self._set_deadlines()
            try:
                async with self.client.stream("POST", self.endpoint.chat_url,
                                              json=self.request.body(), headers=headers,
                                              timeout=timeout) as response:
                    await self._response(number, response, parser, end)
            except httpx.ConnectTimeout:
                end.timed_out = "connect"
                end.retryable = self.retry.connect_errors
                end.error = self._fail(parser, StreamError(
                    f"no connection within {deadlines.connect or 30.0:g} s", "timeout",
                    "connect"))
            except httpx.ConnectError as exc:
                end.retryable = self.retry.connect_errors
                end.error = self._fail(parser, self._transport_error(exc))
            except httpx.TransportError as exc:
                end.error = self._fail(parser, self._transport_error(exc))
                # The connection broke after a 2xx began the stream: the body was cut short.
                end.broken = end.status is not None and 200 <= end.status < 300
        self._attempt_scope = None
        if scope.cancelled_caught and not self._stop_reading:
            name = min(self._attempt_deadlines, key=self._attempt_deadlines.__getitem__)
            end.timed_out = name
            limit = getattr(deadlines, name)
            what = {"first_byte": "no first byte", "first_token": "no first token",
                    "idle": "no event"}[name]
            end.error = self._fail(parser, StreamError(f"{what} within {limit:g} s", "timeout",
                                                       name))
        self._mark("end")

    async def _response(self, number: int, response: httpx.Response, parser: StreamParser,
                        end: _AttemptEnd) -> None:
        self._mark("headers")
        end.status = response.status_code
        parser.status = response.status_code
        kept = {name: response.headers[name] for name in INTERESTING_HEADERS
                if name in response.headers}
        kept.update((k, v) for k, v in response.headers.items() if k.startswith("x-ratelimit-"))
        await self._deliver([StreamStarted(number, response.status_code, kept, self.key,
                                           self.content_key)], end)
        if not 200 <= response.status_code < 300:
            body = await _read_bounded(response, MAX_ERROR_BODY)
            error = error_from_response(response.status_code, body, response.reason_phrase)
            end.error = self._fail(parser, error)
            parser.status = response.status_code
            end.retryable = response.status_code in self.retry.statuses
            end.retry_after = self.retry.retry_after(response.headers)
            return
        idle = self.deadlines.idle
        if idle:
            self._attempt_deadlines["idle"] = trio.current_time() + idle
            self._set_deadlines()
        content_type = response.headers.get("content-type", "")
        if content_type and "event-stream" not in content_type:
            body = await _read_bounded(response, self.max_response_bytes or MAX_JSON_BODY)
            if body:
                self._mark("first_byte")
            await self._deliver(parser.feed_completion(body), end)
            end.error = parser.result().error
            return
        last_event: float | None = None
        async for data in response.aiter_bytes():
            if self._stop_reading:
                continue  # cancelled: the cancellation lands inside httpx's iterator
            if not end.body_started:
                end.body_started = True
                self._mark("first_byte")
                if self._attempt_deadlines.pop("first_byte", None) is not None:
                    self._set_deadlines()
            try:
                events = parser.feed(data)
            except ProtocolError:
                events = []  # strict mode: the parser recorded it and stopped
            if events:
                now = trio.current_time()
                if last_event is not None:
                    self._gaps.append(now - last_event)
                last_event = now
                self._points["last_event"] = now - (self._origin or 0.0)
                if end.answered:  # the hot path: no coroutine unless the buffer is full
                    rest = self._send_ready(events)
                    if rest:
                        await self._deliver_waiting(rest)
                else:
                    await self._deliver(events, end)
                if idle:  # re-armed after delivery: a slow consumer is not an idle upstream
                    self._attempt_deadlines["idle"] = trio.current_time() + idle
                    self._set_deadlines()
            if parser.stopped:
                # Stop reading by cancelling, never by `break` or an exception
                # out of this loop: either would leave httpx's nested async
                # generators unfinished (ResourceWarnings, httpx #3686).
                self._stop_reading = True
                assert self._attempt_scope is not None
                self._attempt_scope.cancel()
        parser.close()
        end.error = parser.result().error

    async def _deliver(self, events: list[Any], end: _AttemptEnd) -> None:
        """Send events to the consumer.

        The fast path (room in the buffer) never waits, so it is no checkpoint
        and nothing can be cancelled in the read loop's body.  When the buffer
        is full, waiting is backpressure (a slow consumer, not a slow
        upstream): the attempt's deadlines are paused, then shifted by the time
        spent, and the wait is shielded so no cancellation fires inside the
        read loop (that would leave httpx's iterators unfinished).  It cannot
        hang: the fan-out closes its receiving end before waiting for streams.
        """
        if not end.delivered:
            for event in events:
                if type(event) in _CONTENT:
                    end.delivered = True
                    self._mark("first_content")
                    if self._attempt_deadlines.pop("first_token", None) is not None:
                        self._set_deadlines()
                    break
        if not end.answered:
            for event in events:
                if type(event) is TextDelta:
                    end.answered = True
                    self._mark("first_text")
                    break
        rest = self._send_ready(events)
        if rest:
            await self._deliver_waiting(rest)

    def _send_ready(self, events: list[Any]) -> list[Any]:
        """Send what fits in the buffer without waiting; return what did not fit."""
        if self._deaf:
            return []
        send_nowait = self.channel.send_nowait
        for index, event in enumerate(events):
            try:
                send_nowait(event)
            except trio.WouldBlock:
                return events[index:]
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._deaf = True
                return []
        return []

    async def _deliver_waiting(self, events: list[Any]) -> None:
        scope = self._attempt_scope
        assert scope is not None
        scope.deadline = math.inf
        before = trio.current_time()
        with trio.CancelScope(shield=True):
            for event in events:
                await self.emit(event)
        blocked = trio.current_time() - before
        if blocked:
            for name in self._attempt_deadlines:
                self._attempt_deadlines[name] += blocked
        self._set_deadlines()

    # -- the end -----------------------------------------------------------------

    def _transport_error(self, exc: httpx.TransportError) -> StreamError:
        message = str(exc) or type(exc).__name__
        return StreamError(self.endpoint.redact(f"{type(exc).__name__}: {message}"),
                           "transport_error", type(exc).__name__)

    def _fail(self, parser: StreamParser, error: StreamError) -> StreamError:
        redacted = attrs.evolve(error, message=self.endpoint.redact(error.message))
        parser.fail(redacted)
        return redacted

    def _finish(self, attempts: list[Attempt], submitted: float, timed_out: str | None, *,
                cancelled: bool) -> StreamResult:
        parser = self._parser
        number, waited = self._current
        end = self._last
        if end is not None and (not attempts or attempts[-1].number != number):
            # Cancelled or timed out during an attempt: it happened, record it.
            attempts.append(Attempt(number, end.status, end.error, waited, end.delivered))
        if self._origin is not None:
            self._mark("end")
        gaps = sorted(self._gaps)
        timings = Timings(
            queued=(trio.current_time() if self._origin is None else self._origin) - submitted,
            request_sent=self._points.get("request_sent"),
            headers=self._points.get("headers"),
            first_byte=self._points.get("first_byte"),
            first_content=self._points.get("first_content"),
            first_text=self._points.get("first_text"),
            last_event=self._points.get("last_event"),
            end=self._points.get("end"),
            gap_max=gaps[-1] if gaps else None,
            gap_p50=(gaps[(len(gaps) - 1) // 2] + gaps[len(gaps) // 2]) / 2 if gaps else None,
            gap_p95=gaps[min(len(gaps) - 1, math.ceil(0.95 * len(gaps)) - 1)] if gaps else None,
        )
        outcome: Outcome | None = None
        if cancelled:
            outcome, timed_out = Outcome.CANCELLED, None
        elif timed_out is not None:
            outcome = Outcome.TIMED_OUT
            if timed_out in ("total", "fanout"):
                limit = self.deadlines.total if timed_out == "total" else None
                parser.fail(StreamError(
                    f"the {timed_out} deadline" + (f" of {limit:g} s" if limit else "")
                    + " passed", "timeout", timed_out))
        elif self._last is not None and self._last.broken:
            outcome = Outcome.TRUNCATED  # the error stays on the result: it says why
        result = parser.result(outcome, timed_out=timed_out, attempts=tuple(attempts),
                               timings=timings)
        if self.others_running is not None:
            result = attrs.evolve(result, others_running=self.others_running(self))
        return result

    async def _send_final(self, result: StreamResult) -> None:
        self.result = result
        if self.on_result is not None:
            self.on_result(self, result)  # so fan.results has it when StreamFinished arrives
        await self.emit(StreamFinished(result, self.key, self.content_key))


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of the body; stops by cancelling, never ``break``
    (leaving ``aiter_bytes`` early leaks ResourceWarnings: httpx #3686)."""
    parts: list[bytes] = []
    size = 0
    with trio.CancelScope() as scope:
        async for data in response.aiter_bytes():
            if size >= limit:
                continue  # cancelled: the cancellation lands inside httpx's iterator
            parts.append(data[: limit - size])
            size += len(data)
            if size >= limit:
                scope.cancel()
    return b"".join(parts)
