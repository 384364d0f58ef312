"""This CPU's fp32 GEMM rate, from which a CPU step's cost is estimated before it is timed.

A step on a CPU may take minutes at a long n: the runner times it only where its FLOPs at
this rate fit the cell's ``time_budget_s`` (:mod:`attnbench.runner.timed`). The rate is a
1024 x 1024 matmul's, read once per thread count in a process (as
:mod:`attnbench.measure.bandwidth` reads the copy bandwidth), again while the CPU was busy
when it was read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.measure.timing import time_forward

_RATES: dict[int, float] = {}  # threads -> fp32 GEMM FLOP/s, once measured uncontended
FLOPS = 2 * 1024**3  # one 1024 x 1024 by 1024 x 1024 matmul


@dataclass(frozen=True)
class Rate:
    """This CPU's fp32 GEMM FLOP/s as read: ``quiet``, its own (what a step's cost is
    estimated at); ``now``, what the load left it when read (``quiet`` on a quiet CPU);
    ``busy``, whether the reading was contended."""

    quiet: float
    now: float
    busy: bool

    @property
    def slowdown(self) -> float:
        """How much longer than on a quiet CPU a step takes under the load read: 1 quiet."""
        return max(self.quiet / self.now, 1.0)


def cpu_matmul_rate() -> Rate:
    """fp32 GEMM FLOP/s of this CPU at the threads in use, to estimate a CPU step's cost.
    Kept for the process once measured on a quiet CPU. A contended reading is used once and
    measured again for the next cell; its ``quiet`` rate is its fastest sample's (a sample
    that had the cores: the median of contended ones is the load's, a time slice lost in a
    40 ms matmul reads as a CPU many times slower), its ``now`` rate its median's."""
    threads = torch.get_num_threads()
    if threads in _RATES:
        return Rate(_RATES[threads], _RATES[threads], False)
    a, w = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = time_forward(
        lambda: a @ w, torch.device("cpu"), min_repeats=5, min_seconds=0.2, patience_s=2.0
    )
    now = FLOPS / t.median
    if not t.busy:
        _RATES[threads] = now
        return Rate(now, now, False)
    return Rate(max(FLOPS / min(t.samples), now), now, True)
