"""DeltaNet (Schlag et al. 2021; parallelised by Yang et al. 2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length"), our own implementation: the delta
rule of :mod:`attnbench.attention.delta_scan`.

Per head, S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ and o_t = S_tᵀ q_t: each token
first erases what S holds along its key, then writes its value there, with a strength
β_t = σ(x_t W_β) per head. As in Yang et al. (section 3.3 and their layer): q, k and v pass
through a short causal convolution (kernel ``conv``) and SiLU, q and k are L2-normalised
per head (so the transition never amplifies the state), q is scaled by 1/√dk, and each
head's output is RMSNorm'd before ``out_proj``. The chunked form is the WY / UT one.

Value heads apart from key heads (``v_heads``, Qwen3-Next's "grouped value attention"): q
and k keep the model's n_heads heads (and their convolution channels), v, β, the decay, the
output norm and gate, and the state S are per value head, and each key head serves
v_heads / n_heads consecutive value heads: q and k are repeated per group when the core
runs, never stored (value head j reads key head ⌊j / g⌋, as transformers'
``Qwen3NextGatedDeltaNet.forward`` repeats them with ``repeat_interleave`` and
flash-linear-attention's ``chunk_gated_delta_rule`` indexes them, ``i_h // (HV // H)``).
``out_proj`` takes v_heads·d_h. None: one value head per key head, the layer as before.

Kept: all of the above at their defaults in flash-linear-attention's layer (no output
gate). Dropped: nothing of the recurrence; key heads are the model's (d_model / n_heads).
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
from attnbench.validators import check_int


@dataclass
class DeltaNetConfig(MixerConfig):
    """:class:`MixerConfig`'s ``causal``, ``chunk`` (of the WY form, its own default) and
    ``kernel``, then ``conv``: the short convolution's kernel (4; 0 for none), and
    ``v_heads``: the value heads, a multiple of the layer's n_heads (its key heads; the
    layer checks that), None for as many as the key heads."""

    mechanism = "deltanet"
    chunk: int = delta_scan.DEFAULT_CHUNK
    conv: int = DEFAULT_CONV
    v_heads: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.v_heads is not None:
            check_int("v_heads", self.v_heads)


def check_v_heads(v_heads: int | None, n_heads: int) -> int:
    """The value heads: ``v_heads`` if it is a positive multiple of the ``n_heads`` key heads
    (each key head serving a whole group of value heads), ``n_heads`` for None."""
    if v_heads is None:
        return n_heads
    if check_int("v_heads", v_heads) % n_heads:
        allowed = ", ".join(str(n_heads * i) for i in (1, 2, 3))
        raise ValueError(
            f"v_heads: must be a multiple of the key heads n_heads={n_heads} ({allowed}, ...), "
            f"got {v_heads}"
        )
    return v_heads


@declare_mixer(
    DeltaNetConfig,
    summary="DeltaNet: the delta rule (erase, then write), L2 keys, conv; chunked WY form",
)
class DeltaNet(RecurrentMixer):
    gate = False  # Gated DeltaNet's decay and output gate

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        d, dh = self.d_model, self.head_dim
        self.v_heads = check_v_heads(self.cfg.v_heads, self.n_heads)
        self.v_width = self.v_heads * dh
        if self.v_heads != self.n_heads:  # in place: the modules keep their order
            self.v_proj = nn.Linear(d, self.v_width)
            self.out_proj = nn.Linear(self.v_width, d)
        self.state_shape = (dh, dh)
        self.conv_weights(2 * self.width + self.v_width)  # q and k at the key heads, v
        self.b_proj = nn.Linear(d, self.v_heads)
        self.norm = nn.Parameter(torch.ones(dh))

    @property
    def state_heads(self) -> int:
        """S is kept per value head."""
        return self.v_heads

    def merge_heads(self, t: Tensor) -> Tensor:
        """(b, v_heads, n, dh) -> (b, n, v_heads·dh): the value heads' width, out_proj's."""
        return t.transpose(1, 2).flatten(2)

    def decay(self, x: Tensor) -> Tensor | None:
        """log α_t (b, h, n), or None: DeltaNet does not decay."""
        return None

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        x = self.inputs(x, at)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        widths = [self.width, self.width, self.v_width]
        q, k, v = (self.split_heads(t) for t in self.convolve(qkv, at, state).split(widths, -1))
        q, k = (F.normalize(wide(t), dim=-1, eps=1e-6) for t in (q, k))
        if (group := self.v_heads // self.n_heads) > 1:  # key head i serves i·g .. i·g + g − 1
            q, k = (t.repeat_interleave(group, dim=1) for t in (q, k))
        beta = torch.sigmoid(wide(self.b_proj(x))).transpose(1, 2)  # (b, v_heads, n)
        o = self.delta(q * self.scale, k, v, beta, self.decay(x), at, state)
        return self.normed(o, self.norm, self.g_proj(x) if self.gate else None, x)

    def attention_flops(self, b: int, n: int) -> int:
        """The core once per value head: q and k repeated per group run in each."""
        dh = self.head_dim
        return b * self.v_heads * delta_scan.chunked_flops(n, dh, dh, self.cfg.chunk)

    def core_backward_flops(self, n: int) -> int:
        """The triangular solve's one backward matmul, less what a backward from a zero
        state skips."""
        dh, chunk = self.head_dim, self.cfg.chunk
        skipped = delta_scan.skipped_backward_flops(n, dh, dh, chunk)
        return delta_scan.solve_backward_flops(n, chunk) - skipped

    def step_attention_flops(self, b: int, n: int) -> int:
        return b * self.v_heads * delta_scan.step_flops(self.head_dim, self.head_dim)
