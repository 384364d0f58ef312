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
