"""fanout.eval.aggregate on hand-built records: known means, the latest answer and its
current scores only (stale ones counted and left out), unscored never a failure, unknown
cost never zero, groups by category and tag, pass@k over samples, flaky prompts, and the
paired comparison of two runs (flips, tests, keys on one side counted)."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import pytest

from fanout.eval import stats
from fanout.eval.aggregate import (
    NO_GROUP,
    compare_runs,
    evaluate,
    infer_samples,
    prepare,
    slim,
    to_json,
)
from fanout.store.results import work_key
from fanout.store.scores import answer_key


def answer(prompt: str | int, model: str, text: str, *, sample: int = 0,
           outcome: str = "completed", **extra: Any) -> dict[str, Any]:
    return {"id": prompt, "model": model, "sample": sample, "outcome": outcome,
            "reason": None if outcome == "completed" else f"{outcome}: cut",
            "flags": [], "content_key": f"ck-{prompt}-{model}", "text": text,
            "finish_reason": "stop" if outcome == "completed" else None,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "metrics": {"ttft": 0.1, "tokens_per_second": 50.0}, **extra}


def score(record: dict[str, Any], value: float | None, *, scorer: str = "exact",
          status: str = "scored", threshold: float = 1.0, key: str | None = None,
          **extra: Any) -> dict[str, Any]:
    return {"id": record["id"], "model": record["model"], "sample": record["sample"],
            "scorer": scorer, "kind": scorer, "scorer_key": "sk",
            "answer_key": key if key is not None else answer_key(record),
            "status": status, "score": value,
            "passed": None if value is None else value >= threshold,
            "explanation": "…", "scored_at": "2026-12-01T11:00:00.000+00:00", **extra}


def latest(scores: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in scores:
        out[(work_key(s["id"], s["model"], s["sample"]), s["scorer"])] = s
    return out


def row_of(evaluation: Any, model: str, group: str | None = None) -> Any:
    return next(r for r in evaluation.rows if r.model == model and r.group == group)


def test_known_means_and_pass_rates() -> None:
    records = [answer(f"q{i}", "a", "x") for i in range(4)] + \
        [answer(f"q{i}", "b", "x") for i in range(4)]
    values = {"a": [1.0, 1.0, 0.0, 0.5], "b": [0.0, 0.0, 0.0, 1.0]}
    scores = [score(r, values[r["model"]][int(r["id"][1])], threshold=0.5) for r in records]
    evaluation = evaluate(prepare(records, latest(scores)), resamples=500, seed=1)
    a = row_of(evaluation, "a").scorers[0]
    assert (a.units, a.completed, a.scored, a.unscored, a.errors, a.missing) == (4, 4, 4, 0, 0, 0)
    assert a.mean.value == 0.625 and (a.passed, a.failed) == (3, 1)
    assert a.pass_rate.value == 0.75
    assert a.mean == stats.bootstrap_mean([1.0, 1.0, 0.0, 0.5], resamples=500, seed=1)
    b = row_of(evaluation, "b").scorers[0]
    assert b.mean.value == 0.25 and b.pass_rate.value == 0.25
    assert evaluation.samples == 1 and a.pass_at_k == {} and a.flaky == ()
    analytic = evaluate(prepare(records, latest(scores)), interval="analytic")
    rate = row_of(analytic, "a").scorers[0].pass_rate
    assert rate == stats.wilson(3, 4)
    mean = row_of(analytic, "a").scorers[0].mean
    assert mean.method == "normal" and mean.high <= 1.0 and mean.low >= 0.0


def test_the_latest_answer_counts_and_stale_scores_are_counted_and_left_out() -> None:
    first = answer("q1", "a", "wrong")
    scores = [score(first, 0.0)]
    redone = answer("q1", "a", "right")  # the same key, a new answer: its old score is stale
    other = answer("q2", "a", "right")
    scores += [score(other, 1.0), score(answer("q9", "gone", "x"), 1.0)]
    run = prepare([first, redone, other], latest(scores))
    assert run.latest[work_key("q1", "a", 0)]["text"] == "right"
    assert (run.stale, run.orphans) == (1, 1)
    evaluation = evaluate(run, resamples=100)
    row = row_of(evaluation, "a").scorers[0]
    assert (row.units, row.scored, row.missing) == (2, 1, 1)  # q1 is not scored any more
    assert row.mean.value == 1.0 and row.passed == 1
    assert (evaluation.stale, evaluation.orphans) == (1, 1)
    # a rescore of the new answer is current again
    run = prepare([first, redone, other], latest([*scores, score(redone, 1.0)]))
    assert run.stale == 0 and evaluate(run, resamples=100).rows[0].scorers[0].scored == 2


def test_an_answer_that_did_not_complete_is_unscored_never_a_failure() -> None:
    records = [answer("q1", "a", "good"), answer("q2", "a", "par", outcome="truncated"),
               answer("q3", "a", "", outcome="error"), answer("q4", "a", "?")]
    scores = [score(records[0], 1.0),
              score(records[1], None, status="unscored"),  # what the scorer writes
              score(records[3], None, status="error")]  # the scorer could not score it
    row = evaluate(prepare(records, latest(scores)), resamples=100).rows[0]
    exact = row.scorers[0]
    # q3 has no score record at all: it did not complete, so it is unscored too
    assert (exact.scored, exact.unscored, exact.errors, exact.missing) == (1, 2, 1, 0)
    assert exact.mean.value == 1.0 and (exact.passed, exact.failed) == (1, 0)
    assert row.states == {"completed": 2, "truncated": 1, "error": 1} and row.completed == 2


def test_unknown_cost_is_never_zero_and_every_attempt_counts() -> None:
    records = [answer("q1", "a", "x", cost=0.002, cost_source="price"),
               answer("q1", "a", "y", cost=0.003, cost_source="price"),  # a redo: paid too
               answer("q2", "a", "x", cost=None, cost_source=None),
               answer("q1", "b", "x"),  # no cost field: unknown
               answer("q2", "b", "x", cost=None)]
    evaluation = evaluate(prepare(records, {}), resamples=100)
    a, b = row_of(evaluation, "a"), row_of(evaluation, "b")
    assert a.cost == pytest.approx(0.005) and (a.cost_known, a.cost_unknown) == (2, 1)
    assert b.cost is None and (b.cost_known, b.cost_unknown) == (0, 2)
    assert evaluation.cost == pytest.approx(0.005) and evaluation.cost_unknown == 3
    assert to_json(evaluation)["models"][1]["cost"] == {"total": None, "known": 0, "unknown": 2,
                                                       "text": "-"}


def test_the_judges_cost_is_apart() -> None:
    records = [answer("q1", "a", "x", cost=0.01), answer("q2", "a", "x", cost=0.01)]
    judge = {"model": "judge", "outcome": "completed", "text": "GRADE: PASS"}
    scores = [score(records[0], 1.0, scorer="judge", judge={**judge, "cost": 0.0004}),
              score(records[1], 1.0, scorer="judge", judge={**judge, "cost": None}),
              score(records[0], 1.0)]
    evaluation = evaluate(prepare(records, latest(scores)), resamples=100)
    assert evaluation.cost == pytest.approx(0.02)
    assert (evaluation.judge.calls, evaluation.judge.known, evaluation.judge.unknown) == (2, 1, 1)
    assert evaluation.judge.cost == pytest.approx(0.0004)
    assert evaluation.scorers == ("exact", "judge")


def test_by_category_and_by_tag() -> None:
    records = [answer("q1", "a", "x", category="math", tags=["easy", "arith"]),
               answer("q2", "a", "x", category="math", tags=["hard"]),
               answer("q3", "a", "x", category="code", cost=0.5),
               answer("q4", "a", "x")]
    scores = [score(r, v) for r, v in zip(records, [1.0, 0.0, 1.0, 0.0], strict=True)]
    run = prepare(records, latest(scores))
    by_category = evaluate(run, by="category", resamples=100)
    assert [(r.model, r.group, r.units) for r in by_category.rows] == [
        ("a", "code", 1), ("a", "math", 2), ("a", NO_GROUP, 1)]
    assert row_of(by_category, "a", "math").scorers[0].mean.value == 0.5
    assert row_of(by_category, "a", "code").cost == 0.5
    assert row_of(by_category, "a", "math").cost is None
    by_tag = evaluate(run, by="tag", resamples=100)
    assert [(r.group, r.units) for r in by_tag.rows] == [
        ("arith", 1), ("easy", 1), ("hard", 1), (NO_GROUP, 2)]
    assert row_of(by_tag, "a", NO_GROUP).scorers[0].mean.value == 0.5


def test_pass_at_k_pass_hat_k_and_flaky_prompts_over_samples() -> None:
    outcomes = {"q1": [1, 1, 1, 1], "q2": [1, 0, 0, 1], "q3": [0, 0, 0, 0], "q4": [1, 0]}
    records, scores = [], []
    for prompt, passes in outcomes.items():
        for sample, passed in enumerate(passes):
            record = answer(prompt, "a", "x", sample=sample)
            records.append(record)
            scores.append(score(record, float(passed)))
    run = prepare(records, latest(scores))
    assert infer_samples(run) == 4
    row = evaluate(run, resamples=100).rows[0].scorers[0]
    assert row.samples == 4 and row.short == 1  # q4 has 2 samples of 4
    expected_at_1 = (1 + 0.5 + 0 + 0.5) / 4
    assert row.pass_at_k[1] == pytest.approx(expected_at_1)
    # pass@4 and pass^4 over q1..q3 (n = 4): 1, 1, 0 and 1, 0, 0
    assert row.pass_at_k[4] == pytest.approx(2 / 3)
    assert row.pass_hat_k[4] == pytest.approx(1 / 3)
    assert row.flaky == ("q2", "q4")
    at_2 = evaluate(run, samples=2, resamples=100).rows[0].scorers[0]
    assert at_2.short == 0
    assert at_2.pass_at_k[2] == pytest.approx(float(
        (1 + stats.pass_at_k(4, 2, 2) + 0 + stats.pass_at_k(2, 1, 2)) / 4))
    assert at_2.pass_hat_k[2] == pytest.approx(float(
        (1 + stats.pass_hat_k(4, 2, 2) + 0 + Fraction(0)) / 4))
    # the bootstrap resamples prompts: each prompt's mean over its samples
    assert row.mean == stats.bootstrap_mean([1.0, 0.5, 0.0, 0.5], resamples=100)


def test_ttft_and_tokens_per_second_distributions() -> None:
    records = [answer(f"q{i}", "a", "x") for i in range(5)]
    for i, record in enumerate(records):
        record["metrics"] = {"ttft": 0.1 * (i + 1), "tokens_per_second": 10.0 * (5 - i)}
    records[4]["metrics"] = {"ttft": None}
    row = evaluate(prepare(records, {}), resamples=100).rows[0]
    assert row.ttft.values == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert row.ttft.p50 == pytest.approx(0.25) and row.ttft.p95 == pytest.approx(0.385)
    assert row.tokens_per_second.values == (20.0, 30.0, 40.0, 50.0)
    assert row.scorers == ()


def test_malformed_score_values_are_errors_not_numbers() -> None:
    records = [answer("q1", "a", "x"), answer("q2", "a", "x")]
    scores = [score(records[0], 1.0), {**score(records[1], 1.0), "score": "1.0"}]
    row = evaluate(prepare(records, latest(scores)), resamples=100).rows[0].scorers[0]
    assert (row.scored, row.errors) == (1, 1)


def test_json_has_stable_keys_and_is_json() -> None:
    records = [answer("q1", "a", "x", sample=s) for s in range(2)]
    scores = [score(r, 1.0) for r in records]
    data = to_json(evaluate(prepare(records, latest(scores)), resamples=100))
    assert list(data) == ["samples", "by", "scorers", "interval", "stale_scores",
                          "orphan_scores", "cost", "models"]
    model = data["models"][0]
    assert list(model) == ["model", "group", "units", "completed", "states", "cost", "ttft",
                           "tokens_per_second", "scorers"]
    assert list(model["scorers"]["exact"]) == [
        "units", "completed", "scored", "unscored", "errors", "missing", "passed", "failed",
        "prompts", "mean", "pass_rate", "pass_at_k", "pass_hat_k", "short_prompts", "flaky"]
    assert model["scorers"]["exact"]["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert json.loads(json.dumps(data)) == data


# ---------------------------------------------------------------------- compare

def _run(passes: dict[str, int], *, model: str = "a", missing: tuple[str, ...] = (),
         truncated: tuple[str, ...] = ()) -> Any:
    records, scores = [], []
    for prompt, passed in passes.items():
        if prompt in missing:
            continue
        outcome = "truncated" if prompt in truncated else "completed"
        record = answer(prompt, model, f"{prompt}:{passed}", outcome=outcome)
        records.append(record)
        if outcome == "completed":
            scores.append(score(record, float(passed)))
    return prepare(records, latest(scores))


def test_compare_runs_pairs_keys_lists_flips_and_counts_one_sided_keys() -> None:
    prompts = [f"q{i}" for i in range(12)]
    baseline = dict.fromkeys(prompts, 1) | {"q8": 0, "q9": 0, "q10": 0, "q11": 0}
    new = dict.fromkeys(prompts, 1) | {"q0": 0, "q1": 0, "q8": 0, "q11": 0}
    b = _run(baseline | {"b-only": 1, "b-only2": 0}, truncated=("q7",))
    a = _run(new | {"a-only": 1}, missing=("q6",))
    comparison = compare_runs(a, b, resamples=1000)
    assert (comparison.only_a, comparison.only_b) == (1, 3)  # q6 is missing from A
    assert comparison.only_a_by_model == {"a": 1} and comparison.only_b_by_model == {"a": 3}
    assert (comparison.both, comparison.not_both_completed) == (11, 1)  # q7 truncated in B
    (row,) = comparison.rows
    assert row.pairs == 10 and row.prompts == 10
    assert [f.id for f in row.pass_to_fail] == ["q0", "q1"]
    assert [f.id for f in row.fail_to_pass] == ["q9", "q10"]
    assert (row.mcnemar.b, row.mcnemar.c) == (2, 2) and row.mcnemar.p_value == 1.0
    assert row.mean_a == row.mean_b == 0.6 and row.difference.difference.value == 0.0
    assert (row.sign.positive, row.sign.negative, row.sign.ties) == (2, 2, 6)
    data = to_json(evaluate(a, resamples=100), comparison)["against"]
    assert data["rows"][0]["pass_to_fail"] == [{"id": "q0", "sample": 0},
                                               {"id": "q1", "sample": 0}]


def test_a_clear_regression_is_significant() -> None:
    prompts = [f"q{i}" for i in range(30)]
    b = _run(dict.fromkeys(prompts, 1))
    a = _run(dict.fromkeys(prompts, 1) | {p: 0 for p in prompts[:12]})
    (row,) = compare_runs(a, b).rows
    assert row.difference.difference.value == pytest.approx(-0.4)
    assert row.difference.difference.high < 0 and row.difference.p_value < 0.001
    assert row.mcnemar.method == "exact" and row.mcnemar.p_value == pytest.approx(2 / 2 ** 12)
    assert row.sign.p_value == pytest.approx(2 / 2 ** 12)
    assert len(row.pass_to_fail) == 12 and row.fail_to_pass == ()


def test_compare_runs_without_common_scorers_or_keys() -> None:
    a = _run({"q1": 1})
    b = prepare([answer("q2", "a", "x")], {})
    comparison = compare_runs(a, b)
    assert comparison.rows == () and (comparison.only_a, comparison.only_b) == (1, 1)
    assert math.isfinite(comparison.resamples)


def test_flips_are_listed_by_prompt_then_sample() -> None:
    a_records, b_records = [], []
    for sample in (1, 0):  # finished in another order than sampled
        a_records += [answer("q2", "m", "x", sample=sample), answer("q1", "m", "x", sample=sample)]
        b_records += [answer("q1", "m", "y", sample=sample), answer("q2", "m", "y", sample=sample)]
    a = prepare(a_records, latest([score(r, 0.0) for r in a_records]))
    b = prepare(b_records, latest([score(r, 1.0) for r in b_records]))
    (row,) = compare_runs(a, b, resamples=100).rows
    assert [(f.id, f.sample) for f in row.pass_to_fail] == [("q2", 0), ("q2", 1), ("q1", 0),
                                                            ("q1", 1)]


def test_absurd_costs_are_unknown_and_never_overflow() -> None:
    records = [answer("q1", "a", "x", cost=1e308), answer("q2", "a", "x", cost=1e308),
               answer("q3", "a", "x", cost=float("nan")), answer("q4", "a", "x", cost=-1),
               answer("q5", "a", "x", cost=True), answer("q6", "a", "x", cost=0.5)]
    evaluation = evaluate(prepare(records, {}), resamples=10)
    row = evaluation.rows[0]
    assert (row.cost, row.cost_known, row.cost_unknown) == (0.5, 1, 5)
    json.dumps(to_json(evaluation), allow_nan=False)  # no Infinity, no NaN


def test_slim_records_give_the_same_evaluation_and_their_own_answer_keys() -> None:
    records = [answer("q1", "a", "x", sample=s, category="c", tags=["t"], cost=0.1)
               for s in range(3)] + [answer("q2", "a", "y", outcome="truncated")]
    old = answer("q1", "a", "old")
    records.insert(0, old)  # q1 sample 0 is redone: its score is of the old answer
    scores = latest([score(old, 1.0)] + [score(r, 1.0) for r in records[2:]])
    whole = evaluate(prepare(records, scores), resamples=50)
    slimmed = [slim(r) for r in records]
    assert all(s.answer_key == answer_key(r) for s, r in zip(slimmed, records, strict=True))
    assert "text" not in slimmed[0] and "choices" not in slimmed[0]
    assert to_json(evaluate(prepare(slimmed, scores), resamples=50)) == to_json(whole)
    assert whole.stale == 1
    # a record field named like the key is never trusted: only slim() computes it
    forged = {**records[1], "answer_key": score(old, 1.0)["answer_key"]}
    assert prepare([forged], latest([score(old, 1.0)])).stale == 1
