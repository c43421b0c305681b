"""`fanout batch --budget`: the bounds, the stop, the exit status, resuming, judge cost."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fanout.batch import BatchOptions, ExitCode
from fanout.bodies import DEFAULT_MAX_TOKENS
from fanout.cli.batch import run_batch
from fanout.core.events import ReasoningDelta, TextDelta, ToolCallDelta, UsageReported
from fanout.core.result import Usage
from fanout.eval.budget import (
    BYTES_PER_TOKEN,
    MESSAGE_OVERHEAD,
    Budget,
    Reservation,
    why_unbounded,
)
from fanout.eval.cost import Price
from fanout.store.scores import scores_path

EXIT_BUDGET = ExitCode.BUDGET

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
max_output_tokens = 200

[[models]]
name = "unpriced"
id = "mock/fast"

[[models]]
name = "unbounded"
id = "mock/fast"
price = { input = 1, output = 1 }

[[models]]
name = "liar"
id = "fault/overcount:10"
params = { max_tokens = 5 }
price = { input = 100.00, output = 200.00 }

[[models]]
name = "overrun"
id = "fault/overrun:400"
params = { max_tokens = 5 }
price = { input = 100.00, output = 200.00 }

[[models]]
name = "claims"
id = "fault/overrun:400"
max_output_tokens = 20
price = { input = 100.00, output = 200.00 }

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

EXIT_BUDGET = ExitCode.BUDGET


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def _batch(tmp_path: Path, config: str, *models: str, output_name: str = "results.jsonl",
           **options: Any) -> tuple[int, str, str, str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out, err = io.StringIO(), io.StringIO()
    output = str(tmp_path / output_name)
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

def _cost(bound: Reservation | None) -> float:
    assert bound is not None
    return bound.cost


def test_bound_is_a_byte_a_token_then_the_largest_prompt_seen() -> None:
    budget = Budget(1.0, {"m": PRICE})
    messages = [{"role": "user", "content": "\u00e9" * 49}]  # 100 bytes as JSON (UTF-8)
    tokens_in = 100 + 2 * MESSAGE_OVERHEAD  # the message's, and the reply's start
    assert _cost(budget.bound("q", "m", messages, {"max_tokens": 10})) == pytest.approx(
        (tokens_in * 100 + 10 * 200) / 1e6)
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert _cost(budget.bound("q", "m", messages, {"max_tokens": 10}, tools=tools)) > \
        _cost(budget.bound("q", "m", messages, {"max_tokens": 10}))  # tools are input too
    budget.observe("q", "m", {"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    budget.observe("q", "m", {"usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    assert _cost(budget.bound("q", "m", messages, {"max_tokens": 10})) == pytest.approx(
        (7 * 100 + 10 * 200) / 1e6)
    # Without max_tokens nothing bounds the output (the largest answer seen is no bound).
    assert budget.bound("q", "m", messages, {}) is None
    assert budget.bound("q", "other", messages, {"max_tokens": 1}) is None  # no price
    fresh = Budget(1.0, {"m": PRICE})
    assert _cost(fresh.bound("q", "m", messages, {"max_completion_tokens": 4,
                                                  "max_tokens": 99})) == pytest.approx(
        (tokens_in * 100 + 4 * 200) / 1e6)
    # n answers of max_tokens each; an Anthropic request is sent 4096 when it sets none
    assert _cost(fresh.bound("q", "m", messages, {"max_tokens": 4, "n": 3})) == \
        pytest.approx((tokens_in * 100 + 12 * 200) / 1e6)
    assert _cost(fresh.bound("q", "m", messages, {}, api="anthropic")) == pytest.approx(
        (tokens_in * 100 + DEFAULT_MAX_TOKENS * 200) / 1e6)
    # The model's max_output_tokens, when the request sets no max_tokens.
    claimed = Budget(1.0, {"m": PRICE}, {"m": 50})
    assert _cost(claimed.bound("q", "m", messages, {})) == pytest.approx(
        (tokens_in * 100 + 50 * 200) / 1e6)
    assert _cost(claimed.bound("q", "m", messages, {"max_tokens": 10})) == pytest.approx(
        (tokens_in * 100 + 10 * 200) / 1e6)


def test_why_unbounded_names_the_model_and_the_keys() -> None:
    assert why_unbounded("m", PRICE, {"max_tokens": 3}) is None
    assert why_unbounded("m", PRICE, {}, max_output_tokens=3) is None
    assert why_unbounded("m", PRICE, {}, api="anthropic") is None
    line = why_unbounded("m", PRICE, {})
    assert line is not None and "'m'" in line
    assert "max_tokens" in line and "max_output_tokens" in line and "\n" not in line
    line = why_unbounded("m", None, {"max_tokens": 3})
    assert line is not None and "no price for 'm'" in line


def _running(budget: Budget, key: str, bound: Reservation) -> None:
    assert budget.fits(bound)
    budget.send(key, bound)


def test_fits_reserves_and_unknown_cost_counts_its_bound() -> None:
    budget = Budget(1.0, {})
    assert budget.fits(Reservation(0.6, 0, 0, PRICE))
    budget.send("a", Reservation(0.6, 0, 0, PRICE))
    assert not budget.fits(Reservation(0.5, 0, 0, PRICE))
    assert budget.fits(Reservation(0.4, 0, 0, PRICE))
    budget.finished("a", 0.1)
    assert budget.spent == pytest.approx(0.1)
    budget.send("b", Reservation(0.3, 0, 0, PRICE))
    budget.finished("b", None)  # unknown is never free
    assert budget.spent == pytest.approx(0.4) and budget.unknown == 1
    budget.send("c", Reservation(0.3, 0, 0, PRICE))
    budget.release("c")  # reserved, never sent: nothing spent
    assert budget.spent == pytest.approx(0.4) and budget.in_flight == 0
    assert budget.exceeded == 0 and "exceeded" not in budget.spent_line()


def test_a_running_stream_is_cancelled_before_it_passes_what_is_left() -> None:
    price = Price(input=0.0, output=1_000_000.0)  # $1 an output token
    budget = Budget(10.0, {"m": price}, {"m": 4})
    claimed = budget.bound("q", "m", [], {})  # 4 tokens claimed, not enforced: $4
    enforced = budget.bound("q", "m", [], {"max_tokens": 3})  # $3
    assert claimed is not None and enforced is not None
    _running(budget, "a", claimed)
    _running(budget, "b", enforced)
    # a may use 10 - 3 (b's bound) = $7: 7 tokens, estimated from its bytes; it is
    # cancelled when one more delta like its largest would pass that
    text = "x" * BYTES_PER_TOKEN
    assert not any(budget.streamed(TextDelta(0, text, stream="a")) for _ in range(5))
    assert budget.streamed(ReasoningDelta(0, text, stream="a")) is False  # $6, next $7
    assert budget.streamed(ToolCallDelta(0, 0, None, None, None, text, stream="a"))  # $7
    assert budget.cancelled == 1 and budget.stopped
    assert "would pass what the budget (--budget 10) had left" in budget.reason("a")
    assert not budget.streamed(TextDelta(0, "y", stream="a"))  # once; still counted
    assert budget.in_flight == pytest.approx(8 + 3)  # what a streamed, and b's bound
    budget.finished("a", None)  # cancelled without usage: what it streamed counts ($8)
    assert budget.spent == pytest.approx(8.0) and budget.in_flight == pytest.approx(3)
    assert budget.exceeded == 0


def test_an_enforced_max_tokens_caps_the_estimate_until_more_deltas_arrive() -> None:
    price = Price(input=0.0, output=1_000_000.0)
    budget = Budget(4.0, {"m": price})
    enforced = budget.bound("q", "m", [], {"max_tokens": 3})  # $3, $1 to spare
    assert enforced is not None
    _running(budget, "b", enforced)
    # its server stops at max_tokens = 3, so long deltas are not more tokens...
    assert not any(budget.streamed(TextDelta(0, "z" * 100, stream="b")) for _ in range(3))
    # ...until a fourth delta arrives: it does not enforce it.  From then on the bytes
    # past the bound count too (4 bytes: 1 token), and one more delta like its largest
    # (100 bytes: 25 tokens) would pass the $1 left: cancelled, one token past its bound
    assert budget.streamed(TextDelta(0, "z" * 4, stream="b"))
    budget.finished("b", None)
    assert budget.spent == pytest.approx(4.0) and budget.exceeded == 0
    # a stream past its bound with no room left at all: the overshoot is said
    tight = Budget(3.0, {"m": price})
    assert enforced is not None
    _running(tight, "c", enforced)
    assert not any(tight.streamed(TextDelta(0, "z", stream="c")) for _ in range(3))
    assert tight.streamed(TextDelta(0, "z", stream="c"))
    tight.finished("c", None)
    assert "budget exceeded by $1.000000" in tight.describe(0)


def test_a_usage_while_running_replaces_the_estimate() -> None:
    price = Price(input=1_000_000.0, output=1_000_000.0)  # $1 a token
    budget = Budget(95.0, {"m": price})
    bound = budget.bound("q", "m", [{"role": "user", "content": "hi"}], {"max_tokens": 10})
    assert bound is not None and bound.cost == pytest.approx(4 + 2 * MESSAGE_OVERHEAD + 10)
    _running(budget, "a", bound)
    # Anthropic says its input at the start: 90 tokens, more than the bound's
    assert not budget.streamed(UsageReported(Usage(prompt_tokens=90), stream="a"))
    assert not any(budget.streamed(TextDelta(0, "x", stream="a")) for _ in range(4))  # $94
    assert budget.streamed(TextDelta(0, "x", stream="a"))  # $95: the next would pass $95
    # a relay's usage on every chunk is taken as it says (it never cancels by itself)
    other = Budget(95.0, {"m": price})
    _running(other, "b", bound)
    assert not other.streamed(UsageReported(Usage(prompt_tokens=90, completion_tokens=9),
                                            stream="b"))
    assert other.streamed(TextDelta(0, "x", stream="b"))  # 90 + 9 + 1 > 95
    other.finished("b", 120.0)  # billed more than its bound: the budget was exceeded
    assert other.over_bound == 1 and other.exceeded == pytest.approx(25.0)
    assert other.spent_line().endswith("budget exceeded by $25.000000 (1 stream cost more "
                                       "than their bound: the relay billed more tokens than "
                                       "were asked for)")


# ------------------------------------------------------------------ batch --budget

def test_the_budget_stops_the_run_and_a_rerun_continues(tmp_path: Path, config: str) -> None:
    # Each echo unit costs 1.5e-3 (7 + 4 tokens at 100/200 per million) and is bounded at
    # 5.7e-3 (47 tokens in: 15 bytes + 2 x 16; 5 out: max_tokens): 0.01 runs a few.
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


def test_a_model_without_an_output_bound_refuses_to_start(tmp_path: Path,
                                                          config: str) -> None:
    # a price, but no max_tokens and no max_output_tokens: "the largest answer seen so
    # far" is no bound, so --budget is refused, in one line naming the model and the keys
    status, output, _, err = _batch(tmp_path, config, "echo", "unbounded", budget=1.0)
    assert status == 2
    assert err.count("\n") == 1, err
    assert err.startswith("fanout batch: --budget: nothing bounds the output of 'unbounded'")
    assert "max_tokens" in err and "max_output_tokens" in err and "nothing was sent" in err
    assert Path(output).read_bytes() == b""
    # a prompt that sets max_tokens for itself bounds it too
    prompts = tmp_path / "bounded.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi", "params": {"max_tokens": 3}})
                       + "\n")
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(tmp_path / "b.jsonl"),
                                    models=("unbounded",), config=config, budget=1.0),
                       stdout=io.StringIO(), stderr=io.StringIO())
    assert status == 0


def test_a_judge_without_an_output_bound_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG.replace('params = { max_tokens = 40 }\n', ''))
    status, _, _, err = _batch(tmp_path, str(path), "echo", budget=1.0, scorers=("judged",))
    assert status == 2 and err.count("\n") == 1, err
    assert "--budget: the judge of --score judged: nothing bounds the output of 'judge'" in err


def test_a_relay_that_bills_past_max_tokens_is_said(tmp_path: Path, config: str) -> None:
    # fault/overcount:10 honours max_tokens = 5 but its usage says 50 tokens: the bound
    # could not hold, and the last line says by how much the budget was passed
    status, output, _, err = _batch(tmp_path, config, "liar", budget=0.02)
    records = _records(output)
    spent = sum(r["cost"] for r in records)
    assert records and all(r["usage"]["completion_tokens"] == 50 for r in records)
    assert spent > 0.02, err
    last = err.splitlines()[-2]  # before the exit line
    assert last.endswith(f"budget exceeded by ${spent - 0.02:.6f} ({len(records)} streams "
                         "cost more than their bound: the relay billed more tokens than were "
                         "asked for)"), err
    assert status == 3


def test_a_server_that_ignores_max_tokens_is_cancelled_at_the_budget(tmp_path: Path,
                                                                     config: str) -> None:
    # fault/overrun streams 400 tokens (20 ms apart) whatever max_tokens says (each would
    # cost $0.08): each stream is cancelled once its running cost would pass what the
    # budget has left, its partial output kept.  "overrun" sends max_tokens = 5, "claims"
    # says max_output_tokens = 20 (not sent); the estimate believes either until one more
    # delta than that comes, so a stream may pass its bound by that delta (one token, up
    # to two as estimated from its bytes, at $0.0002 each), and no more.
    for model in ("claims", "overrun"):
        status, output, _, err = _batch(tmp_path, config, model, budget=0.02,
                                        output_name=f"{model}.jsonl")
        assert status == 3, err
        records = _records(output)
        cancelled = [r for r in records if r["outcome"] == "cancelled"]
        assert cancelled, err
        for record in cancelled:
            assert "would pass what the budget (--budget 0.02) had left" in record["reason"]
            assert record["text"]  # the partial output is kept
        assert "cancelled before passing it" in err
        match = re.search(r"budget exceeded by \$([0-9.]+)", err)
        over = float(match.group(1)) if match else 0.0
        assert over <= 2 * 200e-6 * len(cancelled) + 1e-9, err


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_budget_is_refused(tmp_path: Path, config: str, budget: float) -> None:
    status, _, _, err = _batch(tmp_path, config, "echo", budget=budget)
    assert status == 2 and "--budget must be a number of USD > 0" in err


def test_judge_spending_counts_toward_the_budget(tmp_path: Path, config: str) -> None:
    # a judge request is bounded at ~$0.0095 (its prompt is long): with 0.034 the answers
    # all fit, and the judges until one no longer does
    status, output, out, err = _batch(tmp_path, config, "echo", budget=0.034,
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
    # "free-ish" costs nothing and is bounded at 0; echo's units are bounded at 5.7e-3:
    # with 0.012, echo stops after a few, every free-ish unit still runs.
    status, output, _, err = _batch(tmp_path, config, "echo", "free-ish", budget=0.012)
    assert status == 3, err
    records = _records(output)
    assert sum(r["model"] == "free-ish" for r in records) == 10
    echoed = sum(r["model"] == "echo" for r in records)
    assert 0 < echoed < 10
    match = _STOPPED.search(err)
    assert match is not None and int(match.group(5)) == 10 - echoed


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "true", '"100"'])
def test_max_output_tokens_is_a_whole_number(tmp_path: Path, value: str) -> None:
    from fanout import ConfigError, load_config

    path = tmp_path / "fanout.toml"
    path.write_text(f'[[models]]\nname = "m"\nid = "mock/fast"\nmax_output_tokens = {value}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert "[[models]] #1 (m) max_output_tokens: must be a whole number >= 1" in str(caught.value)
    path.write_text('[[models]]\nname = "m"\nid = "mock/fast"\nmax_output_tokens = 50\n')
    assert load_config(str(path)).model("m").max_output_tokens == 50
