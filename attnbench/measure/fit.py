"""The largest batch a card fits, as its caching allocator decides: the modeled step's
allocations replayed (:mod:`attnbench.measure.allocator`) at each batch a search asks.

A cap set by ``set_per_process_memory_fraction`` bounds what the allocator *reserves*, so the
allocation-only answer (live bytes under the cap: :func:`attnbench.measure.search.
solve_affine`) is an upper bound, and the card's own answer is at or below it. The search
runs in two passes, so that it costs about what the allocation-only one does:

1. on an **affine trace**: the step's allocations are the same calls at every batch, each of
   a size affine in b (a tensor of the batch's rows, or of none of them), so two traced
   batches give every other batch's trace by interpolation, each replay a few milliseconds
   of Python and no meta forward;
2. on **real traces** from that answer (:func:`attnbench.measure.search.largest_fitting`):
   where the two traces differ in their calls (a step whose work depends on b), or a size is
   not affine, the answer is still the real traces' own.

Fitting need not be monotone in b (a freed block of one size serves the next batch and not
the one after it): like the card's own probes, the search starts at a guess and reports the
largest b it finds fitting with b + 1 not fitting there; which b that is depends on the
guess, as it does on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnbench.measure.allocator import largest_batch
from attnbench.measure.allocator_rules import AllocatorConfig
from attnbench.measure.memory import rounded

Trace = Sequence[tuple]


def live_peak(trace: Trace) -> int:
    """The most bytes a trace holds live at once, each request rounded to 512 bytes: the
    tracker's own running sum (:func:`attnbench.measure.memory.tracked_peak`), what the
    allocation-only search compares with the ceiling."""
    sizes: dict[int, int] = {}
    live = top = 0
    for event in trace:
        if event[0] == "alloc":
            sizes[event[1]] = rounded(event[2])
            live += sizes[event[1]]
            top = max(top, live)
        else:
            live -= sizes.pop(event[1])
    return top


def affine(first: Trace, b1: int, second: Trace, b2: int) -> Callable[[int], list[tuple]] | None:
    """The trace at any b from the traces at b1 < b2, where each call's size is affine in b
    (its size at b1 plus a whole number of bytes per sequence); None where the two traces are
    not the same calls in the same order, or a size is not affine."""
    if b2 <= b1 or len(first) != len(second):
        return None
    base, per_b = [], []
    for one, two in zip(first, second, strict=True):
        if one[:2] != two[:2]:
            return None
        if one[0] == "alloc":
            step, rest = divmod(two[2] - one[2], b2 - b1)
            if rest or one[2] - step * b1 < 0:
                return None
            base.append(one[2] - step * b1)
            per_b.append(step)
        else:
            base.append(None)
            per_b.append(None)

    def at(b: int) -> list[tuple]:
        return [
            (e[0], e[1], base[i] + per_b[i] * b) if e[0] == "alloc" else e  # type: ignore[operator]
            for i, e in enumerate(first)
        ]

    return at


def replayed_max_batch(
    trace_of: Callable[[int], Trace], cap: int, config: AllocatorConfig, allocated: int
) -> int:
    """The largest b whose trace replays under ``cap`` (the bytes the allocator may reserve),
    searched from ``allocated``, the allocation-only answer that bounds it; 0: not even b = 1.
    ``trace_of`` is called for b = 2, ``allocated`` and about two more (the module's
    docstring)."""
    guess = max(allocated, 1)
    # from b = 2: at b = 1 some ops take other paths (matmul copies an operand only at b >= 2)
    if allocated >= 3 and (at := affine(trace_of(2), 2, trace_of(allocated), allocated)):
        guess = max(largest_batch(at, cap, config, guess), 1)
    return largest_batch(trace_of, cap, config, guess)
