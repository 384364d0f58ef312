"""PyTorch's fused ``scaled_dot_product_attention``, with the kernel choosable.

``backend=auto`` lets PyTorch pick; naming one (math, flash, efficient, cudnn) pins it, so a
sweep can compare kernels. A backend that cannot serve the input raises one clear error rather
than PyTorch's page of warnings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.attention.base import MultiHeadAttention, blocked_keys
from attnbench.registry import register
from attnbench.validators import check_bool, check_choice

BACKENDS = {
    "auto": None,
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@dataclass
class SDPAConfig:
    causal: bool = False
    backend: str = "auto"

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        check_choice("backend", self.backend, list(BACKENDS))


@register(
    "sdpa",
    config=SDPAConfig,
    causal=True,
    summary="torch scaled_dot_product_attention; backend auto|math|flash|efficient|cudnn",
)
class SDPAAttention(MultiHeadAttention):
    def recomputed_flops(self, b: int, n: int) -> int:
        """The fused kernels' backward recomputes QKᵀ; the math backend keeps P and does not."""
        return 0 if self.cfg.backend == "math" else self.attention_flops(b, n) // 2

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh)
        causal = self.cfg.causal
        allowed = None
        if key_padding_mask is not None:  # a plain is_causal keeps the flash kernel eligible
            allowed = ~blocked_keys(key_padding_mask, causal, x.shape[1], x.device)
            causal = False
        backend = BACKENDS[self.cfg.backend]
        ctx = contextlib.nullcontext() if backend is None else sdpa_kernel(backend)
        try:
            with ctx:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal)
        except RuntimeError as e:
            if "No viable backend" not in str(e):
                raise
            raise RuntimeError(
                f"sdpa: backend={self.cfg.backend} cannot run {q.dtype} on {q.device.type} "
                f"with this input; try backend=auto or math"
            ) from None
        return self.merge_heads(out)  # (b, n, d)
