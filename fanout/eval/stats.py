"""The statistics of an evaluation: means with intervals, pass@k, pass^k, flakiness and
paired tests between two runs.  Pure functions of plain numbers (sans-I/O, stdlib only).

**Intervals.**  Samples of one prompt are not independent (the same question, the
same model), so every interval resamples *prompts*: each prompt counts once, as
the mean of its samples.  Two methods:

- ``bootstrap`` (the report's default): ``RESAMPLES`` (10,000) resamples of the
  prompts with replacement, drawn by ``random.Random(seed)`` (``DEFAULT_SEED`` = 13
  unless told; the values sorted first, so their order does not matter), the mean of
  each, and the percentile interval (linear interpolation
  between order statistics, numpy's default).  The same data and seed give the same
  interval on every machine.
- ``analytic``: Wilson's score interval for a pass rate (each prompt's pass rate is
  treated as one Bernoulli trial per sample, so with several samples a prompt it is
  narrower than the clustered bootstrap), and the normal interval ``mean ± z·s/√n``
  over the prompt means for a mean score.

**pass@k** is the unbiased estimator of Chen et al. (2021): with ``n`` samples of a
prompt of which ``c`` passed, ``1 - C(n-c, k) / C(n, k)``, the probability that at
least one of ``k`` samples drawn without replacement passes; **pass^k** is
``C(c, k) / C(n, k)``, the probability that all ``k`` pass.  Both exact
(``fractions.Fraction``).

**Paired tests.**  McNemar's test on the discordant pairs of pass/fail outcomes
(``b`` passed only in the first run, ``c`` only in the second): the exact
two-sided binomial p-value (used below ``EXACT_BELOW`` = 25 discordant pairs) and
the continuity-corrected chi-square value beside it; the sign test on score
differences; and the paired bootstrap of per-prompt mean differences, with a
percentile interval and a p-value from the recentred resamples.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Final, Literal, TypeVar

import attrs

__all__ = ["CONFIDENCE", "DEFAULT_SEED", "EXACT_BELOW", "RESAMPLES", "Estimate", "McNemar",
           "PairedBootstrap", "SignTest", "binomial_two_sided", "bootstrap_mean",
           "bootstrap_means", "flaky", "mcnemar", "mean", "normal_mean", "paired_bootstrap",
           "pass_at_k", "pass_hat_k", "percentile", "prompt_means", "sign_test", "wilson"]

#: The bootstrap's default seed and number of resamples, and the default confidence.
DEFAULT_SEED: Final = 13
RESAMPLES: Final = 10_000
CONFIDENCE: Final = 0.95
#: McNemar's p-value is the exact binomial one below this many discordant pairs.
EXACT_BELOW: Final = 25

Method = Literal["bootstrap", "wilson", "normal"]
K = TypeVar("K")


@attrs.frozen
class Estimate:
    """A mean with its interval: ``low <= value <= high`` (all in the data's units)."""

    value: float
    low: float
    high: float
    n: int  # the prompts it rests on
    method: Method
    confidence: float = CONFIDENCE


# ------------------------------------------------------------------------- basics

def mean(values: Iterable[float]) -> float:
    """The arithmetic mean (``math.fsum``); ``ValueError`` for no values."""
    items = list(values)
    if not items:
        raise ValueError("mean of no values")
    return math.fsum(items) / len(items)


def prompt_means(groups: Mapping[K, Sequence[float]]) -> dict[K, float]:
    """Each prompt's mean over its samples; prompts without a value are left out."""
    return {key: mean(values) for key, values in groups.items() if values}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0 <= q <= 1) of sorted values, interpolating linearly between
    order statistics (numpy's default, Hyndman and Fan's type 7)."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q!r} is not in [0, 1]")
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    low, high = ordered[below], ordered[above]
    if fraction == 0 or low == high:
        return low
    # Weighted, not ``a + (b - a) * f``: b - a overflows for values near the double range.
    # Rounding can put it a hair outside [low, high]: clamped (an interval never ends
    # past the values it is drawn from).
    return min(max(low * (1 - fraction) + high * fraction, low), high)


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r} is not in (0, 1)")
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


# --------------------------------------------------------------------- intervals

def bootstrap_means(values: Sequence[float], *, resamples: int = RESAMPLES,
                    seed: int = DEFAULT_SEED) -> list[float]:
    """The means of ``resamples`` resamples of ``values`` with replacement, sorted: each
    resample is ``random.Random(seed).choices(sorted(values), k=len(values))``, in
    turn, so the result depends on the values and the seed, not on their order."""
    if not values:
        raise ValueError("bootstrap of no values")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, not {resamples}")
    rng = random.Random(seed)
    # sorted first: the same values give the same resamples in any order (a resumed or
    # sharded run writes its records in another order than a run in one go)
    items, n = sorted(values), len(values)
    if min(items) == max(items):  # every resample is the same
        return [items[0]] * resamples
    return sorted(sum(rng.choices(items, k=n)) / n for _ in range(resamples))


def bootstrap_mean(groups: Mapping[K, Sequence[float]] | Sequence[float], *,
                   resamples: int = RESAMPLES, seed: int = DEFAULT_SEED,
                   confidence: float = CONFIDENCE) -> Estimate:
    """The mean over prompts with its percentile bootstrap interval.

    ``groups``: prompt -> its samples' values (each prompt weighs the same, the mean
    of its samples), or a plain sequence of per-prompt values.  The order of the
    prompts does not matter (``bootstrap_means``).
    """
    return _bootstrap(_values(groups), resamples, seed, confidence)[0]


def _values(groups: Mapping[K, Sequence[float]] | Sequence[float]) -> list[float]:
    return (list(prompt_means(groups).values()) if isinstance(groups, Mapping)
            else list(groups))


def _bootstrap(values: Sequence[float], resamples: int, seed: int,
               confidence: float) -> tuple[Estimate, list[float]]:
    _z(confidence)
    means = bootstrap_means(values, resamples=resamples, seed=seed)
    alpha = 1 - confidence
    return Estimate(mean(values), percentile(means, alpha / 2),
                    percentile(means, 1 - alpha / 2), len(values), "bootstrap",
                    confidence), means


def wilson(successes: int, trials: int, *, confidence: float = CONFIDENCE) -> Estimate:
    """Wilson's score interval for a proportion of ``successes`` in ``trials``."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"wilson: need 0 <= successes <= trials and trials >= 1, not "
                         f"{successes} of {trials}")
    z = _z(confidence)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), trials, "wilson",
                    confidence)


def normal_mean(values: Sequence[float], *, confidence: float = CONFIDENCE) -> Estimate:
    """``mean ± z·s/√n`` (``s`` the sample standard deviation; one value: no width)."""
    m = mean(values)
    half = _z(confidence) * statistics.stdev(values) / math.sqrt(len(values)) \
        if len(values) > 1 else 0.0
    return Estimate(m, m - half, m + half, len(values), "normal", confidence)


# ----------------------------------------------------------------- pass@k, pass^k

def _check_counts(n: int, c: int, k: int) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, not {value!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, not n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in 1..n (n={n} samples)")


def pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The unbiased pass@k of a prompt with ``n`` samples, ``c`` of them passing:
    ``1 - C(n-c, k) / C(n, k)`` (exact).  ``ValueError`` when ``k > n``."""
    _check_counts(n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_hat_k(n: int, c: int, k: int) -> Fraction:
    """pass^k: the probability that ``k`` of the ``n`` samples, drawn without
    replacement, all pass: ``C(c, k) / C(n, k)`` (exact)."""
    _check_counts(n, c, k)
    return Fraction(math.comb(c, k), math.comb(n, k))


def flaky(outcomes: Mapping[K, Sequence[bool]]) -> list[K]:
    """The prompts whose samples disagree (some passed, some failed), in order given."""
    return [key for key, passed in outcomes.items() if any(passed) and not all(passed)]


# ------------------------------------------------------------------ paired tests

def binomial_two_sided(successes: int, trials: int) -> float:
    """The exact two-sided p-value of ``successes`` in ``trials`` under p = 1/2:
    ``min(1, 2·P(X <= min(s, n-s)))`` (the distribution is symmetric)."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, not {successes} of {trials}")
    if trials == 0:
        return 1.0
    low = min(successes, trials - successes)
    tail = Fraction(sum(math.comb(trials, i) for i in range(low + 1)), 2 ** trials)
    return float(min(Fraction(1), 2 * tail))


@attrs.frozen
class McNemar:
    """McNemar's test on paired pass/fail outcomes: ``b`` pairs passed only in the first
    run, ``c`` only in the second."""

    b: int
    c: int
    exact_p: float  # two-sided binomial on b of b + c
    chi2: float  # max(0, |b - c| - 1)^2 / (b + c), continuity-corrected (0 without pairs)
    chi2_p: float  # its p-value, chi-square with 1 degree of freedom

    @property
    def discordant(self) -> int:
        return self.b + self.c

    @property
    def method(self) -> Literal["exact", "chi2"]:
        """Which p-value ``p_value`` is: exact below ``EXACT_BELOW`` discordant pairs."""
        return "exact" if self.discordant < EXACT_BELOW else "chi2"

    @property
    def p_value(self) -> float:
        return self.exact_p if self.method == "exact" else self.chi2_p


def mcnemar(b: int, c: int) -> McNemar:
    """McNemar's test of ``b`` against ``c`` discordant pairs."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, not {b} and {c}")
    if b + c == 0:
        return McNemar(b, c, 1.0, 0.0, 1.0)
    statistic = max(0, abs(b - c) - 1) ** 2 / (b + c)
    # chi-square with one degree of freedom: P(X > x) = erfc(sqrt(x / 2))
    return McNemar(b, c, binomial_two_sided(b, b + c), statistic,
                   math.erfc(math.sqrt(statistic / 2)))


@attrs.frozen
class SignTest:
    """The sign test of paired differences: how many were positive and negative (ties
    dropped), and the exact two-sided p-value."""

    positive: int
    negative: int
    ties: int
    p_value: float


def sign_test(differences: Iterable[float]) -> SignTest:
    """The sign test of ``differences`` (zeros are ties, left out of the test)."""
    items = list(differences)
    positive = sum(1 for d in items if d > 0)
    negative = sum(1 for d in items if d < 0)
    return SignTest(positive, negative, len(items) - positive - negative,
                    binomial_two_sided(positive, positive + negative))


@attrs.frozen
class PairedBootstrap:
    """The mean of paired differences over prompts, its percentile interval, and the
    two-sided p-value of "no difference": the share of resamples, recentred on 0,
    at least as far from 0 as the observed mean (``(1 + count) / (1 + resamples)``)."""

    difference: Estimate
    p_value: float
    resamples: int
    seed: int


def paired_bootstrap(differences: Mapping[K, Sequence[float]] | Sequence[float], *,
                     resamples: int = RESAMPLES, seed: int = DEFAULT_SEED,
                     confidence: float = CONFIDENCE) -> PairedBootstrap:
    """The paired bootstrap of differences, resampling prompts (each prompt: the mean of
    its samples' differences, as in ``bootstrap_mean``)."""
    estimate, means = _bootstrap(_values(differences), resamples, seed, confidence)
    observed = abs(estimate.value)
    if observed == 0:
        return PairedBootstrap(estimate, 1.0, resamples, seed)
    # the resamples' spread around the observed mean stands for the null's around 0;
    # a hair of tolerance so a resample equal to the observed one counts as "as far"
    tolerance = 1e-12 * max(1.0, observed)
    extreme = sum(1 for m in means if abs(m - estimate.value) >= observed - tolerance)
    return PairedBootstrap(estimate, (1 + extreme) / (1 + resamples), resamples, seed)
