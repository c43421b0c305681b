"""The scoring runner: every answer through every selected scorer, into the scores file.

``Scoring.add(record)`` scores one results record: a pure scorer at once
(in-process, no I/O), a judge by queueing its request; ``await
scoring.run(endpoint)`` sends the judges' requests through their own
``open_fanout`` on the config's endpoint, each judge at its own concurrency
(``[[scorers]] concurrency``, default 4) and deadlines (its table's
``deadlines`` over its model's over ``[deadlines]``), and ends once
``close()`` was called and every judge has answered.  ``fanout score`` adds
the records of a results file and closes; ``fanout batch --score`` adds each
unit as it finishes, its runner beside the batch's fan-out in one nursery.

Judge streams share the endpoint's one ``EndpointLimit`` with whoever else
sends there (``run(endpoint, limit)``: a batch passes its own; alone, the
runner makes one capped by ``[concurrency] max``): each judge request takes
one of its slots, and its streams count in every stream's ``others_running``.
A judge stream the server cut while others ran (it ended truncated, or with
an empty answer, or completed without usage where the same judge model's streams
carry usage) lowers that limit and is asked again, at the front of the queue, after
a back-off as a retry's (at most ``JUDGE_REDOS`` times): a cut verdict is never
scored.  A judge model that
ends that way with nothing else running does so on its own: its streams stop
counting as cut.

Each score is written as it is known (one line, flushed; ``fsync`` at least
once a second and at the end).  A (unit, scorer) whose latest score in the
file is of the same ``answer_key`` and ``scorer_key`` is *current* and is not
scored again (unless ``rescore``): judge calls resume like batch units.

A judge stream that does not complete is an ``error`` score naming its
outcome and reason, never a pass and never dropped; a verdict the judge's
parser cannot read is an ``error`` too (``JudgeScorer.verdict``).  The judge's
text, usage and cost are kept in the score's ``judge`` object.
"""

from __future__ import annotations

import difflib
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from ..config import JUDGE_CONCURRENCY, Config, ModelConfig
from ..core.events import StreamFinished
from ..core.result import Flag, Outcome, StreamResult, relayed_cut
from ..fanout import Fanout, open_fanout
from ..ratelimit import EndpointLimit
from ..request import Deadlines, Endpoint, RetryPolicy, StreamRequest
from ..store.results import work_key
from ..store.scores import ScoresFile, answer_key, as_read_back, score_record
from .budget import Budget
from .cost import cost_of, usage_record
from .judge import JudgeScorer
from .scorers import BUILTIN, Answer, Score, Scorer

__all__ = ["JUDGE_REDOS", "JUDGE_RETRY", "REFUSED_STATUSES", "Scoring", "Selected", "Tally",
           "UnknownScorer", "as_scored", "select_scorers"]

#: HTTP statuses that say the request itself is refused: a rerun sends it again, unchanged.
REFUSED_STATUSES = frozenset(range(400, 500)) - {408, 409, 429}

#: Judge requests are retried like batch streams: a 429 storm costs waiting, not scores.
JUDGE_RETRY = RetryPolicy(attempts=8, maximum=30.0, retry_after_spread=0.25)
#: How many times one judge request is asked again in one run after the server cut it.
JUDGE_REDOS = 4


class UnknownScorer(ValueError):
    """``--score NAME`` names no scorer; the message is one line with a did-you-mean."""


@attrs.frozen
class Selected:
    """One scorer of a run: its name, the scorer, and for a judge its model, its
    concurrency and its deadlines."""

    name: str
    scorer: Scorer
    judge_model: ModelConfig | None = None
    concurrency: int = JUDGE_CONCURRENCY
    deadlines: Deadlines | None = None

    @property
    def is_judge(self) -> bool:
        return self.judge_model is not None

    @property
    def judge(self) -> JudgeScorer:
        """The scorer, as the judge it is (``TypeError`` for any other)."""
        if not isinstance(self.scorer, JudgeScorer):
            raise TypeError(f"scorer {self.name!r} is not a judge")
        return self.scorer


def select_scorers(config: Config, names: Sequence[str]) -> list[Selected]:
    """The scorers ``names`` ask for: ``[[scorers]]`` entries first, then the builtins
    (``fanout.eval.scorers.BUILTIN``); ``UnknownScorer`` for a name that is neither,
    ``ValueError`` for a name asked twice."""
    chosen: list[Selected] = []
    for name in names:
        if any(s.name == name for s in chosen):
            raise ValueError(f"--score {name!r} is asked for twice")
        entry = config.scorer(name)
        if entry is None:
            builtin = BUILTIN.get(name)
            if builtin is None:
                known = [s.name for s in config.scorers] + sorted(BUILTIN)
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UnknownScorer(f"--score {name!r}: no such scorer{hint} (known: "
                                    f"{', '.join(known)})")
            chosen.append(Selected(name, builtin))
            continue
        if entry.kind != "judge":
            chosen.append(Selected(name, entry.scorer))
            continue
        if not isinstance(entry.scorer, JudgeScorer):  # pragma: no cover (config builds it)
            raise TypeError(f"scorer {name!r} of kind judge is no JudgeScorer")
        model = config.model(entry.scorer.model)
        deadlines = config.deadlines_for(model)
        if entry.deadline_overrides:
            deadlines = attrs.evolve(deadlines, **entry.deadline_overrides)
        chosen.append(Selected(name, entry.scorer, model, entry.concurrency, deadlines))
    return chosen


@attrs.define
class Tally:
    """What one scorer did in a run."""

    statuses: Counter[str] = attrs.Factory(Counter)  # scored / unscored / error
    passed: int = 0
    current: int = 0  # skipped: a current score was in the file
    unwritten: int = 0  # could not be written (the file failed)
    not_judged: int = 0  # a judge request the budget (or an interruption) kept back
    judge_failed: int = 0  # judge streams that did not complete (error scores, asked again)
    #: of those, the ones the server refused as sent (HTTP 4xx but 408, 409, 429): a rerun
    #: sends the same request
    judge_refused: int = 0
    judge_cut: int = 0  # judge streams the server cut while others ran, asked again at once
    judge_cost: float = 0.0
    judge_cost_known: int = 0  # judge streams whose cost is known (judge_cost is theirs)
    judge_cost_unknown: int = 0

    @property
    def new(self) -> int:
        return sum(self.statuses.values())

    def line(self, name: str) -> str:
        """``exact: 6 new (4 scored, 2 passed, 1 unscored, 1 error), 0 current``."""
        scored = self.statuses["scored"]
        parts = [f"{scored} scored", f"{self.passed} passed",
                 f"{self.statuses['unscored']} unscored", f"{self.statuses['error']} error"]
        line = f"{name}: {self.new} new ({', '.join(parts)}), {self.current} current"
        if self.not_judged:
            line += f", {self.not_judged} not judged"
        if self.unwritten:
            line += f", {self.unwritten} not written"
        if self.judge_cut:
            line += f", {self.judge_cut} judge stream{'s' if self.judge_cut != 1 else ''} cut " \
                    "by the server and asked again"
        if self.judge_cost_known and self.judge_cost_unknown:
            line += f"; judge cost ${self.judge_cost:.6f} (+{self.judge_cost_unknown} unknown)"
        elif self.judge_cost_known:
            line += f"; judge cost ${self.judge_cost:.6f}"
        elif self.judge_cost_unknown:  # no cost known at all: `-`, as `fanout report` says
            line += f"; judge cost - ({self.judge_cost_unknown} unknown)"
        return line


@attrs.frozen
class _Job:
    """One judge request waiting to be sent."""

    key: str
    selected: Selected
    record: Mapping[str, Any]
    answer: str  # its answer_key
    request: StreamRequest
    nonce: str  # the judge's verdict line carries it


class Scoring:
    """Score results records into a scores file (see the module docstring).

    ``budget``: judge requests are sent only while they fit in it (a judge
    request that does not fit is not sent: its score is left for a rerun);
    ``on_budget``: called when the scoring changed the budget (a judge stream
    ended, or the budget stopped), so whoever waits for room looks again.
    """

    def __init__(self, config: Config, scorers: Sequence[Selected], writer: ScoresFile, *,
                 rescore: bool = False, budget: Budget | None = None,
                 on_budget: Callable[[], None] | None = None,
                 stamp: Mapping[str, Any] | None = None) -> None:
        self.config = config
        #: The shard, plan and run of the batch scoring (``store.scores.score_record``).
        self.stamp = stamp
        self.scorers = list(scorers)
        self.writer = writer
        self.rescore = rescore
        self.budget = budget
        self.on_budget = on_budget
        self.tallies = {s.name: Tally() for s in scorers}
        self._queue: deque[_Job] = deque()
        self._jobs: dict[str, _Job] = {}
        self._wake = trio.Event() if self.has_judge else None
        self._closed = False
        self._limits = {s.name: trio.CapacityLimiter(s.concurrency)
                        for s in scorers if s.is_judge}
        self._serial = 0
        self._fan: Fanout | None = None
        #: The endpoint's limit the judges share (set by ``run``).
        self.endpoint: EndpointLimit | None = None
        self._sent: dict[str, float] = {}  # judge key -> when its current attempt was sent
        self._redos: Counter[str] = Counter()  # judge key -> times asked again after a cut
        self._redo_due: dict[str, float] = {}  # judge key -> when it may be asked again
        self._rng = random.Random()
        self._redoing = 0  # judge requests waiting for or running their redo
        self._excused: set[str] = set()  # judge models that end cut-like with nothing else
        self._over_budget = False  # a judge request did not fit: no more judging this run
        self.interrupted = False
        self._submitting = trio.CancelScope()  # cancelled by stop(): nothing more is sent
        self.queued = 0  # judge requests queued in this run (sent or not)
        self.judged = 0  # judge requests that ended (answered, failed, cancelled, not sent)
        #: judge requests done: ended with a score (a verdict, or a failure's error score);
        #: never one cancelled by ``stop`` or not sent (what a progress bar counts as done)
        self.answered = 0
        #: judge requests in flight when ``stop`` cancelled them (no score: a rerun asks)
        self.cancelled_in_flight = 0
        #: ``fsync`` the scores file from ``add`` at least once a second (``fanout score``,
        #: whose pure scorers run outside trio); a batch syncs from its own task instead.
        self.sync_inline = False
        self._synced = time.monotonic()

    @property
    def has_judge(self) -> bool:
        return any(s.is_judge for s in self.scorers)

    @property
    def pending(self) -> int:
        """Judge requests queued or running."""
        return len(self._queue) + len(self._jobs)

    @property
    def judges(self) -> int:
        """How many judge scorers this run has (each answer may queue one request each)."""
        return sum(1 for s in self.scorers if s.is_judge)

    # ------------------------------------------------------------------ scoring

    def add(self, record: Mapping[str, Any], prompt: Mapping[str, Any] | None = None) -> None:
        """Score one results record (``prompt``: a prompts-file line whose ``expected``,
        ``category``, ``tags`` and messages override the record's).  ``expected`` is
        taken as the results file reads it back (``as_read_back``): a score made as
        the batch writes the record is the one ``fanout score`` would make."""
        record, prompt = _read_back(record), prompt and _read_back(prompt)
        effective = _effective(record, prompt)
        answer = Answer.from_record(record, prompt)
        akey = answer_key(effective)
        key = work_key(record["id"], record["model"], record["sample"])
        for selected in self.scorers:
            scorer = selected.scorer
            tally = self.tallies[selected.name]
            if not self.rescore and self.writer.is_current(key, selected.name, akey,
                                                           scorer.key):
                tally.current += 1
                continue
            if not selected.is_judge:
                self._write(selected, record, akey, _pure(scorer, answer))
            else:
                early = selected.judge.prescore(answer)
                if early is not None:  # the stream did not complete: nothing to judge
                    self._write(selected, record, akey, early)
                else:
                    self._queue_judge(selected, record, akey, answer)

    def close(self) -> None:
        """No more records: ``run`` ends once the queued judges have answered."""
        self._closed = True
        self.wake()

    def wake(self) -> None:
        """Something changed that the judge submitter waits on (a record queued, the
        budget's room): it looks again."""
        if self._wake is not None:
            self._wake.set()

    def _queue_judge(self, selected: Selected, record: Mapping[str, Any], akey: str,
                     answer: Answer) -> None:
        judge, model = selected.judge, selected.judge_model
        assert model is not None
        try:
            ask = judge.request(answer)
        except ValueError as exc:  # the template needs what this prompt lacks
            self._write(selected, record, akey, Score.error(str(exc)))
            return
        self.queued += 1
        if self.interrupted or self._over_budget:  # stopped: it would never be sent
            self.tallies[selected.name].not_judged += 1
            self.judged += 1
            return
        self._serial += 1
        key = f"judge/{selected.name}/{self._serial}"
        request = StreamRequest(key, model.id, ask.messages, dict(model.params),
                                deadlines=selected.deadlines, api=model.api)
        self._queue.append(_Job(key, selected, record, akey, request, ask.nonce))
        self.wake()

    def _write(self, selected: Selected, record: Mapping[str, Any], akey: str, score: Score,
               judge: Mapping[str, Any] | None = None) -> None:
        scorer = selected.scorer
        line = score_record(record, selected.name, scorer.kind, scorer.key, answer=akey,
                            status=score.status, score=score.value, passed=score.passed,
                            explanation=score.explanation, judge=judge, stamp=self.stamp)
        tally = self.tallies[selected.name]
        tally.statuses[score.status] += 1
        tally.passed += score.passed is True
        if not self.writer.write(line):
            tally.unwritten += 1
        if self.sync_inline and time.monotonic() - self._synced >= 1.0:
            self._synced = time.monotonic()
            self.writer.sync()

    # ------------------------------------------------------------------ judges

    async def run(self, endpoint: Endpoint, limit: EndpointLimit | None = None) -> None:
        """Send the judges' requests until ``close()`` and the last verdict (returns at
        once without a judge).  ``limit``: the endpoint's limit, shared with whoever else
        sends there (a batch's answers); without it, or when it is another endpoint's
        (its ``url``), one of its own, capped by ``[concurrency] max``."""
        if not self.has_judge:
            return
        cap = int(sum(limit.total_tokens for limit in self._limits.values()))
        if limit is None or limit.url not in (None, endpoint.base_url):
            limit = EndpointLimit(self.config.max_concurrency or cap, url=endpoint.base_url)
        self.endpoint = limit
        async with (
            open_fanout(endpoint, accept_more=True, max_concurrency=cap,
                        retry=JUDGE_RETRY, strict=self.config.strict,
                        endpoint_streams=limit.streams) as fan,
            trio.open_nursery() as nursery,
        ):
            self._fan = fan
            nursery.start_soon(self._submit_all, fan)
            async for event in fan.events:
                if isinstance(event, StreamFinished):
                    self._judged(fan, event.result)
                elif self.budget is not None and self.budget.streamed(event):
                    # It would pass the budget: cancelled (an error score naming why).
                    fan.cancel(event.stream, self.budget.reason(event.stream))
            nursery.cancel_scope.cancel()

    def stop(self) -> None:
        """Ctrl-C (or SIGTERM): send no more judge requests and cancel the running ones;
        neither gets a score (both are ``not judged`` in the tally), so a rerun asks
        them."""
        self.interrupted = True
        # The submitter may be waiting for a judge's slot or for the budget: cancelled
        # there, it sends nothing more (a slot freed by a cancelled judge is not used).
        self._submitting.cancel()
        if self._fan is not None:
            self._fan.cancel_all("cancelled: interrupted")
        self.wake()

    async def _submit_all(self, fan: Fanout) -> None:
        with self._submitting:
            await self._submit_until_done(fan)
        self._drop_queue()
        fan.seal()

    def _drop_queue(self) -> None:
        if self.interrupted or self._over_budget:
            for job in self._queue:
                self.tallies[job.selected.name].not_judged += 1
                self.judged += 1
                if self.budget is not None:
                    self.budget.release(job.key)  # reserved, perhaps, and never sent
            self._queue.clear()

    async def _submit_until_done(self, fan: Fanout) -> None:
        assert self._wake is not None
        while True:
            self._drop_queue()
            if not self._queue:
                if (self._closed and not self._jobs) or self.interrupted:
                    return  # (a judge in flight may come back to be asked again)
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            job = self._queue[0]
            due = self._redo_due.get(job.key)
            if due is not None and trio.current_time() < due:
                await trio.sleep_until(due)  # a redo's back-off: it stays queued meanwhile
                continue
            if not await self._fits(job):
                continue
            limit = self._limits[job.selected.name]
            assert self.endpoint is not None
            await limit.acquire_on_behalf_of(job.key)
            try:
                await self.endpoint.limiter.acquire_on_behalf_of(job.key)
            except BaseException:
                limit.release_on_behalf_of(job.key)
                raise  # not sent: still queued, counted as not judged if it ends here
            # Only now: a job cancelled while waiting stays queued.  Not popleft(): a
            # judge cut while this one waited went back to the head of the queue.
            self._queue.remove(job)
            self._jobs[job.key] = job
            self._sent[job.key] = trio.current_time()
            try:
                await fan.submit(job.request)
            except trio.Cancelled:  # while it waited for room: nothing was started
                del self._jobs[job.key]
                del self._sent[job.key]
                self.endpoint.limiter.release_on_behalf_of(job.key)
                limit.release_on_behalf_of(job.key)
                self._queue.appendleft(job)
                raise

    async def _fits(self, job: _Job) -> bool:
        """Whether the budget lets ``job`` be sent now (waits for running streams to
        end while they might make room); without a budget, always."""
        budget = self.budget
        if budget is None:
            return True
        model = job.selected.judge_model
        assert model is not None
        bound = budget.bound(job.key, model.name, job.request.messages, job.request.params,
                             api=model.api, tools=job.request.tools)
        assert bound is not None  # checked before the run: every judge model has a bound
        while not budget.fits(bound):
            if not budget.running:
                budget.stop(bound)
                self._over_budget = True
                if self.on_budget is not None:
                    self.on_budget()
                return False
            self._wake = trio.Event()
            await self._wake.wait()
        budget.send(job.key, bound)
        return True

    def _judged(self, fan: Fanout, result: StreamResult) -> None:
        self.judged += 1
        fan.forget(result.stream)
        job = self._jobs.pop(result.stream)
        self._limits[job.selected.name].release_on_behalf_of(job.key)
        assert self.endpoint is not None
        self.endpoint.limiter.release_on_behalf_of(job.key)
        sent = self._sent.pop(job.key)
        if self._redos[job.key]:
            self._redoing -= 1
        model = job.selected.judge_model
        assert model is not None
        usage = usage_record(result.usage)
        cost, source = cost_of(usage, model.price)
        tally = self.tallies[job.selected.name]
        if cost is None:
            tally.judge_cost_unknown += 1
        else:
            tally.judge_cost += cost
            tally.judge_cost_known += 1
        if self.budget is not None:
            self.budget.observe(job.key, model.name, {"usage": usage, "cost": cost,
                                                       "cost_source": source})
            self.budget.finished(job.key, cost)
        judge = {"model": model.name, "model_id": model.id, "outcome": str(result.outcome),
                 "reason": result.reason, "text": result.text, "usage": usage, "cost": cost,
                 "cost_source": source}
        if result.outcome == Outcome.CANCELLED and self.interrupted:
            # cut by our own stop, not by the judge: no score at all (an error score
            # would count against the answer until a rerun), left for the rerun
            tally.not_judged += 1
            self.cancelled_in_flight += 1
            self.wake()
            return
        if self._is_cut(model.name, result):
            if self._redos[job.key] < JUDGE_REDOS and not self.interrupted:
                # the server cut it for another stream: no verdict from a cut reply;
                # asked again first, at the endpoint's lowered concurrency
                self._redos[job.key] += 1
                self._redo_due[job.key] = trio.current_time() + JUDGE_RETRY.backoff(
                    self._redos[job.key], self._rng)
                self._redoing += 1
                tally.judge_cut += 1
                self.endpoint.cut(sent, trio.current_time(), result.others_running + 1)
                self._queue.appendleft(job)
                if self.on_budget is not None and self.budget is not None:
                    self.on_budget()
                self.wake()
                return
        elif result.outcome == Outcome.COMPLETED:
            if result.usage is not None:
                self.endpoint.usage_seen.add(model.name)
            if not self._redoing:  # a slot back never lands on a redo's head
                self.endpoint.succeeded()
        if result.outcome == Outcome.COMPLETED:
            score = job.selected.judge.verdict(result.text, job.nonce)
        else:
            tally.judge_failed += 1
            tally.judge_refused += result.status in REFUSED_STATUSES
            score = job.selected.judge.failed(str(result.outcome), result.reason)
        self.answered += 1
        self._write(job.selected, job.record, job.answer, score, judge)
        if self.on_budget is not None and self.budget is not None:
            self.on_budget()
        self.wake()

    def _is_cut(self, name: str, result: StreamResult) -> bool:
        """Whether the server cut this judge stream because others ran on the endpoint:
        it ended truncated, or completed with an empty answer, or completed without usage
        where the same model's streams come with usage; and other streams ran.  The same ending with
        nothing else running says the judge model (``name``) does it on its own."""
        assert self.endpoint is not None
        if result.outcome == Outcome.COMPLETED:
            if Flag.EMPTY_ANSWER not in result.flags and (
                    result.usage is not None or name not in self.endpoint.usage_seen):
                return False
        elif result.outcome != Outcome.TRUNCATED and not relayed_cut(result):
            return False
        if name in self._excused:
            return False
        if not result.others_running:
            self._excused.add(name)
            return False
        return True


def _read_back(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    if "expected" not in fields:
        return fields
    return {**fields, "expected": as_read_back(fields["expected"])}


def _effective(record: Mapping[str, Any], prompt: Mapping[str, Any] | None
               ) -> Mapping[str, Any]:
    """The record as scored: a prompt line's ``expected`` over the record's (the
    ``answer_key`` then changes with the expected value it was scored against)."""
    if prompt is None or "expected" not in prompt:
        return record
    return {**record, "expected": prompt["expected"]}


def _pure(scorer: Scorer, answer: Answer) -> Score:
    """A pure scorer's score; an exception from it (a bug, or a python scorer's) is an
    ``error`` score naming it, never a crash of the run."""
    try:
        return scorer.score(answer)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Score.error(f"{type(exc).__name__}: {first}"[:300])


def judges_of(scorers: Iterable[Selected]) -> list[Selected]:
    return [s for s in scorers if s.is_judge]


def as_scored(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a scorer is given of a results record: one the server cut while others ran
    (its redo never came) did not complete, whatever its outcome says."""
    if record.get("cut") is True and record.get("outcome") == "completed":
        return {**record, "outcome": "truncated",
                "reason": "cut by the server while other streams ran (not redone)"}
    return record
