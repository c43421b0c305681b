"""Per-model summary of a results file: what ``fanout batch`` prints at its end and
``fanout report RESULTS.jsonl`` prints any time.

Outcomes, latencies and tokens count each key's latest record (a redo
replaces a failure); 429s and the time spent waiting on them count every
record, since every attempt cost something.  A completed record with an
empty answer counts as ``empty``, apart from ``completed``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .common import format_seconds, text_console
from .results import STATES, iter_records, state_of, work_key

__all__ = ["model_summary", "report", "summary_table"]

OUTCOMES = STATES


def model_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """model -> its numbers, from every record of a results file in file order."""
    latest: dict[str, Mapping[str, Any]] = {}
    cost: dict[str, dict[str, float]] = {}
    for record in records:
        # Only what the summary reads: a results file can be far bigger than memory.
        metrics = record.get("metrics") or {}
        usage = record.get("usage") or {}
        latest[work_key(record["id"], record["model"], record["sample"])] = {
            "model": record["model"], "outcome": state_of(record),
            "metrics": {"ttft": metrics.get("ttft"),
                        "tokens_per_second": metrics.get("tokens_per_second")},
            "usage": {"prompt_tokens": usage.get("prompt_tokens"),
                      "completion_tokens": usage.get("completion_tokens")},
        }
        spent = cost.setdefault(str(record["model"]), {"rate_limited": 0, "retry_wait": 0.0})
        spent["rate_limited"] += record.get("rate_limited") or 0
        spent["retry_wait"] += record.get("retry_wait") or 0.0
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for record in latest.values():
        by_model.setdefault(str(record["model"]), []).append(record)
    summary: dict[str, dict[str, Any]] = {}
    for model in sorted(by_model):
        rows = by_model[model]
        counts = {outcome: 0 for outcome in OUTCOMES}
        for row in rows:
            counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
        ttft = sorted(_metric(rows, "ttft"))
        rates = sorted(_metric(rows, "tokens_per_second"))
        usage = [row.get("usage") or {} for row in rows]
        summary[model] = {
            "runs": len(rows),
            **counts,
            "completed_pct": 100.0 * counts["completed"] / len(rows),
            "ttft_p50": _percentile(ttft, 50),
            "ttft_p95": _percentile(ttft, 95),
            "tokens_per_second_p50": _percentile(rates, 50),
            "tokens_in": sum(u.get("prompt_tokens") or 0 for u in usage),
            "tokens_out": sum(u.get("completion_tokens") or 0 for u in usage),
            "rate_limited": int(cost[model]["rate_limited"]),
            "retry_wait": round(cost[model]["retry_wait"], 3),
        }
    return summary


def summary_table(summary: Mapping[str, Mapping[str, Any]]) -> Table:
    """The summary as a table for the terminal."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    columns = ("model", "runs", "completed", "empty", "truncated", "error", "timed out",
               "cancelled",
               "TTFT p50", "TTFT p95", "tok/s p50", "tokens in", "tokens out", "429s",
               "429 wait")
    for name in columns:
        table.add_column(name, justify="left" if name == "model" else "right", no_wrap=True)
    for model, row in summary.items():
        failed = row["runs"] - row["completed"]
        table.add_row(
            Text(model),
            str(row["runs"]),
            Text(f"{row['completed']} ({row['completed_pct']:.0f}%)",
                 "green" if not failed else "yellow"),
            *(Text(str(row[k]), "red" if row[k] else "dim")
              for k in ("empty", "truncated", "error", "timed_out", "cancelled")),
            format_seconds(row["ttft_p50"]), format_seconds(row["ttft_p95"]),
            "-" if row["tokens_per_second_p50"] is None
            else f"{row['tokens_per_second_p50']:.0f}",
            f"{row['tokens_in']:,}", f"{row['tokens_out']:,}",
            Text(str(row["rate_limited"]), "yellow" if row["rate_limited"] else "dim"),
            f"{row['retry_wait']:.1f}s")
    return table


def _metric(rows: Iterable[Mapping[str, Any]], name: str) -> list[float]:
    values = []
    for row in rows:
        value = (row.get("metrics") or {}).get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(float(value))
    return values


def _percentile(ordered: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of sorted values; the median is the usual median."""
    if not ordered:
        return None
    if pct == 50:
        return statistics.median(ordered)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def report(path: str, *, as_json: bool, stdout: TextIO | None = None,
           stderr: TextIO | None = None, console: Console | None = None) -> int:
    """``fanout report RESULTS.jsonl [--json]``: the summary of a results file."""
    out = stdout or sys.stdout
    try:
        summary = model_summary(iter_records(path))  # streamed: the file may be big
    except FileNotFoundError:
        print(f"fanout report: {path}: no such file", file=stderr or sys.stderr)
        return 2
    except OSError as exc:
        print(f"fanout report: {path}: cannot read: {exc.strerror or exc}",
              file=stderr or sys.stderr)
        return 2
    if as_json:
        out.write(json.dumps(summary, indent=2) + "\n")
        return 0
    (console or text_console(out, wide=True)).print(summary_table(summary))
    return 0
