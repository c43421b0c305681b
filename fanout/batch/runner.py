"""Running a batch: ``await run(options)`` inside a trio app, ``run_sync(options)`` in
a script, a worker or a Ray task.  Both return a ``BatchSummary``.

Before anything is sent, the options, the config, the prompts (every one must
be sendable) and the results file (``store.results.ResultsFile``: not the
prompts file, a regular file, fanout's own, locked for the run) are checked:
a problem raises ``fanout.ConfigError`` (a line per problem; nothing was
sent).  A results (or scores) file locked by another run, or a disk full
before the first write, is not an error of the input: the summary says so,
with ``ExitCode.TEMPFAIL`` and every unit left.

The work is every (prompt id, model, sample) of this shard
(``plan.plan_work``); what the results file already holds as done for the
same request is skipped, the rest runs in one ``session.Session``.  A shard
``i/N`` takes ``max(1, C // N)`` of the endpoint's concurrency ``C``
(``BatchOptions.concurrency``, else the config's ``[concurrency] max``, else
32), so that N shards on one endpoint ask no more of it than one process
would; ``shard_concurrency`` overrides the share.  A model's own concurrency
(``--per-model-concurrency``, its ``[[models]] concurrency``, ``[concurrency]
per_model``) is shared the same way, ``max(1, cap // N)``.  The static share
assumes the N shards all run at once; with a shared limit
(``BatchOptions.shared_limit``, else ``FANOUT_SHARED_LIMIT``, else ``[concurrency]
shared``; or ``run(..., shared_limits=...)``) nothing is divided: every shard takes
slots of the whole endpoint's and each model's concurrency, and the 429 back-off,
from it (``fanout.sharedlimit``), in the space of the plan on this endpoint and key
(``shared_space``).  Every record carries the
shard (``"0/1"`` unsharded), the plan's fingerprint and the run id.

Without a judge, a scorer or a budget nothing here but the session does I/O,
and nothing at all prints: lines worth telling go to the observer
(``BatchObserver.note``) and into the summary.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs
import trio

from .._exceptions import ConfigError
from .._runtime import only
from ..config import Config, ModelConfig, load_config
from ..eval.budget import Budget, why_unbounded
from ..eval.run import Scoring, Selected, UnknownScorer, as_scored, select_scorers
from ..request import Endpoint
from ..sharedlimit import (
    SharedLimits,
    SharedLimitUnavailable,
    SharedSlots,
    open_shared_limits,
    shown_spec,
    spec_problem,
)
from ..store.prompts import Prompt, PromptFileError, load_prompts
from ..store.results import RecordReader, ResultsFile, ResultsFileError, latest_records, shard_of
from ..store.scores import ScoresFile, scores_path
from .options import DEFAULT_CONCURRENCY, FINAL_STATUSES, BatchOptions, ExitCode
from .plan import Work, encodes, plan_fingerprint, plan_work, unsendable, why_not
from .progress import BatchObserver
from .record import stamp
from .session import Session, is_done
from .summary import (
    BatchSummary,
    Evidence,
    Failure,
    Final,
    exit_code,
    file_evidence,
    not_completed,
)

__all__ = ["SHARED_LIMIT_ENV", "model_caps", "run", "run_sync", "shard_concurrency",
           "shared_space"]

#: The environment variable naming a shared limit (under ``--shared-limit``, over the
#: config's ``[concurrency] shared``).
SHARED_LIMIT_ENV = "FANOUT_SHARED_LIMIT"


async def run(options: BatchOptions, *, observer: BatchObserver | None = None,
              environ: Mapping[str, str] | None = None,
              handle_signals: bool = False,
              shared_limits: SharedLimits | None = None) -> BatchSummary:
    """Run a batch inside the calling trio program; returns its summary.

    ``environ``: where the endpoint's key is read (default ``os.environ``).
    ``handle_signals``: the first SIGINT or SIGTERM stops the run (the streams in
    flight are recorded as cancelled; ``ExitCode.INTERRUPTED`` or ``TERMINATED``), a
    second raises ``KeyboardInterrupt``; leave it off when the program handles its
    signals.  Cancelling the call cancels the streams in flight: what was written
    stays, and the next run resumes it.  Raises ``fanout.ConfigError`` for bad
    options, config or input (nothing was sent).  ``shared_limits``: the limits this
    run shares with the other shards (a ``fanout.sharedlimit.SharedLimits``: a
    ``LocalLimits`` for shards run side by side in one trio program), over any
    ``shared_limit`` the options, environment or config name.
    """
    prepared = _prepare(options, environ, observer, handle_signals, shared_limits)
    if isinstance(prepared, BatchSummary):
        return prepared
    try:
        if prepared.needs_run:
            await prepared.session.run(prepared.endpoint)
        return prepared.finish()
    finally:
        prepared.close()


def run_sync(options: BatchOptions, *, observer: BatchObserver | None = None,
             environ: Mapping[str, str] | None = None,
             handle_signals: bool | None = None,
             shared_limits: SharedLimits | None = None) -> BatchSummary:
    """Run a batch in a process (or thread) with no trio loop running: blocks until it
    ends and returns its summary.  As ``run``; ``handle_signals`` defaults to true in
    the main thread (a second Ctrl-C then raises ``KeyboardInterrupt``)."""
    if handle_signals is None:
        handle_signals = threading.current_thread() is threading.main_thread()
    prepared = _prepare(options, environ, observer, handle_signals, shared_limits)
    if isinstance(prepared, BatchSummary):
        return prepared
    try:
        if prepared.needs_run:
            try:
                trio.run(prepared.session.run, prepared.endpoint)
            except BaseException as exc:
                if only(exc, KeyboardInterrupt):
                    raise KeyboardInterrupt from None  # not a group: what a caller catches
                raise
        return prepared.finish()
    finally:
        prepared.close()


def shard_concurrency(options: BatchOptions, config: Config, *, shared: bool = False) -> int:
    """The endpoint concurrency this run may use: the endpoint's (``concurrency``, else
    the config's ``[concurrency] max``, else 32), and for shard ``i/N`` its share,
    ``max(1, C // N)``, unless ``shard_concurrency`` names it.  With a ``shared``
    limit, no share: the shared limit divides the endpoint among the shards that run."""
    endpoint = options.concurrency or config.max_concurrency or DEFAULT_CONCURRENCY
    if options.shard_concurrency is not None:
        return options.shard_concurrency
    count = options.shard[1] if options.shard is not None and not shared else 1
    return max(1, endpoint // count)


def model_caps(options: BatchOptions, config: Config, models: Sequence[ModelConfig], *,
               shared: bool = False) -> dict[str, int]:
    """Each model's concurrency for this run (model name -> streams): its own
    (``per_model_concurrency``, else its ``[[models]] concurrency``, else the config's
    ``[concurrency] per_model``), and for shard ``i/N`` its share, ``max(1, cap // N)``
    (unless ``shared``), at most the run's endpoint concurrency; a model without one
    has the run's endpoint concurrency."""
    endpoint = shard_concurrency(options, config, shared=shared)
    count = options.shard[1] if options.shard is not None and not shared else 1
    caps = {}
    for model in models:
        own = (options.per_model_concurrency or model.concurrency
               or config.per_model_concurrency)
        caps[model.name] = min(endpoint, max(1, own // count)) if own else endpoint
    return caps


def shared_space(plan: str, endpoint: Endpoint | None) -> str:
    """Where the shards of ``plan`` on ``endpoint`` share their limits: the plan's
    fingerprint and 16 hex digits of a SHA-256 of the base URL and of the key's own
    SHA-256 (never the key)."""
    if endpoint is None:
        return f"{plan}.embedded"
    key = hashlib.sha256((endpoint.api_key or "").encode()).hexdigest()
    identity = hashlib.sha256(f"{endpoint.base_url}\n{key}".encode()).hexdigest()[:16]
    return f"{plan}.{identity}"


def _shared_spec(options: BatchOptions, config: Config,
                 environ: Mapping[str, str] | None) -> tuple[str, str] | None:
    """The shared limit asked for, and where: ``--shared-limit``, else the environment's
    ``FANOUT_SHARED_LIMIT``, else ``[concurrency] shared``; ``None`` for none (or
    ``off``)."""
    env = os.environ if environ is None else environ
    for where, value in (("--shared-limit", options.shared_limit),
                         (SHARED_LIMIT_ENV, env.get(SHARED_LIMIT_ENV)),
                         (f"{config.source}: [concurrency] shared", config.shared_limit)):
        if value:
            problem = spec_problem(value)
            if problem is not None:
                raise _fail(f"{where} {shown_spec(value)}: {problem}; nothing was sent")
            return None if value == "off" else (value, where)
    return None


def _fail(message: str) -> ConfigError:
    return ConfigError(message)


def _prepare(options: BatchOptions, environ: Mapping[str, str] | None,
             observer: BatchObserver | None, handle_signals: bool,
             shared_limits: SharedLimits | None = None) -> _Prepared | BatchSummary:
    """Check everything, open the files, plan: the run ready to start (or, when the
    results file is locked by another run, or the disk is full, the summary of a run
    that sent nothing and left everything)."""
    options.check()
    config = load_config(options.config)
    models = config.select(options.models, default=config.batch)
    endpoint = config.endpoint(dict(environ) if environ is not None else None)
    try:
        selected = select_scorers(config, options.scorers)
    except (UnknownScorer, ValueError, ConfigError) as exc:
        raise _fail(f"{exc}; nothing was sent") from None
    for model in models:  # TOML has nan and inf; JSON does not
        if not encodes(dict(model.params)):
            raise _fail(f"model {model.name!r}: its params cannot be sent "
                        f"({why_not(dict(model.params))}); nothing was sent")
    try:
        prompts = load_prompts(options.prompts)
        problems = unsendable(prompts, models, options.prompts)
        if problems:
            raise PromptFileError(options.prompts, problems, len(problems))
    except PromptFileError as exc:
        lines = list(exc.problems) + ([f"{exc}; nothing was sent"] if exc.total else [])
        raise ConfigError("\n".join(lines)) from None
    try:
        source = os.stat(options.prompts)
    except OSError as exc:  # read a moment ago
        raise _fail(f"{options.prompts}: cannot read: {exc.strerror or exc}") from None

    shard = options.shard or (0, 1)
    whole = plan_work(prompts, models, options.samples, config)
    work = [unit for unit in whole if shard[1] == 1 or shard_of(unit.key, shard[1]) == shard[0]]
    fingerprint = plan_fingerprint(whole, shard[1])
    run_id = options.run_id or fingerprint
    fields = stamp(shard, fingerprint, run_id)

    def left_for_later(exc: ResultsFileError | str, flag: str) -> BatchSummary:
        line = f"{flag} {exc}; nothing was sent"
        why = exc if isinstance(exc, str) else exc.why
        failures = tuple(Failure(u.key, u.model.name, "unsent", None, why) for u in work)
        return BatchSummary(exit_code=ExitCode.TEMPFAIL, total=len(work), done=0,
                            counts={"unsent": len(work)}, ran={}, redone=0,
                            failures=failures, plan=fingerprint, run=run_id, shard=shard,
                            results=options.output, closing=(line,), started=False)

    owned = shared_limits is None  # opened here, closed here
    if shared_limits is None:
        spec = _shared_spec(options, config, environ)
        if spec is not None:
            try:
                shared_limits = open_shared_limits(spec[0])
            except (ValueError, ImportError) as exc:
                raise _fail(f"{spec[1]}: {exc}; nothing was sent") from None
    if shared_limits is not None:
        try:
            shared_limits.check()
        except SharedLimitUnavailable as exc:
            if owned:
                shared_limits.close()
            return left_for_later(f"cannot be reached: {exc}", "the shared limit")
    try:
        writer = ResultsFile(options.output, not_same_as=(f"the prompts file {options.prompts}",
                                                          source))
    except ResultsFileError as exc:
        if shared_limits is not None and owned:
            shared_limits.close()
        if exc.temporary:
            return left_for_later(exc, "-o")
        raise _fail(f"-o {exc}; nothing was sent") from None
    scores: ScoresFile | None = None
    try:
        budget = None
        if options.budget is not None:
            budget = _budget(options, models, selected, writer)
            unbounded = _unbounded(models, prompts, selected)
            if unbounded is not None:
                raise _fail(f"--budget: {unbounded}; nothing was sent")
        if selected:
            target = options.scores or scores_path(options.output)
            try:
                scores = ScoresFile(target, not_same_as=(f"the results file {options.output}",
                                                         os.stat(options.output)))
            except ResultsFileError as exc:
                if exc.temporary:
                    writer.close()
                    if shared_limits is not None and owned:
                        shared_limits.close()
                    return left_for_later(exc, "--scores")
                raise _fail(f"--scores {exc}; nothing was sent") from None
            except OSError as exc:
                raise _fail(f"--scores {exc}; nothing was sent") from None
        return _Prepared(options, config, models, endpoint, prompts, work, writer, scores,
                         selected, budget, fields, observer, handle_signals,
                         shared_limits, owned)
    except BaseException:
        if shared_limits is not None and owned:
            shared_limits.close()
        writer.close()
        if scores is not None:
            scores.close()
        raise


def _budget(options: BatchOptions, models: Sequence[ModelConfig], selected: list[Selected],
            writer: ResultsFile) -> Budget:
    """The run's budget, taught the token counts and reported costs of the file's records."""
    assert options.budget is not None
    prices = {m.name: m.price for m in models}
    for item in selected:
        if item.judge_model is not None:
            prices[item.judge_model.name] = item.judge_model.price
    max_output = {m.name: m.max_output_tokens for m in models}
    for item in selected:
        if item.judge_model is not None:
            max_output[item.judge_model.name] = item.judge_model.max_output_tokens
    budget = Budget(options.budget, prices, max_output)
    try:
        with open(options.output, "rb") as file:
            for record in RecordReader(file):
                budget.observe(record["id"], record["model"], record)
    except OSError:
        pass  # read a moment ago; without it the bounds are only less tight
    return budget


def _unbounded(models: Sequence[ModelConfig], prompts: Sequence[Prompt],
               selected: Sequence[Selected]) -> str | None:
    """Why some stream of this run (an answer, or a judge's) has no bound that holds, in
    one line naming the model and the keys that would bound it; ``None`` if all have."""
    for model in models:
        for params in [{**model.params, **prompt.params} for prompt in prompts] or [
                dict(model.params)]:
            why = why_unbounded(model.name, model.price, params, api=model.api,
                                max_output_tokens=model.max_output_tokens)
            if why is not None:
                return why
    for item in selected:
        judge = item.judge_model
        if judge is not None:
            why = why_unbounded(judge.name, judge.price, judge.params, api=judge.api,
                                max_output_tokens=judge.max_output_tokens)
            if why is not None:
                return f"the judge of --score {item.name}: {why}"
    return None


class _Prepared:
    """A checked batch with its files open and its plan made: ready to run, then to
    sum up (``finish``), then to close."""

    def __init__(self, options: BatchOptions, config: Config, models: Sequence[ModelConfig],
                 endpoint: Endpoint | None, prompts: Sequence[Prompt], work: list[Work],
                 writer: ResultsFile, scores: ScoresFile | None,
                 selected: Sequence[Selected], budget: Budget | None,
                 fields: Mapping[str, str], observer: BatchObserver | None,
                 handle_signals: bool, shared_limits: SharedLimits | None = None,
                 owns_shared: bool = True) -> None:
        self.options = options
        self.shared_limits = shared_limits if owns_shared else None  # to close
        self.endpoint = endpoint
        self.work = work
        self.writer = writer
        self.scores = scores
        self.selected = selected
        self.budget = budget
        self.fields = fields
        self.observer = observer
        self.notes: list[str] = []
        existing = writer.existing
        # What the file says of the units it holds not done: their statuses, for the
        # requests refused as sent (not sent again, unchanged) and the summary.
        self.evidence: dict[str, Evidence] = {}
        if any(not is_done(r.get("state"), options.accept_empty)
               for r in existing.latest.values()):
            with contextlib.suppress(OSError):  # read a moment ago; without it every
                self.evidence = file_evidence(options.output)  # unit not done runs again
        todo, done, changed = [], 0, 0
        refused: list[Evidence] = []
        for unit in work:
            record = existing.latest.get(unit.key)
            if record is not None and is_done(record.get("state"), options.accept_empty):
                if record.get("content_key") == unit.content_key:
                    done += 1
                    continue
                changed += 1
            seen = self.evidence.get(unit.key)
            if (not options.retry_failed and record is not None and seen is not None
                    and seen.status in FINAL_STATUSES and seen.state == record.get("state")
                    and seen.content_key == unit.content_key):
                refused.append(seen)  # the same request, refused as sent: it stays so
                continue
            todo.append(unit)
        if existing.torn_bytes:
            self._note(f"{options.output}: cut off a torn last line ({existing.torn_bytes} "
                       "bytes, from an interrupted run) before appending")
        shared = shared_limits is not None
        cap = shard_concurrency(options, config, shared=shared)
        caps = model_caps(options, config, models, shared=shared)
        shard = ""
        if options.shard:
            index, count = options.shard
            shard = f" (shard {index}/{count}, at most {cap} at once)"
        slots = None
        if shared_limits is not None:
            whole = options.concurrency or config.max_concurrency or DEFAULT_CONCURRENCY
            maxima = model_caps(attrs.evolve(options, shard_concurrency=None), config, models,
                                shared=True)
            slots = SharedSlots(shared_limits, shared_space(fields["plan"], endpoint), whole,
                                maxima)
            where = f"shard {options.shard[0]}/{options.shard[1]}, " if options.shard else ""
            shard = (f" ({where}limits shared through {shared_limits.describe()}: at most "
                     f"{whole} at once on the endpoint across the shards)")
        self._note(f"{len(work)} streams{shard}: {len(prompts)} prompts x {len(models)} "
                   f"models x {options.samples} samples; {done} already completed, "
                   f"{len(todo)} to run" + (f" ({changed} changed since completed)"
                                            if changed else ""))
        if refused:
            statuses = ", ".join(map(str, sorted({seen.status for seen in refused
                                                  if seen.status is not None})))
            self._note(f"{len(refused)} unit{'s' if len(refused) != 1 else ''} skipped: "
                       f"refused as sent before (HTTP {statuses}); --retry-failed to send "
                       f"{'them' if len(refused) != 1 else 'it'} again")
        self.scoring: Scoring | None = None
        if scores is not None:
            if scores.existing.torn_bytes:
                self._note(f"--scores {scores.path}: cut off a torn last line "
                           f"({scores.existing.torn_bytes} bytes, from an interrupted run)")
            self.scoring = Scoring(config, selected, scores, budget=budget, stamp=fields)
            _score_done(self.scoring, options.output,
                        {u.key for u in work} - {u.key for u in todo})
        self.session = Session(config, options, todo, writer, cap=cap, stamp=fields,
                               observer=observer, scoring=self.scoring, budget=budget,
                               handle_signals=handle_signals, model_caps=caps,
                               shared=slots)
        self.needs_run = bool(todo) or (self.scoring is not None and self.scoring.pending > 0)
        self.started = time.monotonic()

    def _note(self, line: str) -> None:
        if self.observer is not None:
            self.observer.note(line)

    def close(self) -> None:
        self.writer.close()
        if self.scores is not None:
            self.scores.close()
        if self.shared_limits is not None:
            self.shared_limits.close()

    def finish(self) -> BatchSummary:
        """Sum the run up: what it did, what is left, its exit code."""
        options, session, writer, budget = self.options, self.session, self.writer, \
            self.budget
        writer.close()  # the last records are tried once more, then synced
        elapsed = time.monotonic() - self.started
        report: list[str] = []
        counts = session.counts
        ran = sum(counts.values()) + session.redone
        if ran:
            parts = [f"{n} {state}" for state, n in counts.most_common()]
            if session.redone:
                parts.append(f"{session.redone} cut and redone")
            report.append(f"this run: {ran} streams in {elapsed:.1f}s "
                          f"({ran / elapsed if elapsed > 0 else 0:.1f}/s): {', '.join(parts)}")
        for name, limit in session.limits.items():
            if limit.rate_limited:
                report.append(
                    f"{name}: {limit.rate_limited} 429s; concurrency went down to "
                    f"{limit.lowest} of {limit.maximum} and is {limit.limit} now; submissions "
                    f"paused {limit.paused:.1f}s")
        report += session.cut_lines()
        failed_write = writer.error
        unrecorded = {key for key, _ in writer.unwritten}
        if failed_write is not None:
            lost = len(writer.unwritten)
            report.append(
                f"-o {options.output}: cannot write: {failed_write.strerror or failed_write}; "
                "no new stream was sent after that; "
                + (f"{lost} finished stream{'s' if lost != 1 else ''} could not be recorded "
                   "(they run again next time)" if lost else
                   "every finished stream was recorded after all"))

        if session.shared_lost is not None:
            report.append(f"the shared limit stopped answering ({session.shared_lost}); no "
                          "new stream was sent after that; the streams in flight were "
                          "recorded; run the same command again once it answers")

        closing: list[str] = []
        scorer_lines: list[str] = []
        scores, scoring = self.scores, self.scoring
        judges_failed = judges_refused = 0
        scores_error = None
        if scoring is not None and scores is not None:
            scores.close()
            scorer_lines = [scoring.tallies[item.name].line(item.name) for item in self.selected]
            if scores.error is not None:
                scores_error = scores.error
                closing.append(f"--scores {scores.path}: cannot write: "
                               f"{scores.error.strerror or scores.error}; `fanout score` on the "
                               "results file scores what is missing")
            judges_failed = sum(scoring.tallies[i.name].judge_failed for i in self.selected)
            judges_refused = sum(scoring.tallies[i.name].judge_refused for i in self.selected)
            failed_judges = _failed_judges(scoring, self.selected, options)
            if failed_judges is not None:
                closing.append(failed_judges)

        # Every unit of the plan: how it stands now.
        states: Counter[str] = Counter()
        finals: dict[str, Final] = {}
        existing = writer.existing
        for unit in self.work:
            final = session.finals.get(unit.key)
            if final is None:  # not run this time: as the file says
                record = existing.latest.get(unit.key)
                state = str(record.get("state")) if record is not None else "unsent"
                if record is not None and unit.key in session.by_key:
                    state = "unsent"  # to run, and not sent: the run stopped first
                seen = self.evidence.get(unit.key)
                if seen is not None and seen.state == state:  # its status and reason
                    final = Final(unit.model.name, state, seen.status, seen.reason)
                else:
                    final = Final(unit.model.name, state, None, None)
            states[final.state] += 1
            if not is_done(final.state, options.accept_empty) or unit.key in unrecorded:
                finals[unit.key] = final if unit.key not in unrecorded else attrs.evolve(
                    final, state="unrecorded")
        interrupted = None
        if session.interrupted:
            interrupted = ExitCode.TERMINATED if session.terminated else ExitCode.INTERRUPTED
            closing.append(_interrupted_line(session, scoring))
        budget_stopped = budget is not None and budget.stopped
        if budget is not None and budget.stopped:
            not_sent = sum(len(queue) for queue in session.queues.values())
            closing.append(budget.describe(not_sent))
        elif budget is not None and interrupted is None:
            closing.append(budget.spent_line())
        units = Counter(unit.model.name for unit in self.work)
        history: list[dict[str, Evidence]] = []

        def samples(key: str) -> int:
            # A model of one unit here: how many runs it ended that way (the file, read
            # again now that it holds this run's records too).
            if not history:
                try:
                    history.append(file_evidence(options.output))
                except OSError:
                    history.append({})
            seen = history[0].get(key)
            return seen.samples if seen is not None else 1

        lines, failures = not_completed(finals, len(self.work), units,
                                        accept_empty=options.accept_empty, samples=samples)
        if interrupted is None and not budget_stopped:
            if failed_write is not None:
                closing.append(
                    f"{len(finals)} of {len(self.work)} streams are not completed or not "
                    f"recorded; once {options.output} can be written, run the same command "
                    "again to finish")
            elif finals:
                closing += lines
        code = exit_code(failures, interrupted=interrupted, budget_stopped=budget_stopped,
                         write_error=(failed_write is not None or scores_error is not None
                                      or session.shared_lost is not None),
                         judges_failed=judges_failed, judges_refused=judges_refused)
        write_error = failed_write or scores_error
        return BatchSummary(
            exit_code=code, total=len(self.work), done=len(self.work) - len(finals),
            counts=dict(states), ran=dict(counts), redone=session.redone,
            failures=tuple(failures), plan=self.fields["plan"], run=self.fields["run"],
            shard=options.shard or (0, 1), results=options.output,
            scores=str(scores.path) if scores is not None else None,
            scorer_lines=tuple(scorer_lines), report=tuple(report), closing=tuple(closing),
            elapsed=elapsed, interrupted=interrupted is not None, budget_stopped=budget_stopped,
            write_error=(write_error.strerror or str(write_error)) if write_error else None,
            judges_failed=judges_failed)


def _interrupted_line(session: Session, scoring: Scoring | None) -> str:
    """What Ctrl-C (or SIGTERM) interrupted: the answers in flight (recorded as
    cancelled), the judges in flight (cancelled, no score), both, or neither."""
    answers = sum(1 for final in session.finals.values() if final.state == "cancelled")
    judges = scoring.cancelled_in_flight if scoring is not None else 0
    said = []
    if answers:
        said.append(f"{answers} answer stream{'s were' if answers != 1 else ' was'} in flight, "
                    "recorded as cancelled with what had arrived")
    if judges:
        said.append(f"{judges} judge stream{'s were' if judges != 1 else ' was'} in flight, "
                    "cancelled without a score")
    what = " and ".join(said) if said else "no stream was in flight"
    return f"interrupted: {what}; run the same command again to finish"


def _failed_judges(scoring: Scoring, selected: Sequence[Selected], options: BatchOptions
                   ) -> str | None:
    """The line that says which judges' streams did not complete (their answers hold an
    ``error`` score, not current) and the command that asks them again; ``None`` if all
    answered."""
    failed = {item.name: scoring.tallies[item.name].judge_failed for item in selected
              if scoring.tallies[item.name].judge_failed}
    if not failed:
        return None
    total = sum(failed.values())
    command = ["fanout", "score", options.output, *(
        part for name in failed for part in ("--score", name))]
    if options.config is not None:
        command += ["--config", options.config]
    if options.scores is not None:
        command += ["--scores", options.scores]
    return (f"{total} judge stream{'s' if total != 1 else ''} did not complete (error "
            f"scores); `{shlex.join(command)}` asks {'them' if total != 1 else 'it'} again")


def _score_done(scoring: Scoring, output: str, keys: set[str]) -> None:
    """Score the units an earlier run completed (those of ``keys``): what is current
    in the scores file is skipped, so only answers not scored yet by these scorers."""
    if not keys:
        return
    try:
        latest, _ = latest_records(output)
    except OSError:
        return  # read a moment ago; `fanout score` can do it later
    for key, record in latest.items():
        if key in keys:
            scoring.add(as_scored(record))



