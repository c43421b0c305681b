"""The session of one batch run: every unit of it through one fan-out.

An endpoint-wide adaptive cap (halved when the server cuts streams while others
run, grown back on success), one adaptive cap per model (halved on 429s, grown
back on success), one submitter per model so models interleave, each result
written and flushed as it finishes.  A unit the server cut while others ran is
redone in the same run, at the lower concurrency, after a back-off as a retry's
(at most ``MAX_REDOS`` times).  A write that fails (a full disk) stops new submissions; the streams
in flight run on and are tried.  With a budget, a unit is sent only while it
fits (``fanout.eval.budget``); with scoring, each record is scored as it is
written (a judge through its own fan-out, under the same endpoint-wide cap).

With ``handle_signals``, the first SIGINT or SIGTERM stops submitting and
cancels the streams in flight (recorded as cancelled, their partial output
kept); a second one raises ``KeyboardInterrupt``: out at once.
"""

from __future__ import annotations

import random
import signal
from collections import Counter, deque
from collections.abc import Mapping
from functools import partial
from typing import Any

import httpx
import trio

from .._runtime import interrupt_on_signals, open_endpoint
from ..config import Config
from ..core.events import StreamFinished, StreamRetrying
from ..core.result import Flag, Outcome, StreamResult, relayed_cut
from ..eval.budget import Budget
from ..eval.run import Scoring
from ..fanout import Fanout, open_fanout
from ..ratelimit import AdaptiveLimit, EndpointLimit
from ..records import flag_label
from ..request import Endpoint
from ..sharedlimit import SharedSlots
from ..store.results import ResultsFile, state_of
from .options import BATCH_RETRY, MAX_REDOS, BatchOptions
from .plan import Work
from .progress import BatchObserver, BatchProgress
from .record import batch_record
from .summary import Final

__all__ = ["PROGRESS_EVERY", "Session", "is_done", "shown_url"]

#: Seconds between progress reports to the observer.
PROGRESS_EVERY = 0.1


def is_done(state: str | None, accept_empty: bool) -> bool:
    """Whether a unit in ``state`` (``store.results.state_of``) needs no redo."""
    return state == "completed" or (accept_empty and state == "empty")


class Session:
    """One run of a batch's units through one fan-out (see the module docstring).

    ``cap``: the endpoint's concurrency for this run (a shard's share);
    ``model_caps``: each model's (model name -> streams; default: its own, at most
    ``cap``); ``shared``: the limits shared with the other shards, when there are some
    (a stream takes a slot of them too, after its own); ``stamp``: the ``shard``,
    ``plan`` and ``run`` fields of every record.
    """

    def __init__(self, config: Config, options: BatchOptions, todo: list[Work],
                 writer: ResultsFile, *, cap: int, stamp: Mapping[str, str],
                 observer: BatchObserver | None = None, scoring: Scoring | None = None,
                 budget: Budget | None = None, handle_signals: bool = False,
                 model_caps: Mapping[str, int] | None = None,
                 shared: SharedSlots | None = None) -> None:
        self.observer = observer
        self.shared = shared
        self.shared_lost: str | None = None  # why the shared limit stopped answering
        if shared is not None:
            shared.on_lost = self._shared_lost
        self.stamp = stamp
        self.handle_signals = handle_signals
        self.terminated = False  # SIGTERM, not SIGINT
        self._started: float | None = None
        self.scoring = scoring
        self.budget = budget
        self.over_budget: set[str] = set()  # models whose next unit did not fit
        self._budget_changed = trio.Event()
        if scoring is not None:
            scoring.on_budget = self._budget_moved
        self.config = config
        self.options = options
        self.todo = todo
        self.writer = writer
        self.counts: Counter[str] = Counter()  # final states of this run's units
        self.finals: dict[str, Final] = {}  # key -> how it ended, in this run
        self.ran_per_model: Counter[str] = Counter()  # units that ended, per model
        self.interrupted = False
        self.stopped = False  # the results file cannot be written: nothing new is sent
        self._submitting = trio.CancelScope()
        self.by_key = {unit.key: unit for unit in todo}
        global_cap = cap
        self.global_cap = global_cap
        self.endpoint = EndpointLimit(global_cap)
        self.limits: dict[str, AdaptiveLimit] = {}
        self.queues: dict[str, deque[Work]] = {}
        for unit in todo:
            model = unit.model
            if model.name not in self.limits:
                cap = (model_caps or {}).get(model.name) or (
                    options.per_model_concurrency or model.concurrency
                    or config.per_model_concurrency or global_cap)
                self.limits[model.name] = AdaptiveLimit(min(cap, global_cap))
                self.queues[model.name] = deque()
            self.queues[model.name].append(unit)
        # What redos need: units taken from a queue and not finished (a redo may come
        # back from any of them), and each model's submitter, to wake.
        self._pending = 0
        self._wake: dict[str, trio.Event] = {}
        self._submitted: dict[str, float] = {}  # key -> when its current attempt was sent
        self.redos: Counter[str] = Counter()  # key -> times redone after a cut, this run
        # key -> when its redo may be sent: redos back off as retries do (a dead server
        # is not asked again at once, for every cut unit at the same moment)
        self.redo_due: dict[str, float] = {}
        self._rng = random.Random()
        self.redone = 0  # records written for streams that were cut and redone
        self._redoing = 0  # units waiting for or running their redo
        self.cut_by: Counter[str] = Counter()  # model -> its cuts that were redone
        self.cut_level: int | None = None  # fewest streams running when one was cut
        self.still_cut = 0  # units cut again after MAX_REDOS redos
        self.relayed = 0  # cuts that came as a normal end ("stop"), a relay's doing
        self.excused: dict[str, int] = {}  # model -> its cuts, found its own (it fails alone)
        # A relay that drops usage on a cut: see _is_cut.  Per model: a model that sends
        # no usage says nothing about another's missing usage.
        # The models with a completed stream with usage: self.endpoint.usage_seen (the
        # judges' too).
        self._usage_optional: set[str] = set()  # ... with one without usage, run alone
        # key -> unit, sent, running, record: not scored until known not to be cut
        self._suspects: dict[str, tuple[Work, float, int, dict[str, Any]]] = {}

    async def run(self, endpoint: Endpoint | None) -> None:
        async with (
            open_endpoint(endpoint) as resolved,
            open_fanout(resolved, accept_more=True, max_concurrency=self.global_cap,
                        retry=BATCH_RETRY, strict=self.config.strict,
                        endpoint_streams=self.endpoint.streams) as fan,
            trio.open_nursery() as nursery,
        ):
            self.endpoint.url = resolved.base_url
            if self.shared is not None:
                await nursery.start(self.shared.run)
            if self.handle_signals:
                nursery.start_soon(interrupt_on_signals, partial(self._signalled, fan),
                                   (signal.SIGINT, signal.SIGTERM))
            nursery.start_soon(self._fsync_every_second)
            nursery.start_soon(self._progress)
            nursery.start_soon(self._submit_all, fan, self._submitting)
            judged = trio.Event()
            if self.scoring is not None:
                nursery.start_soon(self._judge, self.scoring, resolved, judged)
            await self._consume(fan)
            self._report()  # the last frame shows the end, not the frame before it
            if self.scoring is not None:
                self._score_suspects()  # never known to be cut: they stand
                self.scoring.close()
                await judged.wait()
                self._report()  # and the judges' end
            if self.observer is not None:
                self.observer.finished(self.snapshot())
            nursery.cancel_scope.cancel()

    async def _judge(self, scoring: Scoring, endpoint: Endpoint, judged: trio.Event) -> None:
        try:
            await scoring.run(endpoint, self.endpoint)  # one limit for answers and judges
        finally:
            judged.set()

    async def _submit_all(self, fan: Fanout, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for name in self.queues:
                    nursery.start_soon(self._submit_model, fan, name)
        fan.seal()

    async def _submit_model(self, fan: Fanout, name: str) -> None:
        """Submit the model's units in order, and the redos put back at the front,
        until no queue holds a unit and none is pending (any could bring a redo back)."""
        queue, limit = self.queues[name], self.limits[name]
        while True:
            if not queue:
                if not self._pending and not any(
                        q for model, q in self.queues.items() if model not in self.over_budget):
                    return
                self._wake[name] = wake = trio.Event()
                await wake.wait()
                continue
            unit = queue.popleft()
            if self.budget is not None:
                self._pending += 1  # it may come back: the other submitters wait for it
                try:
                    fits = await self._fits(unit)
                finally:
                    self._pending -= 1
                if not fits:
                    # Not sent, nor is the rest of this model's queue: counted as such.
                    # The other models go on while their units fit.
                    queue.appendleft(unit)
                    self.over_budget.add(name)
                    self._wake_all()
                    return
            self._pending += 1
            try:
                due = self.redo_due.pop(unit.key, None)
                if due is not None:
                    try:
                        await trio.sleep_until(due)
                    except BaseException:
                        self.redo_due[unit.key] = due
                        raise
                await limit.wait_if_paused()
                await limit.limiter.acquire_on_behalf_of(unit.key)
                try:
                    await self.endpoint.limiter.acquire_on_behalf_of(unit.key)
                    try:
                        if self.shared is not None:
                            await self.shared.acquire(name, unit.key)
                    except BaseException:
                        self.endpoint.limiter.release_on_behalf_of(unit.key)
                        raise
                except BaseException:
                    limit.limiter.release_on_behalf_of(unit.key)
                    raise
            except BaseException:
                self._pending -= 1
                queue.appendleft(unit)
                if self.budget is not None:
                    self.budget.release(unit.key)  # reserved, and not sent
                raise
            self._submitted[unit.key] = trio.current_time()
            await fan.submit(unit.request(self.config))

    async def _fits(self, unit: Work) -> bool:
        """Whether the budget lets ``unit`` be sent (reserving its bound): while it does
        not, and streams run that may end below their bounds, wait for them; once none
        runs and it still does not fit, ``False``: its model sends no more (the other
        models go on while theirs fit)."""
        budget = self.budget
        assert budget is not None
        request = unit.request(self.config)
        while True:
            bound = budget.bound(unit.prompt.id, unit.model.name, request.messages,
                                 request.params, api=unit.model.api, tools=request.tools)
            assert bound is not None  # checked before the run: every model has a bound
            if budget.fits(bound):
                budget.send(unit.key, bound)
                return True
            if not budget.running:
                budget.stop(bound)
                self._budget_changed.set()
                if self.scoring is not None:
                    self.scoring.wake()
                self._wake_all()
                return False
            if self._budget_changed.is_set():  # one event all waiting submitters share
                self._budget_changed = trio.Event()
            await self._budget_changed.wait()

    def _wake_all(self) -> None:
        for model in list(self._wake):
            wake = self._wake.pop(model, None)
            if wake is not None:
                wake.set()

    def budget_changed(self) -> None:
        """A stream counted by the budget ended: who waits for room looks again."""
        self._budget_moved()
        if self.scoring is not None:
            self.scoring.wake()

    def _budget_moved(self) -> None:
        self._budget_changed.set()
        self._wake_all()

    def _wake_submitters(self, name: str) -> None:
        # The model's own (a redo, or one less pending); all of them once nothing is
        # pending, so each sees whether it is finished.
        for model in list(self._wake) if not self._pending else [name]:
            wake = self._wake.pop(model, None)
            if wake is not None:
                wake.set()

    async def _consume(self, fan: Fanout) -> None:
        async for event in fan.events:
            if isinstance(event, StreamRetrying):
                if event.error.status == 429:
                    unit = self.by_key[event.stream]
                    if self.shared is not None:  # it pauses and lowers every shard's
                        self.shared.rate_limited(unit.model.name, event.wait)
                    else:
                        self.limits[unit.model.name].rate_limited_now(trio.current_time(),
                                                                      event.wait)
            elif isinstance(event, StreamFinished):
                self._finished(fan, event.result)
            elif self.budget is not None and self.budget.streamed(event):
                # It would pass the budget: cancelled, its partial output kept.
                fan.cancel(event.stream, self.budget.reason(event.stream))

    def _finished(self, fan: Fanout, result: StreamResult) -> None:
        unit = self.by_key[result.stream]
        name = unit.model.name
        fan.forget(result.stream)
        self.endpoint.limiter.release_on_behalf_of(unit.key)
        limit = self.limits[name]
        limit.limiter.release_on_behalf_of(unit.key)
        if self.shared is not None:
            self.shared.release(unit.key)
        self._pending -= 1
        redo = self.redos[unit.key]
        if redo:
            self._redoing -= 1
        cut = self._is_cut(unit, result)
        again = cut and redo < MAX_REDOS and not self.interrupted and not self.stopped
        record = batch_record(unit, result, cut=again, redo=redo, run=self.stamp)
        if not self.writer.write(record):
            self._stop_sending()
        if self.budget is not None:
            self.budget.observe(unit.prompt.id, name, record)
            self.budget.finished(unit.key, record["cost"])
            self.budget_changed()
        sent = self._submitted.pop(unit.key)
        # A suspect is judged once it is known not to be cut (a cut answer is redone first).
        suspect = not again and self._suspect(unit, result, sent)
        if self.scoring is not None and not again and not suspect:
            self.scoring.add(record)
        if again:
            self.relayed += result.outcome == Outcome.COMPLETED
            self._cut(unit, sent, result.others_running + 1)
        else:
            del self.by_key[unit.key]
            state = state_of(record)
            self.counts[state] += 1
            self.ran_per_model[name] += 1
            self.still_cut += cut
            reason = result.reason
            if reason is None and Flag.UNFINISHED_CHOICE in result.flags:
                reason = f"{flag_label(Flag.UNFINISHED_CHOICE, result)} (no finish_reason)"
            self.finals[unit.key] = Final(name, state, result.status, reason)
            if is_done(state, self.options.accept_empty):
                limit.succeeded()
                if self.shared is not None:
                    self.shared.succeeded(name)
                if not self._redoing:  # a slot back never lands on a redo's head
                    self.endpoint.succeeded()
            elif result.status == 429:  # retries ran out on a 429: that is a signal too
                if self.shared is not None:
                    self.shared.rate_limited(name, None)
                else:
                    limit.rate_limited_now(trio.current_time(), None)
            if suspect:
                self._suspects[unit.key] = (unit, sent, result.others_running + 1, record)
        if result.outcome == Outcome.COMPLETED and result.usage is not None \
                and name not in self.endpoint.usage_seen:
            self.endpoint.usage_seen.add(name)
            self._redo_suspects(name)
        self._wake_submitters(name)

    def _is_cut(self, unit: Work, result: StreamResult) -> bool:
        """Whether the server cut this stream because others ran: it ended truncated (or
        with a relay's in-band report of the cut after some output: ``relayed_cut``), or
        completed with an empty answer or a choice unfinished, or completed without usage
        where the same model's streams come with usage (a relay that drops usage on a
        cut); and other streams were running.

        Missing usage alone is never evidence: a model that sends none, beside one that
        does, is not cut.  The same ending with nothing else running says it happens on
        its own: a model that truncates (or answers empty) alone stops counting as cut
        (``excused``), and a model that completes a stream without usage alone stops the
        usage rule for itself.
        """
        name = unit.model.name
        others = result.others_running
        if result.outcome == Outcome.COMPLETED:
            if Flag.EMPTY_ANSWER in result.flags and not self.options.accept_empty:
                return self._looks_cut(name, others)
            if Flag.UNFINISHED_CHOICE in result.flags:  # one choice cut: as a truncation
                return self._looks_cut(name, others)
            if result.usage is None and name not in self._usage_optional:
                if not others:
                    self._usage_optional.add(name)
                    self._score_suspects(name)
                return bool(others) and name in self.endpoint.usage_seen
            return False
        return (result.outcome == Outcome.TRUNCATED or relayed_cut(result)) and \
            self._looks_cut(name, others)

    def _looks_cut(self, name: str, others: int) -> bool:
        if name in self.excused:
            return False
        if others:
            return True
        # The model ended that way alone: its earlier "cuts" were its own doing.
        self.excused[name] = self.cut_by.pop(name, 0)
        if self.excused[name] and not self.cut_by:  # nothing else pointed at the server
            self.endpoint.reset()
        return False

    def _score_suspects(self, name: str | None = None) -> None:
        """The suspects (of model ``name``; all of them without one) were not cut after
        all: their records are scored."""
        for key, (unit, _, _, record) in list(self._suspects.items()):
            if name is None or unit.model.name == name:
                if self.scoring is not None:
                    self.scoring.add(record)
                del self._suspects[key]

    def _suspect(self, unit: Work, result: StreamResult, sent: float) -> bool:
        # Completed without usage while others ran, before its model showed it sends
        # usage: a cut if it turns out to (then it is redone, see _redo_suspects).
        name = unit.model.name
        return (result.outcome == Outcome.COMPLETED and result.usage is None
                and result.others_running > 0 and name not in self.endpoint.usage_seen
                and name not in self._usage_optional and self.redos[unit.key] < MAX_REDOS
                and not self.interrupted and not self.stopped)

    def _redo_suspects(self, name: str) -> None:
        """Usage came on model ``name``: its streams that completed without it while
        others ran were cut after all; they are redone (their records stay; the redo's
        record follows)."""
        for key, (unit, sent, running, _) in list(self._suspects.items()):
            if unit.model.name != name:
                continue
            del self._suspects[key]
            final = self.finals.pop(key)
            self.counts[final.state] -= 1
            self.ran_per_model[final.model] -= 1
            self.by_key[key] = unit
            self.relayed += 1
            self._cut(unit, sent, running)
            self._wake_submitters(unit.model.name)

    def _cut(self, unit: Work, sent: float, running: int) -> None:
        """Redo a unit the server cut (sent at ``sent``, cut while ``running`` streams ran,
        itself included), at the front of its model's queue, once its back-off has passed
        (``BATCH_RETRY``'s, as a retry's: the n-th redo waits up to ``initial * 2 ** (n - 1)``
        seconds, with jitter); tell the endpoint's limit."""
        self.cut_level = running if self.cut_level is None else min(self.cut_level, running)
        self.endpoint.cut(sent, trio.current_time(), running)
        self.cut_by[unit.model.name] += 1
        self.redos[unit.key] += 1
        self.redo_due[unit.key] = trio.current_time() + BATCH_RETRY.backoff(
            self.redos[unit.key], self._rng)
        self.redone += 1
        self._redoing += 1
        self.queues[unit.model.name].appendleft(unit)

    def cut_lines(self) -> list[str]:
        """What the end of the run says about cuts: what happened, what to set."""
        lines = []
        cuts = sum(self.cut_by.values())
        judges = sum(t.judge_cut for t in self.scoring.tallies.values()) if self.scoring else 0
        if cuts or judges:
            endpoint = self.endpoint
            lowest = endpoint.lowest
            what = " and ".join(
                f"{n} {noun}{'s' if n != 1 else ''}" for n, noun in
                ((cuts, "answer"), (judges, "judge request")) if n)
            where = f" on {shown_url(endpoint.url)}" if endpoint.url else ""
            lines.append(
                f"the server cut {what} while up to {endpoint.busiest} streams ran at once"
                f"{where}; {'they were' if cuts + judges != 1 else 'it was'} redone at lower "
                f"concurrency ({endpoint.maximum} → {lowest}); set [concurrency] max = "
                f"{lowest} for this endpoint" + (f" (or --concurrency {lowest})"
                                                 if self.options.concurrency else ""))
            if self.relayed:
                lines.append(
                    f"{self.relayed} of the cuts came as a normal end: a relay in front of the "
                    "server turns cuts into finished answers, and one that also sends usage "
                    "makes them impossible to tell from real ones; a one-slot server behind a "
                    "relay needs [concurrency] max = 1")
            if self.still_cut:
                lines.append(f"{self.still_cut} stream{'s were' if self.still_cut != 1 else ' was'}"
                             f" still cut after {MAX_REDOS} redos")
        for name, count in self.excused.items():
            if count:
                lines.append(f"{name}: {count} of its streams that ended while others "
                             "ran were redone; it ends that way alone too, so it was not the "
                             "server cutting them" + (
                                 f"; concurrency is back to {self.endpoint.limit}"
                                 if not cuts else ""))
        return lines

    def _signalled(self, fan: Fanout, signum: int) -> None:
        self.terminated = signum == signal.SIGTERM
        self._interrupt(fan)

    def _interrupt(self, fan: Fanout) -> None:
        # Ctrl-C: stop submitting, cancel what runs (recorded as cancelled with its
        # partial output); the summary follows.
        self.interrupted = True
        self._submitting.cancel()
        fan.cancel_all()
        if self.scoring is not None:
            self.scoring.stop()

    def _shared_lost(self, reason: str) -> None:
        # The shared limit stopped answering: what is sent from now on would take no
        # slot of it.  The streams in flight run on and are recorded.
        self.shared_lost = reason
        self._stop_sending()

    def _stop_sending(self) -> None:
        # The results file cannot be written (a full disk): what is sent from now on
        # could not be kept.  The streams in flight run on; each is tried.
        self.stopped = True
        self._submitting.cancel()

    async def _fsync_every_second(self) -> None:
        while True:
            await trio.sleep(1)
            await trio.to_thread.run_sync(self.writer.sync)
            if self.scoring is not None:
                await trio.to_thread.run_sync(self.scoring.writer.sync)
            if self.writer.error is not None and not self.stopped:
                self._stop_sending()

    def _done_of(self) -> tuple[int, int]:
        """Requests ended, of how many: the units, and the judges' requests (those queued,
        and one per judge for each unit still to end)."""
        done = sum(self.counts.values())
        total = len(self.todo)
        scoring = self.scoring
        if scoring is not None and scoring.judges:
            total += scoring.queued + max(0, total - done) * scoring.judges
            done += scoring.answered  # judged, not cancelled by Ctrl-C nor left unsent
        return done, total

    def snapshot(self) -> BatchProgress:
        """Where the run is, for the observer."""
        done, total = self._done_of()
        scoring = self.scoring
        started = self._started
        return BatchProgress(
            done=done, total=total, counts=dict(self.counts), redone=self.redone,
            judged=scoring.answered if scoring is not None and scoring.judges else None,
            elapsed=trio.current_time() - started if started is not None else 0.0)

    async def _progress(self) -> None:
        self._started = trio.current_time()
        if self.observer is None:
            return
        self.observer.started(self.snapshot())
        while True:
            await trio.sleep(PROGRESS_EVERY)
            self._report()

    def _report(self) -> None:
        if self.observer is not None and self._started is not None:
            self.observer.progress(self.snapshot())


def shown_url(url: str) -> str:
    """A base URL as a summary names it: no user info, no query."""
    try:
        return str(httpx.URL(url).copy_with(userinfo=b"", query=None))
    except (httpx.InvalidURL, ValueError):
        return "the endpoint"
