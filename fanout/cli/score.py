"""``fanout score RESULTS.jsonl --score NAME``: (re)score a results file, answers untouched.

The reported record of every (prompt id, model, sample) of the results file
(``fanout.store.results.latest_records``: its latest, unless a redo of the same
run failed with no output after an attempt that kept some) is scored by every
``--score`` scorer (a ``[[scorers]]`` name of the config, or a builtin:
``fanout.eval.scorers.BUILTIN``) into the scores file (``RESULTS.scores.jsonl``,
or ``--scores FILE``; see ``fanout.store.scores``).
No model request is sent but a judge's.  A score already in the file for the
same answer and scorer is current and kept (``--rescore`` scores it again), so
running the same command twice scores nothing new, and a run killed midway
is completed by the next.  A record the server cut while others ran (a redo
never came) is unscored, like any stream that did not complete.

``--prompts PROMPTS.jsonl``: each prompt line's ``expected``, ``category``,
``tags`` and messages override the record's, by prompt id (a results id with
no prompt line keeps its record's, and is counted).

Exit status (``fanout.batch.ExitCode``, the table of ``fanout batch``): 0 when
every score was written and every judge answered; 75 when a write failed or a
judge stream did not complete (its score is an ``error``; running again asks
it again); 1 when every judge that failed refused the request as sent (HTTP
4xx but 408, 409, 429: a rerun sends the same); 2 for bad usage or input, 130
after Ctrl-C and 143 after SIGTERM: no judge request is sent after it, the
judges in flight are cancelled (they get no score; a rerun asks them) and
what was scored stays; a second Ctrl-C leaves at once.  On a terminal a
progress bar counts the judge requests.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio
from rich.console import Console

from .._exceptions import ConfigError
from ..batch.options import ExitCode
from ..config import Config, load_config
from ..eval.run import Scoring, Selected, UnknownScorer, as_scored, select_scorers
from ..request import Endpoint
from ..store.prompts import PromptFileError, load_prompts
from ..store.results import ResultsFileError, holder_of, latest_records, lock_path
from ..store.scores import ScoresFile, scores_path
from .common import environment_note, interrupt_on_sigint, open_endpoint, text_console
from .common import only as _only
from .report import printable

__all__ = ["ScoreOptions", "run_score"]

EXIT_INTERRUPTED = ExitCode.INTERRUPTED
EXIT_TERMINATED = ExitCode.TERMINATED
#: Units listed by key in a summary line (the rest are counted).
LISTED = 5


@attrs.frozen
class ScoreOptions:
    results: str
    scorers: tuple[str, ...]
    scores: str | None = None
    prompts: str | None = None
    config: str | None = None
    rescore: bool = False


def _being_written(path: str) -> str | None:
    """Who is writing the results file at ``path`` (a batch holds its lock), or
    ``None``: scoring it then sees the records written so far, not the batch's end."""
    try:
        with open(path, "rb") as file:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return holder_of(lock_path(path))
            except OSError:  # a file system without locks: nothing to tell
                return None
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None


def run_score(options: ScoreOptions, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None, environ: dict[str, str] | None = None) -> int:
    """Score a results file; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def say(message: str) -> None:
        print(f"fanout score: {printable(message)}", file=err)

    def fail(message: str) -> int:
        say(message)
        return 2

    if not options.scorers:
        return fail("no scorer: give --score NAME (a [[scorers]] name or a builtin)")
    try:
        config = load_config(options.config, environ=environ)
    except ConfigError as exc:
        for line in exc.problems or [str(exc)]:
            say(line)
        return 2
    try:
        selected = select_scorers(config, options.scorers)
    except (UnknownScorer, ValueError, ConfigError) as exc:
        return fail(str(exc))
    endpoint: Endpoint | None = None
    if any(s.is_judge for s in selected):
        note = environment_note(options.config, environ)
        if note is not None:
            say(note)
        try:
            endpoint = config.endpoint(environ)
        except ConfigError as exc:
            return fail(str(exc))
    prompts: dict[str, dict[str, Any]] | None = None
    if options.prompts is not None:
        try:
            prompts = {str(p.id): {"messages": [dict(m) for m in p.messages],
                                   **p.eval_fields()}
                       for p in load_prompts(options.prompts)}
        except PromptFileError as exc:
            for problem in exc.problems:
                say(problem)
            if exc.total:
                say(f"{exc}; nothing was scored")
            return 2
    try:
        source = os.stat(options.results)
        latest, reader = latest_records(options.results)
    except FileNotFoundError:
        return fail(f"{options.results}: no such results file")
    except IsADirectoryError:
        return fail(f"{options.results}: is a directory, not a results file")
    except OSError as exc:
        return fail(f"{options.results}: cannot read: {exc.strerror or exc}")
    if not latest:
        extra = f" ({reader.unreadable.describe()[0]})" if reader.unreadable else ""
        return fail(f"{options.results}: no results records{extra}; nothing to score")
    if reader.unreadable:
        say(f"{options.results}: {reader.unreadable.total} line"
            f"{'s are' if reader.unreadable.total != 1 else ' is'} not records and "
            f"{'are' if reader.unreadable.total != 1 else 'is'} skipped "
            f"({reader.unreadable.describe()[0]})")
    writing = _being_written(options.results)
    if writing is not None:
        say(f"{options.results}: being written by a running fanout batch ({writing}); "
            f"scoring the {len(latest)} unit{'s' if len(latest) != 1 else ''} recorded so "
            "far: run the same command again once it ends to score the rest")
    target = Path(options.scores) if options.scores else scores_path(options.results)
    try:
        writer = ScoresFile(target, not_same_as=(f"the results file {options.results}", source))
    except ResultsFileError as exc:
        if exc.temporary:  # another run holds it, the disk is full: later
            say(f"--scores {exc}; nothing was scored")
            say(f"exit {ExitCode.TEMPFAIL}: nothing was scored; a rerun may finish")
            return ExitCode.TEMPFAIL
        return fail(f"--scores {exc}; nothing was scored")
    try:
        return _run(options, config, selected, endpoint, latest, prompts, writer, out, say,
                    text_console(err))
    finally:
        writer.close()


def _run(options: ScoreOptions, config: Config, selected: list[Selected],
         endpoint: Endpoint | None, latest: dict[str, dict[str, Any]],
         prompts: dict[str, dict[str, Any]] | None, writer: ScoresFile, out: TextIO,
         say: Callable[[str], None], progress_console: Console) -> int:
    if writer.existing.torn_bytes:
        say(f"{writer.path}: cut off a torn last line ({writer.existing.torn_bytes} bytes, "
            "from an interrupted run) before appending")
    scoring = Scoring(config, selected, writer, rescore=options.rescore)
    scoring.sync_inline = True  # outside trio: no task syncs every second
    without_prompt: list[str] = []
    unscored: list[str] = []
    try:
        for record in latest.values():
            prompt = None
            if prompts is not None:
                prompt = prompts.get(str(record["id"]))
                if prompt is None:
                    without_prompt.append(str(record["id"]))
            scored = as_scored(record)
            if scored.get("outcome") != "completed":
                unscored.append(f"{record['id']}/{record['model']}#{record['sample']}")
            scoring.add(scored, prompt)
    except KeyboardInterrupt:
        # Every score so far is written (one line each); the rest are scored next time.
        say("interrupted: the scores written so far stay; run the same command again to "
            "finish")
        return EXIT_INTERRUPTED
    scoring.close()
    if without_prompt:
        ids = sorted(set(without_prompt))
        shown = ", ".join(map(repr, ids[:LISTED])) + (", …" if len(ids) > LISTED else "")
        say(f"--prompts {options.prompts}: {len(ids)} prompt id{'s' if len(ids) != 1 else ''}"
            f" of the results have no line there ({shown}); their records' expected values "
            "are used")
    interrupted = False
    status_if_interrupted = EXIT_INTERRUPTED
    if scoring.pending:
        pending = scoring.pending
        say(f"{pending} judge request{'s' if pending != 1 else ''} to send")
        scoring.sync_inline = False  # the judges' task syncs every second
        terminated: list[bool] = []
        try:
            trio.run(_judge, scoring, writer, endpoint, terminated, progress_console)
        except BaseException as exc:
            if not _only(exc, KeyboardInterrupt):
                raise
            say("stopped at once; run the same command again to finish")
            return EXIT_INTERRUPTED
        interrupted = scoring.interrupted
        if terminated:
            status_if_interrupted = EXIT_TERMINATED
    writer.close()
    failed_judges = 0
    for item in selected:
        tally = scoring.tallies[item.name]
        print(printable(tally.line(item.name)), file=out)
        failed_judges += tally.judge_failed
    print(f"scores: {printable(str(writer.path))}", file=out)
    if unscored:
        shown = ", ".join(unscored[:LISTED]) + (", …" if len(unscored) > LISTED else "")
        say(f"{len(unscored)} unit{'s' if len(unscored) != 1 else ''} did not complete and "
            f"{'are' if len(unscored) != 1 else 'is'} unscored (not failed): {shown}")
    if writer.error is not None:
        say(f"--scores {writer.path}: cannot write: {writer.error.strerror or writer.error}; "
            "run the same command again once it can be written")
        say(f"exit {ExitCode.TEMPFAIL}: the scores could not all be written; a rerun may "
            "finish")
        return ExitCode.TEMPFAIL
    if interrupted:
        say("interrupted: the judges not asked yet are left; run the same command again to "
            "finish")
        say(f"exit {status_if_interrupted}: interrupted "
            f"({'SIGTERM' if status_if_interrupted == EXIT_TERMINATED else 'Ctrl-C'})")
        return status_if_interrupted
    if failed_judges:
        refused = sum(scoring.tallies[item.name].judge_refused for item in selected)
        say(f"{failed_judges} judge stream{'s' if failed_judges != 1 else ''} did not complete "
            "(error scores); running the same command again asks "
            f"{'them' if failed_judges != 1 else 'it'} again")
        if refused == failed_judges:
            say(f"exit {ExitCode.FAILED}: {refused} judge request"
                f"{'s were' if refused != 1 else ' was'} refused as sent (HTTP 4xx); a rerun "
                "will not fix that: fix the judge's model or params")
            return ExitCode.FAILED
        say(f"exit {ExitCode.TEMPFAIL}: {failed_judges - refused} judge stream"
            f"{'s' if failed_judges - refused != 1 else ''} did not complete; a rerun may "
            "finish")
        return ExitCode.TEMPFAIL
    say(f"exit {ExitCode.DONE}: every score is written")
    return ExitCode.DONE


async def _judge(scoring: Scoring, writer: ScoresFile, endpoint: Endpoint | None,
                 terminated: list[bool], console: Console) -> None:
    progress = _Progress(scoring, console)
    async with open_endpoint(endpoint) as resolved, trio.open_nursery() as nursery:
        nursery.start_soon(interrupt_on_sigint, partial(_interrupt, scoring, nursery))
        nursery.start_soon(_stop_on_sigterm, scoring, terminated)
        nursery.start_soon(_fsync_every_second, writer)
        nursery.start_soon(progress.run)
        await scoring.run(resolved)
        progress.update()  # the last frame shows the end
        nursery.cancel_scope.cancel()


class _Progress:
    """The judge requests, answered of queued: a bar on a terminal (drawn every 0.1 s),
    else a line every ``PLAIN_PROGRESS_EVERY`` seconds."""

    def __init__(self, scoring: Scoring, console: Console) -> None:
        self.scoring = scoring
        self.console = console
        self._bar: tuple[Any, Any, float] | None = None

    async def run(self) -> None:
        from .batch import PLAIN_PROGRESS_EVERY, _Bar

        scoring, console = self.scoring, self.console
        if not console.is_terminal:
            while True:
                await trio.sleep(PLAIN_PROGRESS_EVERY)
                console.print(f"fanout score: {scoring.judged}/{scoring.queued} judge requests "
                              "ended", soft_wrap=True)
        with _Bar(console=console, label="fanout score", auto_refresh=False,
                  transient=False) as bar:
            self._bar = (bar, bar.add_task("score", total=scoring.queued, outcomes="",
                                           rate=""), trio.current_time())
            while True:
                self.update()
                await trio.sleep(0.1)

    def update(self) -> None:
        if self._bar is None:
            return
        bar, task, start = self._bar
        scoring = self.scoring
        elapsed = trio.current_time() - start
        failed = sum(t.judge_failed for t in scoring.tallies.values())
        outcomes = f"judged {scoring.judged}" + (f" failed {failed}" if failed else "")
        bar.update(task, completed=scoring.judged, total=scoring.queued, outcomes=outcomes,
                   rate=f"{scoring.judged / elapsed:.1f}/s" if elapsed > 0 else "")
        bar.refresh()


async def _stop_on_sigterm(scoring: Scoring, terminated: list[bool]) -> None:
    """SIGTERM (what process managers and ``timeout`` send) stops like the first
    Ctrl-C: no more judges sent, the scores written stay, the exit status is 143."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            terminated.append(True)
            scoring.stop()


def _interrupt(scoring: Scoring, nursery: trio.Nursery) -> None:
    scoring.stop()


async def _fsync_every_second(writer: ScoresFile) -> None:
    while True:
        await trio.sleep(1)
        await trio.to_thread.run_sync(writer.sync)
