"""``fanout batch``: every prompt x model x sample through one endpoint, crash-safe.

The work is every (prompt id, model, sample) of this shard.  What the results
file already holds as ``completed`` (for the same request) is skipped; the
rest runs through one fan-out: a global cap and one adaptive cap per model
(halved on 429s, grown back on success), one submitter per model so models
interleave, each result written and flushed as it finishes.  Exit status:
0 when every unit of work is completed, 1 when some are not (run again to
redo them), 2 for bad usage, 130 after Ctrl-C.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any, TextIO

import attrs
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .._exceptions import ConfigError
from ..config import Config, ModelConfig, load_config
from ..core.events import StreamFinished, StreamRetrying
from ..core.result import Outcome, StreamResult
from ..fanout import Fanout, open_fanout
from ..request import Endpoint, RetryPolicy, StreamRequest, content_key
from .common import interrupt_on_sigint, open_endpoint, text_console
from .common import only as _only
from .prompts import Prompt, PromptFileError, load_prompts
from .ratelimit import AdaptiveLimit
from .records import result_record
from .report import model_summary, summary_table
from .results import (
    ResultsWriter,
    iter_records,
    read_results,
    shard_of,
    work_key,
)

__all__ = ["BatchOptions", "Work", "batch_record", "plan_work", "run_batch"]

EXIT_INTERRUPTED = 130
DEFAULT_CONCURRENCY = 32
#: A batch has time: more attempts than the library's default, so a burst of 429s
#: (before the adaptive cap has come down) costs waiting, not failed work; and a
#: Retry-After is stretched by up to 25 %, so streams refused together come back apart.
BATCH_RETRY = RetryPolicy(attempts=8, maximum=30.0, retry_after_spread=0.25)
#: Seconds between progress lines when stderr is not a terminal.
PLAIN_PROGRESS_EVERY = 10.0


@attrs.frozen
class BatchOptions:
    prompts: str
    output: str
    models: tuple[str, ...] = ()
    samples: int = 1
    concurrency: int | None = None
    per_model_concurrency: int | None = None
    shard: tuple[int, int] | None = None
    config: str | None = None


@attrs.frozen
class Work:
    """One unit: a prompt, a model, a sample number."""

    key: str
    prompt: Prompt
    model: ModelConfig
    sample: int
    content_key: str

    def request(self, config: Config) -> StreamRequest:
        return StreamRequest(self.key, self.model.id, self.prompt.messages,
                             {**self.model.params, **self.prompt.params},
                             deadlines=config.deadlines_for(self.model),
                             tools=self.prompt.tools)


def plan_work(prompts: Sequence[Prompt], models: Sequence[ModelConfig], samples: int,
              config: Config, shard: tuple[int, int] | None = None) -> list[Work]:
    """Every (prompt, model, sample) of ``shard`` (all of them without one).

    ``content_key`` hashes what is asked (endpoint, model id, messages,
    params, tools; never the key, nor the embedded upstream's port), so a
    changed prompt or parameter is redone on resume.
    """
    where = config.base_url or "OPENAI_BASE_URL"
    work = []
    for prompt in prompts:
        for model in models:
            params = {**model.params, **prompt.params}
            asked = content_key(where, model.id, list(prompt.messages), params,
                                list(prompt.tools or ()))
            for sample in range(samples):
                key = work_key(prompt.id, model.name, sample)
                if shard is None or shard_of(key, shard[1]) == shard[0]:
                    work.append(Work(key, prompt, model, sample, asked))
    return work


def batch_record(work: Work, result: StreamResult) -> dict[str, Any]:
    """The results-file line of one finished unit of work."""
    base = result_record(result)
    attempts = result.attempts
    rate_limited = sum(1 for a in attempts if a.status == 429)
    retry_wait = sum(a.waited for i, a in enumerate(attempts)
                     if i and attempts[i - 1].status == 429)
    first = result.choices[0] if result.choices else None
    return {
        "id": work.prompt.id,
        "model": work.model.name,
        "sample": work.sample,
        "outcome": base["outcome"],
        "model_id": work.model.id,
        "content_key": work.content_key,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "text": base["text"],
        "finish_reason": first.finish_reason if first else None,
        "choices": base["choices"],
        "usage": base["usage"],
        "error": base["error"],
        "timed_out": base["timed_out"],
        "status": base["status"],
        "attempts": base["attempts"],
        "rate_limited": rate_limited,
        "retry_wait": round(retry_wait, 6),
        "skipped_frames": base["skipped_frames"],
        "response_model": base["model"],
        "response_id": base["response_id"],
        "metrics": base["metrics"],
    }


def run_batch(options: BatchOptions, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None, environ: dict[str, str] | None = None,
              console: Console | None = None, progress_console: Console | None = None) -> int:
    """Run a batch; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def fail(message: str) -> int:
        print(f"fanout batch: {message}", file=err)
        return 2

    if options.samples < 1:
        return fail(f"--samples must be >= 1, not {options.samples}")
    for flag, value in (("--concurrency", options.concurrency),
                        ("--per-model-concurrency", options.per_model_concurrency)):
        if value is not None and value < 1:
            return fail(f"{flag} must be >= 1, not {value}")
    try:
        config = load_config(options.config)
        models = config.select(options.models)
        endpoint = config.endpoint(environ)
    except ConfigError as exc:
        return fail(str(exc))
    try:
        prompts = load_prompts(options.prompts)
    except PromptFileError as exc:
        for problem in exc.problems:
            print(f"fanout batch: {problem}", file=err)
        if exc.total:
            print(f"fanout batch: {exc}; nothing was sent", file=err)
        return 2

    existing = read_results(options.output)
    work = plan_work(prompts, models, options.samples, config, options.shard)
    todo, done, changed = [], 0, 0
    for unit in work:
        record = existing.latest.get(unit.key)
        if record is not None and record.get("outcome") == "completed":
            if record.get("content_key") == unit.content_key:
                done += 1
                continue
            changed += 1
        todo.append(unit)
    console = console or text_console(out, wide=True)
    notes = []
    if existing.torn_bytes:
        notes.append(f"{options.output}: ignored a torn last line ({existing.torn_bytes} bytes, "
                     "from an interrupted run); it is cut off before appending")
    if existing.bad_lines:
        lines = ", ".join(map(str, existing.bad_lines[:10]))
        notes.append(f"{options.output}: skipped {len(existing.bad_lines)} unreadable "
                     f"line(s): {lines}")
    for note in notes:
        print(f"fanout batch: {note}", file=err)
    shard = f" (shard {options.shard[0]}/{options.shard[1]})" if options.shard else ""
    print(f"fanout batch: {len(work)} streams{shard}: {len(prompts)} prompts x {len(models)} "
          f"models x {options.samples} samples; {done} already completed, {len(todo)} to run"
          + (f" ({changed} changed since completed)" if changed else ""), file=err)

    try:
        writer = ResultsWriter(options.output, existing)
    except OSError as exc:
        return fail(f"-o {options.output}: cannot write: {getattr(exc, 'strerror', None) or exc}")
    session = _Session(config, options, todo, writer, progress_console
                       or text_console(err))
    started = time.monotonic()
    try:
        if todo:
            trio.run(session.run, endpoint)
    except BaseException as exc:
        if not _only(exc, KeyboardInterrupt):
            raise
        # A second Ctrl-C: out at once; what was written stays, the rest is redone next time.
        print("fanout batch: stopped at once; run the same command again to finish", file=err)
        return EXIT_INTERRUPTED
    finally:
        writer.close()
    elapsed = time.monotonic() - started

    counts = session.counts
    ran = sum(counts.values())
    if ran:
        parts = ", ".join(f"{n} {outcome}" for outcome, n in counts.most_common())
        print(f"fanout batch: this run: {ran} streams in {elapsed:.1f}s ({ran / elapsed:.1f}/s): "
              f"{parts}", file=err)
    for name, limit in session.limits.items():
        if limit.rate_limited:
            print(f"fanout batch: {name}: {limit.rate_limited} 429s; concurrency went down to "
                  f"{limit.lowest} of {limit.maximum} and is {limit.limit} now; submissions "
                  f"paused {limit.paused:.1f}s", file=err)
    # The whole file, as `fanout report` reads it: earlier runs and this one.
    console.print(summary_table(model_summary(iter_records(options.output))))
    if session.interrupted:
        print("fanout batch: interrupted: the streams in flight were recorded as cancelled; "
              "run the same command again to finish", file=err)
        return EXIT_INTERRUPTED

    def outcome(key: str) -> str | None:
        if key in session.outcomes:
            return session.outcomes[key]
        return (existing.latest.get(key) or {}).get("outcome")

    missing = [u for u in work if outcome(u.key) != "completed"]
    if missing:
        print(f"fanout batch: {len(missing)} of {len(work)} streams are not completed; run the "
              "same command again to redo them", file=err)
        return 1
    return 0


class _Session:
    def __init__(self, config: Config, options: BatchOptions, todo: list[Work],
                 writer: ResultsWriter, progress_console: Console) -> None:
        self.config = config
        self.options = options
        self.todo = todo
        self.writer = writer
        self.progress_console = progress_console
        self.counts: Counter[str] = Counter()
        self.outcomes: dict[str, str] = {}  # key -> outcome, of this run
        self.interrupted = False
        self._submitting = trio.CancelScope()
        self._bar: tuple[Progress, TaskID, float] | None = None
        self.by_key = {unit.key: unit for unit in todo}
        global_cap = options.concurrency or config.max_concurrency or DEFAULT_CONCURRENCY
        self.global_cap = global_cap
        self.slots = trio.CapacityLimiter(global_cap)
        self.limits: dict[str, AdaptiveLimit] = {}
        for unit in todo:
            model = unit.model
            if model.name not in self.limits:
                cap = (options.per_model_concurrency or model.concurrency
                       or config.per_model_concurrency or global_cap)
                self.limits[model.name] = AdaptiveLimit(min(cap, global_cap))

    async def run(self, endpoint: Endpoint | None) -> None:
        async with (
            open_endpoint(endpoint) as resolved,
            open_fanout(resolved, accept_more=True, max_concurrency=self.global_cap,
                        retry=BATCH_RETRY, strict=self.config.strict) as fan,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(interrupt_on_sigint, partial(self._interrupt, fan))
            nursery.start_soon(self._fsync_every_second)
            nursery.start_soon(self._progress)
            nursery.start_soon(self._submit_all, fan, self._submitting)
            await self._consume(fan)
            self._update_bar()  # the last frame shows the end, not the frame before it
            nursery.cancel_scope.cancel()

    async def _submit_all(self, fan: Fanout, scope: trio.CancelScope) -> None:
        per_model: dict[str, list[Work]] = {}
        for unit in self.todo:
            per_model.setdefault(unit.model.name, []).append(unit)
        with scope:
            async with trio.open_nursery() as nursery:
                for name, units in per_model.items():
                    nursery.start_soon(self._submit_model, fan, self.limits[name], units)
        fan.seal()

    async def _submit_model(self, fan: Fanout, limit: AdaptiveLimit, units: list[Work]) -> None:
        for unit in units:
            await limit.wait_if_paused()
            await limit.limiter.acquire_on_behalf_of(unit.key)
            try:
                await self.slots.acquire_on_behalf_of(unit.key)
            except BaseException:
                limit.limiter.release_on_behalf_of(unit.key)
                raise
            await fan.submit(unit.request(self.config))

    async def _consume(self, fan: Fanout) -> None:
        async for event in fan.events:
            if isinstance(event, StreamRetrying):
                if event.error.status == 429:
                    unit = self.by_key[event.stream]
                    self.limits[unit.model.name].rate_limited_now(trio.current_time(),
                                                                  event.wait)
            elif isinstance(event, StreamFinished):
                self._finished(fan, event.result)

    def _finished(self, fan: Fanout, result: StreamResult) -> None:
        unit = self.by_key.pop(result.stream)
        record = batch_record(unit, result)
        self.writer.write(record)
        self.outcomes[unit.key] = record["outcome"]
        self.counts[record["outcome"]] += 1
        fan.forget(result.stream)
        self.slots.release_on_behalf_of(unit.key)
        limit = self.limits[unit.model.name]
        limit.limiter.release_on_behalf_of(unit.key)
        if result.outcome == Outcome.COMPLETED:
            limit.succeeded()
        elif result.status == 429:  # retries ran out on a 429: that is a signal too
            limit.rate_limited_now(trio.current_time(), None)

    def _interrupt(self, fan: Fanout) -> None:
        # Ctrl-C: stop submitting, cancel what runs (recorded as cancelled with its
        # partial output); the summary follows.
        self.interrupted = True
        self._submitting.cancel()
        fan.cancel_all()

    async def _fsync_every_second(self) -> None:
        while True:
            await trio.sleep(1)
            await trio.to_thread.run_sync(self.writer.sync)

    async def _progress(self) -> None:
        total = len(self.todo)
        console = self.progress_console
        if not console.is_terminal:
            start = trio.current_time()
            while True:
                await trio.sleep(PLAIN_PROGRESS_EVERY)
                console.print(self._line(total, trio.current_time() - start), soft_wrap=True)
        columns = (TextColumn("fanout batch"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[outcomes]}"), TextColumn("{task.fields[rate]}"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        with Progress(*columns, console=console, auto_refresh=False, transient=False) as bar:
            self._bar = (bar, bar.add_task("batch", total=total, outcomes="", rate=""),
                         trio.current_time())
            while True:
                self._update_bar()
                await trio.sleep(0.1)

    def _update_bar(self) -> None:
        if self._bar is None:
            return
        bar, task, start = self._bar
        done = sum(self.counts.values())
        elapsed = trio.current_time() - start
        bar.update(task, completed=done, outcomes=self._outcomes(),
                   rate=f"{done / elapsed:.1f}/s" if elapsed > 0 else "")
        bar.refresh()

    def _outcomes(self) -> str:
        return " ".join(f"{outcome} {n}" for outcome, n in sorted(self.counts.items()))

    def _line(self, total: int, elapsed: float) -> str:
        done = sum(self.counts.values())
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 else ""
        return (f"fanout batch: {done}/{total} done ({self._outcomes() or 'none yet'}), "
                f"{rate:.1f}/s{eta}")
