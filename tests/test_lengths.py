"""attnbench.lengths: the seeded draws (reproducible, within their budget and bounds, shaped
as their formulas say), the refusals (one line, the key first) and the layouts' arithmetic,
against hand-counted examples and the Pareto, lognormal and uniform formulas."""

from __future__ import annotations

import itertools
import math
import random
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from attnbench import lengths as L

ROOT = Path(__file__).resolve().parent.parent
BASE = {"total_tokens": 16384, "seed": 0, "max_len": 4096}


def _within_binomial(hits: int, n: int, p: float) -> bool:
    """``hits`` of ``n`` within 4 standard errors of a binomial's ``n·p``."""
    return abs(hits - n * p) <= 4 * math.sqrt(n * p * (1 - p))


def test_importable_without_torch() -> None:
    """The sweep validates cells, and a report reads a row's lengths, before any torch."""
    code = "import sys, attnbench.lengths; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("distribution", "kwargs", "expected"),
    [
        ("uniform", {}, (3462, 3109, 1732, 1072, 2102, 1668, 3214)),
        (
            "lognormal",
            {"max_len": 16384},
            (684, 586, 231, 349, 232, 70, 640, 618, 5497, 2754, 557, 262, 1545, 274),
        ),
        (
            "long_tail",
            {"max_len": 16384, "length_min": 512},
            (2413, 1670, 807, 657, 930, 789, 1835, 692, 878, 1062, 3743),
        ),
    ],
)
def test_a_seed_gives_the_same_lengths_everywhere(distribution, kwargs, expected) -> None:
    """Pinned: a draw reads only Random.random(), whose stream Python keeps across versions
    and machines; these fail if the algorithm (or a helper it leans on) changes."""
    assert L.draw(distribution, **{**BASE, **kwargs}) == expected
    assert L.draw(distribution, **{**BASE, **kwargs}) == expected


@pytest.mark.parametrize("distribution", L.DISTRIBUTIONS)
def test_another_seed_other_lengths_and_no_global_state(distribution) -> None:
    first = L.draw(distribution, **BASE)
    assert L.draw(distribution, **{**BASE, "seed": 1}) != first
    state = random.getstate()
    try:
        random.seed(12345)  # the global generator, moved: a draw never reads it
        assert L.draw(distribution, **BASE) == first
    finally:
        random.setstate(state)


@pytest.mark.parametrize("distribution", L.DISTRIBUTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_one_that_does_not_fit_is_dropped_not_truncated(distribution, seed) -> None:
    """The draw under a budget is the longest prefix of the unbounded stream that fits: its
    last length is the stream's own (not cut), and the stream's next one would pass it."""
    stream = L.draw(distribution, **{**BASE, "seed": seed, "total_tokens": 10**6})
    for budget in (5000, 16384, 40000):
        drawn = L.draw(distribution, **{**BASE, "seed": seed, "total_tokens": budget})
        assert drawn == stream[: len(drawn)]
        assert len(drawn) < len(stream)
        assert sum(drawn) <= budget < sum(drawn) + stream[len(drawn)]


@pytest.mark.parametrize(
    ("distribution", "kwargs"),
    [
        ("uniform", {"length_min": 100, "length_max": 300}),
        ("lognormal", {"length_min": 256, "length_max": 2048, "length_mean": 1024}),
        ("long_tail", {"length_min": 64, "length_max": 2048, "alpha": 1.0}),
    ],
)
def test_every_length_within_its_bounds_and_both_reached(distribution, kwargs) -> None:
    """Inclusive bounds, and the clipped draws land on them. Measured (seed 0, 10⁶ tokens):
    lognormal 19.4 % on 256 and 13.8 % on 2048 of 1159 (the formula: 18.8 %, 11.6 %);
    long_tail 3.1 % on 2048 of 3435 ((64/2047.5)^1 = 3.1 %); uniform 24 and 30 of 4981 on
    100 and 300 (24.8 expected)."""
    drawn = L.draw(distribution, **{**BASE, "total_tokens": 10**6, **kwargs})
    assert min(drawn) == kwargs["length_min"]
    assert max(drawn) == kwargs["length_max"]
    assert all(isinstance(n, int) for n in drawn)


def test_every_length_at_most_max_len_by_default() -> None:
    for distribution in L.DISTRIBUTIONS:
        kwargs = {**BASE, "max_len": 512, "total_tokens": 10**5, "length_mean": 256}
        drawn = L.draw(distribution, **kwargs)
        assert L.LENGTH_MIN <= min(drawn) and max(drawn) <= 512


def test_lognormal_has_its_mean_not_its_median() -> None:
    """Bounds wide enough that clipping is nil: the sample mean is length_mean and the median
    mean·e^(−σ²/2). Measured (seed 1, 38759 documents): mean 1.0078 × 1024 (standard error
    0.67 %), median 0.6084 × 1024 against e^(−1/2) = 0.6065, log-σ 1.0097."""
    kwargs = {"length_min": 1, "length_mean": 1024, "length_sigma": 1.0}
    drawn = L.draw("lognormal", total_tokens=40_000_000, seed=1, max_len=1 << 22, **kwargs)
    assert len(drawn) > 30000
    assert statistics.fmean(drawn) == pytest.approx(1024, rel=0.03)
    assert statistics.median(drawn) == pytest.approx(1024 * math.exp(-0.5), rel=0.03)
    assert statistics.pstdev([math.log(n) for n in drawn]) == pytest.approx(1.0, rel=0.03)


def test_uniform_is_flat_over_its_inclusive_range() -> None:
    """Measured (seed 1): on [1, 4096] a mean of 2043.4 against 2048.5 (9787 documents,
    standard error 12); on [1, 8] counts 5405 to 5658 of 44435 (each 5554 ± 70)."""
    wide = L.draw("uniform", total_tokens=20_000_000, seed=1, max_len=4096, length_min=1)
    error = 4095 / math.sqrt(12 * len(wide))
    assert abs(statistics.fmean(wide) - 2048.5) < 4 * error
    narrow = L.draw("uniform", total_tokens=200_000, seed=1, max_len=8, length_min=1)
    counts = Counter(narrow)
    assert sorted(counts) == list(range(1, 9))
    assert all(_within_binomial(counts[k], len(narrow), 1 / 8) for k in counts)


def test_long_tail_follows_the_pareto_formula() -> None:
    """P(length ≥ k) = P(X ≥ k − ½) = (16/(k − ½))^1.2 (rounded Pareto from 16, α = 1.2),
    and the share clipped onto 4096 is that at k = 4096. Measured (seed 1, 56329 documents):
    k=32 0.4421 (formula 0.4436), 64 0.1949 (0.1913), 256 0.0375 (0.0360), 1024 0.00705
    (0.00681), 4096 0.00130 (0.00129)."""
    drawn = L.draw("long_tail", total_tokens=4_000_000, seed=1, max_len=4096, alpha=1.2)
    assert len(drawn) > 50000
    for k in (32, 64, 256, 1024, 4096):
        hits = sum(n >= k for n in drawn)
        assert _within_binomial(hits, len(drawn), (16 / (k - 0.5)) ** 1.2), k


def test_a_setting_the_distribution_does_not_read_is_not_checked() -> None:
    """The workload passes its length_mean (and its other defaults) to every distribution: a
    mean no draw within the bounds can have refuses a lognormal draw, not a uniform or
    long_tail one, which never read it."""
    odd = {"length_mean": 8000, "length_sigma": -1, "alpha": 0}
    assert L.draw("uniform", **BASE, **odd)
    with pytest.raises(ValueError, match=r"^length_mean: "):
        L.draw("lognormal", **BASE, **odd)
    assert L.draw("long_tail", **BASE, length_mean=8000, length_sigma=-1)


WHY_MAX = "at most max_len, the model's longest sequence"
DRAW_REFUSALS = [
    ("distribution", {"distribution": "zipf"},
     "must be one of uniform, lognormal, long_tail; got 'zipf'"),
    ("seed", {"seed": -1}, "must be an integer >= 0, got -1"),
    ("seed", {"seed": 1.5}, "must be an integer >= 0, got 1.5"),
    ("max_len", {"max_len": 0}, "must be an integer >= 1, got 0"),
    ("length_max", {"length_max": 8192}, f"must be an integer in [1, 4096] ({WHY_MAX}), got 8192"),
    ("length_min", {"length_min": 0},
     "must be an integer in [1, 4096] (at most length_max), got 0"),
    ("length_min", {"length_min": 1024, "length_max": 512},
     "must be an integer in [1, 512] (at most length_max), got 1024"),
    ("total_tokens", {"total_tokens": 8}, "must be an integer >= 16 (at least length_min: a "
     "smaller budget holds no document), got 8"),
    ("total_tokens", {"total_tokens": 100}, "must be an integer >= 684 (the first length seed 0 "
     "draws: a smaller budget draws nothing), got 100"),
    ("length_mean", {"length_mean": 8000}, "must be a number in [16, 4096] (between length_min "
     "and length_max: a draw clipped to them has no other mean), got 8000"),
    ("length_mean", {"length_mean": 8}, "must be a number in [16, 4096] (between length_min "
     "and length_max: a draw clipped to them has no other mean), got 8"),
    ("length_mean", {"length_mean": math.nan}, "must be a number in [16, 4096] (between "
     "length_min and length_max: a draw clipped to them has no other mean), got nan"),
    ("length_sigma", {"length_sigma": 0}, "must be a number in (0, 10], got 0"),
    ("length_sigma", {"length_sigma": 20}, "must be a number in (0, 10], got 20"),
    ("alpha", {"distribution": "long_tail", "alpha": 0}, "must be a number > 0, got 0"),
    ("alpha", {"distribution": "long_tail", "alpha": -1.5}, "must be a number > 0, got -1.5"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "bad", "rest"), DRAW_REFUSALS)
def test_a_bad_draw_is_refused_in_one_line_naming_its_key(key, bad, rest) -> None:
    kwargs = {"distribution": "lognormal", **BASE, **bad}
    with pytest.raises(ValueError) as caught:
        L.draw(kwargs.pop("distribution"), **kwargs)
    assert str(caught.value) == f"{key}: {rest}"


EXPLICIT_REFUSALS = [
    ("lengths", [], None, "must be a list of at least one length, got []"),
    ("lengths", "512", None, "must be a list of lengths, got '512'"),
    ("lengths", 512, None, "must be a list of lengths, got 512"),
    ("lengths[1]", [5, 0, 3], 4096, f"must be an integer in [1, 4096] ({WHY_MAX}), got 0"),
    ("lengths[2]", [5, 6, 5000], 4096, f"must be an integer in [1, 4096] ({WHY_MAX}), got 5000"),
    ("lengths[1]", [5, 2.5], None, "must be an integer >= 1, got 2.5"),
    ("lengths[0]", [-3], None, "must be an integer >= 1, got -3"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "lengths", "max_len", "rest"), EXPLICIT_REFUSALS)
def test_a_bad_list_is_refused_naming_the_index_and_the_max(key, lengths, max_len, rest) -> None:
    with pytest.raises(ValueError) as caught:
        L.explicit(lengths, max_len=max_len)
    assert str(caught.value) == f"{key}: {rest}"


def test_an_explicit_list_comes_back_as_a_tuple_of_ints() -> None:
    assert L.explicit([3, 5, 2], max_len=5) == (3, 5, 2)
    assert L.explicit((7,)) == (7,)


def test_the_layouts_arithmetic_on_a_hand_counted_example() -> None:
    """3, 5, 2: padded to 5 that is 3 × 5 = 15 positions, 10 of them real, 5 padding."""
    lengths = (3, 5, 2)
    assert L.cu_seqlens(lengths) == (0, 3, 8, 10)
    assert L.real_tokens(lengths) == 10
    assert L.padded_tokens(lengths) == 15
    assert L.padding_share(lengths) == pytest.approx(1 / 3)
    assert L.summary(lengths) == {
        "lengths": [3, 5, 2],
        "documents": 3,
        "real_tokens": 10,
        "padded_tokens": 15,
        "padding_share": pytest.approx(1 / 3),
        "max_len": 5,
    }
    assert L.padding_share((4, 4)) == 0.0


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        # sorted 1 2 3 3 5 9 12: 4 × 3 = 12 fits; 5 would make 5 × 5; 9 and 12 each alone
        (12, [(1, 2, 3, 3), (5,), (9,), (12,)]),
        # 3 × 3 = 9 fits, a fourth 3 is 12; 2 × 5 = 10 fits; 12, over the budget, alone
        (10, [(1, 2, 3), (3, 5), (9,), (12,)]),
        (1000, [(1, 2, 3, 3, 5, 9, 12)]),
        (1, [(1,), (2,), (3,), (3,), (5,), (9,), (12,)]),
    ],
)
def test_buckets_on_a_hand_counted_example(budget, expected) -> None:
    assert L.buckets([5, 1, 9, 3, 3, 12, 2], budget) == expected
    assert L.buckets([12, 9, 5, 3, 3, 2, 1], budget) == expected  # the order given is lost


@pytest.mark.parametrize("budget", [1024, 4096, 16384])
def test_buckets_partition_a_draw_greedily_within_the_budget(budget) -> None:
    """Each batch count × max ≤ budget (a longer document alone); together exactly the draw,
    in ascending order; and greedy: the next batch's first would not have fit."""
    drawn = L.draw("long_tail", total_tokens=200_000, seed=3, max_len=8192, alpha=1.0)
    batches = L.buckets(drawn, budget)
    assert [n for batch in batches for n in batch] == sorted(drawn)
    for batch in batches:
        assert len(batch) * max(batch) <= budget or len(batch) == 1
    for batch, after in itertools.pairwise(batches):
        assert (len(batch) + 1) * after[0] > budget
    assert len(batches) < len(drawn)


def test_buckets_refuse_a_budget_below_one_token() -> None:
    with pytest.raises(ValueError) as caught:
        L.buckets([3, 4], 0)
    assert str(caught.value) == "tokens_per_batch: must be an integer >= 1, got 0"
