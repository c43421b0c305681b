"""How a batch ended: its summary, each unfinished unit's failure, and the exit code.

A unit that is not done is a ``Failure``, **permanent** when running again
cannot change it; ``judge`` decides, for ``fanout batch`` and ``fanout merge``
alike, from the unit's failure class and the evidence of its model, never
from how many units one run happened to hold:

- the server refused the request as sent (HTTP 4xx but 408, 409 and 429):
  the same request gets the same answer;
- its model failed every one of its units the same way of its own (the same
  state and HTTP status: truncated, empty, timed out, or an error the server
  sent with a success status), on at least 2 samples: 2 units, or one unit
  that ended that way in 2 runs (the results file's earlier records count:
  a shard holding a single unit of a model that always truncates says so on
  its second run, not never).  The evidence is every unit of the model the
  caller can see: a shard's file (this run's records and earlier ones), or
  all the shards of a merge.

Anything else is **temporary**: a connection refused, a 5xx or 429 after
every retry, a timeout (some of a model's units, not all), a stream still
cut after every redo, a unit never sent (a write error stopped the run), a
unit not recorded (the disk was full), a single truncation seen once.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs

from ..core.result import says_cut
from ..net.stream import NO_SUCH_ROUTE
from ..store.results import RecordReader, attempt_of, supersedes, work_key
from .options import FINAL_STATUSES, ExitCode

__all__ = ["BatchSummary", "Evidence", "Failure", "Judgement", "exit_code", "explain",
           "file_evidence", "judge"]


@final
@attrs.frozen
class Failure:
    """One unit that is not done at the end of a run, and why.

    ``state``: how its latest record ended (``store.results.state_of``:
    ``error``, ``truncated``, ``empty``, ``timed_out``, ``cancelled``), or
    ``unsent`` (never sent: the run stopped first) or ``unrecorded`` (it ended,
    but its record could not be written).  ``status``: the last HTTP status, if
    any; ``reason``: what the stream said (server text: untrusted, escape it
    before a terminal shows it).  ``permanent``: a rerun will not fix it (see the
    module docstring).
    """

    key: str
    model: str
    state: str
    status: int | None = None
    reason: str | None = None
    permanent: bool = False


@final
@attrs.frozen
class BatchSummary:
    """What a batch run did, and what is left.

    Counts are of this shard's units: ``total`` in the plan, ``done`` (completed;
    with ``accept_empty``, empty too), ``left`` (the rest), ``counts`` (every unit by
    the state of its latest record, ``unsent`` for those never run), ``ran`` (the
    units that ended in this run, by state), ``redone`` (records of streams the
    server cut and that were redone at once).  ``failures``: every unit not done,
    each with its reason and whether a rerun may fix it.  ``exit_code``: the
    ``ExitCode`` a command line exits with; ``started``: false when nothing was tried
    (the results file was locked by another run, or the disk was full).  ``plan``,
    ``run``, ``shard``: what the records of this run carry.  ``report`` holds the lines
    that describe the run (for after the progress), ``closing`` those that end it (what
    is left, what to do); both hold server text (model names, reasons): escape before a terminal.
    """

    exit_code: ExitCode
    total: int
    done: int
    counts: Mapping[str, int]
    ran: Mapping[str, int]
    redone: int
    failures: tuple[Failure, ...]
    plan: str
    run: str
    shard: tuple[int, int]
    results: str
    scores: str | None = None
    scorer_lines: tuple[str, ...] = ()
    report: tuple[str, ...] = ()
    closing: tuple[str, ...] = ()
    elapsed: float = 0.0
    interrupted: bool = False
    budget_stopped: bool = False
    write_error: str | None = None
    judges_failed: int = 0
    started: bool = True

    @property
    def left(self) -> int:
        """Units not done."""
        return self.total - self.done

    @property
    def permanent(self) -> int:
        """Units not done that a rerun will not fix."""
        return sum(f.permanent for f in self.failures)

    @property
    def temporary(self) -> int:
        """Units not done that a rerun may finish."""
        return len(self.failures) - self.permanent

    def exit_line(self) -> str:
        """The last line of a run: its exit code and which case it is, e.g. ``exit 75: 3
        units are left that a rerun may finish (connection refused)``."""
        return f"exit {int(self.exit_code)}: {explain(self)}"


def _units(count: int) -> str:
    return f"{count} unit{'s' if count != 1 else ''}"


def _main_reason(failures: Sequence[Failure]) -> str:
    reasons = Counter((f.reason or f.state) for f in failures)
    if not reasons:
        return ""
    reason, _ = reasons.most_common(1)[0]
    return f" ({cut_line(reason, 121)})"


def explain(summary: BatchSummary) -> str:
    """Which case of the exit-code table the summary is, in words."""
    code = summary.exit_code
    temporary = [f for f in summary.failures if not f.permanent]
    permanent = [f for f in summary.failures if f.permanent]
    if code == ExitCode.DONE:
        return f"every unit is done ({summary.done} of {summary.total})"
    if code in (ExitCode.INTERRUPTED, ExitCode.TERMINATED):
        what = "Ctrl-C" if code == ExitCode.INTERRUPTED else "SIGTERM"
        return (f"interrupted ({what}); {_units(summary.left)} left, run the same command "
                "again to finish")
    if code == ExitCode.BUDGET:
        return f"the budget stopped the run; {_units(summary.left)} left"
    if code == ExitCode.TEMPFAIL:
        if summary.write_error is not None and not temporary:
            return "a file could not be written; a rerun may finish"
        if not temporary and summary.judges_failed:
            return (f"{summary.judges_failed} judge stream"
                    f"{'s' if summary.judges_failed != 1 else ''} did not complete; "
                    "a rerun of `fanout score` may finish")
        why = (" (a file could not be written)" if summary.write_error is not None
               else _main_reason(temporary))
        line = (f"{_units(len(temporary))} {'are' if len(temporary) != 1 else 'is'} left "
                f"that a rerun may finish{why}")
        if permanent:
            line += f"; {len(permanent)} more failed for good"
        return line
    if code == ExitCode.FAILED:
        return (f"{_units(len(permanent))} failed in ways a rerun will not fix"
                f"{_main_reason(permanent)}")
    return str(code.name).lower()


def exit_code(failures: Sequence[Failure], *, interrupted: ExitCode | None = None,
              budget_stopped: bool = False, write_error: bool = False,
              judges_failed: int = 0, judges_refused: int = 0) -> ExitCode:
    """The exit code of a run: interrupted first, then the budget; then 75 if anything
    left may be finished by a rerun (a temporary failure, a write error, a judge that
    did not answer for a reason other than refusing the request); then 1 if anything
    failed for good; else 0."""
    if interrupted is not None:
        return interrupted
    if budget_stopped:
        return ExitCode.BUDGET
    if write_error or judges_failed > judges_refused or any(
            not f.permanent for f in failures):
        return ExitCode.TEMPFAIL
    if failures or judges_refused:
        return ExitCode.FAILED
    return ExitCode.DONE


@attrs.frozen
class Final:
    """How one unit ended in this run: enough to say whether a rerun can help."""

    model: str
    state: str
    status: int | None
    reason: str | None


@attrs.frozen
class Judgement:
    """Which units that are not done failed for good (``judge``), and why: ``refused``
    (model -> its units the server refused as sent), ``same_way`` (model -> its units,
    not refused, that all failed one way of the model's own), ``permanent`` (both)."""

    refused: dict[str, list[str]]
    same_way: dict[str, list[str]]

    @property
    def permanent(self) -> set[str]:
        return {key for keys in (*self.refused.values(), *self.same_way.values())
                for key in keys}


def judge(failed: Mapping[str, Final], units: Mapping[str, int], *,
          samples: Callable[[str], int] | None = None) -> Judgement:
    """Which of the units not done (``failed``: key -> how it ended) a rerun will not
    fix, for ``fanout batch`` and ``fanout merge`` alike (see the module docstring).

    ``units``: how many units of each model the evidence holds, done or not (a
    shard's, a merge's).  ``samples(key)``: how many times that unit ended that very
    way (its records of the same request, the same state and status, a cut and redone
    aside), asked only for a model whose one unit is all the evidence; default 1.
    """
    by_model: dict[str, list[tuple[str, Final]]] = {}
    for key, ended in failed.items():
        by_model.setdefault(ended.model, []).append((key, ended))
    refused: dict[str, list[str]] = {}
    same_way: dict[str, list[str]] = {}
    for model, pairs in by_model.items():
        gone = [k for k, f in pairs if f.status in FINAL_STATUSES]
        if gone:
            refused[model] = gone
        others = [(k, f) for k, f in pairs if f.status not in FINAL_STATUSES]
        count = units.get(model, 0) - len(gone)
        if others and _all_the_same([f for _, f in others], count) and (
                count >= 2 or (samples is not None and sum(samples(k) for k, _ in others) >= 2)):
            same_way[model] = [k for k, _ in others]
    return Judgement(refused, same_way)


def not_completed(finals: Mapping[str, Final], total: int, units: Mapping[str, int], *,
                  accept_empty: bool, samples: Callable[[str], int] | None = None
                  ) -> tuple[list[str], list[Failure]]:
    """What the end of a run says about the units that are not done (key -> how each
    ended; ``units``: how many units of each model the shard holds, done or not): its
    lines, and each unit as a ``Failure``, permanent or not (``judge``, which
    ``samples`` goes to).

    Running the same command again is advised only for what it can fix.  It
    cannot fix a request the server refuses as sent (HTTP 4xx but 408, 409 and
    429), nor a model that failed every one of its units the same way of its own
    (the same state and HTTP status, on at least 2 samples, truncated, empty, timed
    out or an error in a 200 response; the requests it refused aside): the next run
    would send the same requests to the same model.  Anything else (a stream cut,
    timed out, a 5xx, a 429 after every retry, a connection refused, a failure some
    units of the model did not meet) may go the other way next time.
    """
    lines = [f"{len(finals)} of {total} streams are not completed"]
    verdict = judge(finals, units, samples=samples)
    models = list(dict.fromkeys(ended.model for ended in finals.values()))
    for model in models:
        refused = [(k, finals[k]) for k in verdict.refused.get(model, ())]
        same = [finals[k] for k in verdict.same_way.get(model, ())]
        if same and not refused:
            lines.append(_same_way(model, same, "", accept_empty=accept_empty))
            continue
        if refused:
            statuses = sorted({f.status for _, f in refused if f.status is not None})
            reason = refused[0][1].reason
            why = f"HTTP {', '.join(map(str, statuses))}"
            if reason:
                reason = cut_line(reason, 160)
                why = f"{why}; e.g. {reason}" if len(statuses) > 1 else reason
            fix = "the base URL" if all(NO_SUCH_ROUTE in (f.reason or "") for _, f in refused) \
                else "the prompt, the params or the model"
            lines.append(f"{model}: {len(refused)} request{'s' if len(refused) != 1 else ''} "
                         f"refused as sent ({why}): running again sends "
                         f"{'them' if len(refused) != 1 else 'it'} unchanged; fix {fix}")
            if same:
                lines.append(_same_way(model, same, "other ", accept_empty=accept_empty))
    permanent = verdict.permanent
    rest = len(finals) - len(permanent)
    if rest and not permanent:
        lines[0] += "; run the same command again to redo them"
    elif rest:
        lines.append(f"run the same command again to redo the other {rest}")
    failures = [Failure(key, ended.model, ended.state, ended.status, ended.reason,
                        key in permanent) for key, ended in finals.items()]
    return lines, failures


@attrs.frozen
class Evidence:
    """What a results file says of one unit: its reported record's state, HTTP status,
    reason and content key, and ``samples``: how many of its records (of that content
    key, none cut and redone) ended that very way (state and status)."""

    state: str
    status: int | None
    reason: str | None
    content_key: object
    samples: int = 1


def file_evidence(path: str | os.PathLike[str]) -> dict[str, Evidence]:
    """key -> ``Evidence`` of every unit the results file at ``path`` holds (``OSError``
    if it cannot be read)."""
    reported: dict[str, tuple[Any, Evidence]] = {}
    ways: Counter[tuple[str, object, str, int | None]] = Counter()
    with open(path, "rb") as file:
        for record in RecordReader(file):
            key = work_key(record["id"], record["model"], record["sample"])
            attempt = attempt_of(record)
            status = record.get("status")
            status = status if isinstance(status, int) and not isinstance(status, bool) \
                else None
            if record.get("cut") is not True:
                ways[(key, attempt.content_key, attempt.state, status)] += 1
            kept = reported.get(key)
            if kept is None or supersedes(kept[0], attempt):
                reason = record.get("reason")
                reported[key] = (attempt, Evidence(
                    attempt.state, status, reason if isinstance(reason, str) else None,
                    attempt.content_key))
    return {key: attrs.evolve(seen, samples=max(1, ways[(key, seen.content_key, seen.state,
                                                         seen.status)]))
            for key, (_, seen) in reported.items()}


def cut_line(text: str, limit: int) -> str:
    """``text`` on one line (runs of whitespace become one space), at most ``limit`` long."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _all_the_same(failed: Sequence[Final], units: int) -> bool:
    """Every one of the model's ``units`` is in ``failed``, and all ended the same way,
    a way that is the model's own: truncated, empty, timed out, or an error the server
    sent with a success status.  A way that is the server's or the network's (a 5xx, a
    408, 409 or 429, no response at all) may pass."""
    return len(failed) == units >= 1 and len({(f.state, f.status) for f in failed}) == 1 \
        and _its_own(failed[0])


def _its_own(final: Final) -> bool:
    if final.state in ("truncated", "empty", "timed_out"):
        return True
    # An error the server sent in a 200 stream, unless its words say a connection broke
    # (a relay's report of its backend's cut: the network's doing, not the model's).
    return (final.state == "error" and final.status is not None and final.status < 300
            and not says_cut(final.reason or ""))


def _same_way(name: str, failed: Sequence[Final], other: str, *, accept_empty: bool) -> str:
    example = next((f for f in failed if f.reason), failed[0])
    why = f" ({cut_line(example.reason, 160)})" if example.reason else ""
    hint = ("; --accept-empty counts empty answers as done"
            if example.state == "empty" and not accept_empty else "")
    if len(failed) > 1:
        what = f"all {len(failed)} of its {other}streams {_ended(example.state)}"
    else:  # one unit, that ended this way in more than one run
        what = f"its one {other}unit ended {example.state} in every run"
    return (f"{name}: {what}{why}: running the same command again will not help{hint}")


def _ended(state: str) -> str:
    return {"empty": "came back empty", "error": "failed", "timed_out": "timed out",
            "truncated": "were truncated", "cancelled": "were cancelled"}.get(
                state, f"ended {state}")

