"""The largest batch that fits under a memory ceiling, in O(log b) probes.

One search serves all three uses: on the memory model (each probe a meta forward), on a GPU
(each probe a real forward under ``set_per_process_memory_fraction``, OOM caught) and on the
CPU under the tracker's artificial ceiling (the tests). Peak memory grows with b, so "fits"
is monotone: true up to the answer, false after it.
"""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(
    fits: Callable[[int], bool], guess: int = 1, limit: int = 1 << 24
) -> tuple[int, int]:
    """``(b, probes)``: the largest b in [0, limit] with ``fits(b)``, starting at ``guess``.

    From a good guess (the model's prediction) an exact answer costs two probes: the guess
    fits and guess + 1 does not. Otherwise it gallops away from the guess, doubling the step,
    until the answer is bracketed, then bisects: O(log |answer - guess|) probes. 0 means even
    b = 1 does not fit.
    """
    probes = 0

    def probe(b: int) -> bool:
        nonlocal probes
        probes += 1
        return fits(b)

    guess = min(max(1, guess), limit)
    if probe(guess):  # gallop up; limit + 1 stands for "too big", never probed
        lo, hi, step = guess, limit + 1, 1
        while lo + step < hi:
            if not probe(lo + step):
                hi = lo + step
                break
            lo, step = lo + step, step * 2
    else:  # gallop down
        lo, hi, step = 0, guess, 1
        while hi - step >= 1:
            if probe(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def solve_affine(
    peak: Callable[[int], int], ceiling: int, fixed: int = 0, limit: int = 1 << 24
) -> tuple[int, int]:
    """``(b, evaluations)``: the largest b in [0, limit] with ``peak(b) <= ceiling``, for a
    peak that is affine in b (the memory model's: a meta forward costs the same at any b).

    Why not :func:`largest_fitting` from a two-point guess: allocations are rounded to
    512 bytes, so at small sizes the slope from b = 1 and 2 is off by a few per cent and the
    search then gallops for a dozen probes. Instead: ``peak(1)``; a first guess from it and
    ``fixed`` (what does not grow with b: weights, overhead); the secant from b = 1 to that
    guess, whose slope is exact to the rounding over the whole span; then confirm the answer
    b fits and b + 1 does not. Four evaluations, unless the peak is not affine there (a
    transient that dominates only at small b), when :func:`largest_fitting` finishes the
    search from the secant's answer, still exactly.
    """
    seen: dict[int, int] = {}

    def at(b: int) -> int:
        if b not in seen:
            seen[b] = peak(b)
        return seen[b]

    p1 = at(1)
    if p1 > ceiling:
        return 0, len(seen)
    per_b = max(p1 - fixed, 1)
    g0 = min(limit, max(2, (ceiling - fixed) // per_b))
    slope = max((at(g0) - p1) / (g0 - 1), 1e-9)
    guess = min(limit, max(1, 1 + int((ceiling - p1) // slope)))
    b, _ = largest_fitting(lambda b: at(b) <= ceiling, guess, limit)
    return b, len(seen)
