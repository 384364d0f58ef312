"""The machine's memory bandwidth, the floor a decode step is held against.

A decode step reads its whole cache or state and the weights once, and does little
arithmetic with them: it is memory-bound, so its achieved bytes per second are compared with
what a plain copy achieves on the same device, measured in the same process. STREAM's
convention: a copy of N bytes moves 2·N (read and write), and that is the figure given.
"""

from __future__ import annotations

import torch

from attnbench.measure.timing import time_forward

COPY_BYTES = 256 * 1024 * 1024  # far past any CPU's last-level cache and a GPU's L2

_MEASURED: dict[tuple[str, int], float] = {}


def copy_bytes_per_s(device: str | torch.device) -> float:
    """Bytes per second a ``copy_`` of :data:`COPY_BYTES` moves (read + write) on ``device``,
    the median of a few repeats; measured once per device type and thread count in a
    process."""
    device = torch.device(device)
    memo = (device.type, torch.get_num_threads())
    if memo not in _MEASURED:
        src = torch.ones(COPY_BYTES // 4, device=device)
        dst = torch.empty_like(src)
        t = time_forward(lambda: dst.copy_(src), device, min_repeats=5, min_seconds=0.2)
        _MEASURED[memo] = 2 * COPY_BYTES / t.median
    return _MEASURED[memo]
