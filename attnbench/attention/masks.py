"""The one definition of "padding" and "causal" for the exact mechanisms (vanilla, sdpa,
xformers, and the quality checks' exact counterparts), so they cannot disagree on it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def blocked_keys(
    key_padding_mask: Tensor | None, causal: bool, n: int, device: torch.device
) -> Tensor | None:
    """Bool mask, True where query i may NOT attend key j, broadcastable to (b, h, n, n).

    The one definition of "padding" and "causal" for the exact mechanisms (vanilla, sdpa,
    xformers), so they cannot disagree on it.
    """
    blocked = None
    if key_padding_mask is not None:
        blocked = key_padding_mask[:, None, None, :]  # (b, 1, 1, n)
    if causal:
        future = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)  # (n, n)
        blocked = future if blocked is None else blocked | future
    return blocked
