"""What the decode benchmarks share (test_decode_floor.py, test_mixer_speed.py): a state filled
at random instead of by a prefill, and a decode step's memory floor measured in the same run.
No tests here."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from attnbench.measure.bandwidth import copy_bytes_per_s


def random_fill(states: list[Any], n: int) -> None:
    """Every state at position n with random contents in (0, 1), no prefill run: what
    ``DecodeWork._random_fill`` does (``seek``, then every floating tensor uniform)."""
    gen = torch.Generator().manual_seed(2)
    for state in states:
        state.seek(n)
        for value in vars(state).values():
            if isinstance(value, Tensor) and value.is_floating_point():
                value.uniform_(0.0, 1.0, generator=gen)


def memory_floor(state_bytes: int, weight_bytes: int) -> dict[str, Any]:
    """A decode step's floor, for a benchmark's ``extra_info``: it reads its whole cache or
    state and every weight once, so (state bytes + weight bytes) ÷ the copy bandwidth
    (``copy_bytes_per_s``: read + write of a 256 MiB ``copy_``, measured once in this
    process, so in the same run), with the load average and the threads it was taken at."""
    bandwidth = copy_bytes_per_s("cpu")
    return {
        "state_bytes": state_bytes,
        "weight_bytes": weight_bytes,
        "read_bytes": state_bytes + weight_bytes,
        "copy_bytes_per_s": bandwidth,
        "floor_s": (state_bytes + weight_bytes) / bandwidth,
        "load_avg": os.getloadavg(),
        "threads": torch.get_num_threads(),
    }
