"""Document lengths for variable-length batches: a seeded draw or an explicit list, and the
arithmetic of the layouts a batch of them can take (padded to the longest, packed end to end,
bucketed by a length-sorting loader).

Pure Python (``math`` and ``random``): the sweep validates cells before any torch is
imported, and a report computes a row's padding share from its lengths alone.

**Reproducible.** Every draw comes from its own ``random.Random(seed)`` (never the global
generator) and reads nothing from it but :meth:`random.Random.random`: Python guarantees only
that ``random()`` yields the same sequence for the same seed across versions; the helpers
built on it (``randint``, ``lognormvariate``, ``paretovariate``) may change, so each
distribution is written here from uniforms (an integer by scaling, a normal by Box–Muller, a
Pareto by inverting its CDF).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

from attnbench.validators import check_choice, check_int, check_number

DISTRIBUTIONS = ("uniform", "lognormal", "long_tail")

# The shape's defaults. A minimum of 16 tokens (the packed workload's length_min): long_tail's
# lengths start there, and from 1 its documents would be mostly 1-3 tokens.
LENGTH_MIN = 16
# lognormal: a mean of 1024 tokens, log-σ 1 (median = mean·e^(−σ²/2) ≈ 0.61·mean; 99th
# percentile ≈ 6.2·mean): a right-skewed spread around a typical length.
LENGTH_MEAN = 1024.0
LENGTH_SIGMA = 1.0
SIGMA_MAX = 10.0
# long_tail: α = 1.2, a finite mean (α/(α−1) = 6·length_min) but an infinite variance (α < 2):
# the regime in which a few long documents hold much of the tokens (documents above x hold
# (length_min/x)^(α−1) of the unclipped tail's tokens: 43 % above 64·length_min).
ALPHA = 1.2
# The most lengths a draw or an explicit list may hold: every length is stored in the row
# (``packed.lengths``, ``prompts.lengths``: ~0.4 MB of JSON at this count) and drawn in Python
# (~0.1 s). A packed batch's documents and a decode mix's prompts (one per sequence, taken in
# turn) need far fewer: +sweep=packed draws about 30. A draw stops at the next one, so its
# cost is bounded before it runs, whatever ``total_tokens`` says.
MAX_LENGTHS = 1 << 16


def draw(
    distribution: str,
    *,
    total_tokens: int,
    seed: int,
    max_len: int,
    length_min: int = LENGTH_MIN,
    length_max: int | None = None,
    length_mean: float = LENGTH_MEAN,
    length_sigma: float = LENGTH_SIGMA,
    alpha: float = ALPHA,
) -> tuple[int, ...]:
    """Lengths drawn one by one from ``distribution`` until the next would pass
    ``total_tokens``: that one is **dropped, not truncated** (a document cut to fit would put
    a length into the draw that the distribution did not give), and the draw stops there,
    rather than skipping to a shorter one (which would favour short documents at the end).
    So the sum is at most ``total_tokens``, short of it by less than the dropped length; and
    since the budget never changes what is drawn, the draw under a budget is a prefix of the
    draw under any larger one (same seed and shape).

    Every length is in ``[length_min, length_max]``; ``length_max`` defaults to ``max_len``,
    the model's longest sequence, and may not pass it.

    * ``uniform``: integers uniform in ``[length_min, length_max]``;
    * ``lognormal``: a lognormal whose **mean** (not median) is ``length_mean`` and whose log
      has standard deviation ``length_sigma``, rounded to an integer and clipped to
      ``[length_min, length_max]`` (the clipped share lands on the bounds);
    * ``long_tail``: a Pareto tail from ``length_min`` with shape ``alpha``,
      P(length > x) = (length_min/x)^alpha, rounded and clipped at ``length_max``: mostly
      short, its median length_min·2^(1/alpha), and (length_min/length_max)^alpha of the
      documents exactly ``length_max``.

    "Documents around 1k with a long tail to 16k" is either: ``lognormal`` with
    ``length_mean=1024, length_max=16384`` (σ = 1: median 621, 3 % above 4096, 0.05 % clipped
    at 16384: the tail thins fast), or, for a heavy tail, ``long_tail`` with
    ``length_min=512, alpha=1.2, length_max=16384`` (median 912, 8 % above 4096, 1.6 % at
    16384).

    Each setting is checked only where the distribution reads it (``length_mean`` and
    ``length_sigma`` for lognormal, ``alpha`` for long_tail): a caller passes its defaults to
    every distribution, and a uniform draw is not refused for a mean it never uses.
    """
    check_choice("distribution", distribution, DISTRIBUTIONS)
    seed = check_int("seed", seed, low=0)
    max_len = check_int("max_len", max_len)
    why = "at most max_len, the model's longest sequence"
    high = max_len if length_max is None else _within("length_max", length_max, 1, max_len, why)
    low = _within("length_min", length_min, 1, high, "at most length_max")
    total_tokens = _budget(total_tokens, low)
    sample = _sampler(
        distribution, random.Random(seed), low, high, length_mean, length_sigma, alpha
    )
    return _until(sample, total_tokens, seed)


def explicit(lengths: Sequence[int], max_len: int | None = None) -> tuple[int, ...]:
    """An explicit list of lengths, validated: at least one, each an integer in
    ``[1, max_len]`` (``max_len`` None: checked against it later, when the model's longest
    sequence is known, as a setting is read before its cell)."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise ValueError(f"lengths: must be a list of lengths, got {lengths!r}")
    if not lengths:
        raise ValueError(f"lengths: must be a list of at least one length, got {lengths!r}")
    if len(lengths) > MAX_LENGTHS:
        raise ValueError(
            f"lengths: must be a list of at most {MAX_LENGTHS} lengths (each is stored in the "
            f"row), got {len(lengths)}"
        )
    if max_len is None:
        return tuple(check_int(f"lengths[{i}]", n) for i, n in enumerate(lengths))
    max_len = check_int("max_len", max_len)
    why = "at most max_len, the model's longest sequence"
    return tuple(_within(f"lengths[{i}]", n, 1, max_len, why) for i, n in enumerate(lengths))


def padded_tokens(lengths: Sequence[int]) -> int:
    """The padded layout's positions: every document padded to the longest, b × max."""
    return len(lengths) * max(lengths)


def real_tokens(lengths: Sequence[int]) -> int:
    """The documents' own tokens: what a packed layout holds."""
    return sum(lengths)


def padding_share(lengths: Sequence[int]) -> float:
    """The share of the padded layout's positions that are padding: 1 − real / padded."""
    return 1 - real_tokens(lengths) / padded_tokens(lengths)


def cu_seqlens(lengths: Sequence[int]) -> tuple[int, ...]:
    """The documents' offsets end to end, 0, l0, l0+l1, …, total: FlashAttention's
    ``cu_seqlens`` (document i is positions cu[i] … cu[i+1] − 1)."""
    return tuple(accumulate(lengths, initial=0))


def buckets(lengths: Sequence[int], tokens_per_batch: int) -> list[tuple[int, ...]]:
    """The batches a length-bucketing data loader makes (fairseq's ``batch_by_size`` with
    ``max_tokens``): the lengths sorted, then consecutive runs cut greedily so that each batch
    padded to its own longest, count × max, holds at most ``tokens_per_batch`` positions.

    A document longer than ``tokens_per_batch`` is a batch of its own (it cannot be left out:
    the loader's epoch has every document once), as is then every longer one. Deterministic:
    the batches and the lengths in each come in ascending order, and every length appears in
    exactly one batch."""
    budget = check_int("tokens_per_batch", tokens_per_batch)
    batches: list[tuple[int, ...]] = []
    batch: list[int] = []
    for n in sorted(lengths):
        if batch and (len(batch) + 1) * n > budget:  # n, sorted last, is the batch's longest
            batches.append(tuple(batch))
            batch = []
        batch.append(n)
    if batch:
        batches.append(tuple(batch))
    return batches


def summary(lengths: Sequence[int]) -> dict[str, Any]:
    """What a row records of a draw: its lengths and the padded layout's arithmetic
    (``max_len`` here is the longest document, the padded layout's width)."""
    return {
        "lengths": list(lengths),
        "documents": len(lengths),
        "real_tokens": real_tokens(lengths),
        "padded_tokens": padded_tokens(lengths),
        "padding_share": padding_share(lengths),
        "max_len": max(lengths),
    }


def _within(name: str, value: Any, low: int, high: int, why: str, *, number: bool = False) -> Any:
    """``value`` as an int (a float where ``number``) in ``[low, high]``; the refusal says why
    those are the limits."""
    try:
        if number:
            return check_number(name, value, low=low, high=high)
        return check_int(name, value, low=low, high=high)
    except ValueError:
        kind = "a number" if number else "an integer"
        raise ValueError(
            f"{name}: must be {kind} in [{low}, {high}] ({why}), got {value!r}"
        ) from None


def _budget(total_tokens: Any, length_min: int) -> int:
    try:
        return check_int("total_tokens", total_tokens, low=length_min)
    except ValueError:
        raise ValueError(
            f"total_tokens: must be an integer >= {length_min} (at least length_min: a smaller "
            f"budget holds no document), got {total_tokens!r}"
        ) from None


def _until(sample: Callable[[], int], total_tokens: int, seed: int) -> tuple[int, ...]:
    """Lengths from ``sample`` while their sum stays within ``total_tokens``: the first that
    would pass it is dropped and ends the draw; none drawn is a budget too small, more than
    :data:`MAX_LENGTHS` a budget too large. That refusal is exact: a draw is a prefix of the
    draw under any larger budget, so the largest budget holding at most ``MAX_LENGTHS``
    lengths is their sum plus the next length, less one."""
    lengths, used = [], 0
    while used + (n := sample()) <= total_tokens:
        if len(lengths) == MAX_LENGTHS:
            raise ValueError(
                f"total_tokens: must be at most {used + n - 1} with these draw settings (a "
                f"draw holds at most {MAX_LENGTHS} lengths, each stored in the row; seed "
                f"{seed}'s first {MAX_LENGTHS} sum to {used} tokens), got {total_tokens!r}"
            )
        lengths.append(n)
        used += n
    if not lengths:
        raise ValueError(
            f"total_tokens: must be an integer >= {n} (the first length seed {seed} draws: "
            f"a smaller budget draws nothing), got {total_tokens!r}"
        )
    return tuple(lengths)


def _sampler(
    distribution: str,
    rng: random.Random,
    low: int,
    high: int,
    mean: Any,
    sigma: Any,
    alpha: Any,
) -> Callable[[], int]:
    """One length per call, from ``rng.random()`` alone (see the module's docstring). The
    continuous ones are computed as a log-length, capped just above ``log(high)`` before
    ``exp``, so that no shape overflows a float: the cap is clipped to ``high`` anyway."""
    if distribution == "uniform":
        span = high - low + 1
        return lambda: low + int(rng.random() * span)  # random() < 1: never above high
    cap = math.log(high) + 1

    def clipped(log_length: float) -> int:
        return min(max(round(math.exp(min(log_length, cap))), low), high)

    if distribution == "lognormal":
        why = "between length_min and length_max: a draw clipped to them has no other mean"
        mean = _within("length_mean", mean, low, high, why, number=True)
        # σ at most SIGMA_MAX: past σ ≈ 3 the clipped draw is nearly all on the bounds anyway,
        # and a bound keeps μ + σ·z finite (σ near 1e308 would make it −inf + inf)
        sigma = check_number("length_sigma", sigma, low=0, high=SIGMA_MAX, open_low=True)
        mu = math.log(mean) - sigma * sigma / 2  # the mean of a lognormal is e^(μ + σ²/2)

        def lognormal() -> int:
            u1, u2 = 1 - rng.random(), rng.random()  # u1 in (0, 1]: its log is finite
            z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)  # Box–Muller
            return clipped(mu + sigma * z)

        return lognormal
    alpha = check_number("alpha", alpha, low=0, open_low=True)
    log_low = math.log(low)
    # P(X > x) = (low/x)^α inverted: X = low · u^(−1/α), u uniform in (0, 1]
    return lambda: clipped(log_low - math.log(1 - rng.random()) / alpha)
