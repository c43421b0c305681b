"""``POST /v1/fanout``: one request's fan-out, its events relayed as records.

Every record is ``fanout.records.event_record`` of one event (the shapes of
``compare --json``), tagged with ``seq`` (its number within its stream, from
0), ``t`` (seconds since the fan-out began) and, when several samples were
asked for, ``sample``.  The order: one ``fanout`` record (the id and the
streams), then every stream's records as they happen, each stream's last one
its ``result``; then one ``summary``; then ``data: [DONE]``.  The relay parses
nothing: the engine did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, final

import trio
from starlette.responses import Response

from .._channel import EventChannel
from ..core.events import CONTENT_EVENTS, Event, StreamFinished
from ..core.result import Outcome, StreamResult
from ..fanout import Fanout, open_fanout
from ..records import event_record, flag_labels, metrics, result_record
from .body import FanoutAsk
from .errors import json_response
from .service import RunningFanout, Service
from .sse import Out

__all__ = ["FIRST_REASON", "LEFT_REASON", "STOP_REASON", "FanoutJob", "drain"]

FIRST_REASON = "cancelled: another stream answered first (mode first)"
LEFT_REASON = "cancelled: the client disconnected"
STOP_REASON = "cancelled by the client (POST /v1/fanout/{id}/cancel)"

#: Events handled between two writes at most: a burst becomes one write, not hundreds.
BATCH = 512


async def drain(events: EventChannel[Event], handle: Callable[[Event], None], out: Out) -> None:
    """Hand every event to ``handle``, flushing ``out`` whenever no event is ready.

    Events ready together go out in one write (under load, one write carries
    many events); whatever is ready when a write is made goes with it, nothing
    waits for more.  After ``out.keepalive`` seconds without a write,
    ``out.idle()`` sends a keep-alive.  Returns when the channel ends.
    """
    keepalive = out.keepalive
    if keepalive is None:
        await _relay(events, handle, out)
        return
    async with trio.open_nursery() as nursery:
        # One timer for the whole response, not one cancel scope per wait for an event:
        # it wakes once a keep-alive period and looks at when the last write was.
        nursery.start_soon(_keep_alive, out, keepalive)
        await _relay(events, handle, out)
        nursery.cancel_scope.cancel()


async def _relay(events: EventChannel[Event], handle: Callable[[Event], None], out: Out) -> None:
    receive_nowait = events.receive_nowait
    flush = out.flush
    while True:
        try:
            event = await events.receive()
        except trio.EndOfChannel:
            await flush()
            return
        handle(event)
        for _ in range(BATCH):
            try:
                event = receive_nowait()
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                await flush()
                return
            handle(event)
        await flush()


async def _keep_alive(out: Out, keepalive: float) -> None:
    """``out.idle()`` whenever ``keepalive`` seconds passed since ``out``'s last write."""
    while True:
        due = out.quiet_since + keepalive
        if trio.current_time() >= due:
            await out.idle()
            if out.quiet_since + keepalive <= trio.current_time():
                # Nothing written: the client is gone, or a write is still under way.
                await trio.sleep(keepalive)
        else:
            await trio.sleep_until(due)


@final
class FanoutJob:
    """Runs one ``FanoutAsk`` through the engine; writes its records (``stream: true``)
    or keeps what the JSON document needs (``stream: false``)."""

    def __init__(self, service: Service, ask: FanoutAsk, running: RunningFanout) -> None:
        self.service = service
        self.ask = ask
        self.running = running
        self.plans = {plan.key: plan for plan in ask.streams}
        self.results: dict[str, StreamResult] = {}
        self.winner: str | None = None
        self.elapsed = 0.0
        self._seq: dict[str, int] = {}
        self._start = 0.0

    def client_left(self) -> None:
        self.running.cancel(LEFT_REASON)

    def close(self) -> None:
        self.service.release(self.running)

    def opening(self) -> dict[str, Any]:
        """The first record: the fan-out's id, mode and streams."""
        return {"type": "fanout", "id": self.running.id, "mode": self.ask.mode,
                "cancel": f"/v1/fanout/{self.running.id}/cancel",
                "streams": [{"stream": plan.key, "model": plan.model.name,
                             "model_id": plan.model.id, "api": plan.model.api,
                             "sample": plan.sample,
                             "content_key": plan.request.content_key(self.service.endpoint)}
                            for plan in self.ask.streams]}

    async def run(self, out: Out) -> None:
        service = self.service
        self._start = trio.current_time()
        if self.ask.stream:
            out.add_event("fanout", self.opening())
            await out.flush()
        fan: Fanout | None = None
        try:
            async with open_fanout(service.endpoint, [p.request for p in self.ask.streams],
                                   **service.fanout_options(p.model for p in self.ask.streams)
                                   ) as fan:
                self.running.attach(fan)
                await drain(fan.events, partial(self._event, out, fan), out)
        finally:
            if fan is not None:
                self.results = dict(fan.results)
                for result in self.results.values():
                    self.running.finished(result)
            self.close()
        self.elapsed = trio.current_time() - self._start
        if self.ask.stream:
            out.add_event("summary", self.summary())
            out.add_done()
            await out.flush()

    def _event(self, out: Out, fan: Fanout, event: Event) -> None:
        key = event.stream
        if isinstance(event, StreamFinished):
            self.running.finished(event.result)
        elif (self.winner is None and self.ask.mode == "first"
              and isinstance(event, CONTENT_EVENTS)):
            self.winner = key
            for other in [*fan.running, *fan.queued]:
                if other != key:
                    fan.cancel(other, FIRST_REASON)
        if not self.ask.stream:
            return
        record = event_record(event)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        record["seq"] = seq
        record["t"] = round(trio.current_time() - self._start, 4)
        sample = self.plans[key].sample
        if sample is not None:
            record["sample"] = sample
        out.add_event(record["type"], record)

    def summary(self) -> dict[str, Any]:
        """The last record: outcomes counted, the winner (mode first), one row a stream."""
        outcomes = Counter(str(r.outcome) for r in self.results.values())
        rows = []
        for plan in self.ask.streams:
            result = self.results.get(plan.key)
            if result is None:  # pragma: no cover - the engine gives every stream a result
                continue
            measured = metrics(result)
            usage = result.usage
            tokens = usage.completion_tokens if usage and usage.completion_tokens is not None \
                else None
            rows.append({
                "stream": plan.key, "model": plan.model.name, "model_id": plan.model.id,
                "sample": plan.sample, "outcome": str(result.outcome), "reason": result.reason,
                "flags": [str(flag) for flag in result.flags],
                "flag_labels": flag_labels(result),
                "finish_reason": result.choices[0].finish_reason if result.choices else None,
                "ttft": measured["ttft"], "tokens_per_second": measured["tokens_per_second"],
                "tokens": tokens if tokens is not None else result.content_events,
                "tokens_estimated": tokens is None,
                "output_chars": measured["output_chars"],
                "e2e_latency": measured["e2e_latency"],
            })
        return {"type": "summary", "id": self.running.id, "mode": self.ask.mode,
                "streams": len(self.ask.streams),
                "completed": outcomes.get(str(Outcome.COMPLETED), 0),
                "outcomes": {str(o): outcomes.get(str(o), 0) for o in Outcome},
                "winner": self.winner, "elapsed": round(self.elapsed, 4), "results": rows}

    def document(self) -> Response:
        """``stream: false``: one JSON document, every result (in request order) and the
        summary."""
        results = []
        for plan in self.ask.streams:
            result = self.results.get(plan.key)
            if result is None:  # pragma: no cover
                continue
            record = {"type": "result", **result_record(result)}
            if plan.sample is not None:
                record["sample"] = plan.sample
            results.append(record)
        return json_response({"object": "fanout", "id": self.running.id,
                              "mode": self.ask.mode, "results": results,
                              "summary": self.summary()})
