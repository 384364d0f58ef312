"""DeltaNet (Schlag et al. 2021; parallelised by Yang et al. 2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length"), our own implementation: the delta
rule of :mod:`attnbench.attention.delta_scan`.

Per head, S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ and o_t = S_tᵀ q_t: each token
first erases what S holds along its key, then writes its value there, with a strength
β_t = σ(x_t W_β) per head. As in Yang et al. (section 3.3 and their layer): q, k and v pass
through a short causal convolution (kernel ``conv``) and SiLU, q and k are L2-normalised
per head (so the transition never amplifies the state), q is scaled by 1/√dk, and each
head's output is RMSNorm'd before ``out_proj``. The chunked form is the WY / UT one.

Kept: all of the above at their defaults in flash-linear-attention's layer (no output
gate). Dropped: nothing of the recurrence; heads are the model's (d_model / n_heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention import delta_scan
from attnbench.attention.mixer import MixerState, RecurrentMixer, wide
from attnbench.attention.mixer_config import DEFAULT_CONV, MixerConfig, declare_mixer
from attnbench.attention.packing import Positions


@dataclass
class DeltaNetConfig(MixerConfig):
    """:class:`MixerConfig`'s ``causal``, ``chunk`` (of the WY form, its own default) and
    ``kernel``, then ``conv``: the short convolution's kernel (4; 0 for none)."""

    mechanism = "deltanet"
    chunk: int = delta_scan.DEFAULT_CHUNK
    conv: int = DEFAULT_CONV


@declare_mixer(
    DeltaNetConfig,
    summary="DeltaNet: the delta rule (erase, then write), L2 keys, conv; chunked WY form",
)
class DeltaNet(RecurrentMixer):
    gate = False  # Gated DeltaNet's decay and output gate

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, h, dh = self.d_model, self.n_heads, self.head_dim
        self.state_shape = (dh, dh)
        self.conv_weights(3 * d)
        self.b_proj = nn.Linear(d, h)
        self.norm = nn.Parameter(torch.ones(dh))

    def decay(self, x: Tensor) -> Tensor | None:
        """log α_t (b, h, n), or None: DeltaNet does not decay."""
        return None

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        q, k, v = (self.split_heads(t) for t in self.convolve(qkv, at, state).chunk(3, -1))
        q, k = (F.normalize(wide(t), dim=-1, eps=1e-6) for t in (q, k))
        beta = torch.sigmoid(wide(self.b_proj(x))).transpose(1, 2)  # (b, h, n)
        o = self.delta(q * self.scale, k, v, beta, self.decay(x), at, state)
        return self.normed(o, self.norm, self.g_proj(x) if self.gate else None, x)

    def attention_flops(self, b: int, n: int) -> int:
        dh = self.head_dim
        return b * self.n_heads * delta_scan.chunked_flops(n, dh, dh, self.cfg.chunk)

    def core_backward_flops(self, n: int) -> int:
        """The triangular solve's one backward matmul, less what a backward from a zero
        state skips."""
        dh, chunk = self.head_dim, self.cfg.chunk
        skipped = delta_scan.skipped_backward_flops(n, dh, dh, chunk)
        return delta_scan.solve_backward_flops(n, chunk) - skipped

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.n_heads * delta_scan.step_flops(self.head_dim, self.head_dim)
