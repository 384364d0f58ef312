"""This CPU's fp32 GEMM rate, from which a CPU step's cost is estimated before it is timed.

A step on a CPU may take minutes at a long n: the runner times it only where its FLOPs at
this rate fit the cell's ``time_budget_s`` (:mod:`attnbench.timed`). The rate is a 1024 x 1024
matmul's, read once per thread count in a process (as :mod:`attnbench.measure.bandwidth`
reads the copy bandwidth), again while the CPU was busy when it was read.
"""

from __future__ import annotations

import torch

from attnbench.measure.timing import time_forward

_RATES: dict[int, float] = {}  # threads -> fp32 GEMM FLOP/s, once measured uncontended


def cpu_matmul_rate() -> tuple[float, bool]:
    """fp32 GEMM FLOP/s of this CPU at the threads in use, to estimate a CPU forward's cost,
    and whether the CPU was busy when it was measured. Kept for the process once measured
    on a quiet CPU; a busy reading is used once and measured again for the next cell, so
    that one contended moment cannot skip the time of a whole sweep."""
    threads = torch.get_num_threads()
    if threads in _RATES:
        return _RATES[threads], False
    a, w = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = time_forward(
        lambda: a @ w, torch.device("cpu"), min_repeats=5, min_seconds=0.2, patience_s=2.0
    )
    rate = 2 * 1024**3 / t.median
    if not t.busy:
        _RATES[threads] = rate
    return rate, t.busy
