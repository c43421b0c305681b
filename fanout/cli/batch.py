"""``fanout batch``: every prompt x model x sample through one endpoint, crash-safe.

The work is every (prompt id, model, sample) of this shard.  What the results
file already holds as ``completed`` with an answer (for the same request) is
skipped; the rest runs through one fan-out: an endpoint-wide adaptive cap
(halved when the server cuts streams while others run, grown back on
success), one adaptive cap per model (halved on 429s, grown back on
success), one submitter per model so models interleave, each result written
and flushed as it finishes.  A unit the server cut while others ran is
redone in the same run, at the lower concurrency (at most ``MAX_REDOS``
times).  Without ``-m``, the config's ``[batch] models`` run (else every
model).

Before anything is sent: the config, the prompts (every one must be
sendable) and the results file (``results.ResultsFile``: not the prompts
file, a regular file, fanout's own, locked for the run) are checked.  A
write that fails mid-run (a full disk) stops new submissions; the streams in
flight run on and are tried, the summary is printed.  Everything a server
sent reaches stderr and stdout through ``report.printable``.

``--score NAME`` (repeatable) scores each unit as its record is written
(``fanout.eval.run.Scoring``: pure scorers at once, a judge through its own
fan-out beside the batch's, its streams under the same endpoint-wide cap and
cut detection as the answers: a cut answer is redone before it is judged, a
cut judge asked again) into the scores file (``RESULTS.scores.jsonl``,
or ``--scores``).  ``--budget USD`` sends a unit only while this run's cost
(its finished streams, judges included, plus a bound for those in flight:
``fanout.eval.budget``) stays within USD; a unit that does not fit waits
while streams run (they may end below their bounds); once none runs and it
still does not fit, its model sends no more (the other models go on while
their units fit), and the run exits 3 at the end.  The budget is this run's: running again,
with a new ``--budget``, continues where it stopped.

Exit status: 0 when every unit of work is completed (an empty answer is not,
unless ``--accept-empty``), 1 when some are not or a write failed (stderr
says whether running again can help), 2 for bad usage or input, 3 when the
budget stopped the run, 130 after Ctrl-C.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TextIO

import attrs
import httpx
import trio
from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from .._exceptions import ConfigError
from ..config import Config, ModelConfig, load_config
from ..core.events import StreamFinished, StreamRetrying
from ..core.result import Flag, Outcome, StreamResult
from ..eval.budget import Budget, why_unbounded
from ..eval.cost import cost_of, usage_record
from ..eval.run import Scoring, Selected, UnknownScorer, select_scorers
from ..fanout import Fanout, open_fanout
from ..ratelimit import AdaptiveLimit, EndpointLimit
from ..request import Endpoint, RetryPolicy, StreamRequest, content_key
from ..store.prompts import Prompt, PromptFileError, load_prompts
from ..store.results import (
    RecordReader,
    ResultsFile,
    ResultsFileError,
    shard_of,
    state_of,
    work_key,
)
from ..store.scores import ScoresFile, scores_path
from .common import interrupt_on_sigint, open_endpoint, text_console
from .common import only as _only
from .records import result_record
from .render import cut_line
from .report import model_summary, printable, summary_console, summary_view

__all__ = ["BatchOptions", "Work", "batch_record", "plan_work", "run_batch", "unsendable"]

EXIT_INTERRUPTED = 130
#: The budget stopped the run (``--budget``): distinct from failures' 1.
EXIT_BUDGET = 3
DEFAULT_CONCURRENCY = 32
#: A batch has time: more attempts than the library's default, so a burst of 429s
#: (before the adaptive cap has come down) costs waiting, not failed work; and a
#: Retry-After is stretched by up to 25 %, so streams refused together come back apart.
BATCH_RETRY = RetryPolicy(attempts=8, maximum=30.0, retry_after_spread=0.25)
#: Seconds between progress lines when stderr is not a terminal.
PLAIN_PROGRESS_EVERY = 10.0
#: How many times one unit is redone in one run after the server cut it.
MAX_REDOS = 4
#: HTTP statuses that say the request itself is refused: a rerun sends it again, unchanged.
FINAL_STATUSES = frozenset(range(400, 500)) - {408, 409, 429}


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
    accept_empty: bool = False  # an empty answer counts as done (as before flags existed)
    scorers: tuple[str, ...] = ()  # --score NAME: scored as each unit is written
    scores: str | None = None  # the scores file (default: beside the results)
    budget: float | None = None  # USD this run may spend


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
                             tools=self.prompt.tools or self.model.tools, api=self.model.api)


def plan_work(prompts: Sequence[Prompt], models: Sequence[ModelConfig], samples: int,
              config: Config, shard: tuple[int, int] | None = None) -> list[Work]:
    """Every (prompt, model, sample) of ``shard`` (all of them without one).

    ``content_key`` hashes what is asked (endpoint, model id, messages,
    params, tools; never the key, nor the embedded upstream's port), so a
    changed prompt or parameter is redone on resume.  A prompt's ``tools`` are
    sent instead of the model's (``[[models]] tools``), as its params go over
    the model's.
    """
    where = config.base_url or "OPENAI_BASE_URL"
    work = []
    for prompt in prompts:
        for model in models:
            params = {**model.params, **prompt.params}
            asked = content_key(where, model.id, list(prompt.messages), params,
                                list(prompt.tools or model.tools or ()), model.api)
            for sample in range(samples):
                key = work_key(prompt.id, model.name, sample)
                if shard is None or shard_of(key, shard[1]) == shard[0]:
                    work.append(Work(key, prompt, model, sample, asked))
    return work


def batch_record(work: Work, result: StreamResult, *, cut: bool = False,
                 redo: int = 0) -> dict[str, Any]:
    """The results-file line of one finished unit of work.

    ``cut``: the server cut this stream while others ran, and it is redone
    (a later record of the same key follows); ``redo``: how many times this
    unit had been cut and redone in this run before this record.

    For evaluation it carries the prompt's ``messages`` as sent, its
    ``expected`` (absent when the prompt has none), ``category`` and ``tags``
    (absent when unset), and the stream's ``cost`` (USD, ``None`` when unknown)
    with its ``cost_source`` (``fanout.eval.cost.cost_of``: ``"reported"``,
    ``"price"`` or ``None``).  ``usage`` keeps every field the relay sent
    (``cost``, ``prompt_tokens_details``, ...) after the three counts.  None of
    these is in ``content_key``: an older results file resumes as before.
    """
    base = result_record(result)
    usage = usage_record(result.usage)
    cost, cost_source = cost_of(usage, work.model.price)
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
        "reason": base["reason"],
        "flags": base["flags"],
        "cut": cut,
        "redo": redo,
        "others_running": result.others_running,
        "model_id": work.model.id,
        "api": work.model.api,
        "content_key": work.content_key,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "text": base["text"],
        "finish_reason": first.finish_reason if first else None,
        "choices": base["choices"],
        "usage": usage,
        "cost": cost,
        "cost_source": cost_source,
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
        "messages": [dict(message) for message in work.prompt.messages],
        **work.prompt.eval_fields(),
    }


def _shown_url(url: str) -> str:
    """A base URL as a summary names it: no user info, no query."""
    try:
        return printable(str(httpx.URL(url).copy_with(userinfo=b"", query=None)))
    except (httpx.InvalidURL, ValueError):
        return "the endpoint"


def is_done(state: str | None, accept_empty: bool) -> bool:
    """Whether a unit in ``state`` (``results.state_of``) needs no redo."""
    return state == "completed" or (accept_empty and state == "empty")


def run_batch(options: BatchOptions, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None, environ: dict[str, str] | None = None,
              console: Console | None = None, progress_console: Console | None = None) -> int:
    """Run a batch; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def say(message: str) -> None:
        # Every line to stderr: model text and file names reach it, and must neither
        # drive the terminal nor fail to encode.
        print(f"fanout batch: {printable(message)}", file=err)

    def fail(message: str) -> int:
        say(message)
        return 2

    if options.samples < 1:
        return fail(f"--samples must be >= 1, not {options.samples}")
    if options.budget is not None and not (math.isfinite(options.budget)
                                           and options.budget > 0):
        return fail(f"--budget must be a number of USD > 0, not {options.budget}")
    for flag, value in (("--concurrency", options.concurrency),
                        ("--per-model-concurrency", options.per_model_concurrency)):
        if value is not None and value < 1:
            return fail(f"{flag} must be >= 1, not {value}")
    try:
        config = load_config(options.config)
        models = config.select(options.models, default=config.batch)
        endpoint = config.endpoint(environ)
    except ConfigError as exc:
        for line in exc.problems or [str(exc)]:  # one problem a line
            say(line)
        return 2
    if options.scores is not None and not options.scorers:
        return fail("--scores names where --score NAME writes; give a --score too")
    try:
        selected = select_scorers(config, options.scorers)
    except (UnknownScorer, ValueError, ConfigError) as exc:
        return fail(f"{exc}; nothing was sent")
    for model in models:  # TOML has nan and inf; JSON does not
        if not _encodes(dict(model.params)):
            return fail(f"model {model.name!r}: its params cannot be sent "
                        f"({_why_not(dict(model.params))}); nothing was sent")
    try:
        prompts = load_prompts(options.prompts)
        problems = unsendable(prompts, models, options.prompts)
        if problems:
            raise PromptFileError(options.prompts, problems, len(problems))
    except PromptFileError as exc:
        for problem in exc.problems:
            say(problem)
        if exc.total:
            say(f"{exc}; nothing was sent")
        return 2

    try:
        source = os.stat(options.prompts)
    except OSError as exc:  # read a moment ago
        return fail(f"{options.prompts}: cannot read: {exc.strerror or exc}")
    try:
        writer = ResultsFile(options.output, not_same_as=(f"the prompts file {options.prompts}",
                                                          source))
    except ResultsFileError as exc:
        return fail(f"-o {exc}; nothing was sent")
    scores: ScoresFile | None = None
    try:
        budget = None
        if options.budget is not None:
            budget = _budget(options, models, selected, writer)
            unbounded = _unbounded(models, prompts, selected)
            if unbounded is not None:
                return fail(f"--budget: {unbounded}; nothing was sent")
        if selected:
            target = options.scores or scores_path(options.output)
            try:
                scores = ScoresFile(target, not_same_as=(f"the results file {options.output}",
                                                         os.stat(options.output)))
            except (ResultsFileError, OSError) as exc:
                return fail(f"--scores {exc}; nothing was sent")
        return _run(options, config, models, endpoint, prompts, writer, out, err, say,
                    console, progress_console, selected, scores, budget)
    finally:
        writer.close()
        if scores is not None:
            scores.close()


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


def unsendable(prompts: Sequence[Prompt], models: Sequence[ModelConfig],
               name: str) -> list[str]:
    """A line per prompt that no request can carry (a lone surrogate is no UTF-8 text,
    NaN is no JSON): refused like a bad line, before anything is sent, not a crash."""
    problems = []
    for prompt in prompts:
        messages, params = list(prompt.messages), dict(prompt.params)
        tools = list(prompt.tools or ())
        parts: list[Any] = [messages, params, tools]
        refused = _refused(prompt, models)
        if refused is not None:
            problems.append(f"{name}:{prompt.line}: cannot be sent: {refused}")
            continue
        if _encodes(parts):
            continue
        # What fanout itself does with it (the library may learn to send it).
        body = {"model": models[0].id, "messages": messages, **params}
        try:
            content_key("", models[0].id, messages, params, tools)
            httpx.Request("POST", "http://127.0.0.1/", json=body)
        except (UnicodeEncodeError, ValueError, TypeError):
            problems.append(f"{name}:{prompt.line}: cannot be sent: {_why_not(parts)}")
    return problems


def _refused(prompt: Prompt, models: Sequence[ModelConfig]) -> str | None:
    """Why a model's dialect cannot carry this prompt (a parameter it lacks), if it cannot."""
    for model in models:
        try:
            StreamRequest("check", model.id, prompt.messages, {**model.params, **prompt.params},
                          tools=prompt.tools or model.tools, api=model.api)
        except ValueError as exc:
            why = str(exc).removeprefix("stream 'check': ")
            return f"model {model.name!r}: {why}"
    return None


def _encodes(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
    except (UnicodeEncodeError, ValueError, TypeError):
        return False
    return True


def _why_not(value: Any) -> str:
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError as exc:
        return (f"it holds a lone surrogate (U+{ord(exc.object[exc.start]):04X}), which is not "
                "UTF-8 text")
    except (ValueError, TypeError) as exc:
        return f"not JSON: {exc}"
    return "?"


def _run(options: BatchOptions, config: Config, models: Sequence[ModelConfig],
         endpoint: Endpoint | None, prompts: Sequence[Prompt], writer: ResultsFile,
         out: TextIO, err: TextIO, say: Callable[[str], None], console: Console | None,
         progress_console: Console | None, selected: Sequence[Selected] = (),
         scores: ScoresFile | None = None, budget: Budget | None = None) -> int:
    existing = writer.existing
    work = plan_work(prompts, models, options.samples, config, options.shard)
    todo, done, changed = [], 0, 0
    for unit in work:
        record = existing.latest.get(unit.key)
        if record is not None and is_done(record.get("state"), options.accept_empty):
            if record.get("content_key") == unit.content_key:
                done += 1
                continue
            changed += 1
        todo.append(unit)
    if existing.torn_bytes:
        say(f"{options.output}: cut off a torn last line ({existing.torn_bytes} bytes, from an "
            "interrupted run) before appending")
    shard = f" (shard {options.shard[0]}/{options.shard[1]})" if options.shard else ""
    say(f"{len(work)} streams{shard}: {len(prompts)} prompts x {len(models)} "
        f"models x {options.samples} samples; {done} already completed, {len(todo)} to run"
        + (f" ({changed} changed since completed)" if changed else ""))

    scoring = None
    if scores is not None:
        if scores.existing.torn_bytes:
            say(f"--scores {scores.path}: cut off a torn last line "
                f"({scores.existing.torn_bytes} bytes, from an interrupted run)")
        scoring = Scoring(config, selected, scores, budget=budget)
        _score_done(scoring, options.output, {u.key for u in work} - {u.key for u in todo})
    session = _Session(config, options, todo, writer, progress_console
                       or text_console(err), scoring=scoring, budget=budget)
    started = time.monotonic()
    try:
        if todo or (scoring is not None and scoring.pending):
            trio.run(session.run, endpoint)
    except BaseException as exc:
        if not _only(exc, KeyboardInterrupt):
            raise
        # A second Ctrl-C: out at once; what was written stays, the rest is redone next time.
        say("stopped at once; run the same command again to finish")
        return EXIT_INTERRUPTED
    writer.close()  # the last records are tried once more, then synced
    elapsed = time.monotonic() - started

    counts = session.counts
    ran = sum(counts.values()) + session.redone
    if ran:
        parts = [f"{n} {state}" for state, n in counts.most_common()]
        if session.redone:
            parts.append(f"{session.redone} cut and redone")
        say(f"this run: {ran} streams in {elapsed:.1f}s ({ran / elapsed:.1f}/s): "
            f"{', '.join(parts)}")
    for name, limit in session.limits.items():
        if limit.rate_limited:
            say(f"{name}: {limit.rate_limited} 429s; concurrency went down to "
                f"{limit.lowest} of {limit.maximum} and is {limit.limit} now; submissions "
                f"paused {limit.paused:.1f}s")
    for line in session.cut_lines():
        say(line)
    failed_write = writer.error
    unrecorded = {key for key, _ in writer.unwritten}
    if failed_write is not None:
        lost = len(writer.unwritten)
        say(f"-o {options.output}: cannot write: {failed_write.strerror or failed_write}; "
            "no new stream was sent after that; "
            + (f"{lost} finished stream{'s' if lost != 1 else ''} could not be recorded "
               "(they run again next time)" if lost else
               "every finished stream was recorded after all"))
    # The whole file, as `fanout report` reads it: earlier runs and this one.
    console = console or summary_console(out)
    try:
        with open(options.output, "rb") as file:
            console.print(summary_view(model_summary(RecordReader(file)), console))
    except OSError as exc:
        say(f"-o {options.output}: cannot read it back for the summary: {exc.strerror or exc}")
    failed_judges: str | None = None
    if scoring is not None and scores is not None:
        scores.close()
        for item in selected:
            print(printable(scoring.tallies[item.name].line(item.name)), file=out)
        print(f"scores: {printable(str(scores.path))}", file=out)
        if scores.error is not None:
            say(f"--scores {scores.path}: cannot write: {scores.error.strerror or scores.error}"
                "; `fanout score` on the results file scores what is missing")
        failed_judges = _failed_judges(scoring, selected, options)
        if failed_judges is not None:
            say(failed_judges)
    if session.interrupted:
        say("interrupted: the streams in flight were recorded as cancelled; "
            "run the same command again to finish")
        return EXIT_INTERRUPTED
    if budget is not None and budget.stopped:
        not_sent = sum(len(queue) for queue in session.queues.values())
        say(budget.describe(not_sent))
        return EXIT_BUDGET
    if budget is not None:
        say(budget.spent_line())

    finals: dict[str, _Final] = {}
    for unit in work:
        final = session.finals.get(unit.key)
        if final is None:  # not run this time: as the file says
            state = (existing.latest.get(unit.key) or {}).get("state")
            final = _Final(unit.model.name, str(state), None, None)
        if not is_done(final.state, options.accept_empty) or unit.key in unrecorded:
            finals[unit.key] = final
    if failed_write is not None:
        say(f"{len(finals)} of {len(work)} streams are not completed or not recorded; once "
            f"{options.output} can be written, run the same command again to finish")
        return 1
    if finals:
        for line in not_completed(finals, len(work), session.ran_per_model,
                                  accept_empty=options.accept_empty):
            say(line)
        return 1
    return 1 if failed_judges is not None else 0


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
    from .score import as_scored, latest_records

    if not keys:
        return
    try:
        latest, _ = latest_records(output)
    except OSError:
        return  # read a moment ago; `fanout score` can do it later
    for key, record in latest.items():
        if key in keys:
            scoring.add(as_scored(record))


@attrs.frozen
class _Final:
    """How one unit ended in this run: enough to say whether a rerun can help."""

    model: str
    state: str
    status: int | None
    reason: str | None


def not_completed(finals: dict[str, _Final], total: int, ran: Counter[str], *,
                  accept_empty: bool) -> list[str]:
    """What the end of a run says about the units that are not done (key -> how each
    ended), ``ran``: how many units of each model ended in this run.

    Running the same command again is advised only for what it can fix.  It
    cannot fix a request the server refuses as sent (HTTP 4xx but 408, 409 and
    429), nor a model that failed every one of its units this run the same way
    (the same state and HTTP status, at least 2 of them; the requests it
    refused aside): the next run would send the same requests to the same
    model.  Anything else (a stream cut, timed out, a 5xx, a failure some units
    of the model did not meet) may go the other way next time.
    """
    lines = [f"{len(finals)} of {total} streams are not completed"]
    by_model: dict[str, list[_Final]] = {}
    for final in finals.values():
        by_model.setdefault(final.model, []).append(final)
    hopeless = 0
    for model, failed in by_model.items():
        refused = [f for f in failed if f.status in FINAL_STATUSES]
        name = printable(model)
        if _all_the_same(failed, ran[model]):
            hopeless += len(failed)
            lines.append(_same_way(name, failed, "", accept_empty=accept_empty))
            continue
        if refused:
            hopeless += len(refused)
            statuses = sorted({f.status for f in refused if f.status is not None})
            reason = refused[0].reason
            why = f"HTTP {', '.join(map(str, statuses))}"
            if reason:
                reason = cut_line(printable(reason), 160)
                why = f"{why}; e.g. {reason}" if len(statuses) > 1 else reason
            lines.append(f"{name}: {len(refused)} request{'s' if len(refused) != 1 else ''} "
                         f"refused as sent ({why}): running again sends "
                         f"{'them' if len(refused) != 1 else 'it'} unchanged; fix the "
                         "prompt, the params or the model")
            others = [f for f in failed if f.status not in FINAL_STATUSES]
            if others and _all_the_same(others, ran[model] - len(refused)):
                hopeless += len(others)
                lines.append(_same_way(name, others, "other ", accept_empty=accept_empty))
    rest = len(finals) - hopeless
    if rest and not hopeless:
        lines[0] += "; run the same command again to redo them"
    elif rest:
        lines.append(f"run the same command again to redo the other {rest}")
    return lines


def _all_the_same(failed: list[_Final], ran: int) -> bool:
    """Every one of the model's units that ended this run (at least 2) is in ``failed``,
    and all ended the same way."""
    return len(failed) == ran >= 2 and len({(f.state, f.status) for f in failed}) == 1


def _same_way(name: str, failed: list[_Final], other: str, *, accept_empty: bool) -> str:
    example = next((f for f in failed if f.reason), failed[0])
    why = f" ({cut_line(printable(example.reason), 160)})" if example.reason else ""
    hint = ("; --accept-empty counts empty answers as done"
            if example.state == "empty" and not accept_empty else "")
    return (f"{name}: all {len(failed)} of its {other}streams this run "
            f"{_ended(example.state)}{why}: running the same command again will not help"
            f"{hint}")


def _ended(state: str) -> str:
    return {"empty": "came back empty", "error": "failed", "timed_out": "timed out",
            "truncated": "were truncated", "cancelled": "were cancelled"}.get(
                state, f"ended {state}")


def _whole() -> Column:
    return Column(no_wrap=True)  # a number is never cut: the bar gives way first


class _Bar(Progress):
    """The progress bar: on one line where it fits, else the counts on a line of their
    own (wrapped at spaces), so no number is ever cut."""

    def __init__(self, *, console: Console, label: str = "fanout batch",
                 **options: Any) -> None:
        self._screen = console
        self._narrow = (BarColumn(bar_width=None), MofNCompleteColumn(table_column=_whole()),
                        TextColumn("{task.fields[rate]}", table_column=_whole()),
                        TimeElapsedColumn(table_column=_whole()),
                        TextColumn("ETA", table_column=_whole()),
                        TimeRemainingColumn(table_column=_whole()))
        super().__init__(TextColumn(label, table_column=_whole()), BarColumn(),
                         MofNCompleteColumn(table_column=_whole()),
                         TextColumn("{task.fields[outcomes]}", table_column=_whole()),
                         TextColumn("{task.fields[rate]}", table_column=_whole()),
                         TimeElapsedColumn(table_column=_whole()),
                         TextColumn("ETA", table_column=_whole()),
                         TimeRemainingColumn(table_column=_whole()), console=console,
                         **options)

    def get_renderables(self) -> Iterable[RenderableType]:
        table = self.make_tasks_table(self.tasks)
        screen = self._screen
        if screen.measure(table, options=screen.options.update_width(10**6)).maximum \
                <= screen.width:
            yield table
            return
        wide, self.columns = self.columns, self._narrow
        try:
            table = self.make_tasks_table(self.tasks)
        finally:
            self.columns = wide
        yield table
        for task in self.tasks:
            if task.fields.get("outcomes"):
                yield Text(task.fields["outcomes"], overflow="fold")


class _Session:
    def __init__(self, config: Config, options: BatchOptions, todo: list[Work],
                 writer: ResultsFile, progress_console: Console, *,
                 scoring: Scoring | None = None, budget: Budget | None = None) -> None:
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
        self.progress_console = progress_console
        self.counts: Counter[str] = Counter()  # final states of this run's units
        self.finals: dict[str, _Final] = {}  # key -> how it ended, in this run
        self.ran_per_model: Counter[str] = Counter()  # units that ended, per model
        self.interrupted = False
        self.stopped = False  # the results file cannot be written: nothing new is sent
        self._submitting = trio.CancelScope()
        self._bar: tuple[Progress, TaskID, float] | None = None
        self.by_key = {unit.key: unit for unit in todo}
        global_cap = options.concurrency or config.max_concurrency or DEFAULT_CONCURRENCY
        self.global_cap = global_cap
        self.endpoint = EndpointLimit(global_cap)
        self.limits: dict[str, AdaptiveLimit] = {}
        self.queues: dict[str, deque[Work]] = {}
        for unit in todo:
            model = unit.model
            if model.name not in self.limits:
                cap = (options.per_model_concurrency or model.concurrency
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
        self.redone = 0  # records written for streams that were cut and redone
        self._redoing = 0  # units waiting for or running their redo
        self.cut_by: Counter[str] = Counter()  # model -> its cuts that were redone
        self.cut_level: int | None = None  # fewest streams running when one was cut
        self.still_cut = 0  # units cut again after MAX_REDOS redos
        self.relayed = 0  # cuts that came as a normal end ("stop"), a relay's doing
        self.excused: dict[str, int] = {}  # model -> its cuts, found its own (it fails alone)
        # A relay that drops usage on a cut: see _is_cut.
        self._usage_seen = False  # a completed stream of this endpoint had usage
        self._usage_optional = False  # one completed without usage with nothing else running
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
            nursery.start_soon(interrupt_on_sigint, partial(self._interrupt, fan))
            nursery.start_soon(self._fsync_every_second)
            nursery.start_soon(self._progress)
            nursery.start_soon(self._submit_all, fan, self._submitting)
            judged = trio.Event()
            if self.scoring is not None:
                nursery.start_soon(self._judge, self.scoring, resolved, judged)
            await self._consume(fan)
            self._update_bar()  # the last frame shows the end, not the frame before it
            if self.scoring is not None:
                self._score_suspects()  # never known to be cut: they stand
                self.scoring.close()
                await judged.wait()
                self._update_bar()  # and the judges' end
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
                await limit.wait_if_paused()
                await limit.limiter.acquire_on_behalf_of(unit.key)
                try:
                    await self.endpoint.limiter.acquire_on_behalf_of(unit.key)
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
        self._pending -= 1
        redo = self.redos[unit.key]
        if redo:
            self._redoing -= 1
        cut = self._is_cut(unit, result)
        again = cut and redo < MAX_REDOS and not self.interrupted and not self.stopped
        record = batch_record(unit, result, cut=again, redo=redo)
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
            self.finals[unit.key] = _Final(name, state, result.status, result.reason)
            if is_done(state, self.options.accept_empty):
                limit.succeeded()
                if not self._redoing:  # a slot back never lands on a redo's head
                    self.endpoint.succeeded()
            elif result.status == 429:  # retries ran out on a 429: that is a signal too
                limit.rate_limited_now(trio.current_time(), None)
            if suspect:
                self._suspects[unit.key] = (unit, sent, result.others_running + 1, record)
        if result.outcome == Outcome.COMPLETED and result.usage is not None \
                and not self._usage_seen:
            self._usage_seen = self.endpoint.usage_seen = True
            self._redo_suspects()
        self._wake_submitters(name)

    def _is_cut(self, unit: Work, result: StreamResult) -> bool:
        """Whether the server cut this stream because others ran: it ended truncated, or
        completed with an empty answer, or completed without usage where the endpoint
        sends usage (a relay that drops usage on a cut: LiteLLM's finish_reason "stop"
        on llama.cpp's cut); and other streams were running.

        The same ending with nothing else running says it happens on its own: a model
        that truncates (or answers empty) alone stops counting as cut (``excused``), and
        an endpoint that completes a stream without usage alone stops the usage rule.
        """
        name = unit.model.name
        others = result.others_running
        if result.outcome == Outcome.COMPLETED:
            if Flag.EMPTY_ANSWER in result.flags and not self.options.accept_empty:
                return self._looks_cut(name, others)
            if result.usage is None and not self._usage_optional:
                if not others:
                    self._usage_optional = True
                    self._score_suspects()
                return bool(others) and self._usage_seen
            return False
        return result.outcome == Outcome.TRUNCATED and self._looks_cut(name, others)

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

    def _score_suspects(self) -> None:
        """The suspects were not cut after all: their records are scored."""
        if self.scoring is not None:
            for _, _, _, record in self._suspects.values():
                self.scoring.add(record)
        self._suspects.clear()

    def _suspect(self, unit: Work, result: StreamResult, sent: float) -> bool:
        # Completed without usage while others ran, before the endpoint showed it sends
        # usage: a cut if it turns out to (then it is redone, see _redo_suspects).
        return (result.outcome == Outcome.COMPLETED and result.usage is None
                and result.others_running > 0 and not self._usage_seen
                and not self._usage_optional and self.redos[unit.key] < MAX_REDOS
                and not self.interrupted and not self.stopped)

    def _redo_suspects(self) -> None:
        """Usage came: the streams that completed without it while others ran were cut
        after all; they are redone (their records stay; the redo's record follows)."""
        for key, (unit, sent, running, _) in self._suspects.items():
            final = self.finals.pop(key)
            self.counts[final.state] -= 1
            self.ran_per_model[final.model] -= 1
            self.by_key[key] = unit
            self.relayed += 1
            self._cut(unit, sent, running)
            self._wake_submitters(unit.model.name)
        self._suspects.clear()

    def _cut(self, unit: Work, sent: float, running: int) -> None:
        """Redo a unit the server cut (sent at ``sent``, cut while ``running`` streams ran,
        itself included), at the front of its model's queue; tell the endpoint's limit."""
        self.cut_level = running if self.cut_level is None else min(self.cut_level, running)
        self.endpoint.cut(sent, trio.current_time(), running)
        self.cut_by[unit.model.name] += 1
        self.redos[unit.key] += 1
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
            where = f" on {_shown_url(endpoint.url)}" if endpoint.url else ""
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
                lines.append(f"{printable(name)}: {count} of its streams that ended while others "
                             "ran were redone; it ends that way alone too, so it was not the "
                             "server cutting them" + (
                                 f"; concurrency is back to {self.endpoint.limit}"
                                 if not cuts else ""))
        return lines

    def _interrupt(self, fan: Fanout) -> None:
        # Ctrl-C: stop submitting, cancel what runs (recorded as cancelled with its
        # partial output); the summary follows.
        self.interrupted = True
        self._submitting.cancel()
        fan.cancel_all()
        if self.scoring is not None:
            self.scoring.stop()

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
            done += scoring.judged
        return done, total

    async def _progress(self) -> None:
        console = self.progress_console
        if not console.is_terminal:
            start = trio.current_time()
            while True:
                await trio.sleep(PLAIN_PROGRESS_EVERY)
                console.print(self._line(trio.current_time() - start), soft_wrap=True)
        with _Bar(console=console, auto_refresh=False, transient=False) as bar:
            self._bar = (bar, bar.add_task("batch", total=self._done_of()[1], outcomes="",
                                           rate=""),
                         trio.current_time())
            while True:
                self._update_bar()
                await trio.sleep(0.1)

    def _update_bar(self) -> None:
        if self._bar is None:
            return
        bar, task, start = self._bar
        done, total = self._done_of()
        elapsed = trio.current_time() - start
        bar.update(task, completed=done, total=total, outcomes=self._outcomes(),
                   rate=f"{done / elapsed:.1f}/s" if elapsed > 0 else "")
        bar.refresh()

    def _outcomes(self) -> str:
        parts = [f"{state} {n}" for state, n in sorted(self.counts.items())]
        if self.redone:
            parts.append(f"cut {self.redone}")
        if self.scoring is not None and self.scoring.judges:
            parts.append(f"judged {self.scoring.judged}")
        return " ".join(parts)

    def _line(self, elapsed: float) -> str:
        done, total = self._done_of()
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 else ""
        return (f"fanout batch: {done}/{total} done ({self._outcomes() or 'none yet'}), "
                f"{rate:.1f}/s{eta}")
