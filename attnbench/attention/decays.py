"""The decay arithmetic the gated and delta-rule cores share: every decay factor e^{Σ g} over a
segment of positions, its exponent summed over the segment itself, never taken as a difference
of two cumulative sums (``gated_scan``'s docstring says why), so that a −∞ (a packed
document's start: the state dropped there) stays −∞ and never meets another. Not a mechanism.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_starts(starts: Tensor | None, q: Tensor) -> None:
    """``starts`` is None or bool (b, n), q being (b, h, n, ·): one ``ValueError`` line."""
    want = (q.shape[0], q.shape[2])
    if starts is not None and (starts.dtype != torch.bool or starts.shape != want):
        raise ValueError(
            f"starts: must be bool (b, n) = {want}, got {starts.dtype} {tuple(starts.shape)}"
        )


def suffix_sums(g: Tensor) -> Tensor:
    """Σ_{t > j} g_t along positions (dim −2): a suffix sum, each as precise as its own size."""
    suffix = g.flip(-2).cumsum(-2).flip(-2)  # Σ_{t ≥ j}
    return torch.cat([suffix[..., 1:, :], torch.zeros_like(suffix[..., :1, :])], dim=-2)


def masked_exp(exponent: Tensor, keep: Tensor) -> Tensor:
    """e^{exponent} where ``keep``, else 0: masked BEFORE the exponential, so an exponent
    outside the causal triangle never overflows, and its gradient is 0, not NaN."""
    return torch.where(keep, exponent, float("-inf")).exp()


def segment_decays(g: Tensor) -> Tensor:
    """e^{Σ_{j < t ≤ i} g_t} for i ≥ j, 0 above the diagonal: g (…, L, d) -> (…, L, L, d).
    Summed over each segment (g_t kept where t > j, summed over t ≤ i), not G_i − G_j: two
    large cumulative sums whose difference is small would lose it to rounding."""
    positions = torch.arange(g.shape[-2], device=g.device)
    later = (positions[:, None] > positions).unsqueeze(-1)  # [t, j]: t > j
    sums = torch.where(later, g.unsqueeze(-2), 0.0).cumsum(-3)  # [i, j]: Σ_{j < t ≤ i} g_t
    return masked_exp(sums, (positions[:, None] >= positions).unsqueeze(-1))
