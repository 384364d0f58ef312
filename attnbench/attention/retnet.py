"""Retention (Sun et al. 2023, "Retentive Network"), our own implementation: the gated
recurrence of :mod:`attnbench.attention.gated_scan` with one fixed decay per head.

Per head, S_t = γ S_{t−1} + k_t v_tᵀ and o_t = S_tᵀ q_t (the paper's eq. 1–2, S stored as
dk × dv), with the paper's multi-scale decays γ_h = 1 − 2^{−5−h}, h = 0 … heads − 1: every
head forgets at its own fixed rate, the slowest near 1 − 2^{−16}. The output is
GroupNorm'd per head (here RMSNorm with a weight, as flash-linear-attention's layer) and gated
by swish(X W_G) before ``out_proj`` (the paper's eq. 8).

Kept: the decays, the k scaling by 1/√dk (here applied to q, the same product), the per-head
norm and the swish gate (``g_proj``, d × d: RetNet carries 5·d² projection weights where the
Transformer carries 4·d²). Dropped, and why: xPos (no mechanism here carries a position
encoding inside the layer, and rotating q and k is elementwise work that changes no cost
measured here); the doubled value dimension (v_proj keeps d × d, as every mechanism's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnbench.attention import gated_scan
from attnbench.attention.mixer import MixerState, RecurrentMixer
from attnbench.attention.mixer_config import MixerConfig, declare_mixer
from attnbench.attention.packing import Positions


@dataclass
class RetNetConfig(MixerConfig):
    """:class:`MixerConfig`'s ``causal``, ``chunk`` (the recurrence carries the state across
    chunks) and ``kernel``; nothing of its own."""

    mechanism = "retnet"


@declare_mixer(
    RetNetConfig,
    summary="retention (RetNet): a fixed decay per head, chunked recurrence, O(n·d²)",
)
class RetNet(RecurrentMixer):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        h, dh = self.n_heads, self.head_dim
        self.state_shape = (dh, dh)
        self.g_proj = nn.Linear(self.d_model, self.d_model)
        self.norm = nn.Parameter(torch.ones(dh))
        gammas = 1 - 2.0 ** (-5 - torch.arange(h, dtype=torch.float64))
        self.register_buffer("log_decay", gammas.log().float().view(1, h, 1, 1))

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        q, k, v = self.qkv_heads(x)
        o = self.gated(q, k, v, self.log_decay, at, state, self.scale)
        return self.normed(o, self.norm, self.g_proj(x), x)

    def attention_flops(self, b: int, n: int) -> int:
        dh = self.head_dim
        return b * self.n_heads * gated_scan.chunked_flops(n, dh, dh, self.cfg.chunk, False)

    def core_backward_flops(self, n: int) -> int:
        dh = self.head_dim
        return -gated_scan.skipped_backward_flops(n, dh, dh, self.cfg.chunk)

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.n_heads * gated_scan.step_flops(self.head_dim, self.head_dim)
