"""Gated DeltaNet (Yang et al. 2025, "Gated Delta Networks: Improving Mamba2 with Delta
Rule"), our own implementation: DeltaNet's layer (:mod:`attnbench.attention.deltanet`) with
Mamba-2's decay on the delta rule and an output gate.

Per head, S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, with a
scalar data-dependent decay per head α_t = exp(−exp(A_h)·softplus(x_t W_α + b_α)) (the
paper's parameterisation, Mamba-2's), β_t = σ(x_t W_β), the short convolution and SiLU on
q, k and v, L2-normalised q and k, and the output RMSNorm(o) ⊙ SiLU(x W_G) per head before
``out_proj`` (the paper's gated output).

Kept: all of the above. Dropped: the paper's wider value heads (expand_v = 2) and fewer,
larger heads: heads are the model's, so its state is h·dk·dv = d²/h numbers plus the
convolution's window, (K − 1)·3d, as DeltaNet's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention.deltanet import DeltaNet, DeltaNetConfig
from attnbench.attention.mixer import wide
from attnbench.attention.mixer_config import declare_mixer


@dataclass
class GatedDeltaNetConfig(DeltaNetConfig):
    """As DeltaNet's: :class:`MixerConfig`'s ``causal``, ``chunk`` and ``kernel``, then
    ``conv`` (4; 0 for none)."""

    mechanism = "gated_deltanet"


@declare_mixer(
    GatedDeltaNetConfig,
    summary="Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate; WY form",
)
class GatedDeltaNet(DeltaNet):
    gate = True

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, h = self.d_model, self.n_heads
        self.a_proj = nn.Linear(d, h)
        self.g_proj = nn.Linear(d, d)
        self.a_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        with torch.no_grad():  # softplus(bias) log-uniform in [0.001, 0.1] at x = 0, Mamba-2's
            dt = torch.empty(h).uniform_(math.log(1e-3), math.log(0.1)).exp()
            self.a_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def decay(self, x: Tensor) -> Tensor:
        """log α_t = −exp(A)·softplus(x W_α + b_α), (b, h, n)."""
        rate = F.softplus(wide(self.a_proj(x))).transpose(1, 2)
        return -wide(self.a_log).exp()[:, None] * rate
