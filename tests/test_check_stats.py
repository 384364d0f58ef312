"""The regression gate's statistics: exact p-values against brute force, the approximation
against the exact path, the bootstrap interval, and compare()'s verdict rule."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.check.stats import (
    Verdict,
    bootstrap_ratio_ci,
    compare,
    hodges_lehmann_ratio,
    mann_whitney_p,
    min_samples,
)


def brute_force_p(a: list[float], b: list[float]) -> float:
    """P(U >= U_obs) over all C(m+n, n) ways to relabel the pooled (tie-free) values."""
    pooled = a + b
    n = len(b)

    def u(group_b: list[float], group_a: list[float]) -> int:
        return sum(y > x for y in group_b for x in group_a)

    observed = u(b, a)
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        chosen = set(idx)
        gb = [pooled[i] for i in idx]
        ga = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += u(gb, ga) >= observed
        total += 1
    assert total == math.comb(len(pooled), n)
    return hits / total


def jittered(center: float, count: int, seed: int, spread: float = 0.01) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(count)]


# --- mann_whitney_p ---------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n"), [(2, 2), (2, 6), (6, 2), (3, 5), (4, 4), (5, 6), (6, 6)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_p_matches_brute_force(m: int, n: int, seed: int) -> None:
    rng = random.Random(seed * 100 + m * 10 + n)
    values = rng.sample(range(1000), m + n)  # distinct: the exact path applies
    shift = rng.choice([0, 200, 500])  # null-ish to clearly separated
    a = [float(v) for v in values[:m]]
    b = [float(v + shift) for v in values[m:]]
    if len(set(a + b)) < m + n:
        b = [v + 0.5 for v in b]
    assert mann_whitney_p(a, b) == pytest.approx(brute_force_p(a, b), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-50, 50), min_size=4, max_size=12, unique=True),
    st.integers(2, 6),
)
def test_exact_p_matches_brute_force_property(values: list[int], m: int) -> None:
    m = min(m, len(values) - 2)
    a, b = [float(v) for v in values[:m]], [float(v) for v in values[m:]]
    assert mann_whitney_p(a, b) == pytest.approx(brute_force_p(a, b), rel=1e-12)


def test_known_value_and_its_mirror() -> None:
    a, b = [float(v) for v in range(1, 7)], [float(v) for v in range(7, 13)]
    assert mann_whitney_p(a, b) == pytest.approx(1 / 924, rel=1e-12)
    assert mann_whitney_p(b, a) == 1.0  # b is never larger: no evidence of a slowdown


def test_one_sided_tails_overlap_only_at_the_observed_u() -> None:
    # P(U >= u) + P(U <= u) = 1 + P(U = u); here U = 2 of 4 and P(U = 2) = 2/6 (orders
    # abba and baab)
    a, b = [1.0, 4.0], [2.0, 3.0]
    assert mann_whitney_p(a, b) + mann_whitney_p(b, a) == pytest.approx(1 + 2 / 6)


def test_min_samples() -> None:
    assert min_samples(0.002) == 6
    assert min_samples(0.05) == 4  # 1/C(6,3) = 0.05 is not < 0.05; 1/C(8,4) = 1/70 is
    five = [float(v) for v in range(5)]
    best_5v5 = mann_whitney_p(five, [v + 10 for v in five])
    assert best_5v5 == pytest.approx(1 / 252) and best_5v5 >= 0.002
    for alpha in (0.2, 0.05, 0.01, 0.002, 1e-4):
        m = min_samples(alpha)
        base = [float(v) for v in range(m)]
        assert mann_whitney_p(base, [v + 100 for v in base]) < alpha
        if m > 2:
            fewer = base[:-1]
            assert mann_whitney_p(fewer, [v + 100 for v in fewer]) >= alpha
    with pytest.raises(ValueError, match="alpha"):
        min_samples(0.0)


@pytest.mark.parametrize("shift", [0.0, 0.3, 0.6, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_normal_approximation_agrees_with_exact(shift: float, seed: int) -> None:
    rng = random.Random(seed)
    a = [rng.gauss(0, 1) for _ in range(30)]
    b = [rng.gauss(shift, 1) for _ in range(30)]
    exact = mann_whitney_p(a, b, exact=True)
    approx = mann_whitney_p(a, b, exact=False)
    assert approx == pytest.approx(exact, abs=0.003)
    assert mann_whitney_p(a, b) == exact  # 30 x 30 = 900 pairs: the default is exact


def test_large_samples_default_to_the_approximation() -> None:
    rng = random.Random(3)
    a = [rng.gauss(0, 1) for _ in range(60)]
    b = [rng.gauss(0.3, 1) for _ in range(60)]
    assert mann_whitney_p(a, b) == mann_whitney_p(a, b, exact=False)
    assert mann_whitney_p(a, b) != mann_whitney_p(a, b, exact=True)


def test_ties_use_the_tie_corrected_approximation() -> None:
    a, b = [1.0, 1.0, 2.0, 2.0, 3.0], [3.0, 3.0, 4.0, 4.0, 5.0]
    # by hand: U = 2 * 4.5 + 2 * 5 + 5 = 24 of 25; tie groups (2, 2, 3, 2, 1) give
    # sum(t^3 - t) = 42, so variance = 25/12 * (11 - 42/90)
    z = (24 - 12.5 - 0.5) / math.sqrt(25 / 12 * (11 - 42 / 90))
    assert mann_whitney_p(a, b) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert mann_whitney_p(a, b) == mann_whitney_p(a, b, exact=False)
    with pytest.raises(ValueError, match="tie"):
        mann_whitney_p(a, b, exact=True)
    assert mann_whitney_p([2.0, 2.0], [2.0, 2.0, 2.0]) == 1.0  # all equal: no evidence


@pytest.mark.parametrize(
    ("a", "b", "name"),
    [
        ([1.0], [1.0, 2.0], "a"),
        ([1.0, 2.0], [], "b"),
        ([1.0, math.nan], [1.0, 2.0], "a"),
        ([1.0, 2.0], [1.0, math.inf], "b"),
    ],
)
def test_mann_whitney_rejects_bad_samples(a: list[float], b: list[float], name: str) -> None:
    with pytest.raises(ValueError, match=f"sample {name}"):
        mann_whitney_p(a, b)


# --- bootstrap_ratio_ci -----------------------------------------------------------------------


def test_bootstrap_ci_covers_the_true_ratio_and_is_reproducible() -> None:
    a, b = jittered(1.0, 12, seed=0), jittered(1.5, 12, seed=1)
    low, high = bootstrap_ratio_ci(a, b)
    assert low <= 1.5 <= high
    assert low > 1.4 and high < 1.6  # separated samples: a tight interval, far from 1
    assert bootstrap_ratio_ci(a, b, seed=0) == (low, high)
    assert bootstrap_ratio_ci(a, b, seed=7) != (low, high)
    narrow = bootstrap_ratio_ci(a, b, confidence=0.5)
    assert low <= narrow[0] <= narrow[1] <= high


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.95])
def test_bootstrap_ci_holds_the_stated_share_of_the_bootstrap_distribution(
    confidence: float,
) -> None:
    # an independent bootstrap (own RNG stream) of the same data: about `confidence` of its
    # ratios should fall inside the interval, half the rest on each side
    rng = random.Random(42)
    a = [rng.lognormvariate(0, 0.3) for _ in range(41)]
    b = [rng.lognormvariate(0.1, 0.3) for _ in range(41)]
    low, high = bootstrap_ratio_ci(a, b, confidence=confidence, resamples=1000, seed=1)
    ratios = [hodges_lehmann_ratio(rng.choices(a, k=41), rng.choices(b, k=41)) for _ in range(1000)]
    below = sum(r < low for r in ratios) / len(ratios)
    above = sum(r > high for r in ratios) / len(ratios)
    assert below == pytest.approx((1 - confidence) / 2, abs=0.04)
    assert above == pytest.approx((1 - confidence) / 2, abs=0.04)


def test_bootstrap_rejects_bad_parameters() -> None:
    a, b = [1.0, 2.0], [1.0, 2.0]
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ratio_ci(a, b, confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ratio_ci(a, b, resamples=0)
    with pytest.raises(ValueError, match="sample a"):
        bootstrap_ratio_ci([0.0, 1.0], b)


# --- compare ----------------------------------------------------------------------------------


def test_clear_slowdown_regresses() -> None:
    a, b = jittered(1.0, 10, seed=0), jittered(1.3, 10, seed=1)
    v = compare(a, b)
    assert v.verdict == "regressed"
    assert v.p == pytest.approx(1 / math.comb(20, 10))
    assert v.ratio == pytest.approx(1.3, rel=0.02)
    assert v.ci_low <= v.ratio <= v.ci_high
    assert (v.n_a, v.n_b, v.threshold, v.alpha) == (10, 10, 0.10, 0.002)
    logs = sorted(math.log(y) - math.log(x) for x in a for y in b)  # 100 pairs
    assert v.ratio == pytest.approx(math.exp((logs[49] + logs[50]) / 2))  # Hodges–Lehmann


def test_hodges_lehmann_ratio_by_hand() -> None:
    # pairwise b/a: 2/1, 2/2, 4/1, 4/2 = 2, 1, 4, 2 -> median 2
    assert hodges_lehmann_ratio([1.0, 2.0], [2.0, 4.0]) == pytest.approx(2.0)
    # one outlier in b moves the median of pairs, not the estimate's order of magnitude
    assert hodges_lehmann_ratio([1.0] * 5, [1.0, 1.0, 1.0, 1.0, 100.0]) == pytest.approx(1.0)


def test_clear_speedup_improves() -> None:
    v = compare(jittered(1.0, 10, seed=0), jittered(0.7, 10, seed=1))
    assert v.verdict == "improved"
    assert v.p == 1.0  # p is the slowdown test's; the mirror test fired


def test_identical_distributions_are_same() -> None:
    a = jittered(1.0, 10, seed=0, spread=0.05)
    b = jittered(1.0, 10, seed=1, spread=0.05)
    v = compare(a, b)
    assert v.verdict == "same" and v.p > 0.002
    assert compare(a, list(a)).verdict == "same"  # literally the same times (all tied pairs)


def test_significant_but_small_slowdown_is_same() -> None:
    a, b = jittered(1.0, 10, seed=0, spread=0.002), jittered(1.05, 10, seed=1, spread=0.002)
    v = compare(a, b)
    assert v.p < v.alpha  # the rank test alone would flag it ...
    assert v.verdict == "same"  # ... but 5% is under the 10% threshold
    assert compare(a, b, threshold=0.03).verdict == "regressed"  # a 3% gate does flag it


def test_large_but_unproven_slowdown_is_same() -> None:
    v = compare([1.0, 1.01], [5.0, 5.1])
    assert v.ratio > 4
    assert v.p == pytest.approx(1 / 6)  # 2 vs 2 can never get below 1/6
    assert v.verdict == "same"


def test_verdict_is_frozen() -> None:
    v = compare([1.0, 1.1], [1.0, 1.2])
    assert isinstance(v, Verdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.verdict = "regressed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": math.nan}, "threshold"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"confidence": 0.0}, "confidence"),
        ({"confidence": 1.0}, "confidence"),
        ({"resamples": 0}, "resamples"),
    ],
)
def test_compare_rejects_bad_parameters(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        compare([1.0, 1.1, 1.2], [1.0, 1.1, 1.2], **kwargs)


@pytest.mark.parametrize(
    ("a", "b", "name"),
    [
        ([1.0, 0.0], [1.0, 1.1], "a"),
        ([1.0, 1.1], [1.0, -1.0], "b"),
        ([1.0, math.nan], [1.0, 1.1], "a"),
        ([1.0, 1.1], [math.inf, 1.0], "b"),
        ([1.0], [1.0, 1.1], "a"),
    ],
)
def test_compare_rejects_bad_times(a: list[float], b: list[float], name: str) -> None:
    with pytest.raises(ValueError, match=f"sample {name}"):
        compare(a, b)
