"""Statistics for the regression gate: a rank test, a bootstrap interval and the verdict rule.

Pure functions on lists of times (seconds, or any positive unit), standard library only, so the
gate's decision can be unit-tested exactly and does not depend on torch, numpy or scipy.

Why a rank test: benchmark times are skewed and carry outliers (a context switch, a clock
change), so a t-test's normality assumption fails exactly where it matters. Mann–Whitney U only
uses the order of the values, is exact for small tie-free samples and needs no distribution.
Why one-sided: the gate asks two separate questions ("did it get slower?", "did it get
faster?"), each at level ``alpha``; a two-sided p would spend half of ``alpha`` on the direction
not asked about.
"""

from __future__ import annotations

import math
import random
import statistics
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

EXACT_MAX_PAIRS = 2500
"""Largest ``len(a) * len(b)`` for which the exact null distribution is used by default.

The exact counts cost O(min(m, n)**2 * max(m, n)) integer additions (a few ms at 50 vs 50);
beyond that the normal approximation is within about 0.001 of the exact p anyway.
"""

VERDICTS = ("regressed", "improved", "same")


def _sample(name: str, xs: Sequence[float], *, positive: bool) -> list[float]:
    """``xs`` as a list of floats, or a ValueError naming the sample and what is wrong with it.

    Checked here rather than left to fail later, because a NaN silently breaks sorting (and so
    every rank) and a zero time makes the ratio meaningless: both must stop the gate loudly.
    """
    values = [float(x) for x in xs]
    if len(values) < 2:
        raise ValueError(f"sample {name} needs at least 2 values, got {len(values)}")
    for x in values:
        if not math.isfinite(x):
            raise ValueError(f"sample {name} contains a non-finite value: {x!r}")
        if positive and x <= 0:
            raise ValueError(f"sample {name} contains a time that is not > 0: {x!r}")
    return values


def _open_unit(name: str, value: float) -> None:
    """Reject ``value`` unless 0 < value < 1 (NaN included, which fails both comparisons)."""
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in the open interval (0, 1), got {value!r}")


def _u_counts(m: int, n: int) -> list[int]:
    """Number of orderings of m a's and n b's with U = u, for u = 0 .. m*n (sums to C(m+n, m)).

    The classic recursion f(u; m, n) = f(u - n; m - 1, n) + f(u; m, n - 1) says that these
    counts are the coefficients of the Gaussian binomial coefficient [m + n choose m]_q, whose
    product form prod_{i=1..k} (1 - q^(j+i)) / (1 - q^i) (k = min(m, n), j = max(m, n)) gives
    them in O(k * m * n) steps instead of O((m * n)**2). Python ints keep the counts exact.
    """
    k, j = min(m, n), max(m, n)
    size = k * j + k + 1  # room for the degree j*(i-1) + j + i reached before each division
    c = [0] * size
    c[0] = 1
    for i in range(1, k + 1):
        shift = j + i
        for u in range(size - 1, shift - 1, -1):  # times (1 - q^shift), from the top down
            c[u] -= c[u - shift]
        for u in range(i, size):  # divided by (1 - q^i): exact, the quotient is a polynomial
            c[u] += c[u - i]
    return c[: k * j + 1]


def mann_whitney_p(a: Sequence[float], b: Sequence[float], *, exact: bool | None = None) -> float:
    """One-sided p of the Mann–Whitney U test for "values in ``b`` tend to be larger than in ``a``".

    ``a`` is the old version's times and ``b`` the new one's, so a small p is evidence that the
    new version is slower. U counts the pairs (a_i, b_j) with b_j > a_i (ties count 1/2) and
    p = P(U >= U_observed) under the null hypothesis that all orderings are equally likely.

    ``exact=None`` uses the exact null distribution when the pooled sample has no ties and
    ``len(a) * len(b) <= EXACT_MAX_PAIRS``, else the normal approximation with tie and
    continuity corrections. ``exact=True`` forces the exact path (ValueError on ties, where it
    does not apply); ``exact=False`` forces the approximation. Both paths exist so tests can
    compare them.

    Sample size limits what the gate can ever detect: with 5 vs 5 samples the smallest possible
    exact p (every b above every a) is 1/C(10, 5) = 1/252 ≈ 0.004, so a gate at p < 0.002 can
    never fire with fewer than 6 per side (1/924 ≈ 0.0011); see :func:`min_samples`.
    """
    xs = _sample("a", a, positive=False)
    ys = _sample("b", b, positive=False)
    m, n = len(xs), len(ys)
    xs_sorted = sorted(xs)
    # 2U as an integer, so the exact path indexes its table without float rounding
    two_u = 0
    for y in ys:
        lo, hi = bisect_left(xs_sorted, y), bisect_right(xs_sorted, y)
        two_u += 2 * lo + (hi - lo)
    ties = [t for t in Counter(xs + ys).values() if t > 1]
    if exact is None:
        exact = not ties and m * n <= EXACT_MAX_PAIRS
    if exact:
        if ties:
            raise ValueError("exact=True needs tie-free samples; the exact null assumes no ties")
        counts = _u_counts(m, n)
        return sum(counts[two_u // 2 :]) / math.comb(m + n, m)
    big_n = m + n
    tie_term = sum(t**3 - t for t in ties) / (big_n * (big_n - 1))
    variance = m * n / 12 * ((big_n + 1) - tie_term)
    if variance <= 0:  # every value equal: the data say nothing about direction
        return 1.0
    z = (two_u / 2 - m * n / 2 - 0.5) / math.sqrt(variance)
    return min(1.0, 0.5 * math.erfc(z / math.sqrt(2)))


def min_samples(alpha: float) -> int:
    """Smallest m (at least 2) such that m vs m tie-free samples can reach a one-sided p < alpha.

    The most extreme ordering has exact p = 1/C(2m, m); below this many samples per side the
    gate cannot fire at ``alpha`` however large the slowdown, so a CI config should ask for at
    least this many.
    """
    _open_unit("alpha", alpha)
    m = 2
    while 1 / math.comb(2 * m, m) >= alpha:
        m += 1
    return m


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), 0 <= q <= 1, of pre-sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def hodges_lehmann_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The ratio b/a that goes with the rank test: exp of the median of all pairwise
    log(b_j) - log(a_i) (the Hodges–Lehmann shift estimate on log times).

    Why not median(b) / median(a): on this project's 2-core CI machine (per-sample noise
    around 8 %), the ratio of medians of 30 samples put a planted 15 % slowdown under the 10 %
    threshold in about 9 % of replays; the Hodges–Lehmann estimate, which uses every pair
    rather than two middle values, in under 1 % (scripts/gate_power.py, docs/gate.md).
    """
    la = [math.log(x) for x in _sample("a", a, positive=True)]
    lb = [math.log(y) for y in _sample("b", b, positive=True)]
    return _hl_of_logs(la, lb)


def _hl_of_logs(la: list[float], lb: list[float]) -> float:
    """Hodges–Lehmann on log times already checked: the bootstrap's inner loop."""
    return math.exp(statistics.median([y - x for x in la for y in lb]))


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`hodges_lehmann_ratio` at ``confidence``.

    Each sample is resampled with replacement independently (the two versions' runs are
    separate draws), and a fixed ``random.Random(seed)`` makes the interval reproducible, so a
    CI log can be re-derived from its inputs. Medians, like the rank test, shrug off outliers.
    """
    xs = _sample("a", a, positive=True)
    ys = _sample("b", b, positive=True)
    _open_unit("confidence", confidence)
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")
    rng = random.Random(seed)
    la, lb = [math.log(x) for x in xs], [math.log(y) for y in ys]  # once, not per resample
    ratios = []
    for _ in range(resamples):
        new = rng.choices(lb, k=len(lb))
        old = rng.choices(la, k=len(la))
        ratios.append(_hl_of_logs(old, new))
    ratios.sort()
    tail = (1 - confidence) / 2
    return _quantile(ratios, tail), _quantile(ratios, 1 - tail)


@dataclass(frozen=True)
class Verdict:
    """The gate's decision on old times ``a`` vs new times ``b``, with the numbers behind it.

    ``ratio`` is the Hodges–Lehmann estimate of b/a (> 1: the new version is slower),
    ``p`` the one-sided p-value of "b is slower" (:func:`mann_whitney_p`),
    ``ci_low``/``ci_high`` the bootstrap interval of ``ratio``, and ``threshold``/``alpha``
    the rule's parameters, kept so a report can state exactly what was tested.
    """

    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float
    ci_low: float
    ci_high: float
    p: float
    threshold: float
    alpha: float
    verdict: str


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    threshold: float = 0.10,
    alpha: float = 0.002,
    confidence: float = 0.99,
    resamples: int = 1000,
    seed: int = 0,
) -> Verdict:
    """Judge new times ``b`` against old times ``a``: "regressed", "improved" or "same".

    The rule is asv's (airspeed velocity), made one-sided: "regressed" iff the rank test says
    b is slower (p < ``alpha``) AND the slowdown is large enough to matter
    (ratio > 1 + ``threshold``); "improved" iff the mirror test says a is slower (p < ``alpha``)
    AND ratio < 1 / (1 + ``threshold``), so a speed-up and the slowdown that undoes it use the
    same factor. Needing both keeps the gate quiet on tiny-but-real changes (significant, small)
    and on big-but-noisy ones (large ratio, too few samples to tell).

    The bootstrap interval is reported but not part of the decision: asv's rule is the
    documented, widely used one, and mixing in a second criterion would make the gate's
    behaviour harder to state. The interval tells the reader how sure the ratio is.
    """
    xs = _sample("a", a, positive=True)
    ys = _sample("b", b, positive=True)
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite fraction > 0 (e.g. 0.10), got {threshold!r}")
    _open_unit("alpha", alpha)
    _open_unit("confidence", confidence)
    median_a, median_b = statistics.median(xs), statistics.median(ys)
    ratio = hodges_lehmann_ratio(xs, ys)
    ci_low, ci_high = bootstrap_ratio_ci(
        xs, ys, confidence=confidence, resamples=resamples, seed=seed
    )
    p = mann_whitney_p(xs, ys)
    if p < alpha and ratio > 1 + threshold:
        verdict = "regressed"
    elif mann_whitney_p(ys, xs) < alpha and ratio < 1 / (1 + threshold):
        verdict = "improved"
    else:
        verdict = "same"
    return Verdict(
        n_a=len(xs),
        n_b=len(ys),
        median_a=median_a,
        median_b=median_b,
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        p=p,
        threshold=threshold,
        alpha=alpha,
        verdict=verdict,
    )
