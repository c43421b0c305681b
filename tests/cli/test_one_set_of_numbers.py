"""One run, every view: the same numbers and the same flag words for each stream.

One batch against the embedded upstream (a stream retried after a 500, a
tool-calling stream, a stream without usage), then its results records,
``fanout report --json``, the HTML report's data and ``compare --json`` of the
same models: each view's numbers are ``fanout.records.metrics``' and its flag
words ``fanout.records.flag_label``'s.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fanout.cli.main import main
from fanout.eval.cost import format_cost, round_cost

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 5
total = 30

[[models]]
name = "retried"
id = "fault/500-then-ok"
price = { input = 1.3, output = 7.1 }

[[models]]
name = "tools"
id = "mock/tools"
price = { input = 1.3, output = 7.1 }

[[models]]
name = "nousage"
id = "fault/no-usage"
"""


def _html_data(path: Path) -> dict[str, Any]:
    page = path.read_text()
    found = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(html.unescape(found.group(1)))  # type: ignore[no-any-return]


def test_every_view_shows_the_same_numbers_and_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fanout.toml"
    config.write_text(CONFIG)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "q1", "messages": [{"role": "user", "content": "hi there"}]}\n')
    results = tmp_path / "results.jsonl"
    assert main(["batch", str(prompts), "-o", str(results), "--config", str(config)]) == 0
    records = {r["model"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert set(records) == {"retried", "tools", "nousage"}
    retried, tools, nousage = records["retried"], records["tools"], records["nousage"]

    # The definitions: a stream's time is the whole stream, retries included.
    assert len(retried["attempts"]) == 2 and retried["metrics"]["retrying"] > 0
    assert retried["metrics"]["e2e_latency"] > retried["metrics"]["retrying"]
    # chars: what the model produced, tool arguments included.
    arguments = sum(len(call["arguments"]) for c in tools["choices"] for call in c["tool_calls"])
    assert arguments > 0 and tools["metrics"]["output_chars"] == arguments
    assert nousage["flags"] == ["missing_usage"] and nousage["flag_labels"] == ["missing usage"]

    capsys.readouterr()
    page = tmp_path / "report.html"
    assert main(["report", str(results), "--json", "--html", str(page)]) == 0
    report = json.loads(capsys.readouterr().out)
    summary = {name: row for name, row in report["summary"].items()}
    costs = {row["model"]: row["cost"] for row in report["evaluation"]["models"]}
    data = _html_data(page)
    cells = {cell["model"]: cell for cell in data["cells"]}
    models = {row["model"]: row for row in data["evaluation"]["models"]}
    for name, record in records.items():
        measured = record["metrics"]
        # fanout report --json: one record a model, so each percentile is its number.
        row = summary[name]
        assert row["ttft_p50"] == row["ttft_p95"] == measured["ttft"]
        assert row["tokens_per_second_p50"] == measured["tokens_per_second"]
        # The HTML report: the same metrics, words, percentiles and cost text.
        cell = cells[name]
        for metric in ("ttft", "e2e_latency", "output_chars", "tokens_per_second"):
            assert cell["metrics"][metric] == measured[metric], (name, metric)
        assert cell["flag_labels"] == record["flag_labels"]
        assert models[name]["ttft"]["p95"] == pytest.approx(measured["ttft"], abs=1e-6)
        cost = record["cost"]
        assert cell["cost"] == round_cost(cost)
        if cost is not None:
            assert cell["cost_text"] == format_cost(cost) == costs[name]["text"]
            assert models[name]["cost"] == costs[name]
            assert costs[name]["total"] == round_cost(cost)

    # compare --json, the same models: the same definitions and the same words.
    assert main(["compare", "hi there", "--json", "--config", str(config),
                 "-m", "retried", "-m", "tools", "-m", "nousage"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    finals = {line["stream"]: line for line in lines if line["type"] == "result"}
    assert set(finals) == set(records)
    for name, final in finals.items():
        assert final["flags"] == records[name]["flags"]
        assert final["flag_labels"] == records[name]["flag_labels"]
        assert final["metrics"]["output_chars"] == records[name]["metrics"]["output_chars"]
    again = finals["retried"]
    assert len(again["attempts"]) == 2
    assert again["metrics"]["e2e_latency"] > again["metrics"]["retrying"] > 0
