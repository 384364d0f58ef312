"""The short causal convolution Mamba-2, DeltaNet and Gated DeltaNet put before their cores,
written as K shifted products rather than ``conv1d``: elementwise work, counted by no FLOP
instrument (FlopCounterMode counts a depthwise conv1d's weight gradient as if it were dense,
C times too many), and cut at a packed document's start. Not a mechanism.
"""

from __future__ import annotations

import torch
from torch import Tensor


def short_conv(
    x: Tensor, weight: Tensor, window: Tensor | None, offsets: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The depthwise causal convolution, y_t = Σ_j weight[:, j] ⊙ x_{t−K+1+j}, as K shifted
    products: x (b, n, C), weight (C, K), ``window`` the K − 1 inputs before x (b, K − 1, C),
    None for zeros. ``offsets`` (b, n): each position's distance from its packed document's
    first, so that no input from an earlier document is read (a shift of s reads x_{t−s}
    only where the offset is at least s). Returns y (b, n, C) and the window after x (a
    view: copy it to keep it)."""
    b, n, c = x.shape
    k = weight.shape[1]
    before = x.new_zeros(b, k - 1, c) if window is None else window.to(x.dtype)
    full = torch.cat([before, x], dim=1)  # (b, K − 1 + n, C)
    y = None
    for j in range(k):
        term = full[:, j : j + n] * weight[:, j]  # x_{t − s}, s = K − 1 − j
        if offsets is not None and j < k - 1:
            term = torch.where((offsets >= k - 1 - j)[..., None], term, 0.0)
        y = term if y is None else y + term
    assert y is not None  # K >= 1
    return y, full[:, full.shape[1] - (k - 1) :]
