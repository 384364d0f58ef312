"""Gated DeltaNet (Yang et al. 2025, "Gated Delta Networks: Improving Mamba2 with Delta
Rule"), our own implementation: DeltaNet's layer (:mod:`attnbench.attention.deltanet`) with
Mamba-2's decay on the delta rule and an output gate.

Per head, S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, with a
scalar data-dependent decay per head α_t = exp(−exp(A_h)·softplus(x_t W_α + b_α)) (the
paper's parameterisation, Mamba-2's), β_t = σ(x_t W_β), the short convolution and SiLU on
q, k and v, L2-normalised q and k, and the output RMSNorm(o) ⊙ SiLU(x W_G) per head before
``out_proj`` (the paper's gated output).

``v_heads`` (DeltaNet's): value heads apart from the key heads, each key head's q and k
serving v_heads / n_heads of them; the decay (A, W_α, b_α), β, the gate W_G and the state
are per value head (transformers' ``Qwen3NextGatedDeltaNet``: ``in_proj_ba`` and ``A_log``
of ``num_v_heads``, ``conv_dim = 2·key_dim + value_dim``, ``out_proj`` from ``value_dim``).
The state is v_heads·dk·dv plus the window (K − 1)·(2·n_heads + v_heads)·dh.

Kept: all of the above. Dropped: the paper's wider value heads (expand_v = 2: a value head
here is as wide as a key head; ``v_heads`` widens by more heads instead, as Qwen3-Next) and
fewer, larger heads: key heads are the model's.
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
    ``conv`` (4; 0 for none) and ``v_heads`` (None: as many as the key heads)."""

    mechanism = "gated_deltanet"


@declare_mixer(
    GatedDeltaNetConfig,
    summary="Gated DeltaNet: the delta rule with Mamba-2's decay and an output gate; WY form",
)
class GatedDeltaNet(DeltaNet):
    gate = True

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, h = self.d_model, self.v_heads  # the decay and the gate per value head
        self.a_proj = nn.Linear(d, h)
        self.g_proj = nn.Linear(d, self.v_width)
        self.a_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        with torch.no_grad():  # softplus(bias) log-uniform in [0.001, 0.1] at x = 0, Mamba-2's
            dt = torch.empty(h).uniform_(math.log(1e-3), math.log(0.1)).exp()
            self.a_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def decay(self, x: Tensor) -> Tensor:
        """log α_t = −exp(A)·softplus(x W_α + b_α), (b, v_heads, n)."""
        rate = F.softplus(wide(self.a_proj(x))).transpose(1, 2)
        return -wide(self.a_log).exp()[:, None] * rate
