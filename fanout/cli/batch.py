"""``fanout batch``: the batch library (``fanout.batch``) with a progress bar and a summary.

Everything the run does is ``fanout.batch.run_sync``; this module draws it: the
library's notes as ``fanout batch: ...`` lines on stderr (every line through
``report.printable``: model text and file names reach it, and must neither
drive the terminal nor fail to encode), a progress bar on a terminal (else a
line every ``PLAIN_PROGRESS_EVERY`` seconds), then the per-model summary of the
whole results file on stdout, and the closing lines, the last of which names
the exit status and its case (``fanout.batch.ExitCode``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

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
from ..batch import BatchObserver, BatchOptions, BatchProgress, ExitCode, run_sync
from ..store.results import RecordReader
from .common import environment_note, text_console
from .report import model_summary, printable, summary_console, summary_view

__all__ = ["PLAIN_PROGRESS_EVERY", "BatchOptions", "run_batch"]

#: Seconds between progress lines when stderr is not a terminal.
PLAIN_PROGRESS_EVERY = 10.0


def run_batch(options: BatchOptions, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None, environ: Mapping[str, str] | None = None,
              console: Console | None = None, progress_console: Console | None = None) -> int:
    """Run a batch and show it; returns the exit status (``fanout.batch.ExitCode``)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def say(message: str) -> None:
        print(f"fanout batch: {printable(message)}", file=err)

    note = environment_note(options.config, environ)
    if note is not None:
        say(note)
    view = _View(progress_console or text_console(err), say)
    try:
        summary = run_sync(options, observer=view, environ=environ, handle_signals=True)
    except ConfigError as exc:
        for line in exc.problems or [str(exc)]:  # one problem a line
            say(line)
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        # A second Ctrl-C: out at once; what was written stays, the rest is redone next time.
        say("stopped at once; run the same command again to finish")
        return int(ExitCode.INTERRUPTED)
    finally:
        view.stop()
    for line in summary.report:
        say(line)
    if summary.started:
        # The whole file, as `fanout report` reads it: earlier runs and this one.
        shown = console or summary_console(out)
        try:
            with open(options.output, "rb") as file:
                shown.print(summary_view(model_summary(RecordReader(file)), shown))
        except OSError as exc:
            say(f"-o {options.output}: cannot read it back for the summary: "
                f"{exc.strerror or exc}")
    if summary.scores is not None:
        for line in summary.scorer_lines:
            print(printable(line), file=out)
        print(f"scores: {printable(summary.scores)}", file=out)
    for line in summary.closing:
        say(line)
    say(summary.exit_line())
    return int(summary.exit_code)


class _View(BatchObserver):
    """The library's notes as lines, its progress as a bar (a terminal) or a line every
    ``PLAIN_PROGRESS_EVERY`` seconds."""

    def __init__(self, console: Console, say: Any) -> None:
        self.console = console
        self.say = say
        self._bar: tuple[Progress, TaskID] | None = None
        self._printed = 0.0

    def note(self, line: str) -> None:
        self.say(line)

    def started(self, progress: BatchProgress) -> None:
        if self.console.is_terminal:
            bar = _Bar(console=self.console, auto_refresh=False, transient=False)
            bar.start()
            self._bar = (bar, bar.add_task("batch", total=progress.total, outcomes="",
                                           rate=""))

    def progress(self, progress: BatchProgress) -> None:
        if self._bar is None:
            if progress.elapsed - self._printed >= PLAIN_PROGRESS_EVERY:
                self._printed = progress.elapsed
                self.console.print(_line(progress), soft_wrap=True)
            return
        bar, task = self._bar
        elapsed = progress.elapsed
        bar.update(task, completed=progress.done, total=progress.total,
                   outcomes=progress.outcomes(),
                   rate=f"{progress.done / elapsed:.1f}/s" if elapsed > 0 else "")
        bar.refresh()

    def finished(self, progress: BatchProgress) -> None:
        if self._bar is not None:
            self.progress(progress)
        self.stop()

    def stop(self) -> None:
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None


def _line(progress: BatchProgress) -> str:
    done, total, elapsed = progress.done, progress.total, progress.elapsed
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 else ""
    return (f"fanout batch: {done}/{total} done ({progress.outcomes() or 'none yet'}), "
            f"{rate:.1f}/s{eta}")


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
