"""An evaluation's numbers, from a results file's records and its scores (sans-I/O).

``prepare`` reads the records in file order: the reported record of each key
(prompt id, model, sample) is the answer (its latest, unless
``fanout.store.results.supersedes`` keeps an earlier one: a redo of the same run
that failed with no output does not replace text); a score counts only while it
is of that answer (its ``answer_key`` is ``fanout.store.scores.answer_key`` of
that record): others are *stale*, counted and left out.  ``evaluate`` then gives,
per model (and per category or tag with ``by``), per scorer:

- ``units`` (keys), ``completed`` (``fanout.store.results.state_of``), ``scored``,
  ``unscored`` (the answer did not complete: never a failure), ``errors`` (the
  scorer could not score), ``missing`` (no current score: never scored, or stale);
- the mean score and the pass rate with their intervals (``fanout.eval.stats``:
  the bootstrap over prompts by default, ``interval="analytic"`` for Wilson and
  the normal interval);
- with ``samples`` K > 1: pass@1 and pass@K, pass^K (each prompt's ``n`` its
  scored samples; a prompt with fewer than K is left out of the K columns and
  counted as ``short``), and the flaky prompts (samples that disagree);

and per model: cost (the sum of every record's known ``cost``, every attempt
having been paid for; how many are unknown, never counted as 0), TTFT and
tokens/s over the latest records (p50, p95 and the values: the percentiles
``fanout report`` shows, by the same ``stats.percentile``).  The judge's cost is
apart: the sum over the current scores' ``judge.cost``.

``compare_runs(a, b)`` pairs two runs key by key: B is the baseline, a
difference is A - B, ``pass_to_fail`` lists what passed in B and fails in A.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from ..store.results import Attempt, attempt_of, state_of, supersedes, work_key
from . import stats
from .cost import format_cost, round_cost
from .stats import Estimate, McNemar, PairedBootstrap, SignTest

__all__ = ["COST_LIMIT", "NO_GROUP", "By", "Comparison", "Distribution", "Evaluation", "Flip",
           "JudgeCost", "ModelRow", "Paired", "Run", "ScorerRow", "Slim",
           "compare_runs",
           "comparison_json", "evaluate", "infer_samples", "prepare", "to_json"]

By = Literal["category", "tag"]
Interval = Literal["bootstrap", "analytic"]
#: The group of records without a category (``by="category"``) or tag (``by="tag"``).
NO_GROUP: Final = "(none)"


# ------------------------------------------------------------------------ input

def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


#: A record's cost at or above this (USD) is taken as garbage: unknown, not summed (a sum
#: of such numbers could overflow to infinity, which JSON cannot carry).
COST_LIMIT: Final = 1e12


def _cost(value: object) -> float | None:
    number = _number(value)
    return number if number is not None and number < COST_LIMIT else None


@attrs.frozen
class Run:
    """One run's latest answers and their current scores.

    ``latest``: work key -> the key's reported record (``supersedes``), in file order
    of those records; ``scores``: (work key, scorer) -> a score of that answer;
    ``stale``: scores of an older answer (left out); ``orphans``: scores of a key
    the results do not hold (left out); ``attempts``: per model, every record's cost
    (``None``: unknown) and its (category, *tags); ``prompts``: the prompt ids in order
    of first appearance in the results file (the prompts file's order, as a batch writes
    it), whatever order later redos wrote.
    """

    latest: dict[str, dict[str, Any]]  # whole records or ``Slim`` ones, as given
    scores: dict[tuple[str, str], dict[str, Any]]
    scorers: tuple[str, ...]
    stale: int = 0
    orphans: int = 0
    attempts: dict[str, list[tuple[float | None, tuple[str, ...]]]] = attrs.Factory(dict)
    prompts: tuple[str, ...] = ()


def _default_answer_key() -> Callable[[Mapping[str, Any]], str]:
    from ..store.scores import answer_key

    return answer_key


class Slim(dict[str, Any]):
    """A results record cut to what ``evaluate`` and ``compare_runs`` read, with its
    ``answer_key`` and ``attempt`` (what ``supersedes`` compares) computed from the
    whole record (``slim``): a big file stays small in memory.  ``prepare`` takes slim
    and whole records alike."""

    answer_key: str = ""
    attempt: Attempt | None = None


#: What ``slim`` keeps of a record (``state_of`` needs outcome, cut and flags).
_SLIM = ("id", "model", "sample", "outcome", "cut", "flags", "category", "tags", "cost")
_SLIM_METRICS = ("ttft", "tokens_per_second")


def slim(record: Mapping[str, Any], *,
         answer_key: Callable[[Mapping[str, Any]], str] | None = None) -> Slim:
    """``record`` cut to what the evaluation reads (``Slim``)."""
    out = Slim({name: record[name] for name in _SLIM if name in record})
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        out["metrics"] = {name: metrics.get(name) for name in _SLIM_METRICS}
    if not isinstance(record.get("flags"), list) and "choices" in record:
        out["choices"] = record["choices"]  # a record from before flags: state_of reads them
    out.answer_key = (answer_key or _default_answer_key())(record)
    out.attempt = attempt_of(record)
    return out


def _attempt(record: Mapping[str, Any]) -> Attempt:
    if isinstance(record, Slim) and record.attempt is not None:
        return record.attempt
    return attempt_of(record)


def prepare(records: Iterable[Mapping[str, Any]],
            scores: Mapping[tuple[str, str], Mapping[str, Any]] | None = None, *,
            answer_key: Callable[[Mapping[str, Any]], str] | None = None) -> Run:
    """A ``Run`` from every record of a results file in file order and the latest score
    per (work key, scorer) (``fanout.store.scores.read_scores``)."""
    key_of = answer_key or _default_answer_key()
    latest: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[tuple[float | None, tuple[str, ...]]]] = {}
    prompts: dict[str, None] = {}
    for record in records:
        key = work_key(record["id"], record["model"], record["sample"])
        prompts.setdefault(str(record["id"]), None)
        earlier = latest.get(key)
        if earlier is None or supersedes(_attempt(earlier), _attempt(record)):
            latest.pop(key, None)  # else the earlier stays, in its place
            latest[key] = record if isinstance(record, Slim) else dict(record)
        model = str(record["model"])
        groups.setdefault(model, []).append((_cost(record.get("cost")), _labels(record)))
    current: dict[tuple[str, str], dict[str, Any]] = {}
    stale = orphans = 0
    names: set[str] = set()
    for (key, scorer), score in (scores or {}).items():
        names.add(scorer)
        answer = latest.get(key)
        if answer is None:
            orphans += 1
        elif score.get("answer_key") != (answer.answer_key if isinstance(answer, Slim)
                                          else key_of(answer)):
            stale += 1
        else:
            current[(key, scorer)] = dict(score)
    return Run(latest, current, tuple(sorted(names)), stale, orphans, groups, tuple(prompts))


def _labels(record: Mapping[str, Any]) -> tuple[str, ...]:
    """(category, *tags) as strings; a missing or malformed one is left out."""
    category = record.get("category")
    tags = record.get("tags")
    return ((category if isinstance(category, str) else "",)
            + (tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list)
               else ()))


def _groups_of(record: Mapping[str, Any], by: By | None) -> list[str | None]:
    if by is None:
        return [None]
    labels = _labels(record)
    if by == "category":
        return [labels[0] or NO_GROUP]
    return list(dict.fromkeys(labels[1:])) or [NO_GROUP]


def infer_samples(run: Run) -> int:
    """The most samples any (prompt, model) has: the K of pass@K by default (1 at least)."""
    counts: dict[tuple[str, str], int] = {}
    for record in run.latest.values():
        pair = (str(record["id"]), str(record["model"]))
        counts[pair] = counts.get(pair, 0) + 1
    return max(counts.values(), default=1)


# ----------------------------------------------------------------------- output

@attrs.frozen
class Distribution:
    """Values of one metric (seconds or tokens/s) with their p50 and p95 (linear)."""

    values: tuple[float, ...]
    p50: float | None
    p95: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        ordered = tuple(sorted(values))
        if not ordered:
            return cls((), None, None)
        return cls(ordered, stats.percentile(ordered, 0.5), stats.percentile(ordered, 0.95))


@attrs.frozen
class ScorerRow:
    """One scorer's numbers for one model (and group)."""

    scorer: str
    units: int
    completed: int
    scored: int
    unscored: int
    errors: int
    missing: int
    passed: int
    failed: int
    prompts: int  # prompts with a scored sample
    mean: Estimate | None
    pass_rate: Estimate | None
    samples: int  # the K of pass@K
    pass_at_k: dict[int, float]  # k -> mean over prompts (1 and K), when K > 1
    pass_hat_k: dict[int, float]  # K -> pass^K, when K > 1
    short: int  # prompts with fewer than K scored samples, left out of the K columns
    flaky: tuple[str, ...]  # prompt ids whose samples disagree


@attrs.frozen
class ModelRow:
    """One model (and group, with ``by``): outcomes, cost, latency and each scorer."""

    model: str
    group: str | None
    units: int
    states: dict[str, int]
    cost: float | None  # the sum of known costs; None when none is known
    cost_known: int
    cost_unknown: int
    ttft: Distribution
    tokens_per_second: Distribution
    scorers: tuple[ScorerRow, ...]

    @property
    def completed(self) -> int:
        return self.states.get("completed", 0)


@attrs.frozen
class JudgeCost:
    """What the judge's calls cost, apart from the models'."""

    calls: int
    cost: float | None
    known: int
    unknown: int


@attrs.frozen
class Evaluation:
    """Everything ``fanout report`` shows of an evaluation."""

    rows: tuple[ModelRow, ...]
    scorers: tuple[str, ...]
    samples: int
    by: By | None
    interval: Interval
    seed: int
    resamples: int
    stale: int
    orphans: int
    judge: JudgeCost
    cost: float | None  # over every model
    cost_unknown: int


def _score_value(score: Mapping[str, Any]) -> float | None:
    value = score.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


class _Intervals:
    """Intervals, memoised: a pass/fail scorer's mean and pass rate are the same data."""

    def __init__(self, interval: Interval, seed: int, resamples: int) -> None:
        self.interval, self.seed, self.resamples = interval, seed, resamples
        self._done: dict[tuple[float, ...], Estimate] = {}

    def mean(self, groups: Mapping[str, Sequence[float]]) -> Estimate | None:
        values = tuple(stats.prompt_means(groups).values())
        if not values:
            return None
        if self.interval == "analytic":
            estimate = stats.normal_mean(values)
            return attrs.evolve(estimate, low=max(0.0, estimate.low),
                                high=min(1.0, estimate.high))
        if values not in self._done:
            self._done[values] = stats.bootstrap_mean(values, resamples=self.resamples,
                                                      seed=self.seed)
        return self._done[values]

    def rate(self, outcomes: Mapping[str, Sequence[bool]]) -> Estimate | None:
        trials = sum(len(v) for v in outcomes.values())
        if not trials:
            return None
        if self.interval == "analytic":
            return stats.wilson(sum(sum(v) for v in outcomes.values()), trials)
        return self.mean({key: [float(p) for p in v] for key, v in outcomes.items() if v})


def evaluate(run: Run, *, by: By | None = None, samples: int | None = None,
             interval: Interval = "bootstrap", seed: int = stats.DEFAULT_SEED,
             resamples: int = stats.RESAMPLES) -> Evaluation:
    """The evaluation of ``run``: a row per model (and group), sorted by model then group."""
    k = samples if samples is not None else infer_samples(run)
    if k < 1:
        raise ValueError(f"samples must be >= 1, not {k}")
    intervals = _Intervals(interval, seed, resamples)
    cells: dict[tuple[str, str | None], list[tuple[str, dict[str, Any]]]] = {}
    for key, record in run.latest.items():
        for group in _groups_of(record, by):
            cells.setdefault((str(record["model"]), group), []).append((key, record))
    rows = []
    for (model, group) in sorted(cells, key=lambda c: (c[0], c[1] == NO_GROUP, c[1] or "")):
        units = cells[(model, group)]
        states: dict[str, int] = {}
        for _, record in units:
            state = state_of(record)
            states[state] = states.get(state, 0) + 1
        costs = [cost for cost, labels in run.attempts.get(model, ())
                 if group is None or _in_group(labels, by, group)]
        known = [c for c in costs if c is not None]
        rows.append(ModelRow(
            model=model, group=group, units=len(units), states=states,
            cost=math.fsum(known) if known else None, cost_known=len(known),
            cost_unknown=len(costs) - len(known),
            ttft=Distribution.of(v for _, r in units
                                 if (v := _number(_metrics(r).get("ttft"))) is not None),
            tokens_per_second=Distribution.of(
                v for _, r in units
                if (v := _number(_metrics(r).get("tokens_per_second"))) is not None),
            scorers=tuple(_scorer_row(run, scorer, units, k, intervals)
                          for scorer in run.scorers)))
    every = [cost for attempts in run.attempts.values() for cost, _ in attempts]
    known = [c for c in every if c is not None]
    return Evaluation(tuple(rows), run.scorers, k, by, interval, seed, resamples, run.stale,
                      run.orphans, _judge_cost(run), math.fsum(known) if known else None,
                      len(every) - len(known))


def _in_group(labels: tuple[str, ...], by: By | None, group: str) -> bool:
    if by == "category":
        return (labels[0] or NO_GROUP) == group
    tags = labels[1:]
    return group in tags if group != NO_GROUP else not tags


def _metrics(record: Mapping[str, Any]) -> Mapping[str, Any]:
    value = record.get("metrics")
    return value if isinstance(value, dict) else {}


def _scorer_row(run: Run, scorer: str, units: Sequence[tuple[str, Mapping[str, Any]]], k: int,
                intervals: _Intervals) -> ScorerRow:
    counts = dict.fromkeys(("scored", "unscored", "error", "missing"), 0)
    values: dict[str, list[float]] = {}
    outcomes: dict[str, list[bool]] = {}
    for key, record in units:
        score = run.scores.get((key, scorer))
        if score is not None:
            status = score.get("status")
        else:  # not scored (yet): an answer that did not complete cannot be
            status = "missing" if record.get("outcome") == "completed" else "unscored"
        value = _score_value(score) if score is not None and status == "scored" else None
        if status == "scored" and value is None:
            status = "error"  # a scored record without a usable number
        counts[str(status)] = counts.get(str(status), 0) + 1
        if value is None or score is None:
            continue
        prompt = str(record["id"])
        values.setdefault(prompt, []).append(value)
        passed = score.get("passed")
        if isinstance(passed, bool):
            outcomes.setdefault(prompt, []).append(passed)
    passed_count = sum(sum(v) for v in outcomes.values())
    at_k: dict[int, float] = {}
    hat_k: dict[int, float] = {}
    short = 0
    if k > 1 and outcomes:
        full = {p: v for p, v in outcomes.items() if len(v) >= k}
        short = len(outcomes) - len(full)
        at_k[1] = stats.mean(float(stats.pass_at_k(len(v), sum(v), 1))
                             for v in outcomes.values())
        if full:
            at_k[k] = stats.mean(float(stats.pass_at_k(len(v), sum(v), k))
                                 for v in full.values())
            hat_k[k] = stats.mean(float(stats.pass_hat_k(len(v), sum(v), k))
                                  for v in full.values())
    return ScorerRow(
        scorer=scorer, units=len(units),
        completed=sum(1 for _, r in units if state_of(r) == "completed"),
        scored=counts["scored"], unscored=counts["unscored"], errors=counts["error"],
        missing=counts["missing"], passed=passed_count,
        failed=sum(len(v) for v in outcomes.values()) - passed_count, prompts=len(values),
        mean=intervals.mean(values), pass_rate=intervals.rate(outcomes), samples=k,
        pass_at_k=at_k, pass_hat_k=hat_k, short=short,
        flaky=tuple(stats.flaky(outcomes)))


def _judge_cost(run: Run) -> JudgeCost:
    calls = known = 0
    total: list[float] = []
    for score in run.scores.values():
        judge = score.get("judge")
        if not isinstance(judge, dict):
            continue
        calls += 1
        cost = _cost(judge.get("cost"))
        if cost is not None:
            known += 1
            total.append(cost)
    return JudgeCost(calls, math.fsum(total) if total else None, known, calls - known)


# ---------------------------------------------------------------------- compare

@attrs.frozen
class Flip:
    """A key whose pass/fail differs between the runs."""

    id: str | int
    sample: int


@attrs.frozen
class Paired:
    """One model and scorer compared over the keys both runs completed and scored."""

    model: str
    scorer: str
    pairs: int
    prompts: int
    mean_a: float | None
    mean_b: float | None
    difference: PairedBootstrap | None  # of A - B, None without pairs
    sign: SignTest
    mcnemar: McNemar  # b: passed only in A (fail_to_pass), c: only in B (pass_to_fail)
    pass_to_fail: tuple[Flip, ...]  # passed in B, fails in A
    fail_to_pass: tuple[Flip, ...]  # failed in B, passes in A


@attrs.frozen
class Comparison:
    """Run A against run B: per model and scorer, and what could not be paired."""

    rows: tuple[Paired, ...]
    keys_a: int
    keys_b: int
    only_a: int  # keys in A's results only
    only_b: int
    both: int
    not_both_completed: int  # keys in both, not completed in both
    only_a_by_model: dict[str, int]
    only_b_by_model: dict[str, int]
    seed: int
    resamples: int


def compare_runs(a: Run, b: Run, *, seed: int = stats.DEFAULT_SEED,
                 resamples: int = stats.RESAMPLES) -> Comparison:
    """A paired comparison of ``a`` against the baseline ``b``, key by key."""
    only_a = [key for key in a.latest if key not in b.latest]
    only_b = [key for key in b.latest if key not in a.latest]
    both = [key for key in a.latest if key in b.latest]
    paired = [key for key in both if state_of(a.latest[key]) == "completed"
              and state_of(b.latest[key]) == "completed"]
    rows = []
    models = sorted({str(a.latest[key]["model"]) for key in paired})
    scorers = sorted(set(a.scorers) & set(b.scorers))
    for model in models:
        for scorer in scorers:
            row = _paired(a, b, [k for k in paired if a.latest[k]["model"] == model],
                          model, scorer, seed, resamples)
            if row is not None:
                rows.append(row)
    return Comparison(tuple(rows), len(a.latest), len(b.latest), len(only_a), len(only_b),
                      len(both), len(both) - len(paired), _by_model(a, only_a),
                      _by_model(b, only_b), seed, resamples)


def _by_model(run: Run, keys: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        model = str(run.latest[key]["model"])
        counts[model] = counts.get(model, 0) + 1
    return dict(sorted(counts.items()))


def _paired(a: Run, b: Run, keys: Sequence[str], model: str, scorer: str, seed: int,
            resamples: int) -> Paired | None:
    differences: dict[str, list[float]] = {}
    values_a: list[float] = []
    values_b: list[float] = []
    flat: list[float] = []
    worse: list[Flip] = []
    better: list[Flip] = []
    for key in keys:
        score_a, score_b = a.scores.get((key, scorer)), b.scores.get((key, scorer))
        if score_a is None or score_b is None or score_a.get("status") != "scored" \
                or score_b.get("status") != "scored":
            continue
        value_a, value_b = _score_value(score_a), _score_value(score_b)
        if value_a is None or value_b is None:
            continue
        record = a.latest[key]
        values_a.append(value_a)
        values_b.append(value_b)
        flat.append(value_a - value_b)
        differences.setdefault(str(record["id"]), []).append(value_a - value_b)
        passed_a, passed_b = score_a.get("passed"), score_b.get("passed")
        if passed_b is True and passed_a is False:
            worse.append(Flip(record["id"], record["sample"]))
        elif passed_b is False and passed_a is True:
            better.append(Flip(record["id"], record["sample"]))
    if not flat:
        return None
    order = {prompt: index for index, prompt in enumerate(differences)}
    worse.sort(key=lambda flip: (order[str(flip.id)], flip.sample))
    better.sort(key=lambda flip: (order[str(flip.id)], flip.sample))
    return Paired(model, scorer, len(flat), len(differences), stats.mean(values_a),
                  stats.mean(values_b),
                  stats.paired_bootstrap(differences, resamples=resamples, seed=seed),
                  stats.sign_test(flat), stats.mcnemar(len(better), len(worse)),
                  tuple(worse), tuple(better))


# ------------------------------------------------------------------------- JSON

def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _estimate(estimate: Estimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    return {"value": _round(estimate.value), "low": _round(estimate.low),
            "high": _round(estimate.high), "n": estimate.n, "method": estimate.method}


def _distribution(distribution: Distribution) -> dict[str, Any]:
    return {"p50": _round(distribution.p50), "p95": _round(distribution.p95),
            "n": len(distribution.values),
            "values": [_round(v) for v in distribution.values]}


def to_json(evaluation: Evaluation, comparison: Comparison | None = None) -> dict[str, Any]:
    """``evaluation`` (and ``comparison``) as plain JSON data with stable keys."""
    out: dict[str, Any] = {
        "samples": evaluation.samples, "by": evaluation.by, "scorers": list(evaluation.scorers),
        "interval": {"method": evaluation.interval, "confidence": stats.CONFIDENCE,
                     "seed": evaluation.seed, "resamples": evaluation.resamples},
        "stale_scores": evaluation.stale, "orphan_scores": evaluation.orphans,
        "cost": {"total": round_cost(evaluation.cost), "unknown": evaluation.cost_unknown,
                 "text": format_cost(evaluation.cost, evaluation.cost_unknown),
                 "judge": {"calls": evaluation.judge.calls,
                           "total": round_cost(evaluation.judge.cost),
                           "text": format_cost(evaluation.judge.cost,
                                                    evaluation.judge.unknown),
                           "unknown": evaluation.judge.unknown}},
        "models": [{
            "model": row.model, "group": row.group, "units": row.units,
            "completed": row.completed, "states": row.states,
            "cost": {"total": round_cost(row.cost), "known": row.cost_known,
                     "unknown": row.cost_unknown,
                     "text": format_cost(row.cost, row.cost_unknown)},
            "ttft": _distribution(row.ttft),
            "tokens_per_second": _distribution(row.tokens_per_second),
            "scorers": {s.scorer: {
                "units": s.units, "completed": s.completed, "scored": s.scored,
                "unscored": s.unscored, "errors": s.errors, "missing": s.missing,
                "passed": s.passed, "failed": s.failed, "prompts": s.prompts,
                "mean": _estimate(s.mean), "pass_rate": _estimate(s.pass_rate),
                "pass_at_k": {str(k): _round(v) for k, v in s.pass_at_k.items()},
                "pass_hat_k": {str(k): _round(v) for k, v in s.pass_hat_k.items()},
                "short_prompts": s.short, "flaky": list(s.flaky)}
                for s in row.scorers},
        } for row in evaluation.rows],
    }
    if comparison is not None:
        out["against"] = comparison_json(comparison)
    return out


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """``comparison`` as plain JSON data with stable keys."""
    return {
        "keys_a": comparison.keys_a, "keys_b": comparison.keys_b,
        "only_a": comparison.only_a, "only_b": comparison.only_b, "both": comparison.both,
        "not_both_completed": comparison.not_both_completed,
        "only_a_by_model": comparison.only_a_by_model,
        "only_b_by_model": comparison.only_b_by_model,
        "seed": comparison.seed, "resamples": comparison.resamples,
        "rows": [{
            "model": row.model, "scorer": row.scorer, "pairs": row.pairs,
            "prompts": row.prompts, "mean_a": _round(row.mean_a), "mean_b": _round(row.mean_b),
            "difference": None if row.difference is None else {
                **(_estimate(row.difference.difference) or {}),
                "p_value": _round(row.difference.p_value)},
            "sign_test": {"positive": row.sign.positive, "negative": row.sign.negative,
                          "ties": row.sign.ties, "p_value": _round(row.sign.p_value)},
            "mcnemar": {"b": row.mcnemar.b, "c": row.mcnemar.c,
                        "exact_p": _round(row.mcnemar.exact_p),
                        "chi2": _round(row.mcnemar.chi2), "chi2_p": _round(row.mcnemar.chi2_p),
                        "method": row.mcnemar.method, "p_value": _round(row.mcnemar.p_value)},
            "pass_to_fail": [{"id": f.id, "sample": f.sample} for f in row.pass_to_fail],
            "fail_to_pass": [{"id": f.id, "sample": f.sample} for f in row.fail_to_pass],
        } for row in comparison.rows],
    }
