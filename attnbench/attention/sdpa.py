"""PyTorch's fused ``scaled_dot_product_attention``, with the kernel choosable.

``backend=auto`` lets PyTorch pick; naming one (math, flash, efficient, cudnn) pins it, so a
sweep can compare kernels. A backend that cannot serve the input raises one clear error rather
than PyTorch's page of warnings.

Grouped-query heads (``kv_heads``) go to the kernel as they are, with ``enable_gqa=True``
(what each backend then does with them is its own: ``docs/serving.md`` measures it against
repeating K and V first). Its incremental form keeps a preallocated K/V cache
(:class:`attnbench.attention.cache.KVCache`) and runs the same kernel over it.

``gate`` is the output gate (:mod:`attnbench.attention.sinks_gate`). ``sinks=true``: no
kernel of ``scaled_dot_product_attention`` takes a sink logit (nor returns the log-sum-exp
it could be applied with), so the layer then runs its math: vanilla's eager softmax with the
sink in the denominator (:func:`attnbench.attention.vanilla.softmax_attend`), for every form
(forward, packed, decode), and a backend other than auto or math is refused with it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.attention.base import declare
from attnbench.attention.cache import CachedAttention, KVCache, grouped, ungrouped
from attnbench.attention.masks import blocked_keys
from attnbench.attention.packing import Packing, per_document
from attnbench.attention.sinks_gate import SinksGateConfig
from attnbench.attention.vanilla import softmax_attend
from attnbench.validators import check_bool, check_choice

BACKENDS = {
    "auto": None,
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@dataclass
class SDPAConfig(SinksGateConfig):
    causal: bool = False
    backend: str = "auto"

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        check_choice("backend", self.backend, list(BACKENDS))
        super().__post_init__()
        if self.sinks and self.backend not in ("auto", "math"):
            raise ValueError(
                f"backend: no sdpa kernel takes a sink, so sinks=true runs its math "
                f"(backend=auto or math); got backend={self.backend}"
            )


@declare(
    "sdpa",
    packs="one pass of projections, then each document's block through the kernel",
    config=SDPAConfig,
    causal=True,
    gqa=True,
    head_dim=True,
    cannot_decode=None,
    summary="torch scaled_dot_product_attention; backend auto|math|flash|efficient|cudnn",
)
class SDPAAttention(CachedAttention):
    def recomputed_flops(self, b: int, n: int) -> int:
        """The fused kernels' backward recomputes QKᵀ; the math backend (and the eager math
        that sinks run) keeps P and does not."""
        if self.cfg.backend == "math" or self.sinks is not None:
            return 0
        return self.attention_flops(b, n) // 2

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh); k, v (b, kv_heads, n, dh)
        causal = self.cfg.causal
        allowed = None
        if key_padding_mask is not None:  # a plain is_causal keeps the flash kernel eligible
            allowed = ~blocked_keys(key_padding_mask, causal, x.shape[1], x.device)
            causal = False
        return self.merge_heads(self._sdpa(q, k, v, allowed, causal))  # (b, n, d)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """The projections over the packed rows at once, then each document's block through
        the kernel (``is_causal`` kept, so the flash kernel stays eligible). Nested jagged
        tensors would make it one call, but torch 2.13 has no causal kernel for them on a
        CPU."""
        q, k, v = self.qkv_heads(x)

        def alone(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return self._sdpa(q, k, v, None, self.cfg.causal)

        return self.merge_heads(per_document(alone, packing, q, k, v))

    def extend_attend(self, x: Tensor, state: KVCache, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, c, dh); k, v (b, kv_heads, c, dh)
        first = state.length == 0
        keys, values = state.append(k, v, key_padding_mask)  # (b, kv_heads, L, dh)
        c = x.shape[1]
        if self.sinks is not None:
            return self.merge_heads(
                self._with_sinks(q, keys, values, state.blocked(c), state.has_padding)
            )
        if first and not state.has_padding:  # a whole prompt: is_causal keeps flash eligible
            return self.merge_heads(self._sdpa(q, keys, values, None, c > 1))
        blocked = state.blocked(c)  # None for one token without padding
        bias = None
        if blocked is not None:  # additive, made here: sdpa would convert a boolean mask
            # inside the kernel call, an allocation the memory model (which keeps sdpa
            # whole) cannot see; made here, both it and the profiler count it
            bias = torch.zeros(blocked.shape, dtype=q.dtype, device=q.device)
            bias.masked_fill_(blocked, float("-inf"))
        return self.merge_heads(self._sdpa(q, keys, values, bias, False))  # (b, c, d)

    def _with_sinks(
        self, q: Tensor, k: Tensor, v: Tensor, blocked: Tensor | None, padded: bool
    ) -> Tensor:
        """The math with sinks (no kernel takes them): vanilla's eager softmax, grouped
        query heads stacked as vanilla stacks them, ``blocked`` True where a query may not
        see a key, ``padded`` where a query may see none."""
        out = softmax_attend(
            grouped(q, self.kv_heads), k, v, blocked, self.scale, padded, self.sinks
        )
        return ungrouped(out, self.n_heads)

    def _sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, causal: bool
    ) -> Tensor:
        """The kernel on (b, h, ·, dh) queries and (b, kv_heads, ·, dh) keys and values,
        the backend pinned if the config names one; the error of a backend that cannot
        serve the input is one line. With sinks, their math (:meth:`_with_sinks`) with
        the same mask (``allowed`` True where a query may see a key, ``causal`` j ≤ i)."""
        if self.sinks is not None:
            blocked = None if allowed is None else ~allowed
            if causal:
                n = q.shape[-2]
                blocked = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            return self._with_sinks(q, k, v, blocked, allowed is not None)
        gqa = {"enable_gqa": True} if self.kv_heads != self.n_heads else {}
        backend = BACKENDS[self.cfg.backend]
        ctx = contextlib.nullcontext() if backend is None else sdpa_kernel(backend)
        try:
            with ctx:
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, is_causal=causal, **gqa
                )
        except RuntimeError as e:
            if "No viable backend" not in str(e):
                raise
            raise RuntimeError(
                f"sdpa: backend={self.cfg.backend} cannot run {q.dtype} on {q.device.type} "
                f"with this input; try backend=auto or math"
            ) from None
