"""Multi-head latent attention (MLA), DeepSeek-V2's and -V3's attention.

Softmax attention whose keys and values are up-projections of one low-rank latent per token,
so that a decoder keeps the latent instead of every head's key and value (DeepSeek-V2,
arXiv:2405.04434, sec. 2.1; shapes as in transformers'
``models/deepseek_v3/modeling_deepseek_v3.py``, ``DeepseekV3Attention``):

* c = RMSNorm(x W_dkv), the latent of ``latent`` dims (``kv_lora_rank``), and k_R = RoPE(x
  W_kr) of ``rope_dim`` dims (``qk_rope_head_dim``), one for every head ("decoupled RoPE",
  sec. 2.1.3). Both come from one projection of x, ``kv_down`` (upstream's
  ``kv_a_proj_with_mqa``), the latent normalised (``kv_a_layernorm``).
* Head i's key is [c W_uk,i, k_R] and its value c W_uv,i (``kv_up``, upstream's
  ``kv_b_proj``, no bias); its query [q_C,i, RoPE(q_R,i)] comes from x through ``q_proj``,
  or from a normalised query latent of ``q_latent`` dims (``q_lora_rank``; 0: none, as
  DeepSeek-V2-Lite). The scale is 1/√(head_dim + rope_dim), upstream's ``qk_head_dim ** -0.5``.

The **naive** form computes every head's keys and values and runs softmax attention over
them, as upstream's forward does. The **absorbed** form (sec. 2.1.2: "W_UK can be absorbed
into W_Q, and W_UV into W_O") never makes them. With ``kv_up``'s rows of head i as W_uk,i
(head_dim × latent) and W_uv,i (v_head_dim × latent), a score's first part is
q_C,i · (W_uk,i c) = (q_C,i W_uk,i) · c: each head's query is carried into latent space and
every head attends over the same keys [c, k_R] with c itself as the values, W_uv,i applied
to the result. It is the same function (``tests/test_mla.py`` holds the two equal in
float64); it reads the cache rather than every head's keys, which is what a decode step
wants, but each score runs over latent + rope_dim dims against head_dim + rope_dim (and
P·V over latent against v_head_dim), so prefill is cheaper naive: vLLM prefills with the
"compute friendly" naive form and decodes with the "data-movement friendly" absorbed one
(``vllm/v1/attention/backends/mla/common.py``, its module docstring). ``form`` picks the
forward's and a prefill's (``extend`` by more than one token, naive: every cached latent
up-projected); a decode step (``extend`` by one token) always attends absorbed over the
cache.

The decode state (:class:`LatentCache`) is c and k_R of every token, latent + rope_dim
elements a token and layer, shared by the heads: DeepSeek-V2 (60 layers, latent 512, RoPE 64,
128 heads of 128) keeps 34 560 elements a token against 1 966 080 for multi-head keys and
values (``tests/test_mla.py``). RoPE positions are the token's index in its sequence (in the
cache: its slot, left padding included); scores depend on differences of positions only, so
a left-padded prompt, a prompt prefilled in pieces and a packed document alone give the same
outputs. Packed rows go document by document through :meth:`attend` (the base class's way),
positions counted from each document's first token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor, nn

from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.attention.cache import KVCache, flag_bytes, grouped, ungrouped
from attnbench.attention.masks import blocked_keys
from attnbench.attention.vanilla import softmax_attend
from attnbench.validators import check_bool, check_choice, check_int

FORMS = ("naive", "absorbed")
ROPE_THETA = 10000.0  # RoPE's base, transformers' DeepseekV3Config rope_theta default
NORM_EPS = 1e-6  # the latents' RMSNorm epsilon, DeepseekV3RMSNorm's default


@dataclass
class MLAConfig:
    """MLA's dimensions, upstream's names in brackets. The defaults scale DeepSeek-V2's ratios
    to the base model's heads of d_h = 64: its latent is 4 d_h (512 for heads of 128) and its
    RoPE part d_h / 2 (64), so latent 256 and rope_dim 32 here: 288 elements a token and layer
    against 1 536 for the base model's 12 heads' keys and values. Each head's query and key
    width without RoPE (``qk_nope_head_dim``) is the model's ``head_dim`` (``model.head_dim``;
    null: d_model / n_heads, so it keeps the per-head width of the model it replaces), and
    ``v_head_dim`` (null: that width, as upstream's are equal) its values'; ``q_latent`` 0 projects
    queries from x directly (DeepSeek-V2-Lite; V2 and V3 use 1536); ``form`` naive: the
    forward upstream runs, and the cheaper prefill at these sizes (see the module)."""

    causal: bool = False
    latent: int = 256
    rope_dim: int = 32
    v_head_dim: int | None = None
    q_latent: int = 0
    form: str = "naive"

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        check_int("latent", self.latent)
        check_int("rope_dim", self.rope_dim, low=2)
        if self.rope_dim % 2:
            raise ValueError(
                f"rope_dim: must be an even integer >= 2 (RoPE rotates pairs), got {self.rope_dim}"
            )
        if (value := self.v_head_dim) is not None:
            try:
                check_int("v_head_dim", value)
            except ValueError:
                raise ValueError(
                    f"v_head_dim: must be an integer >= 1 or null (the heads' width), got {value!r}"
                ) from None
        check_int("q_latent", self.q_latent, low=0)
        check_choice("form", self.form, FORMS)


def rope(t: Tensor, positions: Tensor) -> Tensor:
    """RoPE over the last dim r of ``t`` (..., n, r) at ``positions`` (n,): pair j of the
    halves (x_j, x_{j+r/2}) turned by positions · θ^(−2j/r), the rotate-half layout of
    transformers' ``apply_rotary_pos_emb`` with ``DeepseekV3RotaryEmbedding``'s default
    frequencies. Angles in float32 at least (float64 stays float64): a half-precision
    position times a frequency is off by whole turns at a few thousand tokens."""
    r = t.shape[-1]
    wide = torch.promote_types(t.dtype, torch.float32)
    freqs = ROPE_THETA ** (-torch.arange(0, r, 2, device=t.device, dtype=wide) / r)  # (r/2,)
    angles = positions.to(wide)[:, None] * freqs[None, :]  # (n, r/2)
    cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
    x1, x2 = t[..., : r // 2], t[..., r // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def masked_softmax(scores: Tensor, blocked: Tensor | None, padded: bool) -> Tensor:
    """softmax over the last dim of ``scores`` (b, 1, h·c, L), heads stacked as
    :func:`attnbench.attention.cache.grouped` stacks them, with ``blocked`` (True: may not
    see) for c rows broadcast to every head's; a row that sees nothing gets 0 (``padded``),
    as :func:`attnbench.attention.vanilla.softmax_attend` gives."""
    if blocked is None:
        return scores.softmax(dim=-1)
    if blocked.shape[-2] not in (1, scores.shape[-2]):
        blocked = blocked.repeat(
            *[1] * (blocked.dim() - 2), scores.shape[-2] // blocked.shape[-2], 1
        )
    probs = scores.masked_fill(blocked, float("-inf")).softmax(dim=-1)
    if padded:
        probs = probs.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
    return probs


@dataclass
class LatentCache(KVCache):
    """Every token's latent c (``k``: (b, 1, slots, latent)) and RoPE key k_R (``v``: (b, 1,
    slots, rope_dim)), one for all heads, in a :class:`KVCache`'s slots: the same writes,
    padding flags, ``slot``/``admit``/``seek``/``pad_left`` as the exact mechanisms' cache,
    only the two widths differ."""

    @classmethod
    def latents(
        cls,
        b: int,
        slots: int,
        latent: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Self:
        return cls(
            torch.zeros((b, 1, slots, latent), dtype=dtype, device=device),
            torch.zeros((b, 1, slots, rope_dim), dtype=dtype, device=device),
            torch.full((b, slots), cls.UNWRITTEN, dtype=torch.bool, device=device),
        )


@declare(
    "mla",
    config=MLAConfig,
    causal=True,
    cannot_decode=None,
    head_dim=True,
    summary="multi-head latent attention (DeepSeek-V2): K/V from a cached latent, RoPE apart",
)
class MLAAttention(MultiHeadAttention):
    """MLA (module docstring). ``k_proj`` and ``v_proj`` are not kept: keys and values come
    from the latent (``kv_down``, ``kv_norm``, ``kv_up``); ``q_proj`` makes every head's
    [q_C, q_R] (from x, or from the query latent ``q_down``/``q_norm``) and ``out_proj``
    takes h · v_head_dim back to d_model."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        max_seq_len: int,
        cfg: MLAConfig,
        head_dim: int | None = None,
    ) -> None:
        super().__init__(
            d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg, head_dim=head_dim
        )
        del self.k_proj, self.v_proj  # unused, they would be parameters without a gradient
        h = n_heads
        self.nope_dim = self.head_dim  # qk_nope_head_dim: the model's heads' width
        self.v_dim = cfg.v_head_dim or self.nope_dim
        self.latent, self.rope_dim = cfg.latent, cfg.rope_dim
        self.scale = 1.0 / math.sqrt(self.nope_dim + self.rope_dim)
        q_width = h * (self.nope_dim + self.rope_dim)
        if cfg.q_latent:
            self.q_down = nn.Linear(d_model, cfg.q_latent)
            self.q_norm = nn.RMSNorm(cfg.q_latent, eps=NORM_EPS)
            self.q_proj = nn.Linear(cfg.q_latent, q_width, bias=False)
        else:
            self.q_proj = nn.Linear(d_model, q_width)
        self.kv_down = nn.Linear(d_model, self.latent + self.rope_dim)
        self.kv_norm = nn.RMSNorm(self.latent, eps=NORM_EPS)
        # no bias: the absorbed form folds W_uk into the query and W_uv after the attention,
        # which a bias would not follow (upstream's kv_b_proj has none either)
        self.kv_up = nn.Linear(self.latent, h * (self.nope_dim + self.v_dim), bias=False)
        self.out_proj = nn.Linear(h * self.v_dim, d_model)

    # -- the pieces both forms share ---------------------------------------------------------

    def _queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q_C (b, h, n, head_dim) and RoPE(q_R) (b, h, n, rope_dim)."""
        b, n, _ = x.shape
        source = self.q_norm(self.q_down(x)) if self.cfg.q_latent else x
        q = self.q_proj(source).view(b, n, self.n_heads, -1).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_nope, rope(q_rope, positions)

    def _latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """c (b, n, latent), normalised, and k_R = RoPE(x W_kr) (b, n, rope_dim): what the
        cache keeps of each token."""
        c, k_rope = self.kv_down(x).split([self.latent, self.rope_dim], dim=-1)
        return self.kv_norm(c), rope(k_rope, positions)

    def _up_weights(self) -> tuple[Tensor, Tensor]:
        """W_uk (h, head_dim, latent) and W_uv (h, v_head_dim, latent): ``kv_up``'s rows,
        head by head, as the naive form's keys and values apply them."""
        w = self.kv_up.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.latent)
        w_uk, w_uv = w.split([self.nope_dim, self.v_dim], dim=1)
        return w_uk, w_uv

    def _merge(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape  # (b, h, n, v_head_dim)
        return out.transpose(1, 2).reshape(b, n, self.n_heads * self.v_dim)

    # -- the two forms --------------------------------------------------------------------

    def _naive(
        self,
        q_nope: Tensor,
        q_rope: Tensor,
        c: Tensor,
        k_rope: Tensor,
        blocked: Tensor | None,
        padded: bool,
    ) -> Tensor:
        """Every head's keys [c W_uk,i, k_R] and values c W_uv,i, then softmax attention:
        (b, h, n, v_head_dim)."""
        b, n, _ = c.shape
        kv = self.kv_up(c).view(b, n, self.n_heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        keys = torch.cat((k_nope, k_rope[:, None].expand(-1, self.n_heads, -1, -1)), dim=-1)
        queries = torch.cat((q_nope, q_rope), dim=-1)
        return softmax_attend(queries, keys, v, blocked, self.scale, padded)

    def _absorbed(
        self,
        q_nope: Tensor,
        q_rope: Tensor,
        latents: Tensor,
        k_rope: Tensor,
        blocked: Tensor | None,
        padded: bool,
    ) -> Tensor:
        """Each head's q_C carried into latent space (q_C W_uk,i), every head against the
        same keys [c, k_R] (b, 1, L, ·) and values c, W_uv,i after: (b, h, c, v_head_dim).
        The heads are stacked rows of one matrix (as grouped-query heads with one key/value
        head), and the two parts of each score are two matmuls added, not a concatenation:
        the cache is not copied at every step."""
        w_uk, w_uv = self._up_weights()
        q_latent = q_nope @ w_uk  # (b, h, c, latent)
        scores = grouped(q_latent, 1) @ latents.transpose(-2, -1)  # (b, 1, h·c, L)
        scores.add_(grouped(q_rope, 1) @ k_rope.transpose(-2, -1)).mul_(self.scale)
        probs = masked_softmax(scores, blocked, padded)
        out = ungrouped(probs @ latents, self.n_heads)  # (b, h, c, latent)
        return out @ w_uv.transpose(-2, -1)  # (b, h, c, v_head_dim)

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = x.shape[1]
        positions = torch.arange(n, device=x.device)
        q_nope, q_rope = self._queries(x, positions)
        c, k_rope = self._latents(x, positions)
        blocked = blocked_keys(key_padding_mask, self.cfg.causal, n, x.device)
        padded = key_padding_mask is not None
        if self.cfg.form == "naive":
            out = self._naive(q_nope, q_rope, c, k_rope, blocked, padded)
        else:
            out = self._absorbed(q_nope, q_rope, c[:, None], k_rope[:, None], blocked, padded)
        return self._merge(out)  # (b, n, h·v_head_dim)

    # -- the incremental form, over the latent cache ----------------------------------------
    # A decode step (one token) is always absorbed: it reads the cache, never every head's
    # keys. A piece of several tokens (a prefill) runs in ``form``: naive up-projects every
    # cached latent into each head's keys and values, as a prefill over the forward would.

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> LatentCache:
        return LatentCache.latents(b, capacity, self.latent, self.rope_dim, dtype, device)

    def extend_attend(
        self, x: Tensor, state: LatentCache, key_padding_mask: Tensor | None
    ) -> Tensor:
        c_len = x.shape[1]
        positions = torch.arange(state.length, state.length + c_len, device=x.device)
        q_nope, q_rope = self._queries(x, positions)
        c, k_rope = self._latents(x, positions)
        latents, rope_keys = state.append(c[:, None], k_rope[:, None], key_padding_mask)
        blocked, padded = state.blocked(c_len), state.has_padding
        if self.cfg.form == "naive" and c_len > 1:  # a prefill: every cached latent up
            out = self._naive(q_nope, q_rope, latents[:, 0], rope_keys[:, 0], blocked, padded)
        else:
            out = self._absorbed(q_nope, q_rope, latents, rope_keys, blocked, padded)
        return self._merge(out)  # (b, c, h·v_head_dim)

    def context_elements(self, n: int) -> int:
        """Every token's latent and RoPE key, one for all heads: n · (latent + rope_dim)."""
        return n * (self.latent + self.rope_dim)

    def state_bytes(self, n: int, itemsize: int) -> int:
        """The latent cache at capacity n, and a padding flag a token."""
        return self.context_bytes(n, itemsize) + flag_bytes(n)

    # -- FLOPs ------------------------------------------------------------------------------

    def _token_flops(self) -> int:
        """The projections of one token, whatever the form: its query (through the query
        latent, if any), its latent and RoPE key, and ``out_proj``."""
        d, h = self.d_model, self.n_heads
        q_width, q_latent = h * (self.nope_dim + self.rope_dim), self.cfg.q_latent
        q = 2 * d * q_width if not q_latent else 2 * (d * q_latent + q_latent * q_width)
        return q + 2 * d * (self.latent + self.rope_dim) + 2 * h * self.v_dim * d

    def flops(self, b: int, n: int) -> int:
        """The projections of every token, plus :meth:`attention_flops`."""
        return b * n * self._token_flops() + self.attention_flops(b, n)

    def attention_flops(self, b: int, n: int) -> int:
        """Naive: ``kv_up`` of every token (2·n·latent·h·(head_dim + v_head_dim)), QKᵀ over
        head_dim + rope_dim and P·V over v_head_dim per head. Absorbed: q_C W_uk and W_uv
        after (2·n·h·latent·(head_dim + v_head_dim) together), QKᵀ over latent + rope_dim
        and P·V over latent per head."""
        h, lat, dn, dr, dv = self.n_heads, self.latent, self.nope_dim, self.rope_dim, self.v_dim
        up = 2 * n * lat * h * (dn + dv)  # kv_up, or the absorption and W_uv after
        if self.cfg.form == "naive":
            return b * (up + 2 * n * n * h * (dn + dr + dv))
        return b * (up + 2 * n * n * h * (2 * lat + dr))

    def step_flops(self, b: int, n: int) -> int:
        """One token's projections, plus :meth:`step_attention_flops`."""
        return b * self._token_flops() + self.step_attention_flops(b, n)

    def step_attention_flops(self, b: int, n: int) -> int:
        """The absorbed form for one query against n cached tokens: q_C W_uk and W_uv after
        (2·h·latent·(head_dim + v_head_dim)), scores over latent + rope_dim and P·c over
        latent per head."""
        h, lat, dr = self.n_heads, self.latent, self.rope_dim
        return b * (2 * h * lat * (self.nope_dim + self.v_dim) + 2 * n * h * (2 * lat + dr))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, cfg={self.cfg}"
