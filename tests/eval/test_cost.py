"""Cost: the relay's reported figure wins, else price x usage; unknown stays None."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout.eval import cost as cost_module
from fanout.eval.cost import Price, cost_of, estimate, total

PRICE = Price(input=2.50, output=10.00, cached_input=1.25)


def test_price_times_usage() -> None:
    cost, source = cost_of({"prompt_tokens": 1000, "completion_tokens": 200}, PRICE)
    assert source == "price"
    assert cost == pytest.approx((1000 * 2.50 + 200 * 10.00) / 1e6)  # 0.0045


def test_reported_cost_wins_over_the_price() -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "cost": 0.0123}
    assert cost_of(usage, PRICE) == (0.0123, "reported")
    assert cost_of(usage, None) == (0.0123, "reported")
    assert cost_of({"cost": 0}, None) == (0.0, "reported")  # a reported 0 is known: free


def test_cached_tokens_at_the_cached_price() -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 200,
             "prompt_tokens_details": {"cached_tokens": 600}}
    cost, source = cost_of(usage, PRICE)
    assert source == "price"
    assert cost == pytest.approx((400 * 2.50 + 600 * 1.25 + 200 * 10.00) / 1e6)
    # Without a cached price every prompt token is at the input price.
    plain = Price(input=2.50, output=10.00)
    assert cost_of(usage, plain)[0] == pytest.approx((1000 * 2.50 + 200 * 10.00) / 1e6)


def test_more_cached_than_prompt_tokens_is_capped() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 0,
             "prompt_tokens_details": {"cached_tokens": 500}}
    assert cost_of(usage, PRICE)[0] == pytest.approx(100 * 1.25 / 1e6)


@pytest.mark.parametrize("usage", [
    None,
    {},
    {"prompt_tokens": 10},
    {"completion_tokens": 10},
    {"prompt_tokens": None, "completion_tokens": 5},
    {"prompt_tokens": "10", "completion_tokens": 5},
    {"prompt_tokens": 10.5, "completion_tokens": 5},
    {"prompt_tokens": True, "completion_tokens": 5},
    {"prompt_tokens": -1, "completion_tokens": 5},
    {"prompt_tokens": 10, "completion_tokens": 5, "cost": "0.1"},  # not a number: price
])
def test_unknown_usage_is_unknown_cost_never_zero(usage: Any) -> None:
    cost, source = cost_of(usage, PRICE)
    if usage and usage.get("cost") == "0.1":
        assert source == "price"
        return
    assert (cost, source) == (None, None)


def test_no_price_and_no_reported_cost_is_unknown() -> None:
    assert cost_of({"prompt_tokens": 10, "completion_tokens": 5}, None) == (None, None)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf"), True])
def test_a_bad_reported_cost_falls_back_to_the_price(bad: Any) -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 0, "cost": bad}
    assert cost_of(usage, PRICE) == (2.5, "price")


@pytest.mark.parametrize(("field", "value"), [("input", -1), ("output", "x"),
                                              ("cached_input", float("nan")),
                                              ("input", True)])
def test_price_is_checked(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"input": 1.0, "output": 2.0, field: value}
    with pytest.raises(ValueError, match=f"{field} must be a number >= 0"):
        Price(**fields)


def test_total_counts_unknown_apart() -> None:
    assert total([0.5, None, 0.25, None]) == (0.75, 2)
    assert total([]) == (0.0, 0)


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7))
def test_cost_is_linear_and_monotone(prompt: int, cached: int, completion: int) -> None:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    cost, source = cost_of(usage, PRICE)
    assert source == "price" and cost is not None
    hit = min(cached, prompt)
    assert cost == pytest.approx(estimate(PRICE, prompt - hit, completion, hit))
    # Caching never costs more than not caching (cached_input <= input here).
    assert cost <= estimate(PRICE, prompt, completion) + 1e-12


@pytest.mark.parametrize("module", ["cost", "budget", "scores"])
def test_cost_budget_and_scores_import_no_network_io(module: str) -> None:
    folder = Path(cost_module.__file__).parent
    path = (folder.parent / "store" if module == "scores" else folder) / f"{module}.py"
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not imported & {"trio", "httpx", "anyio", "asyncio", "socket"}
    relative = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level}
    assert not relative & {"run", "fanout", "net"}  # nor the runner or the engine


def test_usage_record_keeps_what_the_relay_sent() -> None:
    from fanout.core.result import Usage
    from fanout.eval.cost import usage_record

    raw = {"prompt_tokens": 10, "completion_tokens": "5", "total_tokens": 15, "cost": 0.25,
           "prompt_tokens_details": {"cached_tokens": 4}}
    record = usage_record(Usage.from_dict(raw))
    assert record == {"prompt_tokens": 10, "completion_tokens": None, "total_tokens": 15,
                      "cost": 0.25, "prompt_tokens_details": {"cached_tokens": 4}}
    assert list(record)[:3] == ["prompt_tokens", "completion_tokens", "total_tokens"]
    assert cost_of(record, PRICE) == (0.25, "reported")
    assert cost_of({**record, "cost": None}, PRICE) == (None, None)  # a count is not an int
    assert usage_record(None) is None
