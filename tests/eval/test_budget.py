"""`fanout batch --budget`: the bounds, the stop, the exit status, resuming, judge cost."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fanout.cli.batch import EXIT_BUDGET, BatchOptions, run_batch
from fanout.eval.budget import DEFAULT_OUTPUT_TOKENS, REPORTED_MARGIN, Budget
from fanout.eval.cost import Price
from fanout.eval.scores import scores_path

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 5
total = 30

[concurrency]
max = 4

[[models]]
name = "echo"
id = "mock/echo"
params = { max_tokens = 5 }
price = { input = 100.00, output = 200.00 }

[[models]]
name = "free-ish"
id = "mock/fast"
price = { input = 0, output = 0 }

[[models]]
name = "unpriced"
id = "mock/fast"

[[models]]
name = "judge"
id = "mock/judge"
params = { max_tokens = 40 }
price = { input = 10.00, output = 40.00 }

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"
concurrency = 2
"""

PRICE = Price(input=100.0, output=200.0)
PROMPTS = [{"id": f"p{i}", "prompt": f"item number {i}", "expected": f"number {i}"}
           for i in range(10)]


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def _batch(tmp_path: Path, config: str, *models: str, **options: Any
           ) -> tuple[int, str, str, str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out, err = io.StringIO(), io.StringIO()
    output = str(tmp_path / "results.jsonl")
    status = run_batch(BatchOptions(prompts=str(prompts), output=output, models=models,
                                    config=config, **options), stdout=out, stderr=err)
    return status, output, out.getvalue(), err.getvalue()


def _records(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


_STOPPED = re.compile(r"budget: stopped sending at \$([0-9.]+) spent \+ \$([0-9.]+) bound in "
                      r"flight of \$([0-9.]+) \(the smallest bound that did not fit: \$([0-9.]+)\); (\d+) "
                      r"units? "
                      r"not sent \(a rerun with a new --budget continues\)")


def _unit_cost(record: dict[str, Any]) -> float:
    usage = record["usage"]
    return (usage["prompt_tokens"] * 100.0 + usage["completion_tokens"] * 200.0) / 1e6


# ------------------------------------------------------------------ the bounds (pure)

def test_bound_uses_chars_then_the_largest_prompt_seen() -> None:
    budget = Budget(1.0, {"m": PRICE})
    messages = [{"role": "user", "content": "x" * 98}]  # 100 chars as JSON: 50 tokens
    assert budget.bound("q", "m", messages, {"max_tokens": 10}) == pytest.approx(
        (50 * 100 + 10 * 200) / 1e6)
    budget.observe("q", "m", {"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    budget.observe("q", "m", {"usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    assert budget.bound("q", "m", messages, {"max_tokens": 10}) == pytest.approx(
        (7 * 100 + 10 * 200) / 1e6)
    # Without max_tokens: the largest completion seen for the model, else the default.
    assert budget.bound("q", "m", messages, {}) == pytest.approx((7 * 100 + 9 * 200) / 1e6)
    assert budget.bound("q", "other", messages, {}) is None  # no price
    fresh = Budget(1.0, {"m": PRICE})
    assert fresh.bound("q", "m", messages, {"max_completion_tokens": 4, "max_tokens": 99}) \
        == pytest.approx((50 * 100 + 4 * 200) / 1e6)
    assert fresh.bound("q", "m", messages, {}) == pytest.approx(
        (50 * 100 + DEFAULT_OUTPUT_TOKENS * 200) / 1e6)


def test_an_unpriced_model_is_bounded_by_its_reported_costs() -> None:
    budget = Budget(1.0, {"m": None})
    assert budget.unbounded(["m"]) == ["m"]
    budget.observe("q", "m", {"cost": 0.002, "cost_source": "reported"})
    budget.observe("q", "m", {"cost": 0.001, "cost_source": "reported"})
    budget.observe("q", "m", {"cost": 9.0, "cost_source": "price"})  # not the relay's
    assert budget.unbounded(["m"]) == []
    assert budget.bound("q", "m", [], {}) == pytest.approx(0.002 * REPORTED_MARGIN)


def test_fits_reserves_and_unknown_cost_counts_its_bound() -> None:
    budget = Budget(1.0, {})
    assert budget.fits(0.6)
    budget.send("a", 0.6)
    assert not budget.fits(0.5) and budget.fits(0.4)
    budget.finished("a", 0.1)
    assert budget.spent == pytest.approx(0.1) and budget.fits(0.9)
    budget.send("b", 0.3)
    budget.finished("b", None)  # unknown is never free
    assert budget.spent == pytest.approx(0.4) and budget.unknown == 1


# ------------------------------------------------------------------ batch --budget

def test_the_budget_stops_the_run_and_a_rerun_continues(tmp_path: Path, config: str) -> None:
    # Each echo unit costs 1.5e-3 (7 + 4 tokens at 100/200 per million) and is bounded at
    # 1.8e-3 (8 tokens in: chars / 2; 5 out: max_tokens): a budget of 0.01 runs a few.
    status, output, _, err = _batch(tmp_path, config, "echo", budget=0.01)
    assert status == EXIT_BUDGET == 3
    match = _STOPPED.search(err)
    assert match is not None, err
    spent, in_flight, limit, needed, not_sent = match.groups()
    records = _records(output)
    assert 0 < len(records) < 10
    assert int(not_sent) == 10 - len(records)
    assert float(in_flight) == 0.0 and float(limit) == 0.01
    assert float(spent) == pytest.approx(sum(_unit_cost(r) for r in records), abs=1e-6)
    assert float(spent) + float(needed) > 0.01  # it stopped because the next did not fit
    assert all(r["outcome"] == "completed" and r["cost_source"] == "price" for r in records)
    assert err.count("budget:") == 1
    # The file resumes: a new budget for this run's spending, the rest is sent.
    status, _, _, err = _batch(tmp_path, config, "echo", budget=1.0)
    assert status == 0, err
    assert f"{len(records)} already completed, {10 - len(records)} to run" in err
    rest = _records(output)[len(records):]
    assert len(rest) == 10 - len(records)
    assert f"budget: this run spent ${sum(_unit_cost(r) for r in rest):.6f} of $1.000000" in err


def test_a_budget_too_small_for_one_unit_sends_nothing(tmp_path: Path, config: str) -> None:
    status, output, _, err = _batch(tmp_path, config, "echo", budget=0.0001)
    assert status == 3
    assert "10 units not sent" in err
    assert not _records(output)


def test_a_model_without_a_price_refuses_to_start(tmp_path: Path, config: str) -> None:
    status, output, _, err = _batch(tmp_path, config, "free-ish", "unpriced", budget=1.0)
    assert status == 2
    assert err.count("\n") == 1
    assert "--budget: no price for 'unpriced'" in err and "nothing was sent" in err
    assert Path(output).read_bytes() == b""  # opened (its records could bound it), empty


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_budget_is_refused(tmp_path: Path, config: str, budget: float) -> None:
    status, _, _, err = _batch(tmp_path, config, "echo", budget=budget)
    assert status == 2 and "--budget must be a number of USD > 0" in err


def test_judge_spending_counts_toward_the_budget(tmp_path: Path, config: str) -> None:
    status, output, out, err = _batch(tmp_path, config, "echo", budget=0.02,
                                      scorers=("judged",))
    assert status == 3, err
    match = _STOPPED.search(err)
    assert match is not None, err
    spent = float(match.group(1))
    answers = sum(_unit_cost(r) for r in _records(output))
    judged = [json.loads(line) for line in scores_path(output).read_text().splitlines()]
    judge_cost = sum(s["judge"]["cost"] for s in judged)
    assert judged and judge_cost > 0
    assert all(s["judge"]["cost_source"] == "price" for s in judged)
    assert spent == pytest.approx(answers + judge_cost, abs=2e-6)  # printed to 6 places
    assert spent > answers  # the judges' part is in it
    assert f"judge cost ${judge_cost:.6f}" in out


def test_without_a_budget_nothing_changes(tmp_path: Path, config: str) -> None:
    status, output, _, err = _batch(tmp_path, config, "echo", "unpriced")
    assert status == 0, err
    assert "budget" not in err
    unpriced = [r for r in _records(output) if r["model"] == "unpriced"]
    assert unpriced and all(r["cost"] is None and r["cost_source"] is None for r in unpriced)


def test_scores_without_score_is_refused(tmp_path: Path, config: str) -> None:
    status, _, _, err = _batch(tmp_path, config, "echo", scores=str(tmp_path / "s.jsonl"))
    assert status == 2 and "--scores names where --score NAME writes" in err


def test_a_model_over_budget_stops_alone(tmp_path: Path, config: str) -> None:
    # "free-ish" costs nothing and is bounded at 0; echo's units are bounded at 1.8e-3:
    # with 0.004, echo stops after a couple, every free-ish unit still runs.
    status, output, _, err = _batch(tmp_path, config, "echo", "free-ish", budget=0.004)
    assert status == 3, err
    records = _records(output)
    assert sum(r["model"] == "free-ish" for r in records) == 10
    echoed = sum(r["model"] == "echo" for r in records)
    assert 0 < echoed < 10
    match = _STOPPED.search(err)
    assert match is not None and int(match.group(5)) == 10 - echoed
