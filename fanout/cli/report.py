"""Per-model summary of a results file: what ``fanout batch`` prints at its end and
``fanout report RESULTS.jsonl`` prints any time.

Outcomes, latencies, tokens and the reasons for failures count each key's
reported record: its latest (a redo replaces a failure), unless
``fanout.store.results.supersedes`` keeps an earlier one (a redo of the same run
that failed with no output after an attempt that kept some: that attempt's
reason says so, naming how the redo failed, and ``earlier_kept`` counts them);
429s and the time spent waiting on them count every record, since every attempt
cost something.  A completed
record with an empty answer counts as ``empty``, apart from ``completed``.
Tokens are ``None`` (shown ``-``) when no record of the model had usage: unknown
is not zero; a sum over only some of them is shown with a ``+``.

When the records name their plan (``fanout.store.plan_check``), a line on stderr
says whether the file is complete for it.

Any record shape is summarised without failing: a field of the wrong type
counts as missing.  Text from a results file reaches a terminal only through
``printable`` (escapes and controls removed, lone surrogates replaced).

The table fits the console: one table where it is wide enough (about 150
columns), else two tables (outcomes; latency, tokens and 429s), with two-line
headers when narrower, the model column folding; below about 60 columns one
block per model.  Every number is whole in each layout.

With scores (``RESULTS.scores.jsonl`` beside the results, or ``--scores``) the
report goes on with the evaluation (``fanout.eval.aggregate``, drawn by
``eval_report``): each scorer's table, cost, ``--against``'s comparison, and
``--html`` writes the page (``fanout.eval.html``).  The evaluation holds the
results file's records in memory (the summary alone streams it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..eval import stats
from ..eval.cost import format_cost, round_cost
from ..files import NotRegularFile, read_small
from ..store.results import STATES, RecordReader, attempt_of, supersedes, work_key
from .common import format_seconds
from .render import pair_lines, printable

if TYPE_CHECKING:
    from ..eval.aggregate import By, Interval

__all__ = ["model_summary", "printable", "report", "summary_console", "summary_table",
           "summary_view"]

OUTCOMES = STATES
#: Failure kinds listed per model (in the summary; ``--json`` keeps up to 10).
SHOWN_REASONS = 3
KEPT_REASONS = 10
#: The narrowest the model column gets before a layout gives up for the next one.
MODEL_MIN = 8

# ------------------------------------------------------------------------ numbers

def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past 1e308
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _field(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = record.get(name)
    return value if isinstance(value, dict) else {}


_CUT = "cut by the server while others ran"
_NOT_REDONE = "; its redo never ran"


def _reason(record: Mapping[str, Any], state: str) -> str:
    reason = record.get("reason")
    if isinstance(reason, str) and reason.strip():
        return " ".join(reason.split())[:300]
    if state == "empty":
        return "no text, reasoning, refusal or tool call (flagged empty_answer)"
    if state == "truncated" and record.get("cut") is True:
        return _CUT + _NOT_REDONE
    return "no reason recorded"


def _kept_over(why: tuple[str, int | None, str], later: tuple[str, int | None, str]
               ) -> tuple[str, int | None, str]:
    """The reason of a record kept over a later attempt of the same run that failed
    with no output (``supersedes``): its own, and how that attempt ended."""
    state, status, reason = why
    if reason == _CUT + _NOT_REDONE:
        reason = _CUT  # its redo did run: it is the later attempt
    what, code, said = later
    ended = what.replace("_", " ") + (f" HTTP {code}" if code is not None else "")
    said = said.removeprefix(f"HTTP {code}: ") if code is not None else said
    return (state, status, f"{reason} (its output is kept: a later attempt of the same run "
                           f"ended {ended} with no output: {said})")


def model_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """model -> its numbers, from every record of a results file in file order."""
    latest: dict[str, dict[str, Any]] = {}
    cost: dict[str, dict[str, float]] = {}
    for record in records:
        # Only what the summary reads: a results file can be far bigger than memory.
        model = str(record["model"])
        metrics, usage = _field(record, "metrics"), record.get("usage")
        attempt = attempt_of(record)
        state = attempt.state
        row: dict[str, Any] = {
            "model": model, "outcome": state, "attempt": attempt,
            "ttft": _number(metrics.get("ttft")),
            "rate": _number(metrics.get("tokens_per_second")),
            "usage": None if not isinstance(usage, dict) else (
                _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))),
        }
        if state != "completed":
            status = _count(record.get("status"))
            row["why"] = (state, status if state == "error" else None, _reason(record, state))
        key = work_key(record["id"], model, record["sample"])
        earlier = latest.get(key)
        if earlier is not None and not supersedes(earlier["attempt"], attempt):
            earlier["later"] = row["why"]  # not done, so it has a why
        else:
            latest[key] = row
        spent = cost.setdefault(model, {"rate_limited": 0, "retry_wait": 0.0})
        spent["rate_limited"] += _count(record.get("rate_limited")) or 0
        spent["retry_wait"] += _number(record.get("retry_wait")) or 0.0
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in latest.values():
        if "later" in row:
            row["why"] = _kept_over(row["why"], row["later"])
        by_model.setdefault(row["model"], []).append(row)
    summary: dict[str, dict[str, Any]] = {}
    for model in sorted(by_model):
        rows = by_model[model]
        counts = dict.fromkeys(OUTCOMES, 0)
        for row in rows:
            counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
        ttft = sorted(r["ttft"] for r in rows if r["ttft"] is not None)
        rates = sorted(r["rate"] for r in rows if r["rate"] is not None)
        summary[model] = {
            "runs": len(rows),
            **counts,
            "completed_pct": 100.0 * counts["completed"] / len(rows),
            "ttft_p50": _percentile(ttft, 50),
            "ttft_p95": _percentile(ttft, 95),
            "tokens_per_second_p50": _percentile(rates, 50),
            **_tokens(rows),
            "rate_limited": int(cost[model]["rate_limited"]),
            "retry_wait": round(cost[model]["retry_wait"], 3),
            # units whose reported record is an earlier attempt with output, kept over a
            # later attempt of the same run that failed with none (``supersedes``)
            "earlier_kept": sum("later" in row for row in rows),
            "reasons": _reasons(rows),
        }
    return summary


def _tokens(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sums over the records that had usage; ``None`` when none did (unknown, not 0)."""
    ins = [r["usage"][0] for r in rows if r["usage"] and r["usage"][0] is not None]
    outs = [r["usage"][1] for r in rows if r["usage"] and r["usage"][1] is not None]
    return {"tokens_in": sum(ins) if ins else None, "tokens_out": sum(outs) if outs else None,
            "tokens_in_known": len(ins), "tokens_out_known": len(outs)}


def _reasons(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Why the model's streams did not complete, most common first: one entry per
    (state, HTTP status, reason with its numbers blanked), with the first example."""
    groups: Counter[tuple[str, int | None, str]] = Counter()
    example: dict[tuple[str, int | None, str], str] = {}
    for row in rows:
        if "why" not in row:
            continue
        state, status, reason = row["why"]
        key = (state, status, re.sub(r"\d+(?:\.\d+)?", "#", reason))
        groups[key] += 1
        example.setdefault(key, reason)
    return [{"outcome": key[0], "status": key[1], "reason": example[key], "count": count}
            for key, count in groups.most_common(KEPT_REASONS)]


def _percentile(ordered: list[float], pct: float) -> float | None:
    """``fanout.eval.stats.percentile`` (linear, the HTML report's too) at ``pct`` percent;
    ``None`` for no values."""
    return stats.percentile(ordered, pct / 100) if ordered else None


# ------------------------------------------------------------------------- layout

_OUTCOME_COLUMNS = (("runs", "runs"), ("completed", "completed"), ("empty", "empty"),
                    ("truncated", "truncated"), ("error", "error"),
                    ("timed out", "timed\nout"), ("cancelled", "cancelled"))
_COST_COLUMNS = (("TTFT p50", "TTFT\np50"), ("TTFT p95", "TTFT\np95"),
                 ("tok/s p50", "tok/s\np50"), ("tokens in", "tokens\nin"),
                 ("tokens out", "tokens\nout"), ("429s", "429s"), ("429 wait", "429\nwait"))


def _tokens_cell(total: int | None, known: int, runs: int) -> str:
    if total is None:
        return "-"
    return f"{total:,}" + ("+" if known < runs else "")


def _cells(row: Mapping[str, Any]) -> dict[str, Text]:
    """Every cell of a model's row, by column name."""
    failed = row["runs"] - row["completed"]
    cells = {
        "runs": Text(str(row["runs"])),
        "completed": Text(f"{row['completed']} ({row['completed_pct']:.0f}%)",
                          "green" if not failed else "yellow"),
        **{label: Text(str(row[key]), "red" if row[key] else "dim")
           for label, key in (("empty", "empty"), ("truncated", "truncated"),
                              ("error", "error"), ("timed out", "timed_out"),
                              ("cancelled", "cancelled"))},
        "TTFT p50": Text(format_seconds(row["ttft_p50"])),
        "TTFT p95": Text(format_seconds(row["ttft_p95"])),
        "tok/s p50": Text("-" if row["tokens_per_second_p50"] is None
                          else f"{row['tokens_per_second_p50']:.0f}"),
        "tokens in": Text(_tokens_cell(row["tokens_in"], row["tokens_in_known"], row["runs"])),
        "tokens out": Text(_tokens_cell(row["tokens_out"], row["tokens_out_known"],
                                        row["runs"])),
        "429s": Text(str(row["rate_limited"]), "yellow" if row["rate_limited"] else "dim"),
        "429 wait": Text(f"{row['retry_wait']:.1f}s"),
    }
    return cells


def _table(summary: Mapping[str, Mapping[str, Any]], columns: Sequence[tuple[str, str]], *,
           narrow: bool) -> Table:
    if narrow:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      padding=(0, 1, 0, 0))
    else:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("model", justify="left", overflow="fold")
    for label, short in columns:
        table.add_column(short if narrow else label, justify="right", no_wrap=True)
    for model, row in summary.items():
        cells = _cells(row)
        table.add_row(Text(printable(model)), *(cells[label] for label, _ in columns))
    return table


def summary_table(summary: Mapping[str, Mapping[str, Any]]) -> Table:
    """The summary as one wide table (about 150 columns)."""
    return _table(summary, _OUTCOME_COLUMNS + _COST_COLUMNS, narrow=False)


def _width(console: Console, table: Table, summary: Mapping[str, Any]) -> int:
    """How wide ``table`` is with its model column folded to at most ``MODEL_MIN``."""
    natural = console.measure(table, options=console.options.update_width(10**6)).maximum
    model = max([cell_len("model"), *(cell_len(printable(m)) for m in summary)])
    return natural - model + min(model, MODEL_MIN)


def summary_view(summary: Mapping[str, Mapping[str, Any]], console: Console) -> RenderableType:
    """The summary laid out for ``console``'s width, with each model's top reasons."""
    width = console.width
    wide = summary_table(summary)
    parts: list[RenderableType]
    if console.measure(wide, options=console.options.update_width(10**6)).maximum <= width:
        parts = [wide]
    else:
        for narrow in (False, True):
            tables = [_table(summary, _OUTCOME_COLUMNS, narrow=narrow),
                      _table(summary, _COST_COLUMNS, narrow=narrow)]
            if all(_width(console, t, summary) <= width for t in tables):
                parts = [tables[0], Text(), tables[1]]
                break
        else:
            parts = _blocks(summary, width)
    reasons = _reason_lines(summary)
    if reasons:
        parts += [Text(), Text("why streams did not complete (the reported record of each):"),
                  *reasons]
    return Group(*parts)


def _blocks(summary: Mapping[str, Mapping[str, Any]], width: int) -> list[RenderableType]:
    """One block per model: its name, then ``label value`` pairs, as many a line as fit
    (a pair is never split)."""
    parts: list[RenderableType] = []
    for model, row in summary.items():
        cells = _cells(row)
        parts.append(Text(printable(model), "bold", overflow="fold"))
        parts += pair_lines([(label, cells[label])
                             for label, _ in _OUTCOME_COLUMNS + _COST_COLUMNS], width)
    return parts


def _reason_lines(summary: Mapping[str, Mapping[str, Any]]) -> list[Text]:
    lines = []
    for model, row in summary.items():
        reasons = row["reasons"]
        for entry in reasons[:SHOWN_REASONS]:
            what = entry["outcome"].replace("_", " ")
            reason = entry["reason"]
            status = ""
            if entry["status"] is not None:
                status = f" HTTP {entry['status']}"
                reason = reason.removeprefix(f"HTTP {entry['status']}: ")
            # wrapped at word boundaries, never cut (a word wider than the line is folded)
            line = Text(f"  {printable(model)}: {entry['count']} {what}{status}: ",
                        overflow="fold")
            line.append(printable(reason), "dim")
            lines.append(line)
        more = sum(entry["count"] for entry in reasons[SHOWN_REASONS:])
        if len(reasons) > SHOWN_REASONS:
            lines.append(Text(f"  {printable(model)}: {more} more, for other reasons "
                              "(fanout report --json lists them)", "dim", overflow="fold"))
    return lines


def summary_console(file: TextIO) -> Console:
    """A console for the summary: a terminal's width; off a terminal ``COLUMNS`` when
    set, else 240 (a file is never folded).  It never interprets what it prints."""
    console = Console(file=file, highlight=False, emoji=False, markup=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(file=file, highlight=False, emoji=False, markup=False, width=240)
    return console


# ------------------------------------------------------------------------- report

def _read_results(path: str, say: Callable[[str], None], *, keep: Callable[[dict[str, Any]],
                  None]) -> tuple[dict[str, dict[str, Any]] | None, int]:
    """The summary of the results file at ``path`` (each record also handed to ``keep``),
    and the exit status when there is none: what it could not read is said."""
    from ..store.plan_check import PlanTally

    tally = PlanTally()

    def tee(reader: RecordReader) -> Iterator[dict[str, Any]]:
        for record in reader:
            keep(record)
            tally.add(record)
            yield record

    try:
        with open(path, "rb") as file:
            reader = RecordReader(file)
            summary = model_summary(tee(reader))  # streamed: the file may be big
    except FileNotFoundError:
        say("no such file")
        return None, 2
    except OSError as exc:
        say(f"cannot read: {exc.strerror or exc}")
        return None, 2
    for line in reader.unreadable.describe():
        say(line)
    if reader.torn_bytes:
        say(f"ignored a torn last line ({reader.torn_bytes} bytes, from an interrupted run)")
    if not reader.records:
        if reader.unreadable:
            say("not a fanout results file: no line is a record (an object with id, model, "
                "sample, outcome and content_key)")
            return None, 2
        say("no records" + (" (the file is empty)" if not reader.size else ""))
        return None, 1
    completeness = tally.check()  # None: the records name no plan
    if completeness is not None:
        say(completeness.line())
    return summary, 0


def _read_scores(path: str, explicit: bool, say: Callable[[str], None]
                 ) -> dict[tuple[str, str], dict[str, Any]] | None:
    """The latest score per (key, scorer) of ``path``; ``None`` (said) when it cannot
    be read or is not a scores file; a missing file has none unless ``explicit``."""
    from ..store.scores import read_scores

    if not os.path.lexists(path):
        if explicit:
            say("no such file")
            return None
        return {}
    try:
        scores = read_scores(path)
    except OSError as exc:
        say(f"cannot read: {exc.strerror or exc}")
        return None
    for line in scores.unreadable.describe():
        say(line)
    if scores.torn_bytes:
        say(f"ignored a torn last line ({scores.torn_bytes} bytes, from an interrupted run)")
    if not scores.records and scores.unreadable:
        say("not a fanout scores file: no line is a score record (an object with id, model, "
            "sample, scorer, status, answer_key and scorer_key)")
        return None
    return dict(scores)


def _over(record: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]] | None
          ) -> dict[str, Any]:
    """``record`` with its prompt line's fields over its own (``fanout score``'s rule:
    the answer_key then hashes the expected value it was scored against)."""
    line = overrides.get(str(record["id"])) if overrides else None
    return record if line is None else {**record, **line}


def _load_prompts(path: str, err: TextIO) -> dict[str, dict[str, Any]] | None:
    """prompt id -> what a prompts file's line says over a record (messages, and
    expected, category, tags when it has them), as ``fanout score --prompts`` reads it;
    ``None`` (said, every bad line) when the file is unusable."""
    from ..store.prompts import PromptFileError, load_prompts
    from ..store.scores import as_read_back

    try:
        return {str(p.id): {"messages": [dict(m) for m in p.messages],
                            **{name: as_read_back(value) if name == "expected" else value
                               for name, value in p.eval_fields().items()}}
                for p in load_prompts(path)}
    except PromptFileError as exc:
        for problem in exc.problems:
            print(f"fanout report: {printable(problem)}", file=err)
        if exc.total:
            print(f"fanout report: {printable(str(exc))}", file=err)
        return None


def _same_file(one: str, other: str) -> bool:
    """Whether two paths name the same existing file (a pipe never is: it is read once)."""
    try:
        return os.path.samefile(one, other) and stat.S_ISREG(os.stat(one).st_mode)
    except OSError:
        return False


def _html_problem(target: str, inputs: Sequence[str]) -> str | None:
    """Why ``target`` must not be written (replaced) by the page, or ``None``: an input
    of the report, anything but a regular file (a symbolic link is not followed, nor
    replaced), a file that is not an HTML page."""
    try:
        head, _ = read_small(target, 64)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        if exc.is_link:
            return (f"is {exc.kind}: fanout writes no file through a link (it is left as "
                    "it was); name the file itself")
        return f"not a regular file ({exc.kind}); name a file to write the page to"
    except OSError as exc:
        return f"cannot read what is there: {exc.strerror or exc}"
    for name in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(target, name):
                return f"is {printable(name)}, an input of the report; name another file"
    if head and not head.lstrip().lower().startswith(b"<!doctype html"):
        return "exists and is not an HTML page (it is left as it was); name another file"
    return None


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as ``None``: strict JSON (no ``NaN`` or
    ``Infinity``, which most parsers refuse) whatever a results file held."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _json_text(value: Any) -> str:
    return json.dumps(_finite(value), indent=2, allow_nan=False).replace(
        "\x7f", "\\u007f")  # ASCII, inert


_LIGHT = ("id", "model", "sample", "outcome", "content_key", "cost", "category", "tags")


def report(path: str, *, as_json: bool, stdout: TextIO | None = None,
           stderr: TextIO | None = None, console: Console | None = None,
           scores: str | None = None, by: By | None = None, samples: int | None = None,
           against: str | None = None, against_scores: str | None = None,
           html: str | None = None, interval: Interval = "bootstrap",
           prompts: str | None = None, against_prompts: str | None = None) -> int:
    """``fanout report RESULTS.jsonl [--json]``: the summary of a results file, and with
    scores (``scores``, else ``fanout.store.scores.scores_path`` of ``path`` when it
    exists) or any of ``by``, ``samples``, ``against``, ``html`` its evaluation.

    Without any of them the report is the summary alone (``--json``: model -> its
    numbers), with the cost per model when records carry one.  With them:
    the summary, then each scorer's table, cost, and the comparison with
    ``against`` (``--json``: ``{"files", "summary", "evaluation"}``).  ``prompts``
    (and ``against_prompts``): a prompts file whose lines' expected, category, tags
    and messages stand over the records' (as ``fanout score --prompts`` scored them).

    Exit status: 0 with a report (lines that are not records are counted on
    stderr, a line per kind and file); 1 when the results file holds no record
    (empty, or a torn line only); 2 when a file cannot be read or is not what it
    should be (a results or scores file), when ``scores`` is given and missing,
    for a bad value, or when ``html`` cannot be written.
    """
    out, err = stdout or sys.stdout, stderr or sys.stderr

    def sayer(name: str) -> Callable[[str], None]:
        shown = printable(name)
        return lambda line: print(f"fanout report: {shown}: {printable(line)}", file=err)

    if samples is not None and samples < 1:
        print(f"fanout report: --samples {samples}: must be 1 or more", file=err)
        return 2
    for flag, given in (("--against-scores", against_scores),
                        ("--against-prompts", against_prompts)):
        if given is not None and against is None:
            print(f"fanout report: {flag} needs --against", file=err)
            return 2
    overrides = other_overrides = None
    if prompts is not None and (overrides := _load_prompts(prompts, err)) is None:
        return 2
    if against_prompts is not None and (
            other_overrides := _load_prompts(against_prompts, err)) is None:
        return 2
    from ..eval.aggregate import slim
    from ..store.scores import scores_path

    scores_file = scores if scores is not None else str(scores_path(path))
    for flag, given, results in (("--scores", scores, path),
                                 ("--against-scores", against_scores, against)):
        if given is not None and results is not None and _same_file(given, results):
            print(f"fanout report: {flag} {printable(given)}: is the results file "
                  f"{printable(results)}; name its scores file", file=err)
            return 2
    if html is not None:
        inputs = [path, scores_file] + ([against, against_scores or str(scores_path(against))]
                                        if against is not None else [])
        problem = _html_problem(html, inputs)
        if problem is not None:
            print(f"fanout report: --html {printable(html)}: {problem}", file=err)
            return 2
    evaluating = (scores is not None or by is not None or samples is not None
                  or against is not None or html is not None or prompts is not None
                  or os.path.lexists(scores_file))
    kept: list[dict[str, Any]] = []

    def keep(record: dict[str, Any]) -> None:
        # a big file stays small: only what cost needs without scores, what the
        # evaluation reads with them, the whole record only for the page
        record = _over(record, overrides)
        if not evaluating:
            kept.append({name: record[name] for name in _LIGHT if name in record})
        elif html is None:
            kept.append(slim(record))
        else:
            kept.append(record)

    summary, status = _read_results(path, sayer(path), keep=keep)
    if summary is None:
        return status
    console = console or summary_console(out)
    if not evaluating:
        return _plain(summary, kept, as_json=as_json, out=out, console=console)

    from ..eval.aggregate import compare_runs, evaluate, prepare, to_json

    latest_scores = _read_scores(scores_file, scores is not None, sayer(scores_file))
    if latest_scores is None:
        return 2
    run = prepare(kept, latest_scores)
    evaluation = evaluate(run, by=by, samples=samples, interval=interval)
    comparison = None
    against_file = None
    if against is not None:
        other: list[dict[str, Any]] = []
        found, status = _read_results(against, sayer(against),
                                      keep=lambda record: other.append(
                                          slim(_over(record, other_overrides))))
        if found is None:
            return 2
        against_file = against_scores if against_scores is not None \
            else str(scores_path(against))
        other_scores = _read_scores(against_file, against_scores is not None,
                                    sayer(against_file))
        if other_scores is None:
            return 2
        comparison = compare_runs(run, prepare(other, other_scores))
    if html is not None:
        from ..eval.html import write_report

        try:
            write_report(html, run, evaluation, comparison, title=path,
                         against=against)
        except NotRegularFile as exc:  # put there since it was checked
            print(f"fanout report: --html {printable(html)}: is {exc.kind}; nothing "
                  "was written", file=err)
            return 2
        except OSError as exc:
            print(f"fanout report: --html {printable(html)}: cannot write: "
                  f"{exc.strerror or exc}", file=err)
            return 2
    has_cost = any("cost" in record for record in kept) or evaluation.judge.calls > 0
    if as_json:
        data = {"files": {"results": path,
                          "scores": scores_file if os.path.lexists(scores_file) else None,
                          "prompts": prompts, "against": against,
                          "against_scores": against_file,
                          "against_prompts": against_prompts, "html": html},
                "summary": summary, "evaluation": to_json(evaluation, comparison)}
        out.write(_json_text(data) + "\n")
        return 0
    from .eval_report import comparison_view, evaluation_view, matrix_view

    parts: list[RenderableType] = [*matrix_view(evaluation, console),
                                   summary_view(summary, console),
                                   *evaluation_view(evaluation, console, cost=has_cost)]
    if comparison is not None and against is not None:
        parts += comparison_view(comparison, against, console)
    if html is not None:
        parts += [Text(), Text(f"wrote {printable(html)}")]
    console.print(Group(*parts))
    return 0


def _plain(summary: dict[str, dict[str, Any]], kept: list[dict[str, Any]], *, as_json: bool,
           out: TextIO, console: Console) -> int:
    """The report without scores: today's summary, and cost when records carry it."""
    evaluation = None
    if any("cost" in record for record in kept):
        from ..eval.aggregate import evaluate, prepare

        evaluation = evaluate(prepare(kept, {}))
        for row in evaluation.rows:
            summary[row.model]["cost"] = {
                "total": round_cost(row.cost), "text": format_cost(row.cost, row.cost_unknown),
                "known": row.cost_known, "unknown": row.cost_unknown}
    if as_json:
        out.write(_json_text(summary) + "\n")
        return 0
    if evaluation is None:
        console.print(summary_view(summary, console))
        return 0
    from .eval_report import cost_lines

    console.print(Group(summary_view(summary, console), *cost_lines(evaluation, console)))
    return 0


# ------------------------------------------------------------------------- --watch

def add_watch_arguments(parser: Any) -> None:
    """``fanout report --watch``'s options, on the ``report`` parser."""
    parser.add_argument("--watch", action="store_true",
                        help="RESULTS is the shards' directory (or shard files, as for fanout "
                             "merge): show each shard's units done, failed and left and the "
                             "total, again every --every seconds, until every shard is "
                             "complete (or Ctrl-C); exit 0. fanout merge --check looks once")
    parser.add_argument("--every", type=float, default=2.0, metavar="SECONDS",
                        help="with --watch: seconds between two looks (default 2)")
    parser.add_argument("--max-updates", type=int, metavar="N",
                        help="with --watch: stop after N looks")
    parser.add_argument("--config", metavar="FILE",
                        help="with --watch and --prompts: the batch's config (the plan is "
                             "recomputed: units planned and left per shard)")


def watch(paths: Sequence[str], *, every: float = 2.0, max_updates: int | None = None,
          prompts: str | None = None, config: str | None = None,
          stdout: TextIO | None = None, stderr: TextIO | None = None,
          sleep: Callable[[float], None] | None = None, live: bool | None = None) -> int:
    """``fanout report --watch DIR``: ``fanout merge --check``'s lines (the same check,
    ``fanout.batch.shards.check``), again every ``every`` seconds until nothing is left
    to run (every shard there and done, or failed for good: the check's exit status is
    0 or 1), ``max_updates`` looks, or Ctrl-C; exit 0 (2 for bad usage).  On a terminal
    (``live``) the lines are redrawn in place, else each look that changed anything is
    printed whole."""
    import time

    from .._exceptions import ConfigError
    from ..batch.shards import EXIT_UNFINISHED, check
    from .merge import check_lines, render

    out, err = stdout or sys.stdout, stderr or sys.stderr
    if every <= 0 or (max_updates is not None and max_updates < 1):
        print("fanout report: --every must be above 0 and --max-updates at least 1",
              file=err)
        return 2
    if config is not None and prompts is None:
        print("fanout report: --config: the plan needs the prompts too: give --prompts",
              file=err)
        return 2
    live = out.isatty() if live is None else live
    pause = sleep or time.sleep
    console = Console(file=out, highlight=False, soft_wrap=True) if live else None
    shown: list[str] | None = None
    looks = 0

    def look() -> tuple[list[str], bool]:
        try:
            report = check(paths, prompts=prompts, config=config)
        except ConfigError as exc:  # no shard file yet, say: look again
            return [f"fanout report: {printable(str(exc))}"], False
        return ([printable(line) for line in check_lines(report)]
                + [printable(render(report)[1][-1])], report.exit_code != EXIT_UNFINISHED)

    from rich.live import Live

    context = (Live(console=console, auto_refresh=False, transient=False)
               if console is not None else contextlib.nullcontext())
    try:
        with context as screen:
            while True:
                lines, finished = look()
                looks += 1
                if screen is not None:
                    screen.update(Text("\n".join(lines)), refresh=True)
                elif lines != shown:
                    print("\n".join(lines), file=out, flush=True)
                shown = lines
                if finished or (max_updates is not None and looks >= max_updates):
                    break
                pause(every)
    except KeyboardInterrupt:
        pass
    return 0
