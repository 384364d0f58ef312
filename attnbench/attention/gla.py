"""Gated linear attention (Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"), our own implementation: the gated recurrence of
:mod:`attnbench.attention.gated_scan` with a data-dependent decay per key dimension.

Per head, S_t = diag(α_t) S_{t−1} + k_t v_tᵀ and o_t = S_tᵀ q_t, with
α_t = σ(x_t W_α1 W_α2 + b_α)^{1/τ}: a low-rank (16) projection to one decay per head and key
dimension, τ = 16 (the paper's section 4.4), taken in log space as g = log σ(·)/τ. The
output is RMSNorm'd per head and gated by swish(x W_r) before ``out_proj`` (section 4.4).

Kept: the low-rank gate and τ, q scaled by 1/√dk, the per-head norm and the output gate
(``g_proj``, d × d, and the gate's 2 × 16·d: GLA carries more weights than the Transformer).
Dropped: the paper's half-width keys (dk = d/2 per layer); here q and k keep d_model, as
every mechanism's projections, so the state is h·dk·dv = d²/h numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention import gated_scan
from attnbench.attention.mixer import MixerState, RecurrentMixer, wide
from attnbench.attention.mixer_config import MixerConfig, declare_mixer
from attnbench.attention.packing import Positions

GATE_RANK = 16  # the low-rank gate's width (the paper's)
GATE_TEMPERATURE = 16.0  # τ: α = σ(·)^{1/τ}, decays near 1 (the paper's)


@dataclass
class GLAConfig(MixerConfig):
    """:class:`MixerConfig`'s ``causal``, ``chunk`` and ``kernel``; nothing of its own."""

    mechanism = "gla"


@declare_mixer(
    GLAConfig,
    summary="gated linear attention (GLA): a data-dependent decay per key dimension, chunked",
)
class GLA(RecurrentMixer):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, dh = self.d_model, self.head_dim
        self.state_shape = (dh, dh)
        self.gate_down = nn.Linear(d, GATE_RANK, bias=False)
        self.gate_up = nn.Linear(GATE_RANK, d)
        self.g_proj = nn.Linear(d, d)
        self.norm = nn.Parameter(torch.ones(dh))

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        q, k, v = self.qkv_heads(x)
        g = F.logsigmoid(wide(self.split_heads(self.gate_up(self.gate_down(x)))))
        o = self.gated(q, k, v, g / GATE_TEMPERATURE, at, state, self.scale)
        return self.normed(o, self.norm, self.g_proj(x), x)

    def attention_flops(self, b: int, n: int) -> int:
        dh = self.head_dim
        return b * self.n_heads * gated_scan.chunked_flops(n, dh, dh, self.cfg.chunk, True)

    def core_backward_flops(self, n: int) -> int:
        dh = self.head_dim
        return -gated_scan.skipped_backward_flops(n, dh, dh, self.cfg.chunk)

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.n_heads * gated_scan.step_flops(self.head_dim, self.head_dim)
