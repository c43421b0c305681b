"""Many streams, one endpoint, one key: the fan-out.

``open_fanout`` runs one nursery with one task per stream.  Each task gets
a clone of the send side of one bounded memory channel and closes it when
its stream ends, so ``async for event in fan.events`` ends when the last
stream has ended (and, with ``accept_more=True``, after ``fan.seal()``).

Backpressure is real: a stream whose events are not consumed waits when
the channel's buffer is full, and so does its HTTP read; ``submit`` waits
while ``max_queued`` streams wait for a slot.  A consumer that only wants
results uses ``run_fanout``; one that wants one stream uses its
``StreamHandle`` (``await handle.wait()``, ``handle.snapshot()``).

An exception raised by your code inside ``async with open_fanout(...)``
comes out as itself, not wrapped in an ``ExceptionGroup`` (the nursery is
fanout's own business): ``except ConnectionClosed:`` works.  Only when
several exceptions happened at once (your code's and a bug's) do they come
out as a group.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from typing import Literal, TypedDict, Unpack, final

import attrs
import httpx
import trio

from ._channel import EventChannel
from .core.events import Event
from .core.result import ChoiceResult, StreamResult, Usage
from .core.sse import DEFAULT_MAX_EVENT_SIZE
from .net.idle import IdleWatch
from .net.stream import StreamRunner
from .net.transport import make_client
from .request import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Deadlines,
    Endpoint,
    RetryPolicy,
    StreamRequest,
    StreamSettings,
)

DEFAULT_RETRY = RetryPolicy()

__all__ = ["EndpointStreams", "Fanout", "FanoutOptions", "StreamHandle", "StreamSnapshot",
           "open_fanout", "run_fanout"]

DEFAULT_BUFFER = 1024
#: Submitted streams that may wait for a concurrency slot before ``submit`` waits too.
DEFAULT_MAX_QUEUED = 1024

StreamState = Literal["queued", "connecting", "streaming", "retrying", "finished"]


@attrs.frozen
class StreamSnapshot:
    """What a stream has produced so far, without touching the event channel.

    ``state``: ``queued`` (waiting for a slot), ``connecting`` (an attempt sent,
    no response yet), ``streaming``, ``retrying`` (waiting before the next
    attempt) or ``finished`` (then ``result`` is set).  ``choices`` are the
    current attempt's output (a retry starts again from nothing: retries happen
    only before content).  Building one joins the text so far: cheap, but not
    free on every event.
    """

    key: str
    state: StreamState
    attempt: int
    status: int | None
    choices: tuple[ChoiceResult, ...]
    usage: Usage | None
    result: StreamResult | None

    @property
    def text(self) -> str:
        """The first choice's text so far."""
        return self.choices[0].text if self.choices else ""


@final
class StreamHandle:
    """One stream of a fan-out: ``await handle.wait()`` for its result, ``snapshot()``
    for what it has produced so far, ``cancel()``.  ``submit`` returns one;
    ``fan.handle(key)`` finds one."""

    def __init__(self, fan: Fanout, runner: StreamRunner) -> None:
        self._fan = fan
        self._runner = runner

    @property
    def key(self) -> str:
        return self._runner.key

    @property
    def request(self) -> StreamRequest:
        return self._runner.request

    @property
    def result(self) -> StreamResult | None:
        """The result once the stream has finished, else ``None``."""
        return self._runner.result

    async def wait(self) -> StreamResult:
        """Wait for the stream's end; return its result (also after ``forget``)."""
        await self._runner.finished.wait()
        assert self._runner.result is not None
        return self._runner.result

    def snapshot(self) -> StreamSnapshot:
        """What the stream has produced so far (its result's choices once finished)."""
        runner = self._runner
        result = runner.result
        if result is not None:
            return StreamSnapshot(runner.key, "finished", runner.attempt, result.status,
                                  result.choices, result.usage, result)
        accumulator = runner.parser.accumulator
        return StreamSnapshot(runner.key, runner.state, runner.attempt,  # type: ignore[arg-type]
                              runner.status, accumulator.choices(), accumulator.usage, None)

    def cancel(self, reason: str = "cancelled by the caller") -> bool:
        """Cancel the stream; ``False`` if it had already finished."""
        if self._runner.result is not None:
            return False
        self._runner.cancel(reason)
        return True


@final
class EndpointStreams:
    """The streams holding a slot on one endpoint, counted across every fan-out given
    this object (``open_fanout(..., endpoint_streams=...)``).

    A server with one generation slot cuts the stream it serves when another
    request arrives, whichever fan-out sent it (a judge's beside a batch's).  With
    one ``EndpointStreams`` shared, each stream's ``others_running``, and the rule
    that a 2xx which delivered nothing while others ran is not retried, count the
    streams of all of them.  ``len()``: how many hold a slot now.
    """

    def __init__(self) -> None:
        self._runners: set[StreamRunner] = set()

    def __len__(self) -> int:
        return len(self._runners)

    def others(self, runner: StreamRunner) -> int:
        return len(self._runners) - (runner in self._runners)

    def add(self, runner: StreamRunner) -> None:
        self._runners.add(runner)

    def discard(self, runner: StreamRunner) -> None:
        self._runners.discard(runner)


@final
class Fanout:
    """A running fan-out (made by ``open_fanout``).

    ``events`` (an ``EventChannel``): every stream's events, tagged with
    ``.stream``; each stream's last event is its ``StreamFinished``.
    ``results``: key -> ``StreamResult`` as streams finish (a result is there
    before its ``StreamFinished`` arrives).  ``running`` and ``queued``: live
    views of the keys.  ``submit``, ``seal``, ``handle``, ``wait``, ``cancel``,
    ``cancel_where``, ``cancel_all``, ``forget``.
    """

    def __init__(self, nursery: trio.Nursery, endpoint: Endpoint, client: httpx.AsyncClient,
                 send: trio.MemorySendChannel[Event],
                 receive: trio.MemoryReceiveChannel[Event], *, buffer: int,
                 settings: StreamSettings, rng: random.Random,
                 max_concurrency: int | None,
                 per_model_concurrency: int | Mapping[str, int] | None,
                 max_queued: int, endpoint_streams: EndpointStreams | None = None) -> None:
        self._nursery = nursery
        self._endpoint = endpoint
        self._client = client
        self._send = send
        # Drain up to a whole buffer before yielding: the buffer bounds it anyway.
        self.events: EventChannel[Event] = EventChannel(receive, schedule_every=max(buffer, 64))
        self.results: dict[str, StreamResult] = {}
        self._runners: dict[str, StreamRunner] = {}
        self._running: set[str] = set()
        self._queued: set[str] = set()
        self._settings = settings
        self._rng = rng
        self._global = trio.CapacityLimiter(max_concurrency) if max_concurrency else None
        self._per_model_setting = per_model_concurrency
        self._per_model: dict[str, trio.CapacityLimiter] = {}
        self._sealed = False
        # A submitted stream holds its place until its task has ended: waiting for a
        # slot, running, or waiting for the consumer to take its final event (a slow
        # consumer must push back on the producer too, not pile up finished tasks).
        self._queue_room = trio.Semaphore(max_queued + (max_concurrency or 0))
        self._holding_room: set[StreamRunner] = set()
        self._endpoint_streams = endpoint_streams
        self._idle_watch = IdleWatch(nursery)  # one task watches every stream's idle deadline

    @property
    def running(self) -> AbstractSet[str]:
        """The keys of the streams that hold a concurrency slot and have not finished.

        A live read-only view (no copy): it changes as streams start and end.
        Disjoint from ``queued``; a stream is in one or the other until it ends.
        """
        return self._running

    @property
    def queued(self) -> AbstractSet[str]:
        """The keys of the streams still waiting for a concurrency slot (a live view)."""
        return self._queued

    def _limiters(self, model: str) -> list[trio.CapacityLimiter]:
        limiters = [self._global] if self._global is not None else []
        setting = self._per_model_setting
        cap = setting.get(model) if isinstance(setting, Mapping) else setting
        if cap:
            if model not in self._per_model:
                self._per_model[model] = trio.CapacityLimiter(cap)
            limiters.append(self._per_model[model])
        return limiters

    def _start(self, request: StreamRequest, barrier: _Barrier | None = None) -> StreamRunner:
        if request.key in self._runners:
            raise ValueError(f"stream key {request.key!r} is already in this fan-out")
        send = self._send.clone()  # one per producer: the consumer sees the end
        runner = StreamRunner(self._client, self._endpoint, request, send, self._settings,
                              rng=self._rng, on_result=self._store,
                              others_running=self._others_running, on_slot=self._slot_taken,
                              idle_watch=self._idle_watch)
        self._runners[request.key] = runner
        self._queued.add(request.key)
        self._nursery.start_soon(self._run, runner, send, barrier,
                                 name=f"fanout stream {request.key}")
        return runner

    async def _run(self, runner: StreamRunner, send: trio.MemorySendChannel[Event],
                   barrier: _Barrier | None) -> None:
        async with send:
            wait = barrier.wait if barrier is not None else None
            try:
                await runner.run(self._limiters(runner.request.model), wait)
            finally:
                if runner.result is not None:
                    self._store(runner, runner.result)
                if self._endpoint_streams is not None:
                    self._endpoint_streams.discard(runner)
                self._leave_queue(runner)
                runner.finished.set()

    def _others_running(self, runner: StreamRunner) -> int:
        # Streams that hold a slot and have not finished, this one aside (on the
        # whole endpoint when the fan-out shares one's count).
        if self._endpoint_streams is not None:
            return self._endpoint_streams.others(runner)
        return len(self._running) - (runner.key in self._running)

    def _slot_taken(self, runner: StreamRunner) -> None:
        if self._runners.get(runner.key) is runner:
            self._queued.discard(runner.key)
            self._running.add(runner.key)
            if self._endpoint_streams is not None:
                self._endpoint_streams.add(runner)

    def _leave_queue(self, runner: StreamRunner) -> None:
        if runner in self._holding_room:
            self._holding_room.discard(runner)
            self._queue_room.release()

    def _store(self, runner: StreamRunner, result: StreamResult) -> None:
        if self._endpoint_streams is not None:
            self._endpoint_streams.discard(runner)
        # Not for a runner that was forgotten (its key may already run again).
        if self._runners.get(runner.key) is runner and runner.key not in self.results:
            self.results[runner.key] = result
            self._running.discard(runner.key)
            self._queued.discard(runner.key)

    async def submit(self, request: StreamRequest) -> StreamHandle:
        """Start another stream (``accept_more=True`` fan-outs, until ``seal()``).

        Waits while ``max_queued`` submitted streams wait for a concurrency slot
        beyond the ``max_concurrency`` that run (so a producer loop is bounded by
        default, also when the consumer is slower than the streams), then starts
        the stream and returns its handle.  Cancelled, it raises only while it
        waits for room, before anything was started: a stream ``submit`` started,
        it always returns.  A key already in the fan-out (running, or finished and
        not forgotten) is a ``ValueError``; so is one submitted twice while
        waiting here.
        """
        if self._sealed:
            raise RuntimeError("this fan-out is sealed: open it with accept_more=True and "
                               "submit before calling seal()")
        if request.key in self._runners:
            raise ValueError(f"stream key {request.key!r} is already in this fan-out")
        waited = False
        try:
            self._queue_room.acquire_nowait()
        except trio.WouldBlock:
            await self._queue_room.acquire()  # cancellable: then nothing was started
            waited = True
        try:
            if self._sealed:
                raise RuntimeError("this fan-out was sealed while submit waited for room")
            runner = self._start(request)
        except BaseException:
            self._queue_room.release()
            raise
        self._holding_room.add(runner)
        if not waited:
            # A schedule point that cannot raise: once started, submit returns the handle,
            # so a caller cancelled here never loses track of a stream that runs.
            await trio.lowlevel.cancel_shielded_checkpoint()
        return StreamHandle(self, runner)

    def handle(self, key: str) -> StreamHandle:
        """The handle of a stream of this fan-out (``KeyError`` if unknown or forgotten)."""
        try:
            return StreamHandle(self, self._runners[key])
        except KeyError:
            raise KeyError(f"no stream {key!r} in this fan-out (never submitted, or "
                           "forgotten)") from None

    async def wait(self, key: str) -> StreamResult:
        """Wait for one stream's end; return its result (``KeyError`` if unknown)."""
        return await self.handle(key).wait()

    def snapshot(self, key: str) -> StreamSnapshot:
        """What one stream has produced so far (``KeyError`` if unknown or forgotten)."""
        return self.handle(key).snapshot()

    def seal(self) -> None:
        """No more submissions: ``events`` ends when the running streams have ended."""
        if not self._sealed:
            self._sealed = True
            self._send.close()

    def cancel(self, key: str, reason: str = "cancelled by the caller") -> bool:
        """Cancel one stream: it ends ``cancelled`` with ``reason``, keeping its output.

        Returns ``True`` if the stream was queued or running, ``False`` for any
        other key (finished, forgotten, or never submitted), so a disconnect
        handler may call it without checking.  The cancellation takes effect at
        the stream's next checkpoint: its result is in ``results`` (and
        ``await fan.wait(key)`` returns) once its task has ended, a moment
        later, before its ``StreamFinished`` is delivered.  Also when the stream
        waits for room in a full channel (a consumer that stopped reading): its
        upstream connection closes at once, and the events that were waiting,
        then its ``StreamFinished``, are delivered when the consumer reads again.
        """
        runner = self._runners.get(key)
        if runner is None or runner.result is not None:
            return False
        runner.cancel(reason)
        return True

    def cancel_where(self, predicate: Callable[[StreamRequest], bool],
                     reason: str = "cancelled by the caller") -> list[str]:
        """Cancel every unfinished stream whose request matches; return their keys.

        ``fan.cancel_where(lambda r: "job-7" in r.tags)`` cancels a group.
        """
        keys = [key for key in [*self._running, *self._queued]
                if predicate(self._runners[key].request)]
        for key in keys:
            self._runners[key].cancel(reason)
        return keys

    def forget(self, key: str) -> StreamResult:
        """Drop a finished stream from ``results`` (and the fan-out's memory); return its result.

        For long-running fan-outs (``accept_more=True``) that handle each result as
        it arrives: without it, every result is kept until the block ends.  The key
        may then be submitted again.  ``KeyError`` if the stream has not finished.
        """
        result = self.results.pop(key)
        del self._runners[key]
        return result

    def cancel_all(self, reason: str = "cancelled by the caller") -> None:
        """Cancel every stream that has not finished, queued or running (what leaving
        the block does); each ends ``cancelled`` with ``reason``."""
        for key in [*self._running, *self._queued]:
            self._runners[key].cancel(reason)


class _Barrier:
    """Releases everyone once ``parties`` have arrived: side-by-side fairness."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.event = trio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.event.set()
        await self.event.wait()


@asynccontextmanager
async def open_fanout(
    endpoint: Endpoint,
    requests: Iterable[StreamRequest] = (),
    *,
    max_concurrency: int | None = None,
    per_model_concurrency: int | Mapping[str, int] | None = None,
    deadlines: Deadlines | None = None,
    deadline: float | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    buffer: int | None = None,
    client: httpx.AsyncClient | None = None,
    strict: bool = False,
    start_together: bool = False,
    accept_more: bool = False,
    max_event_size: int = DEFAULT_MAX_EVENT_SIZE,
    max_response_bytes: int | None = DEFAULT_MAX_RESPONSE_BYTES,
    max_queued: int = DEFAULT_MAX_QUEUED,
    seed: int | None = None,
    endpoint_streams: EndpointStreams | None = None,
) -> AsyncIterator[Fanout]:
    """Stream every request at once through ``endpoint``; yield the running ``Fanout``.

    ``max_concurrency`` caps streams in flight, ``per_model_concurrency`` caps
    them per model (one number, or a mapping model -> cap).  ``deadlines`` are
    the default per-stream deadlines (a request's own win; ``None``: the
    documented ``Deadlines()`` defaults, so no server can hang a stream
    forever; ``Deadlines.none()`` disables them); ``deadline`` is for the whole
    fan-out, in seconds.  ``retry`` says when an attempt is tried again (a
    request's own wins).  ``max_response_bytes`` (64 MiB by default, ``None``
    for no cap) ends an endless stream with its output kept;
    ``max_event_size`` bounds one event.  Keys must be unique (``ValueError``
    before anything is sent).  ``buffer`` bounds the event channel (default:
    16 events a stream in flight, at least 1,024: a bounded buffer, so a
    consumer that stops reading stops the streams).  ``start_together``: the
    initial requests send their HTTP requests at the same moment (they must
    all fit in the caps).

    ``accept_more``: ``await fan.submit(request)`` adds streams until
    ``fan.seal()``; ``async for event in fan.events`` ends only after
    ``seal()`` and the last stream.  ``submit`` waits while ``max_queued``
    (1,024) submitted streams wait beyond the ``max_concurrency`` running ones
    (for a slot, or for the consumer to take their last event), so a producer
    loop cannot pile up tasks.

    ``client``: your own ``httpx.AsyncClient`` (fanout builds one sized to
    ``max_concurrency`` otherwise, and closes it; yours it leaves open, so
    one client can serve many fan-outs: build it once with
    ``make_client(max_connections)``).  A pool smaller than the concurrency
    works: waiting for one of its connections counts as queueing
    (``Timings.queued``), never as time to first token, and moves the
    stream's first-byte and first-token deadlines with it.

    ``endpoint_streams``: an ``EndpointStreams`` shared with the other fan-outs
    on the same server, so each stream's ``others_running`` counts theirs too
    (a one-slot server cuts a stream whoever sends the next request).

    Leaving the block cancels every stream still running; each still ends
    with its ``StreamFinished`` and its result in ``fan.results``.  An
    exception from your code in the block comes out unwrapped.
    """
    initial = list(requests)
    keys: set[str] = set()
    for request in initial:
        if request.key in keys:  # before anything is sent, and not in an exception group
            raise ValueError(f"stream key {request.key!r} is used twice; keys name streams "
                             "and must be unique within a fan-out")
        keys.add(request.key)
    if buffer is None:
        buffer = max(DEFAULT_BUFFER, 16 * (max_concurrency or len(initial)))
    if buffer < 0:
        raise ValueError(f"buffer must be >= 0, not {buffer}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, not {max_concurrency}")
    if deadline is not None and not deadline > 0:
        raise ValueError(f"deadline must be a positive number of seconds, not {deadline!r}")
    if isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1:
        raise ValueError(f"max_queued must be a whole number >= 1, not {max_queued!r}")
    if start_together:
        _check_fits(initial, max_concurrency, per_model_concurrency)
    own_client = client is None
    if client is None:
        client = make_client(max_concurrency or min(max(len(initial), 100), 10_000))
    settings = StreamSettings(
        deadlines=Deadlines() if deadlines is None else deadlines, retry=retry, strict=strict,
        max_event_size=max_event_size, max_response_bytes=max_response_bytes,
        fanout_deadline=trio.current_time() + deadline if deadline else math.inf)
    send, receive = trio.open_memory_channel[Event](buffer)
    lone: BaseException | None = None
    try:
        try:
            async with trio.open_nursery() as nursery:
                fan = Fanout(nursery, endpoint, client, send, receive, buffer=buffer,
                             settings=settings, rng=random.Random(seed),
                             max_concurrency=max_concurrency,
                             per_model_concurrency=per_model_concurrency,
                             max_queued=max_queued, endpoint_streams=endpoint_streams)
                barrier = _Barrier(len(initial)) if start_together and initial else None
                for request in initial:
                    fan._start(request, barrier)
                if not accept_more:
                    fan.seal()
                try:
                    yield fan
                finally:
                    fan.cancel_all("cancelled: the fan-out's block ended before the stream did")
                    fan.seal()
                    # Close our end first: a final event sent to nobody must not block.
                    fan.events.close()
        except BaseExceptionGroup as group:
            lone = _lone(group)
            if lone is None:
                raise
        if lone is not None:
            # The caller's own exception, as itself: the nursery is fanout's business.
            raise lone
    finally:
        if own_client:
            with trio.CancelScope(shield=True):
                await client.aclose()


def _lone(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception in ``group`` that is not a cancellation, if there is exactly one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


def _check_fits(requests: list[StreamRequest], max_concurrency: int | None,
                per_model: int | Mapping[str, int] | None) -> None:
    if max_concurrency is not None and len(requests) > max_concurrency:
        raise ValueError(f"start_together: {len(requests)} requests do not fit in "
                         f"max_concurrency={max_concurrency}")
    counts: dict[str, int] = {}
    for request in requests:
        counts[request.model] = counts.get(request.model, 0) + 1
    for model, count in counts.items():
        cap = per_model.get(model) if isinstance(per_model, Mapping) else per_model
        if cap is not None and count > cap:
            raise ValueError(f"start_together: {count} requests for {model!r} do not fit in "
                             f"its concurrency cap of {cap}")


class FanoutOptions(TypedDict, total=False):
    """The keyword options of ``open_fanout``, for ``run_fanout``'s typed ``**options``."""

    max_concurrency: int | None
    per_model_concurrency: int | Mapping[str, int] | None
    deadlines: Deadlines | None
    deadline: float | None
    retry: RetryPolicy
    buffer: int | None
    client: httpx.AsyncClient | None
    strict: bool
    start_together: bool
    max_event_size: int
    max_response_bytes: int | None
    max_queued: int
    seed: int | None
    endpoint_streams: EndpointStreams | None


async def run_fanout(endpoint: Endpoint, requests: Iterable[StreamRequest],
                     **options: Unpack[FanoutOptions]) -> dict[str, StreamResult]:
    """Run every request to its end; return key -> result in request order.

    Takes the keyword options of ``open_fanout`` (type-checked: a misspelt one
    is an error), except ``accept_more``: nothing could submit more or seal.
    Cancelled from outside, it returns nothing; to keep the results then, use
    ``open_fanout`` and read ``fan.results`` after the block.
    """
    if "accept_more" in options:
        raise TypeError("run_fanout takes no accept_more: nothing could submit or seal; "
                        "use open_fanout for a fan-out that accepts more")
    requests = list(requests)
    async with open_fanout(endpoint, requests, **options) as fan:
        async for _ in fan.events:
            pass
    return {request.key: fan.results[request.key] for request in requests}
