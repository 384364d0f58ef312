"""The SSD layer of Mamba-2 (Dao & Gu 2024, "Transformers are SSMs"), our own implementation:
the gated recurrence of :mod:`attnbench.attention.gated_scan` with a scalar data-dependent
decay per head.

Per head h with P = d_model / heads channels and a state of N (``d_state``) per channel,

    S_t = exp(Δ_t A_h) S_{t−1} + B_t (Δ_t x_t)ᵀ,   y_t = S_tᵀ C_t + D_h x_t

(the paper's section 7: A a negative scalar per head, Δ_t = softplus(x W_Δ + b_Δ) per head,
B and C of N per group of heads, shared by the ``groups`` groups' heads). x, B and C pass
through the short causal convolution (kernel ``conv``) and SiLU; the output is
RMSNorm(y ⊙ SiLU(z)) over each group's channels (the gate z from ``g_proj``, the paper's
normalisation after gating), then ``out_proj``. In this layer's projections ``v_proj`` makes
x, ``k_proj`` B and ``q_proj`` C, so S is N × P per head: the state is h·N·P numbers plus
the window, (K − 1)·(d + 2·groups·N).

Kept: the scalar decay, Δ and its bias, A and D per head, grouped B and C, the
convolution over x, B and C, the gated norm; the initialisations (A ∈ [1, 16], Δ ∈
[0.001, 0.1]). Dropped: the expansion of x to 2·d (x keeps d_model, as every mechanism's v
does) and so Mamba-2's 64-channel heads at twice the width: heads are the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention import gated_scan
from attnbench.attention.base import check_head_groups
from attnbench.attention.mixer import NORM_EPS, MixerState, RecurrentMixer, wide
from attnbench.attention.mixer_config import DEFAULT_CONV, MixerConfig, declare_mixer
from attnbench.attention.packing import Positions
from attnbench.validators import check_int


@dataclass
class Mamba2Config(MixerConfig):
    """After :class:`MixerConfig`'s ``causal``, ``chunk`` and ``kernel``: ``d_state``: N, the
    state per channel (64); ``groups``: the groups of heads that share B and C (1, must divide
    the heads); ``conv``: the short convolution's kernel (4; 0 for none)."""

    mechanism = "mamba2"
    d_state: int = 64
    groups: int = 1
    conv: int = DEFAULT_CONV

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("d_state", self.d_state)
        check_int("groups", self.groups)


@declare_mixer(
    Mamba2Config,
    summary="Mamba-2 (SSD): a data-dependent scalar decay per head, conv, gate; chunked",
)
class Mamba2(RecurrentMixer):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, h, cfg = self.d_model, self.n_heads, self.cfg
        self.groups = check_head_groups("groups", cfg.groups, h)
        bc = self.groups * cfg.d_state
        self.q_proj, self.k_proj = nn.Linear(d, bc), nn.Linear(d, bc)  # C and B
        self.state_shape = (cfg.d_state, self.head_dim)
        self.conv_weights(d + 2 * bc)
        self.dt_proj = nn.Linear(d, h)
        self.g_proj = nn.Linear(d, d)
        self.a_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.skip = nn.Parameter(torch.ones(h))  # D
        self.norm = nn.Parameter(torch.ones(d))
        with torch.no_grad():  # Δ = softplus(bias) log-uniform in [0.001, 0.1] at x = 0
            dt = torch.empty(h).uniform_(math.log(1e-3), math.log(0.1)).exp()
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        b, n, d = x.shape
        bc = self.groups * self.cfg.d_state
        xbc = torch.cat([self.v_proj(x), self.k_proj(x), self.q_proj(x)], dim=-1)
        xs, big_b, big_c = self.convolve(xbc, at, state).split([d, bc, bc], dim=-1)
        dt = F.softplus(wide(self.dt_proj(x))).transpose(1, 2)  # Δ, (b, h, n)
        g = (dt * -wide(self.a_log).exp()[:, None])[..., None]  # Δ·A, (b, h, n, 1)
        heads = self.split_heads(xs)  # x, (b, h, n, P)
        per_group = self.n_heads // self.groups
        k, q = (
            t.view(b, n, self.groups, -1).transpose(1, 2).repeat_interleave(per_group, dim=1)
            for t in (big_b, big_c)
        )  # (b, h, n, N)
        y = self.gated(q, k, heads * dt[..., None], g, at, state, 1.0)
        y = y + wide(self.skip)[:, None, None] * heads
        y = self.merge_heads(y) * F.silu(wide(self.g_proj(x)))
        y = F.rms_norm(y.unflatten(-1, (self.groups, -1)), (d // self.groups,), eps=NORM_EPS)
        return (y.flatten(-2) * wide(self.norm)).to(x.dtype)

    def attention_flops(self, b: int, n: int) -> int:
        dk, dv = self.state_shape
        return b * self.n_heads * gated_scan.chunked_flops(n, dk, dv, self.cfg.chunk, False)

    def core_backward_flops(self, n: int) -> int:
        return -gated_scan.skipped_backward_flops(n, *self.state_shape, self.cfg.chunk)

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.n_heads * gated_scan.step_flops(*self.state_shape)
