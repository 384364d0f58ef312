"""xFormers' ``memory_efficient_attention``: exact softmax attention in O(n) memory.

The kernel of Rabe & Staats, "Self-attention does not need O(n²) memory" (2021): softmax(QKᵀ/√d)V
computed block by block, so the (b, h, n, n) scores never exist. It is exact, so it is tested
against ``vanilla`` and measures what a fused kernel saves without approximating anything.

xformers is an optional extra and has no CPU kernels, so this module imports it only inside
:meth:`XFormersAttention.attend`: importing attnbench must work, silently, without it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.attention.base import MultiHeadAttention, blocked_keys
from attnbench.registry import register
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


@register(
    "xformers",
    config=XFormersConfig,
    causal=True,
    devices=("cuda",),
    dtypes=("fp16", "bf16"),
    why_unavailable=why_unavailable,
    summary="xformers memory_efficient_attention: exact, O(n) memory (CUDA only)",
)
class XFormersAttention(MultiHeadAttention):
    def recomputed_flops(self, b: int, n: int) -> int:
        """Memory-efficient attention keeps no scores: its backward recomputes QKᵀ."""
        return self.attention_flops(b, n) // 2

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        # one line rather than xformers' page-long NotImplementedError
        if x.device.type != "cuda":
            raise RuntimeError(why_unavailable() or f"xformers has no kernels for {x.device.type}")
        try:
            import xformers.ops as xops  # a dict lookup once imported: cheap on the timed path
        except ImportError:
            raise RuntimeError(NOT_INSTALLED) from None

        b, n, _ = x.shape
        h, dh = self.n_heads, self.head_dim
        # xformers' layout is BMHK, so the projections need only a view, no transpose
        q = self.q_proj(x).view(b, n, h, dh)  # (b, n, h, dh)
        k = self.k_proj(x).view(b, n, h, dh)  # (b, n, h, dh)
        v = self.v_proj(x).view(b, n, h, dh)  # (b, n, h, dh)
        bias = None
        if key_padding_mask is not None:
            bias = self._padding_bias(key_padding_mask, q)  # (b, h, n, n)
        elif self.cfg.causal:
            bias = xops.LowerTriangularMask()  # never materialised
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=self.scale)
        return out.reshape(b, n, self.d_model)  # (b, n, h*dh)

    def _padding_bias(self, key_padding_mask: Tensor, q: Tensor) -> Tensor:
        """Additive bias, −inf where a key is blocked (padding, and the future if causal).

        Built from :func:`blocked_keys` so padding and causal mean what they mean for vanilla.
        A tensor bias costs an n × n read per head, so padded runs give back part of what the
        kernel saves: this materialises (b, 1, n, n) in q's dtype and expands it, stride 0,
        over the heads (the xformers maintainers' advice, facebookresearch/xformers#854) rather
        than allocating (b, h, n, n). The kernel wants each bias row 16-byte aligned, so the
        last dim is allocated padded to a multiple of 8 and sliced back to n, as its error
        message's HINT says.
        """
        b, n, h, _ = q.shape  # (b, n, h, dh)
        blocked = blocked_keys(key_padding_mask, self.cfg.causal, n, q.device)  # (b, 1, 1|n, n)
        n_aligned = -(-n // 8) * 8
        bias = q.new_zeros(b, 1, n, n_aligned)[..., :n]  # (b, 1, n, n), rows 16-byte aligned
        bias.masked_fill_(blocked, float("-inf"))
        return bias.expand(b, h, n, n)  # (b, h, n, n), a view
