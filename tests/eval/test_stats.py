"""fanout.eval.stats against known values: pass@k and pass^k against the closed form and
against enumerating every subset; the bootstrap interval on a fixed seed (exact numbers,
and close to scipy's); Wilson and the normal interval by hand; McNemar on a hand-computed
table and against scipy's binomtest and chi2; the sign test; the paired bootstrap."""

from __future__ import annotations

import ast
import itertools
import math
import random
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout.eval import stats
from fanout.eval.stats import (
    DEFAULT_SEED,
    RESAMPLES,
    binomial_two_sided,
    bootstrap_mean,
    bootstrap_means,
    flaky,
    mcnemar,
    normal_mean,
    paired_bootstrap,
    pass_at_k,
    pass_hat_k,
    percentile,
    prompt_means,
    sign_test,
    wilson,
)

scipy_stats = pytest.importorskip("scipy.stats")
ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------- pass@k, pass^k

def _by_enumeration(n: int, c: int, k: int) -> tuple[Fraction, Fraction]:
    """(pass@k, pass^k) by drawing every k-subset of n samples, c of them passing."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return (Fraction(sum(any(s) for s in subsets), len(subsets)),
            Fraction(sum(all(s) for s in subsets), len(subsets)))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_and_pass_hat_k_equal_enumerating_every_subset(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            at_k, hat_k = _by_enumeration(n, c, k)
            assert pass_at_k(n, c, k) == at_k, (n, c, k)
            assert pass_hat_k(n, c, k) == hat_k, (n, c, k)


def test_pass_at_k_closed_form_values() -> None:
    # 1 - C(n-c, k) / C(n, k), worked by hand
    assert pass_at_k(10, 3, 1) == Fraction(3, 10)
    assert pass_at_k(10, 3, 5) == 1 - Fraction(math.comb(7, 5), math.comb(10, 5)) \
        == Fraction(11, 12)
    assert pass_at_k(5, 0, 3) == 0
    assert pass_at_k(5, 3, 3) == 1  # n - c < k: some sample always passes
    assert pass_at_k(200, 13, 100) == 1 - Fraction(math.comb(187, 100), math.comb(200, 100))
    # the product form of Chen et al. agrees
    n, c, k = 20, 4, 6
    product = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))
    assert float(pass_at_k(n, c, k)) == pytest.approx(product, rel=1e-12)
    assert pass_hat_k(10, 3, 2) == Fraction(3, 45)
    assert pass_hat_k(4, 4, 4) == 1 and pass_hat_k(4, 3, 4) == 0


def test_pass_at_1_is_the_pass_rate_and_pass_at_n_is_any() -> None:
    for n in range(1, 12):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pass_hat_k(n, c, 1) == Fraction(c, n)
            assert pass_at_k(n, c, n) == (1 if c else 0)
            assert pass_hat_k(n, c, n) == (1 if c == n else 0)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 1, 0), (0, 0, 1), (3, 4, 1),
                                           (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        pass_hat_k(n, c, k)


def test_pass_at_k_refuses_non_integers() -> None:
    with pytest.raises(TypeError):
        pass_at_k(3.0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pass_at_k(3, True, 1)


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_grows_with_k_and_pass_hat_k_shrinks(case: tuple[int, int, int]) -> None:
    n, c, k = case
    assert 0 <= pass_hat_k(n, c, k) <= Fraction(c, n) <= pass_at_k(n, c, k) <= 1
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k)
        assert pass_hat_k(n, c, k + 1) <= pass_hat_k(n, c, k)


def test_flaky_lists_the_prompts_whose_samples_disagree() -> None:
    outcomes = {"q1": [True, True], "q2": [True, False, True], "q3": [False], "q4": [],
                "q5": [False, True]}
    assert flaky(outcomes) == ["q2", "q5"]


# --------------------------------------------------------------------- intervals

def test_percentile_interpolates_like_numpy() -> None:
    numpy = pytest.importorskip("numpy")
    values = sorted(random.Random(5).random() for _ in range(37))
    for q in (0, 0.025, 0.1, 0.5, 0.9, 0.975, 1):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q * 100)),
                                                      abs=1e-15)
    assert percentile([4.0], 0.3) == 4.0
    # Between two equal values, the value itself: the weighted sum's rounding once put a
    # one-value bootstrap's low end above its high end (found by hypothesis).
    same = 0.6937367735202083
    assert {percentile([same] * 200, q) for q in (0.025, 0.5, 0.975)} == {same}
    estimate = bootstrap_mean([same], resamples=200)
    assert estimate.low == estimate.value == estimate.high == same
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_the_bootstrap_on_a_fixed_seed_gives_these_exact_numbers() -> None:
    values = [0.2, 0.5, 0.9, 1.0, 0.0, 0.3]
    estimate = bootstrap_mean(values, resamples=1000, seed=7)
    assert estimate.value == pytest.approx(2.9 / 6, abs=1e-15)
    assert (estimate.low, estimate.high) == (0.18333333333333335, 0.7833333333333332)
    assert (estimate.n, estimate.method, estimate.confidence) == (6, "bootstrap", 0.95)
    # the same seed, the same interval; another seed, another one
    assert bootstrap_mean(values, resamples=1000, seed=7) == estimate
    assert bootstrap_mean(values, resamples=1000, seed=8) != estimate
    # the defaults are documented: seed 13, 10,000 resamples
    assert (DEFAULT_SEED, RESAMPLES) == (13, 10_000)
    assert bootstrap_mean(values) == bootstrap_mean(values, resamples=10_000, seed=13)


def test_the_bootstrap_is_the_percentile_interval_of_the_resampled_means() -> None:
    values = [0.0, 1.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75]
    means = bootstrap_means(values, resamples=500, seed=11)
    # rebuilt independently: the same generator, the same draws from the sorted values
    rng = random.Random(11)
    expected = sorted(sum(rng.choices(sorted(values), k=8)) / 8 for _ in range(500))
    assert means == pytest.approx(expected, abs=1e-15)
    estimate = bootstrap_mean(values, resamples=500, seed=11)
    assert estimate.low == percentile(means, 0.025)
    assert estimate.high == percentile(means, 0.975)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.randoms(use_true_random=False))
def test_the_bootstrap_does_not_depend_on_the_order_of_the_prompts(
        values: list[float], shuffler: random.Random) -> None:
    shuffled = list(values)
    shuffler.shuffle(shuffled)
    first = bootstrap_mean(values, resamples=200)
    again = bootstrap_mean(shuffled, resamples=200)
    assert (again.low, again.high) == (first.low, first.high)
    assert again.value == pytest.approx(first.value, abs=1e-12)
    assert min(values) - 1e-12 <= first.low <= first.high <= max(values) + 1e-12
    paired = paired_bootstrap(values, resamples=200)
    assert paired_bootstrap(shuffled, resamples=200).p_value == paired.p_value
    assert 0 < paired.p_value <= 1


@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_is_symmetric_and_a_probability(b: int, c: int) -> None:
    result, mirrored = mcnemar(b, c), mcnemar(c, b)
    assert (result.exact_p, result.chi2, result.chi2_p) == (
        mirrored.exact_p, mirrored.chi2, mirrored.chi2_p)
    assert 0 < result.exact_p <= 1 and 0 < result.chi2_p <= 1
    if b == c:
        assert result.p_value == 1.0


def test_the_bootstrap_resamples_prompts_not_samples() -> None:
    # prompt a has 4 samples, b one: each prompt weighs the same
    groups = {"a": [1.0, 1.0, 1.0, 1.0], "b": [0.0]}
    assert prompt_means(groups) == {"a": 1.0, "b": 0.0}
    estimate = bootstrap_mean(groups, resamples=2000, seed=1)
    assert estimate.value == 0.5 and estimate.n == 2
    assert (estimate.low, estimate.high) == (0.0, 1.0)
    assert bootstrap_mean({"a": [0.5, 1.0], "b": [0.25]}, resamples=100).value == 0.5


def test_the_bootstrap_is_close_to_scipys_percentile_bootstrap() -> None:
    rng = random.Random(2)
    values = [min(1.0, max(0.0, rng.gauss(0.6, 0.25))) for _ in range(80)]
    ours = bootstrap_mean(values)
    theirs = scipy_stats.bootstrap((values,), lambda x, axis: x.mean(axis=axis),
                                   n_resamples=10_000, method="percentile",
                                   random_state=0).confidence_interval
    # two generators: the intervals agree to the Monte Carlo error, about 0.005 here
    assert ours.low == pytest.approx(theirs.low, abs=0.01)
    assert ours.high == pytest.approx(theirs.high, abs=0.01)
    assert ours.low < ours.value < ours.high


def test_a_constant_sample_has_no_width_and_no_values_is_an_error() -> None:
    assert bootstrap_mean([1.0, 1.0, 1.0]) == stats.Estimate(1.0, 1.0, 1.0, 3, "bootstrap")
    with pytest.raises(ValueError):
        bootstrap_mean([])
    with pytest.raises(ValueError):
        bootstrap_mean([1.0], resamples=0)
    with pytest.raises(ValueError):
        bootstrap_mean([1.0, 0.0], confidence=1.0)


def test_wilson_by_hand() -> None:
    # 7 of 10, z = 1.959964: centre (0.7 + z²/20) / (1 + z²/10), half-width
    # z / (1 + z²/10) * sqrt(0.021 + z²/400)
    z = 1.959963984540054
    centre = (0.7 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.7 * 0.3 / 10 + z * z / 400)
    estimate = wilson(7, 10)
    assert estimate.value == 0.7 and estimate.method == "wilson"
    assert estimate.low == pytest.approx(centre - half, abs=1e-12) == pytest.approx(0.396778, abs=1e-6)
    assert estimate.high == pytest.approx(centre + half, abs=1e-12) == pytest.approx(0.892209, abs=1e-6)
    assert wilson(0, 5).low == 0.0 and wilson(5, 5).high == 1.0
    # scipy's binomtest gives the same Wilson interval
    theirs = scipy_stats.binomtest(7, 10).proportion_ci(method="wilson")
    assert (estimate.low, estimate.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    with pytest.raises(ValueError):
        wilson(3, 0)
    with pytest.raises(ValueError):
        wilson(4, 3)


def test_the_normal_interval_by_hand() -> None:
    values = [1.0, 0.0, 1.0, 1.0]
    estimate = normal_mean(values)
    half = 1.959963984540054 * 0.5 / 2  # s = 0.5, n = 4
    assert (estimate.value, estimate.low, estimate.high) == pytest.approx(
        (0.75, 0.75 - half, 0.75 + half), abs=1e-12)
    assert normal_mean([0.4]) == stats.Estimate(0.4, 0.4, 0.4, 1, "normal")
    assert normal_mean(values, confidence=0.9).high < estimate.high


# ------------------------------------------------------------------ paired tests

def test_mcnemar_on_a_hand_computed_table() -> None:
    #                 run B pass  run B fail
    # run A pass          40          10      b = 10 (passed only in A)
    # run A fail           3          47      c = 3  (passed only in B)
    result = mcnemar(10, 3)
    # exact: 2 * P(X <= 3), X ~ Bin(13, 1/2) = 2 * (1 + 13 + 78 + 286) / 8192 = 756 / 8192
    assert result.exact_p == 756 / 8192 == 0.09228515625
    # chi-square, continuity-corrected: (|10 - 3| - 1)^2 / 13 = 36 / 13
    assert result.chi2 == 36 / 13
    assert result.chi2_p == pytest.approx(0.0960923, abs=1e-7)
    assert (result.discordant, result.method, result.p_value) == (13, "exact", result.exact_p)


def test_mcnemar_against_scipy() -> None:
    for b, c in [(0, 1), (1, 1), (5, 0), (10, 3), (3, 10), (12, 12), (30, 12), (100, 70)]:
        result = mcnemar(b, c)
        assert result.exact_p == pytest.approx(scipy_stats.binomtest(b, b + c).pvalue,
                                               rel=1e-12)
        # the correction never overshoots: |b - c| = 0 is a statistic of 0, not 1 / (b + c)
        statistic = max(0, abs(b - c) - 1) ** 2 / (b + c)
        assert result.chi2 == pytest.approx(statistic)
        assert result.chi2_p == pytest.approx(scipy_stats.chi2.sf(statistic, 1), rel=1e-9)
    assert mcnemar(30, 12).method == "chi2" and mcnemar(30, 12).p_value == mcnemar(30, 12).chi2_p
    assert mcnemar(0, 0) == stats.McNemar(0, 0, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError):
        mcnemar(-1, 2)


def test_binomial_two_sided() -> None:
    assert binomial_two_sided(0, 0) == 1.0
    assert binomial_two_sided(0, 5) == 2 / 32
    assert binomial_two_sided(3, 6) == 1.0
    for s in range(21):
        assert binomial_two_sided(s, 20) == pytest.approx(
            scipy_stats.binomtest(s, 20).pvalue, rel=1e-12)


def test_the_sign_test() -> None:
    result = sign_test([0.5, -0.25, 0.0, 1.0, 0.25, 0.0, 0.1])
    assert (result.positive, result.negative, result.ties) == (4, 1, 2)
    assert result.p_value == 2 * 6 / 32  # 2 * P(X <= 1), X ~ Bin(5, 1/2)
    assert sign_test([]).p_value == 1.0 and sign_test([0.0, 0.0]).ties == 2


def test_the_paired_bootstrap_on_a_fixed_seed() -> None:
    differences = {"a": [0.5], "b": [0.0], "c": [1.0], "d": [-0.5], "e": [0.25]}
    result = paired_bootstrap(differences, resamples=2000, seed=3)
    assert result.difference.value == 0.25
    assert (result.difference.low, result.difference.high) == (-0.2, 0.7)
    assert result.p_value == 0.3098450774612694
    assert (result.resamples, result.seed) == (2000, 3)
    # recomputed from the resampled means: recentred ones at least 0.25 from 0
    means = bootstrap_means([0.5, 0.0, 1.0, -0.5, 0.25], resamples=2000, seed=3)
    extreme = sum(1 for m in means if abs(m - 0.25) >= 0.25 - 1e-12)
    assert result.p_value == (1 + extreme) / 2001


def test_the_paired_bootstrap_sees_a_clear_difference_and_no_difference() -> None:
    rng = random.Random(4)
    clear = [0.3 + rng.uniform(-0.1, 0.1) for _ in range(60)]
    result = paired_bootstrap(clear)
    assert result.p_value == 1 / (1 + RESAMPLES)  # no resample as far from 0.3 as 0.3
    assert 0.25 < result.difference.low < 0.3 < result.difference.high < 0.35
    assert paired_bootstrap([0.0, 0.0, 0.0]).p_value == 1.0
    symmetric = paired_bootstrap([1.0, -1.0] * 20)
    assert symmetric.p_value == 1.0  # the mean is exactly 0


def test_the_statistics_are_sans_io() -> None:
    for name in ("stats", "aggregate", "html"):
        tree = ast.parse((ROOT / "fanout" / "eval" / f"{name}.py").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and not node.level}
        assert not imported & {"trio", "httpx", "numpy", "scipy", "rich", "anyio"}, name


def test_stats_aggregate_and_the_page_run_without_trio_or_httpx() -> None:
    # A fresh interpreter where trio and httpx cannot be imported, and the package's
    # __init__ (which imports the I/O layers) is skipped.
    script = textwrap.dedent(f"""
        import importlib.abc, sys, types

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('trio', 'httpx', 'httpcore', 'anyio', 'rich'):
                    raise ImportError('blocked: ' + name)
                return None

        sys.meta_path.insert(0, Block())
        stub = types.ModuleType('fanout')
        stub.__path__ = [{str(ROOT / "fanout")!r}]
        sys.modules['fanout'] = stub
        from fanout.eval import aggregate, html, stats
        from fanout.store.scores import answer_key
        record = {{"id": "q1", "model": "m", "sample": 0, "outcome": "completed",
                   "content_key": "c", "text": "yes", "choices": []}}
        score = {{"id": "q1", "model": "m", "sample": 0, "scorer": "exact",
                  "answer_key": answer_key(record), "status": "scored", "score": 1.0,
                  "passed": True}}
        run = aggregate.prepare([record], {{('["q1", "m", 0]', "exact"): score}})
        evaluation = aggregate.evaluate(run, resamples=10)
        assert evaluation.rows[0].scorers[0].mean.value == 1.0
        assert "<script>" in html.page(html.report_data(run, evaluation))
        assert stats.pass_at_k(3, 1, 2) == stats.Fraction(2, 3)
        print(sorted(m for m in sys.modules
                     if m.split('.')[0] in ('trio', 'httpx', 'httpcore', 'anyio', 'rich')))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
