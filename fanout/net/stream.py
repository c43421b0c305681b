"""One stream: its HTTP attempts, deadlines and retries, and exactly one final event.

Cancel scopes, from the outside in:

- the stream's scope: ``cancel()`` (the caller), the ``total`` deadline and
  the fan-out's deadline; it also covers the wait for a concurrency slot;
- one scope per attempt whose deadline is the earliest of ``first_byte``,
  ``first_token`` and ``idle`` (moved by every event; before the first content
  not armed while ``first_token`` is set, else moved by keep-alive comments and
  events the dialect ignores too, never after it); the name of the one that
  fired is recorded.

Every expected failure ends as data on the ``StreamResult``; only bugs
propagate.  The final ``StreamFinished`` is sent whatever ends the stream:
its own end, ``cancel()``, a cancellation from outside (plain, or grouped in
a ``BaseExceptionGroup`` by a nursery underneath), Ctrl-C, or a bug (then
the exception goes on after it).  It is sent shielded; the fan-out closes
its receiving end before waiting for its streams, so that send cannot block
forever.

A consumer that stops reading fills the channel and the stream waits to send
(shielded: see ``_deliver``).  ``cancel()`` ends that wait at once: the
events that did not fit are kept, the upstream connection is closed, and
those events, then the final one, are delivered when the consumer reads again.

A request that met a pooled connection the server had already closed (no
response at all) is sent again at once on a fresh connection: see
``StreamRunner._resend``.

Everything the server sends reaches the result through the attempt's
``StreamParser``, which redacts the endpoint's key (body, error bodies,
headers, and the errors recorded here).

The stream's dialect (``StreamRequest.api``, else ``Endpoint.api``) picks the
URL, the headers that carry the key (``Endpoint.auth_headers``), the body
(``StreamRequest.body``, built once) and the parser's interpreter.
"""

from __future__ import annotations

import errno
import math
import random
import re
import socket
import zlib
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from .._exceptions import ProtocolError
from ..core.events import (
    CONTENT_EVENTS,
    ErrorReported,
    Event,
    StreamFinished,
    StreamRetrying,
    StreamStarted,
    TextDelta,
)
from ..core.parser import StreamParser
from ..core.result import Attempt, Outcome, StreamError, StreamResult, Timings
from ..records import dumps
from ..request import Endpoint, StreamRequest, StreamSettings
from .body import body_reader
from .idle import IdleWatch
from .transport import FRESH_CONNECTION, ShardedTransport

__all__ = ["DEFAULT_SETTINGS", "StreamRunner", "connect_failure", "public_url"]

DEFAULT_SETTINGS = StreamSettings()

MAX_ERROR_BODY = 64 * 1024
INTERESTING_HEADERS = ("content-type", "content-encoding", "x-request-id", "request-id",
                       "openai-processing-ms", "retry-after", "retry-after-ms", "openai-model")
_CONTENT = frozenset(CONTENT_EVENTS)
#: An error the same request will meet again: retrying it only costs.
_DETERMINISTIC = re.compile(r"validation error|input should be|invalid_request_error", re.I)
#: A server saying it is overloaded (Anthropic's ``overloaded_error``, in the type or code).
_OVERLOADED = re.compile(r"overloaded", re.I)
#: Inflated bytes handed to the parser at a time: a small gzip body can hold gigabytes.
_INFLATE_PIECE = 64 * 1024
#: Sends again after a stale pooled connection, per stream, beyond the retry budget.  Through
#: fanout's own client each goes out on a fresh connection, so one follows each stale one;
#: through a client of yours it goes through its pool, where each stale connection met
#: leaves the pool: this bounds that walk.
MAX_RESENDS = 8


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
    connect_failed: bool = False
    unreported: bool = False  # ``error`` was found here, not sent as an event yet
    stale: bool = False  # a pooled connection the server had closed: no response at all


class StreamRunner:
    """Runs one ``StreamRequest``; ``cancel()`` may be called at any time, from any task."""

    # Slots: thousands of these live at once (a dict per instance costs ~1 KB).
    __slots__ = ("_asked", "_attempt_deadlines", "_attempt_scope", "_blocked", "_body",
                 "_connection", "_current", "_deaf", "_first_sent", "_gaps", "_idle_fired",
                 "_idle_watch", "_last", "_origin", "_parser", "_pending", "_points",
                 "_pool_wait", "_stop_reading", "_traced", "api", "attempt", "cancel_reason",
                 "cancel_requested", "channel", "client", "content_key", "deadlines",
                 "endpoint", "fanout_deadline", "finished", "idle_due", "idle_entry", "key",
                 "on_result", "on_slot", "others_running", "request", "result", "retry", "rng",
                 "scope", "settings", "state", "status", "url")

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: Endpoint,
        request: StreamRequest,
        channel: trio.MemorySendChannel[Event],
        settings: StreamSettings = DEFAULT_SETTINGS,
        *,
        rng: random.Random | None = None,
        on_result: Callable[[StreamRunner, StreamResult], None] | None = None,
        others_running: Callable[[StreamRunner], int] | None = None,
        on_slot: Callable[[StreamRunner], None] | None = None,
        idle_watch: IdleWatch | None = None,
    ) -> None:
        self.client = client
        self.endpoint = endpoint
        self.request = request
        self.channel = channel
        self.settings = settings
        self.on_result = on_result  # called with the result just before StreamFinished
        self.others_running = others_running  # how many other streams hold a slot now
        self.on_slot = on_slot  # called once the stream holds its concurrency slots
        self._deaf = False  # the consumer closed its end: events go nowhere, results stay
        #: The wait for room in the channel, while one runs: ``cancel()`` ends it.
        self._blocked: trio.CancelScope | None = None
        #: Events a cancel left undelivered, in order: sent just before the final event.
        self._pending: list[Event] = []
        self.deadlines = request.deadlines or settings.deadlines
        self.retry = request.retry or settings.retry
        self.fanout_deadline = settings.fanout_deadline
        self.rng = rng or random.Random()
        #: The dialect of this stream: the request's, else the endpoint's.
        self.api = request.api_for(endpoint)
        self.url = endpoint.url(self.api)
        try:  # built once: a parameter the dialect lacks fails here, before anything is sent
            self._body = request.body(self.api)
        except ValueError as exc:
            raise ValueError(f"stream {request.key!r}: {exc}") from None
        self._traced = _traces(client, self.url)
        self.key = request.key
        self.content_key = request.content_key(endpoint)
        self.scope = trio.CancelScope()
        #: Where the stream is: queued, connecting, streaming, retrying or finished.
        self.state = "queued"
        self.attempt = 0
        self.status: int | None = None
        self.cancel_requested = False
        self.cancel_reason = "cancelled by the caller"
        self.result: StreamResult | None = None
        self.finished = trio.Event()  # set by the fan-out once the stream's task has ended
        self._origin: float | None = None  # when the stream got its slot
        self._points: dict[str, float] = {}
        self._first_sent: float | None = None
        self._pool_wait = 0.0  # waiting for a connection of the client's pool: queueing
        self._asked: float | None = None  # this attempt handed its request to the client
        #: Gaps between events, 8 bytes each (a list of floats costs 32): exact statistics.
        self._gaps = array("d")
        self._attempt_deadlines: dict[str, float] = {}
        self._attempt_scope: trio.CancelScope | None = None
        #: The attempt's connection, from httpcore's first trace event for it: "new"
        #: (it opened one), "pooled" (it sent on one that served before), or None.
        self._connection: str | None = None
        self._stop_reading = False
        self._parser = self._new_parser()  # the current attempt's: it holds the output
        self._last: _AttemptEnd | None = None
        self._current = (0, 0.0)  # the attempt under way: its number and the wait before it
        #: The idle deadline: when it falls (moved by every event: a float, no heap),
        #: watched by ``idle_watch`` (one task for the fan-out's streams); without
        #: one, the attempt's scope carries it, moved on every event.
        self._idle_watch = idle_watch
        self.idle_due = math.inf
        self.idle_entry: list[object] | None = None
        self._idle_fired = False

    async def emit(self, event: Event) -> None:
        """Send one event, waiting for buffer space (backpressure)."""
        if self._deaf:
            return
        try:
            await self.channel.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._deaf = True

    async def _emit_or_keep(self, event: Event) -> None:
        """``emit``; cancelled while waiting for room, the event is kept for the end."""
        if self._pending:
            self._pending.append(event)  # after those already kept: order holds
            return
        try:
            await self.emit(event)
        except trio.Cancelled:
            self._pending.append(event)  # a cancelled send sent nothing (trio's contract)
            raise

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel the stream: it ends ``cancelled`` with this reason, keeping what arrived.

        Takes effect at once also while the stream waits for a consumer that
        stopped reading: the upstream connection closes now, and the events
        that were waiting, then the final one, reach the consumer when it reads.
        """
        if not self.cancel_requested:
            self.cancel_requested = True
            self.cancel_reason = reason
        self.scope.cancel()
        if self._blocked is not None:
            self._blocked.cancel()

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
        except BaseException as exc:
            # From outside: a cancellation (plain, or grouped by a nursery below us),
            # Ctrl-C, or a bug.  Still exactly one final event with what arrived,
            # then the exception goes on.
            outcome, reason = _interrupted(exc)
            result = self._finish(attempts, submitted, None, outcome=outcome, reason=reason)
            with trio.CancelScope(shield=True):
                await self._send_final(result)
            raise
        result = self._finish(attempts, submitted, timed_out,
                              outcome=Outcome.CANCELLED if self.cancel_requested else None,
                              reason=self.cancel_reason if self.cancel_requested else None)
        with trio.CancelScope(shield=True):  # the one final event is never lost
            await self._send_final(result)
        return result

    # -- attempts ----------------------------------------------------------------

    def _new_parser(self) -> StreamParser:
        settings, endpoint, request = self.settings, self.endpoint, self.request
        return StreamParser(strict=settings.strict, tools=request.tools,
                            max_event_size=settings.max_event_size,
                            max_response_bytes=settings.max_response_bytes,
                            stream=self.key, content_key=self.content_key,
                            secrets=endpoint.secrets,
                            require_finish_reason=endpoint.require_finish_reason,
                            expect_choices=request.expected_choices if self.api == "chat"
                            else 1,
                            expect_usage=request.expects_usage if self.api == "chat"
                            else True, api=self.api)

    async def _attempts(self, attempts: list[Attempt]) -> None:
        waited = 0.0
        number = 0
        resent = 0  # attempts that were sends again after a stale connection
        fresh = False
        while True:
            number += 1
            self._parser = parser = self._new_parser()
            self._last = end = _AttemptEnd()
            self._current = (number, waited)
            self.state, self.attempt, self.status = "connecting", number, None
            await self._attempt(number, parser, end, fresh=fresh)
            if end.error is not None and end.unreported:
                # HTTP statuses, transport errors and deadlines are errors the consumer
                # sees as events too, not only on the result (in-stream ones already were).
                await self._emit_or_keep(ErrorReported(end.error, self.key,
                                                       self.content_key))
            end.retryable = self._retryable(end, parser)
            attempts.append(Attempt(number, end.status, end.error, waited, end.delivered))
            if end.stale and resent < MAX_RESENDS:
                resent += 1
                await self._resend(number, end)
                waited, fresh = 0.0, True
                continue
            fresh = False
            counted = number - resent  # the retry budget counts the stream's own failures
            if not (end.retryable and self.retry.allows(end.status, counted)):
                return
            wait = end.retry_after
            if wait is None:
                wait = self.retry.backoff(counted, self.rng)
            elif self.retry.retry_after_spread:
                wait *= 1 + self.rng.uniform(0, self.retry.retry_after_spread)
            if trio.current_time() + wait >= self.scope.deadline:
                return  # no time left for another attempt
            assert end.error is not None
            self.state = "retrying"
            await self._emit_or_keep(StreamRetrying(number, wait, end.error, self.key,
                                                    self.content_key))
            await trio.sleep(wait)
            waited = wait

    async def _resend(self, number: int, end: _AttemptEnd) -> None:
        """The attempt met a pooled connection the server had closed: send it again now.

        A request that got no response at all (not a byte of a status line:
        httpcore's "Server disconnected without sending a response", a reset,
        or a write that failed) on a connection that had served a request
        before is the stale keep-alive race: the server closed the idle
        connection (the native llama.cpp server does it a few milliseconds
        after every streamed response) while the client was sending on it.
        The server never saw the request, so sending it again costs nothing
        and duplicates nothing.  It goes out at once, whatever other streams
        run (it says nothing about the server's load), is not counted against
        the retry budget, and is recorded as an attempt whose error says what
        happened (code ``stale_connection``).

        "Reused" is known, not guessed: httpcore's trace hook reports opening
        a connection before the request's own events, so an attempt whose
        first event is the request's went out on a pooled connection.  "No
        status line" alone would also match a fresh connection the server
        drops on purpose, where sending again at once is no cure.  A client
        whose transport reports no trace events gets no such re-send (its
        retry policy still applies).  The re-send is marked
        ``FRESH_CONNECTION``: fanout's client sends it on a new connection of
        its own, since the other pooled connections may be just as stale (the
        server closes them all); a client of your own sends it through its
        pool, where each stale connection met leaves the pool
        (``MAX_RESENDS`` bounds that).
        """
        assert end.error is not None
        self.state = "retrying"
        await self._emit_or_keep(StreamRetrying(number, 0.0, end.error, self.key,
                                                self.content_key))

    def _on_pooled(self) -> bool:
        """Whether this attempt went out on a pooled connection (set by ``_trace``)."""
        return self._connection == "pooled"

    def _retryable(self, end: _AttemptEnd, parser: StreamParser) -> bool:
        """May this attempt be tried again?  Never after content; never a failure the
        same request meets again; never a content-less 2xx while other streams ran."""
        if end.delivered:
            return False
        retry = self.retry
        if end.timed_out is not None:
            return end.timed_out == "connect" and retry.connect_errors
        if end.connect_failed:
            return retry.connect_errors
        error = end.error
        deterministic = error is not None and bool(_DETERMINISTIC.search(
            f"{error.message} {error.type or ''}"))
        if end.status is not None and not 200 <= end.status < 300:
            return end.status in retry.statuses and not deterministic
        if error is not None and _OVERLOADED.search(f"{error.type or ''} {error.code or ''}"):
            # An error event (Anthropic's overloaded_error) before any content: the
            # server said why, so this is no slot cut, whatever else is running.
            return True
        if self.others_running is not None and self.others_running(self):
            # A 2xx that delivered nothing while other streams ran is how a server
            # with one slot cuts a stream: a retry now would cut another one.  Left to
            # the caller, with ``others_running`` on the result (batch redoes such
            # units at a lower concurrency; compare says what to set).
            return False
        if error is not None:  # a 2xx: the connection broke, or an error event came first
            return error.type not in ("protocol_error", "not_event_stream") and not deterministic
        if end.status is not None and retry.empty_responses:
            result = parser.result()  # a 2xx that ended without delivering anything
            if result.outcome is Outcome.TRUNCATED:
                end.error = StreamError(result.reason or "no content", "no_content")
                return True
        return False

    def _mark(self, point: str) -> None:
        assert self._origin is not None
        self._points[point] = trio.current_time() - self._origin

    def _set_deadlines(self) -> None:
        assert self._attempt_scope is not None
        self._attempt_scope.deadline = min(self._attempt_deadlines.values(), default=math.inf)

    def _arm_idle(self, due: float) -> None:
        """The idle deadline falls at ``due`` (``math.inf``: paused)."""
        watch = self._idle_watch
        if watch is None:
            self._attempt_deadlines["idle"] = due
            self._set_deadlines()
            return
        self.idle_due = due
        if self.idle_entry is None and due != math.inf:
            watch.arm(self)

    def idle_expired(self) -> None:
        """Called by the ``IdleWatch``: no event within the idle deadline."""
        if self._attempt_scope is not None and not self._stop_reading:
            self._idle_fired = True
            self._attempt_scope.cancel()

    async def _trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: its first event means a connection was ours.

        Until then the request waited for the client's pool, which is queueing,
        not the model's latency: the wait counts in ``Timings.queued``, and
        ``request_sent`` and the first-byte and first-token deadlines start
        only now.  That first event also says whether the connection is new
        (``connection.connect_tcp.started``, or ``connect_unix_socket``) or
        pooled (the request's own ``send_request_headers``).
        """
        if self._connection is None:
            self._connection = "new" if ".connect_" in name else "pooled"
        if self._asked is None:
            return
        now = trio.current_time()
        self._pool_wait += now - self._asked
        self._asked = None
        self._mark("request_sent")
        if self._current[0] == 1:
            self._first_sent = self._points["request_sent"]
        self._arm_request_deadlines(now)
        if self._attempt_scope is not None:
            self._set_deadlines()

    def _arm_request_deadlines(self, sent: float) -> None:
        deadlines = self.deadlines
        if deadlines.first_byte:
            self._attempt_deadlines["first_byte"] = sent + deadlines.first_byte
        if deadlines.first_token:
            self._attempt_deadlines["first_token"] = sent + deadlines.first_token

    async def _attempt(self, number: int, parser: StreamParser, end: _AttemptEnd, *,
                       fresh: bool = False) -> None:
        try:
            await self._attempt_watched(number, parser, end, fresh=fresh)
        finally:  # however the attempt ends (a cancel from outside too): unwatched
            self.idle_due = math.inf
            if self._idle_watch is not None:
                self._idle_watch.disarm(self)

    async def _attempt_watched(self, number: int, parser: StreamParser, end: _AttemptEnd, *,
                               fresh: bool = False) -> None:
        deadlines = self.deadlines
        self._connection = None
        self._points = {}
        self._gaps = array("d")
        self._stop_reading = False
        self._mark("request_sent")
        sent = trio.current_time()
        if self._first_sent is None:
            self._first_sent = self._points["request_sent"]
        self._attempt_deadlines = {}
        self._idle_fired = False
        self.idle_due = math.inf
        if not self._traced:  # else from the trace hook: once a pooled connection is ours
            self._arm_request_deadlines(sent)
        ours = {**self.endpoint.headers, **self.request.headers}
        headers = {**ours, "accept": "text/event-stream", "accept-encoding": "identity",
                   "content-type": "application/json"}
        given = {name.lower() for name in ours}
        for name, value in self.endpoint.auth_headers(self.api).items():
            if name not in given:  # the caller's own anthropic-version wins (the key cannot
                headers[name] = value  # be given: requests and endpoints refuse it)
        connect = deadlines.connect
        timeout = httpx.Timeout(connect=connect, read=None, write=30.0, pool=None)
        with trio.CancelScope() as scope:
            self._attempt_scope = scope
            self._set_deadlines()
            try:
                # Our own JSON writer: httpx's cannot encode a lone surrogate ("\ud800",
                # valid in JSON, so a prompt may hold one); ours escapes it.
                extensions: dict[str, Any] = {"trace": self._trace}
                if fresh:
                    extensions[FRESH_CONNECTION] = True
                request = self.client.build_request(
                    "POST", self.url, content=dumps(self._body).encode(),
                    headers=headers, timeout=timeout, extensions=extensions)
                if not any(name.lower() == "cookie" for name in ours):
                    # No stream sends what another stream's server set in the client's jar.
                    request.headers.pop("cookie", None)
                # httpx's own body stream is an async generator: cancelled mid-send, it
                # would be left unfinished (a ResourceWarning); ours is a plain iterator.
                request.stream = _RequestBody(request.content)
                self._asked = trio.current_time()
                response = await self.client.send(request, stream=True)
                try:
                    await self._response(number, response, parser, end)
                finally:
                    try:
                        await response.aclose()
                    finally:
                        # httpx's response and its body stream refer to each other: a
                        # cycle that would keep the request, the connection's objects
                        # and this runner alive until a full collection.
                        response.stream = _CLOSED_BODY
            except httpx.ConnectTimeout:
                end.timed_out = "connect"
                end.unreported = True
                end.error = self._fail(parser, StreamError(
                    f"no connection within {connect:g} s" if connect else "connect timed out",
                    "timeout", "connect"))
            except httpx.ConnectError as exc:
                end.connect_failed = True
                end.unreported = True
                end.error = self._fail(parser, _transport_error(
                    exc, base_url=self.endpoint.base_url))
            except httpx.TransportError as exc:
                end.unreported = True
                answered = end.status is not None
                end.stale = not answered and self._on_pooled() and _unanswered(exc)
                end.error = self._fail(parser, _transport_error(exc, answered=answered,
                                                                stale=end.stale))
                # The connection broke after a 2xx began the stream: the body was cut short.
                end.broken = end.status is not None and 200 <= end.status < 300
        self._attempt_scope = None
        self._asked = None
        if scope.cancelled_caught and not self._stop_reading:
            name = ("idle" if self._idle_fired else
                    min(self._attempt_deadlines, key=self._attempt_deadlines.__getitem__))
            end.timed_out = name
            limit = getattr(deadlines, name)
            what = {"first_byte": "no first byte", "first_token": "no first token",
                    "idle": "no event"}[name]
            end.unreported = True
            end.error = self._fail(parser, StreamError(f"{what} within {limit:g} s", "timeout",
                                                       name))
        self._mark("end")

    def _explain(self, error: StreamError) -> StreamError:
        """What an HTTP error means for the first hour with an endpoint, said first (the
        server's own words after it): a 401/403 when no key was sent, a 401 when the key
        sent was refused (``key_refused``); a 404 that names
        the model (the endpoint does not know it), or else no such route at all (the
        base URL is wrong: most need ``/v1``)."""
        status = error.status
        said = _server_said(error.message, status)
        if status in (401, 403) and not self.endpoint.api_key:
            message = f"no API key was sent: set OPENAI_API_KEY or [endpoint] api_key_env{said}"
        elif status == 401:
            message = key_refused(self.endpoint) + said
        elif status == 404 and _names_model(error, self.request.model):
            if not _NOT_KNOWN.search(error.message):
                return error  # about the model, but not that it is unknown: its own words
            message = (f"the endpoint does not know model {self.request.model!r}; "
                       f"`fanout models` lists what it offers{said}")
        elif status == 404:
            message = (f"{public_url(self.url)} answered 404: {NO_SUCH_ROUTE}; "
                       f"{base_url_hint(self.endpoint.base_url) or 'is base_url right?'}")
        else:
            return error
        return attrs.evolve(error, message=message)

    async def _response(self, number: int, response: httpx.Response, parser: StreamParser,
                        end: _AttemptEnd) -> None:
        self._mark("headers")
        self.state, self.status = "streaming", response.status_code
        end.status = response.status_code
        parser.status = response.status_code
        kept = {name: response.headers[name] for name in INTERESTING_HEADERS
                if name in response.headers}
        kept.update((k, v) for k, v in response.headers.items() if k.startswith("x-ratelimit-"))
        await self._deliver([StreamStarted(number, response.status_code, parser.headers(kept),
                                           self.key, self.content_key)], end)
        inflater = _Inflater.for_encoding(response.headers.get("content-encoding", ""))
        if isinstance(inflater, StreamError):
            end.unreported = True
            end.error = self._fail(parser, inflater)
            return
        if not 200 <= response.status_code < 300:
            body = await _read_bounded(response, MAX_ERROR_BODY, inflater)
            end.unreported = True
            end.error = parser.fail_http(response.status_code, body,
                                         response.reason_phrase, explain=self._explain).error
            end.retry_after = self.retry.retry_after(response.headers)
            return
        idle = self.deadlines.idle
        # Before the first content, a set ``first_token`` governs alone: idle starts at
        # the first content (llama.cpp sends nothing at all while it evaluates a long
        # prompt, up to its first keep-alive at 30 s).
        held = bool(idle) and bool(self.deadlines.first_token)
        if idle and not held:
            self._arm_idle(trio.current_time() + idle)
        content_type = response.headers.get("content-type", "")
        if content_type and "event-stream" not in content_type:
            limit = self.settings.max_response_bytes or 64 * 1024 * 1024
            body = await _read_bounded(response, limit, inflater)
            if body:
                self._mark("first_byte")
            await self._deliver(parser.feed_completion(body, content_type), end)
            end.error = parser.result().error
            return
        last_event: float | None = None
        single = _Single()
        # Before the first content, with no ``first_token`` set, whatever the server says
        # moves the idle deadline: a keep-alive comment or an event the dialect ignores
        # (llama.cpp's `:` pings while it evaluates a long prompt, Anthropic's ``ping``),
        # counted by the parser (``heard``); ``total`` bounds that wait.  Once content
        # came, only events do: a relay can send keep-alives forever while the model is
        # stuck.  Checked only on reads that completed no event, while waiting.
        waiting = bool(idle)
        heard = 0
        async for raw in body_reader(response) or _body(response):
            if self._stop_reading:
                continue  # cancelled: the cancellation lands inside httpx's iterator
            if not end.body_started:
                end.body_started = True
                self._mark("first_byte")
                if self._attempt_deadlines.pop("first_byte", None) is not None:
                    self._set_deadlines()
            batch = single.load(raw) if inflater is None else inflater.pieces(raw)
            del raw
            for data in batch:
                try:
                    events = parser.feed(data)
                except ProtocolError:
                    events = []  # strict mode: the parser recorded it and stopped
                # Parsed: a stream that waits for its consumer below holds its events, not
                # the read's bytes too (up to RECEIVE_SIZE each, thousands of streams).
                del data
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
                        if waiting:
                            waiting = not end.delivered
                            heard = parser.heard
                            held = held and waiting
                    if idle and not held:  # re-armed after delivery (a slow consumer is no
                        # idle upstream)
                        if self._idle_watch is not None:
                            self.idle_due = trio.current_time() + idle
                            if self.idle_entry is None:
                                self._idle_watch.arm(self)
                        else:
                            self._arm_idle(trio.current_time() + idle)
                elif waiting and not held and parser.heard != heard:  # a keep-alive, before
                    # any content
                    heard = parser.heard
                    assert idle
                    self._arm_idle(trio.current_time() + idle)
                if parser.stopped:
                    break
            if inflater is not None and inflater.error is not None and not parser.stopped:
                parser.fail(inflater.error)
                end.unreported = True
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
        Only ``cancel()`` ends the wait early (the wait's own scope, which it
        cancels): what did not fit is kept in ``_pending``, and the read loop's
        next read meets the stream's cancellation inside httpx's iterator, which
        closes the connection.
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

    def _send_ready(self, events: list[Any]) -> Sequence[Any]:
        """Send what fits in the buffer without waiting; return what did not fit (``()``,
        not a new list, when all did: a container per read is work for the cyclic GC)."""
        if self._deaf:
            return ()
        if self._pending:  # cancelled with events kept: these go after them
            self._pending.extend(events)
            return ()
        send_nowait = self.channel.send_nowait
        for index, event in enumerate(events):
            try:
                send_nowait(event)
            except trio.WouldBlock:
                return events[index:]
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._deaf = True
                return ()
        return ()

    async def _deliver_waiting(self, events: Sequence[Any]) -> None:
        if self.cancel_requested:  # no waiting once cancelled: kept for the end
            self._pending.extend(events)
            return
        scope = self._attempt_scope
        assert scope is not None
        scope.deadline = math.inf
        self.idle_due = math.inf  # paused; re-armed by the read loop after this
        before = trio.current_time()
        sent = 0
        with trio.CancelScope(shield=True) as wait:
            self._blocked = wait
            try:
                for event in events:
                    await self.emit(event)
                    sent += 1
            finally:
                self._blocked = None
        if sent < len(events):  # cancel() ended the wait: nothing of a cancelled send went
            self._pending.extend(events[sent:])
        blocked = trio.current_time() - before
        if blocked:
            for name in self._attempt_deadlines:
                self._attempt_deadlines[name] += blocked
        self._set_deadlines()

    # -- the end -----------------------------------------------------------------

    def _fail(self, parser: StreamParser, error: StreamError) -> StreamError:
        return parser.fail(error).error  # the parser redacts it

    def _finish(self, attempts: list[Attempt], submitted: float, timed_out: str | None, *,
                outcome: Outcome | None = None, reason: str | None = None) -> StreamResult:
        parser = self._parser
        number, waited = self._current
        end = self._last
        if end is not None and (not attempts or attempts[-1].number != number):
            # Cancelled or timed out during an attempt: it happened, record it.
            attempts.append(Attempt(number, end.status, end.error, waited, end.delivered))
        if self._origin is not None:
            self._mark("end")
        gaps = sorted(self._gaps)
        slot_wait = (trio.current_time() if self._origin is None else self._origin) - submitted
        timings = Timings(
            queued=slot_wait + self._pool_wait,
            first_request_sent=self._first_sent,
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
        if outcome is not None:
            timed_out = None
        elif timed_out is not None:
            outcome = Outcome.TIMED_OUT
            if timed_out in ("total", "fanout"):
                limit = self.deadlines.total if timed_out == "total" else None
                parser.fail(StreamError(
                    f"the {timed_out} deadline" + (f" of {limit:g} s" if limit else "")
                    + " passed", "timeout", timed_out))
            error = parser.result().error
            reason = error.message if error is not None else f"the {timed_out} deadline passed"
        elif self._last is not None and self._last.broken:
            outcome = Outcome.TRUNCATED  # the error stays on the result: it says why
        result = parser.result(outcome, timed_out=timed_out, attempts=tuple(attempts),
                               timings=timings, reason=reason)
        if self.others_running is not None:
            result = attrs.evolve(result, others_running=self.others_running(self))
        return result

    @property
    def parser(self) -> StreamParser:
        """The current attempt's parser: what the stream produced so far (read-only use)."""
        return self._parser

    async def _send_final(self, result: StreamResult) -> None:
        self.result = result
        self.state = "finished"
        if self.on_result is not None:
            self.on_result(self, result)  # so fan.results has it when StreamFinished arrives
        pending, self._pending = self._pending, []
        for event in pending:  # what a cancel kept from a consumer that was not reading
            await self.emit(event)
        await self.emit(StreamFinished(result, self.key, self.content_key))


def _traces(client: httpx.AsyncClient, url: str) -> bool:
    """Whether the client's transport for ``url`` reports httpcore trace events (an
    ``AsyncHTTPTransport``, or fanout's shards of them; a test double does not)."""
    find = getattr(client, "_transport_for_url", None)  # httpx has no public accessor
    try:
        transport = find(httpx.URL(url)) if find is not None else None
    except Exception:  # a client of another shape: assume no traces
        return False
    if isinstance(transport, ShardedTransport):
        return all(isinstance(t, httpx.AsyncHTTPTransport) for t in transport.transports)
    return isinstance(transport, httpx.AsyncHTTPTransport)


def _interrupted(exc: BaseException) -> tuple[Outcome, str]:
    """The outcome and reason of a stream ended by an exception from outside."""
    leaves = list(_leaves(exc)) if isinstance(exc, BaseExceptionGroup) else [exc]
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return Outcome.CANCELLED, "interrupted (Ctrl-C)"
    if all(isinstance(leaf, trio.Cancelled) for leaf in leaves):
        return Outcome.CANCELLED, "cancelled from outside the fan-out (a cancel scope or deadline)"
    bug = next(leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled))
    return Outcome.ERROR, f"internal error: {type(bug).__name__}: {bug}"


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _unanswered(exc: httpx.TransportError) -> bool:
    """Whether the request got no response at all because the connection ended: closed
    before a status line (httpcore's own words), reset, or broken while writing (httpcore
    then reads for an early response, so a write error rarely surfaces as one)."""
    if isinstance(exc, httpx.RemoteProtocolError):
        return "without sending a response" in str(exc)
    return isinstance(exc, httpx.ReadError | httpx.WriteError)


def _server_said(message: str, status: int | None) -> str:
    """`` (the server said: ...)``, short; nothing when it said no more than its status."""
    text = " ".join(message.split())
    if not text or text.startswith(f"HTTP {status}"):
        return ""
    return f" (the server said: {text if len(text) <= 160 else text[:157] + '...'})"


def _names_model(error: StreamError, model: str) -> bool:
    """Whether a 404 is about the model (OpenAI's ``model_not_found``, vLLM's and
    Ollama's messages), not about the route."""
    said = f"{error.code or ''} {error.type or ''} {error.message}".lower()
    # The id as a whole word: a short one ("a") is inside every message.
    named = re.search(rf"(?<![\w/.:-]){re.escape(model.lower())}(?![\w/.:-])", said)
    return "model" in said or named is not None


def connect_failure(exc: httpx.TransportError, base_url: str) -> str:
    """One line for a request to ``base_url`` that got no answer: the words a stream's
    result uses (``cannot connect to ...`` when nothing is there)."""
    return _transport_error(exc, answered=False, base_url=base_url).message


def key_refused(endpoint: Endpoint) -> str:
    """What a 401 to a key that was sent means, and what to check: where the key came
    from and where it went (never the key)."""
    where = public_url(endpoint.base_url)
    if endpoint.key_env is None:
        return (f"the key sent to {where} was refused: check that it is valid for this "
                "endpoint and not expired")
    return (f"the key in {endpoint.key_env} was sent to {where} and refused: check that it "
            "is valid for this endpoint, not expired, and the right variable")


def public_url(url: str) -> str:
    """``url`` as an error may show it: no user, password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}".rstrip("/")


#: What a base URL that answered 404 may have wrong: a route pasted into it, or no /v1.
_ROUTES = ("/chat/completions", "/responses", "/messages", "/models")


#: What a 404 for no route says (the batch summary's advice follows it: fix the base URL).
NO_SUCH_ROUTE = "no such route"


def base_url_hint(base_url: str) -> str:
    """The one diagnosis for a 404 on a route of ``base_url``, or ``""`` when there is none
    to make: a base URL holding a route already gets the route added again; one without
    ``/v1`` misses what OpenAI-compatible servers expect (try it with ``/v1``)."""
    path = public_url(base_url)
    route = next((r for r in _ROUTES if path.endswith(r)), None)
    if route is not None:
        return f"leave {route} out of base_url (fanout adds the route; it ends with /v1)"
    return "" if path.endswith("/v1") else f"the base URL probably needs /v1: try {path}/v1"


#: A 404 about the model saying the endpoint does not know it (OpenAI, vLLM, Ollama, ...).
_NOT_KNOWN = re.compile(r"does ?n[o']t exist|not found|unknown|no such|invalid model", re.I)
#: Why a connection could not be made that says the server is not there (yet).
_UNREACHED = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "no route to host",
              errno.ENETUNREACH: "network unreachable"}


def _transport_error(exc: httpx.TransportError, *, answered: bool = True,
                     stale: bool = False, base_url: str | None = None) -> StreamError:
    """One line that says what happened on the wire, with the OS's own reason.

    ``answered``: a status line had arrived (else the error says the server
    never answered); ``stale``: a pooled connection the server had closed;
    ``base_url``: where a connection failed (named when nothing is there, or
    its host name does not resolve).
    """
    message = str(exc) or type(exc).__name__
    os_error = _os_error(exc)
    code = type(exc).__name__
    if stale:
        what = ("reset" if os_error is not None
                and os_error.errno in (errno.ECONNRESET, errno.EPIPE) else "closed")
        return StreamError(f"the server {what} the connection before answering (a pooled "
                           f"connection it had given up on: sent again on a fresh one) "
                           f"({code}: {message})", "transport_error", "stale_connection")
    if os_error is not None and os_error.errno in (errno.EMFILE, errno.ENFILE):
        return StreamError("too many open files: the process ran out of file descriptors "
                           "(raise the limit with `ulimit -n`, or lower the concurrency)",
                           "transport_error", "too_many_open_files")
    unreached = None if os_error is None else (
        f"host name not found: {os_error.strerror or os_error}"
        if isinstance(os_error, socket.gaierror) else _UNREACHED.get(os_error.errno or 0))
    if unreached is not None and base_url is not None:
        return StreamError(f"cannot connect to {public_url(base_url)}: is the server running, "
                           "is base_url right? run the same command again once it is "
                           f"({unreached})", "transport_error", code)
    if os_error is not None and os_error.errno == errno.ECONNREFUSED:
        return StreamError(f"connection refused ({code}: {message})", "transport_error", code)
    if os_error is not None and os_error.errno in (errno.ECONNRESET, errno.EPIPE):
        before = "" if answered else " before answering"
        return StreamError(f"connection reset by the server{before} ({code}: {message})",
                           "transport_error", "connection_reset")
    if isinstance(exc, httpx.RemoteProtocolError):
        when = "mid-response" if answered else "before answering"
        return StreamError(f"the server closed the connection {when} ({code}: {message})",
                           "transport_error", code)
    return StreamError(f"{code}: {message}", "transport_error", code)


def _os_error(exc: BaseException) -> OSError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        if isinstance(current, BaseExceptionGroup):
            for inner in current.exceptions:
                found = _os_error(inner)
                if found is not None:
                    return found
        current = current.__cause__ or current.__context__
    return None


class _Inflater:
    """A gzip or deflate body, inflated in bounded pieces.

    fanout asks for ``identity``; a server that compresses anyway is read,
    but never inflated all at once: a few megabytes of gzip can hold
    gigabytes, and the parser's response cap must hold after inflating.
    """

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        self.error: StreamError | None = None

    @classmethod
    def for_encoding(cls, header: str) -> _Inflater | StreamError | None:
        encoding = header.strip().lower()
        if encoding in ("", "identity"):
            return None
        if encoding in ("gzip", "x-gzip", "deflate"):
            return cls()
        return StreamError(f"the body is {encoding[:40]}-encoded, which fanout cannot read "
                           "(it asks for identity)", "protocol_error", "content_encoding")

    def pieces(self, data: bytes) -> Iterator[bytes]:
        try:
            out = self._inflate.decompress(data, _INFLATE_PIECE)
            while True:
                if out:
                    yield out
                tail = self._inflate.unconsumed_tail
                if not tail and len(out) < _INFLATE_PIECE:
                    return
                out = self._inflate.decompress(tail, _INFLATE_PIECE)
        except zlib.error as exc:
            self.error = StreamError(f"the compressed body is corrupt: {exc}", "protocol_error",
                                     "content_encoding")


def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it came off the wire (never decoded by httpx: see ``_Inflater``)."""
    if response.is_stream_consumed:  # a response built with its content (a test double)
        return _Once(response.content)
    return response.aiter_raw()


class _Single:
    """Iterates over one piece of bytes, and lets go of it once taken.  Loaded
    again for every read (``load``): no container is made per read, which
    would be work for the cyclic GC (at thousands of streams it was a third of
    a fan-out's CPU)."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: bytes | None = None

    def load(self, data: bytes) -> _Single:
        self._data = data
        return self

    def __iter__(self) -> _Single:
        return self

    def __next__(self) -> bytes:
        data, self._data = self._data, None
        if data is None:
            raise StopIteration
        return data


#: What a closed response's ``stream`` becomes (see ``_attempt_watched``).
_CLOSED_BODY = httpx.ByteStream(b"")


class _RequestBody(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self._data)


class _Once(AsyncIterator[bytes]):
    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    async def __anext__(self) -> bytes:
        data, self._data = self._data, None
        if not data:
            raise StopAsyncIteration
        return data


async def _read_bounded(response: httpx.Response, limit: int,
                        inflater: _Inflater | None = None) -> bytes:
    """At most ``limit`` bytes of the (inflated) body; stops by cancelling, never
    ``break`` (leaving ``aiter_raw`` early leaks ResourceWarnings: httpx #3686)."""
    parts: list[bytes] = []
    size = 0
    with trio.CancelScope() as scope:
        async for raw in _body(response):
            if size >= limit:
                continue  # cancelled: the cancellation lands inside httpx's iterator
            for data in (inflater.pieces(raw) if inflater is not None else (raw,)):
                parts.append(data[: limit - size])
                size += len(data)
                if size >= limit:
                    scope.cancel()
                    break
    return b"".join(parts)
