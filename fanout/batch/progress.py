"""What a running batch tells whoever watches it: a small observer interface.

The library never prints.  A caller that wants to show progress passes a
``BatchObserver`` (override what you need; every method does nothing by
default).  Its methods are called from inside the run's trio loop, so they
must return quickly and never block; an exception raised in one ends the run.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["BatchObserver", "BatchProgress"]


@attrs.frozen
class BatchProgress:
    """Where a running batch is: ``done`` requests ended of ``total`` (the units of this
    run, plus the judges' requests when a judge scores them), ``counts``: this run's
    units by state, ``redone``: streams cut and redone, ``judged``: judge requests
    ended (``None`` without a judge), ``elapsed``: seconds since the streams began."""

    done: int
    total: int
    counts: Mapping[str, int]
    redone: int = 0
    judged: int | None = None
    elapsed: float = 0.0

    def outcomes(self) -> str:
        """``completed 12 error 1 cut 2 judged 5``: the counts in one short line."""
        parts = [f"{state} {n}" for state, n in sorted(self.counts.items())]
        if self.redone:
            parts.append(f"cut {self.redone}")
        if self.judged is not None:
            parts.append(f"judged {self.judged}")
        return " ".join(parts)


class BatchObserver:
    """Receives what a batch says while it runs.  Subclass it and override what you
    need; the base class ignores everything."""

    def note(self, line: str) -> None:
        """A line worth telling a person (the plan, a repaired torn tail).  It may hold
        file names and model names: escape it before a terminal shows it."""

    def started(self, progress: BatchProgress) -> None:
        """The streams begin (called once, before any is sent)."""

    def progress(self, progress: BatchProgress) -> None:
        """Called about ten times a second while streams run, and once at the end."""

    def finished(self, progress: BatchProgress) -> None:
        """Every stream (and judge) ended, or the run was interrupted: the last call."""
