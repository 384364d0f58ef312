"""xFormers' ``memory_efficient_attention``: exact softmax attention in O(n) memory.

The kernel of Rabe & Staats, "Self-attention does not need O(n²) memory" (2021): softmax(QKᵀ/√d)V
computed block by block, so the (b, h, n, n) scores never exist. It is exact, so it is tested
against ``vanilla`` and measures what a fused kernel saves without approximating anything.

Grouped-query heads (``kv_heads``) use xformers' 5-D layout (batch, tokens, groups, heads,
dim) with K and V expanded over each group's heads as stride-0 views, xformers' documented
way to run GQA/MQA without copying them. Its incremental form keeps the same preallocated
K/V cache as vanilla and sdpa (:class:`attnbench.attention.cache.KVCache`).

xformers is an optional extra and has no CPU kernels, so this module imports it only inside
:meth:`XFormersAttention.attend`: importing attnbench must work, silently, without it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.attention.base import declare
from attnbench.attention.cache import CachedAttention, KVCache
from attnbench.attention.masks import blocked_keys
from attnbench.validators import check_bool

NOT_INSTALLED = "xformers is not installed (pip install 'attnbench[xformers]')"
NO_GPU = "xformers has no CPU kernels and no CUDA GPU is visible"


def why_unavailable() -> str | None:
    """One line saying why xformers cannot run here, or None.

    ``find_spec`` first, so asking does not import xformers: a wheel built for another torch
    logs a multi-line warning on import, which ``attnbench info`` should not print.
    """
    if importlib.util.find_spec("xformers") is None:
        return NOT_INSTALLED
    if not torch.cuda.is_available():
        return NO_GPU
    try:
        import xformers.ops  # noqa: F401
    except ImportError:
        return NOT_INSTALLED
    return None


@dataclass
class XFormersConfig:
    causal: bool = False

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)


@declare(
    "xformers",
    config=XFormersConfig,
    causal=True,
    devices=("cuda",),
    dtypes=("fp16", "bf16"),
    why_unavailable=why_unavailable,
    gqa=True,
    head_dim=True,
    cannot_decode=None,
    summary="xformers memory_efficient_attention: exact, O(n) memory (CUDA only)",
)
class XFormersAttention(CachedAttention):
    def recomputed_flops(self, b: int, n: int) -> int:
        """Memory-efficient attention keeps no scores: its backward recomputes QKᵀ."""
        return self.attention_flops(b, n) // 2

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        b, n, _ = x.shape
        # xformers' layout is BMHK, so the projections need only a view, no transpose
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim)  # (b, n, h, dh)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)  # (b, n, kv_heads, dh)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        blocked = None
        if key_padding_mask is not None:
            blocked = blocked_keys(key_padding_mask, self.cfg.causal, n, x.device)
        return self._xformers(q, k, v, blocked, causal=self.cfg.causal and blocked is None)

    def extend_attend(self, x: Tensor, state: KVCache, key_padding_mask: Tensor | None) -> Tensor:
        b, c, _ = x.shape
        q = self.q_proj(x).view(b, c, self.n_heads, self.head_dim)  # (b, c, h, dh)
        k, v = (self.split_heads(p(x)) for p in (self.k_proj, self.v_proj))  # (b, g, c, dh)
        keys, values = state.append(k, v, key_padding_mask)  # (b, kv_heads, L, dh)
        # the cache is (b, kv_heads, L, dh): a transposed view is xformers' (b, L, g, dh)
        blocked = state.blocked(c)  # (b | 1, 1, c | 1, L) or None
        return self._xformers(q, keys.transpose(1, 2), values.transpose(1, 2), blocked, False)

    def _xformers(
        self, q: Tensor, k: Tensor, v: Tensor, blocked: Tensor | None, causal: bool
    ) -> Tensor:
        """memory_efficient_attention on q (b, c, h, dh) and k, v (b, L, kv_heads, dh)
        -> (b, c, h·dh); ``blocked`` (True: may not see) as an additive bias."""
        # one line rather than xformers' page-long NotImplementedError
        if q.device.type != "cuda":
            raise RuntimeError(why_unavailable() or f"xformers has no kernels for {q.device.type}")
        try:
            import xformers.ops as xops  # a dict lookup once imported: cheap on the timed path
        except ImportError:
            raise RuntimeError(NOT_INSTALLED) from None
        b, c, h, dh = q.shape
        length, g = k.shape[1], self.kv_heads
        bias = None
        if blocked is not None:
            bias = self._bias(blocked, b, c, length, q)  # (b, h, c, L)
        elif causal:
            bias = xops.LowerTriangularMask()  # never materialised
        if g != h:  # BMGHK: each group's K and V expanded over its heads, stride 0
            per = h // g
            q = q.view(b, c, g, per, dh)
            k = k[:, :, :, None].expand(b, length, g, per, dh)
            v = v[:, :, :, None].expand(b, length, g, per, dh)
            if isinstance(bias, Tensor):
                bias = bias.view(b, g, per, c, length)
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=self.scale)
        return out.reshape(b, c, self.width)  # (b, c, h*dh)

    def _bias(self, blocked: Tensor, b: int, c: int, length: int, q: Tensor) -> Tensor:
        """Additive bias, −inf where a key is blocked (padding, and the future if causal).

        Built from the same blocked mask as vanilla's, so padding and causal mean what they
        mean there. A tensor bias costs a c × L read per head, so padded runs give back
        part of what the kernel saves: this materialises (b, 1, c, L) in q's dtype and
        expands it, stride 0, over the heads (the xformers maintainers' advice,
        facebookresearch/xformers#854) rather than allocating (b, h, c, L). The kernel
        wants each bias row 16-byte aligned, so the last dim is allocated padded to a
        multiple of 8 and sliced back to L, as its error message's HINT says.
        """
        aligned = -(-length // 8) * 8
        bias = q.new_zeros(b, 1, c, aligned)[..., :length]  # (b, 1, c, L), rows 16-byte aligned
        bias.masked_fill_(blocked, float("-inf"))
        return bias.expand(b, self.n_heads, c, length)  # (b, h, c, L), a view
