"""Kimi Delta Attention (Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention
Architecture"), our own implementation: Gated DeltaNet's layer
(:mod:`attnbench.attention.gated_deltanet`) with a decay per key channel, on the core of
:mod:`attnbench.attention.kda_scan`.

Per head, S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, with
a data-dependent decay per head and key channel (flash-linear-attention's layer,
``fla/layers/kda.py`` ``KimiDeltaAttention``, and its gate ``fla/ops/kda/gate.py``
``naive_kda_gate``): log α_t = −exp(A_h) · softplus(x_t W_↓ W_↑ + b_dt), a low-rank
projection d → d_h → d (one decay per channel of every head), A_h log-uniform in [1, 16],
b_dt zero at start; β_t = σ(x_t W_β) per head; q, k and v through the short convolution and
SiLU, q and k L2-normalised per head, q scaled by 1/√d_h; the output RMSNorm(o) ⊙ σ(x V_↓ V_↑)
per head before ``out_proj``, the gate low-rank (d → d_h → d, a bias on the second) and a
sigmoid, not Gated DeltaNet's SiLU (fla's ``FusedRMSNormGated(activation="sigmoid")``).

Kept: all of the above, fla's layer at its defaults (one value head per key head, expand_v =
1, β without the doubling of ``allow_neg_eigval``). Dropped: the paper's fewer, larger heads
and grouped value heads: heads are the model's, so the state is h·dk·dv = d²/h numbers plus
the convolution's window, (K − 1)·3d, as Gated DeltaNet's; the q, k, v projections keep the
biases every mechanism's have (fla's have none), and the norm's ε is the mixers' shared
``NORM_EPS`` (fla's 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention import delta_scan, fla_kernels, kda_scan
from attnbench.attention.mixer import NORM_EPS, MixerState, RecurrentMixer, wide
from attnbench.attention.mixer_config import DEFAULT_CONV, MixerConfig, declare_mixer
from attnbench.attention.packing import Positions


@dataclass
class KDAConfig(MixerConfig):
    """:class:`MixerConfig`'s ``causal``, ``chunk`` (of the WY form, 64) and ``kernel``, then
    ``conv``: the short convolution's kernel (4; 0 for none)."""

    mechanism = "kda"
    chunk: int = delta_scan.DEFAULT_CHUNK
    conv: int = DEFAULT_CONV


@declare_mixer(
    KDAConfig,
    summary="Kimi Delta Attention: the delta rule with a decay per key channel; WY form",
)
class KDA(RecurrentMixer):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, h, dh = self.d_model, self.n_heads, self.head_dim
        self.state_shape = (dh, dh)
        self.conv_weights(3 * d)
        self.b_proj = nn.Linear(d, h, bias=False)
        self.f_down = nn.Linear(d, dh, bias=False)  # the decay's low-rank projection
        self.f_up = nn.Linear(dh, d, bias=False)
        self.a_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(torch.zeros(d))
        self.gate_down = nn.Linear(d, dh, bias=False)  # the output gate's
        self.gate_up = nn.Linear(dh, d)
        self.norm = nn.Parameter(torch.ones(dh))

    def decay(self, x: Tensor) -> Tensor:
        """log α_t = −exp(A_h)·softplus(x W_↓ W_↑ + b_dt), (b, h, n, dk)."""
        rate = F.softplus(wide(self.f_up(self.f_down(x))) + wide(self.dt_bias))
        return -wide(self.a_log).exp()[:, None, None] * self.split_heads(rate)

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        q, k, v = (self.split_heads(t) for t in self.convolve(qkv, at, state).chunk(3, -1))
        q, k = (F.normalize(wide(t), dim=-1, eps=1e-6) for t in (q, k))
        beta = torch.sigmoid(wide(self.b_proj(x))).transpose(1, 2)  # (b, h, n)
        q, g = q * self.scale, self.decay(x)
        if self.cfg.kernel == "fla" and q.device.type != "meta":
            o = self._fla(fla_kernels.kda, at, state, q, k, v, g, beta)
        else:
            o = self._recur(
                kda_scan.kda_chunked, kda_scan.kda_step, at, state, (q, k, v, g), (beta,)
            )
        o = F.rms_norm(o, (o.shape[-1],), self.norm.to(o.dtype), NORM_EPS)
        gate = torch.sigmoid(self.gate_up(self.gate_down(x)).to(o.dtype))
        return (self.merge_heads(o) * gate).to(x.dtype)

    def attention_flops(self, b: int, n: int) -> int:
        dh = self.head_dim
        return b * self.n_heads * kda_scan.chunked_flops(n, dh, dh, self.cfg.chunk)

    def core_backward_flops(self, n: int) -> int:
        """As the scalar delta rule's: the triangular solve's one backward matmul, less what
        a backward from a zero state skips (the score matmuls' backward is twice theirs)."""
        dh, chunk = self.head_dim, self.cfg.chunk
        skipped = delta_scan.skipped_backward_flops(n, dh, dh, chunk)
        return delta_scan.solve_backward_flops(n, chunk) - skipped

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.n_heads * delta_scan.step_flops(self.head_dim, self.head_dim)
