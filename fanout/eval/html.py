"""``fanout report --html``: the evaluation as ONE self-contained HTML file.

The file holds its data, its script and its style; it loads nothing, and its
Content-Security-Policy (a ``<meta>``) allows only the script and the style it
carries (by their SHA-256) and ``data:`` images: no request can leave it, even
from a model's text.  The data is JSON inside ``<script type="application/json">``,
written by ``fanout.records.dumps`` (C1 and bidi controls, line separators and
lone surrogates escaped) with ``<``, ``>`` and ``&`` escaped as well, so no
answer can close the element; the script (``static/report.js``) inserts every
string from the data as text (``textContent``, text nodes), never as markup.

The page shows: the per-model summary per scorer with intervals, drawn (score
per model with its interval; TTFT and tokens/s per model as box and strip plots,
in SVG built by the script); the grid of prompts (in the prompts file's order)
by models (each answer cut to a few lines, its outcome and scores), filtered to
failures, errors, truncated, flagged empty, or *different* (models disagree on
pass/fail, or, unscored, on the answer's text), or by a search; a detail per
answer (the prompt's messages, expected value, answer, reasoning, refusal, tool
calls, scores with their explanations, metrics, usage, cost); with
``--against``, the paired differences and the flipped prompts. """

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import os
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

from ..files import replace_whole
from ..records import dumps
from ..store.results import state_of
from .aggregate import Comparison, Evaluation, Run, to_json
from .cost import format_cost, round_cost

__all__ = ["MAX_TEXT", "page", "report_data", "write_report"]

#: The most characters of one string (an answer, reasoning, arguments) the file keeps.
MAX_TEXT: Final = 100_000


def _cut(value: object) -> str:
    text = value if isinstance(value, str) else ""
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n[… {len(text) - MAX_TEXT:,} more characters not kept here]"


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _cell(key: str, record: Mapping[str, Any], run: Run) -> dict[str, Any]:
    choices = record.get("choices")
    first = _dict(choices[0]) if isinstance(choices, list) and choices else {}
    calls = first.get("tool_calls")
    metrics, usage = _dict(record.get("metrics")), _dict(record.get("usage"))
    scores = {}
    for scorer in run.scorers:
        score = run.scores.get((key, scorer))
        if score is not None:
            judge = _dict(score.get("judge"))
            scores[scorer] = {
                "status": score.get("status"), "score": score.get("score"),
                "passed": score.get("passed"), "explanation": _cut(score.get("explanation")),
                "judge": {"model": judge.get("model"), "text": _cut(judge.get("text")),
                          "cost": judge.get("cost")} if judge else None}
    cost = record.get("cost")
    cost = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None
    return {
        "id": str(record["id"]), "model": str(record["model"]), "sample": record["sample"],
        "outcome": record.get("outcome"), "state": state_of(record),
        "reason": _cut(record.get("reason")) or None,
        "flags": [f for f in record.get("flags") or [] if isinstance(f, str)]
        if isinstance(record.get("flags"), list) else [],
        # The words every view uses (fanout.records.flag_label), from the record.
        "flag_labels": [f for f in record.get("flag_labels") or [] if isinstance(f, str)]
        if isinstance(record.get("flag_labels"), list) else [],
        "text": _cut(record.get("text") if isinstance(record.get("text"), str)
                     else first.get("text")),
        "reasoning": _cut(first.get("reasoning")), "refusal": _cut(first.get("refusal")),
        "finish_reason": record.get("finish_reason"),
        "tool_calls": [{"name": _cut(_dict(c).get("name")),
                        "arguments": _cut(_dict(c).get("arguments")),
                        "valid_json": _dict(c).get("valid_json"),
                        "schema_valid": _dict(c).get("schema_valid")}
                       for c in calls] if isinstance(calls, list) else [],
        "metrics": {name: metrics.get(name) for name in
                    ("ttft", "ttfc", "tokens_per_second", "tokens_estimated", "e2e_latency",
                     "generation_time", "output_chars")},
        "usage": {name: usage.get(name) for name in
                  ("prompt_tokens", "completion_tokens", "total_tokens")} if usage else None,
        "cost": round_cost(cost), "cost_text": None if cost is None else format_cost(cost),
        "cost_source": record.get("cost_source"),
        "model_id": record.get("model_id"), "scores": scores,
    }


def report_data(run: Run, evaluation: Evaluation, comparison: Comparison | None = None, *,
                title: str = "", against: str | None = None) -> dict[str, Any]:
    """What the page shows, as JSON-ready data: prompts (in ``run.prompts``' order: the
    prompts file's), cells, the evaluation."""
    prompts: dict[str, dict[str, Any]] = {}
    cells = []
    for key, record in run.latest.items():
        prompt = str(record["id"])
        if prompt not in prompts:
            messages = record.get("messages")
            prompts[prompt] = {
                "id": prompt,
                "messages": [{"role": _cut(_dict(m).get("role")),
                              "content": _cut(c) if isinstance(c := _dict(m).get("content"),
                                                               str) else dumps(c)}
                             for m in messages] if isinstance(messages, list) else [],
                "has_expected": "expected" in record,
                "expected": dumps(record["expected"]) if "expected" in record else None,
                "category": record.get("category") if isinstance(record.get("category"), str)
                else None,
                "tags": [t for t in record.get("tags") or [] if isinstance(t, str)]
                if isinstance(record.get("tags"), list) else []}
        cells.append(_cell(key, record, run))
    return {
        "title": title,
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "against": against,
        "models": sorted({cell["model"] for cell in cells}),
        "scorers": list(evaluation.scorers), "samples": evaluation.samples,
        "prompts": [prompts[p] for p in _file_order(run, prompts)], "cells": cells,
        "evaluation": to_json(evaluation, comparison),
    }


def _file_order(run: Run, prompts: Mapping[str, Any]) -> list[str]:
    """The ids of ``prompts`` in the results file's first-appearance order (a ``Run``
    built by hand, without ``prompts``, keeps its own order)."""
    seen = [p for p in run.prompts if p in prompts]
    return seen + [p for p in prompts if p not in set(seen)]


def _asset(name: str) -> str:
    return resources.files("fanout.eval").joinpath("static", name).read_text("utf-8")


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def _script_json(data: Any) -> str:
    """``data`` as JSON that can sit inside a ``<script>`` element: nothing in it can end
    the element or start a comment (``<``, ``>``, ``&`` escaped), and it is valid
    UTF-8 whatever the strings hold (``fanout.records.dumps``)."""
    return dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(data: Mapping[str, Any]) -> str:
    """The HTML text of the page for ``data`` (``report_data``)."""
    script, style = _asset("report.js"), _asset("report.css")
    if "</script" in script.lower() or "</style" in style.lower():  # would end them early
        raise ValueError("the report's script or style holds its own end tag")
    policy = (f"default-src 'none'; script-src '{_hash(script)}'; "
              f"style-src '{_hash(style)}'; img-src data:; base-uri 'none'; form-action 'none'")
    title = html.escape(f"fanout report · {data.get('title') or ''}".strip(" ·"), quote=True)
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<meta name=\"referrer\" content=\"no-referrer\">\n"
        f"<title>{title}</title>\n<link rel=\"icon\" href=\"data:,\">\n"
        f"<style>{style}</style>\n</head>\n<body>\n"
        "<noscript>This report draws itself with its own script; "
        "allow JavaScript for this file.</noscript>\n"
        f"<script type=\"application/json\" id=\"data\">{_script_json(data)}</script>\n"
        f"<script>{script}</script>\n</body>\n</html>\n")


def write_report(path: str | os.PathLike[str], run: Run, evaluation: Evaluation,
                 comparison: Comparison | None = None, *, title: str = "",
                 against: str | None = None) -> None:
    """Write the page to ``path`` whole or not at all (a temporary file made beside
    it, renamed: ``fanout.files.replace_whole``); ``OSError`` when it cannot be
    written, ``fanout.files.NotRegularFile`` when ``path`` is a symbolic link, a
    directory, a pipe...: nothing is written through a link or into a pipe."""
    text = page(report_data(run, evaluation, comparison, title=title, against=against))
    replace_whole(path, text.encode("utf-8"))
