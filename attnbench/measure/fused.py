"""The fused attention kernel a device would run, for a training step on meta tensors.

With autograd on, ``scaled_dot_product_attention`` is decomposed above the memory tracker
into the kernel its backend choice picks; on meta tensors that choice is the math path,
which saves the whole n × n attention matrix for the backward — memory no CPU or GPU run
of a fused kernel spends (an sdpa layer's modeled training peak came out 17–33 % high
against the CPU profiler). Inside :func:`device_kernels` the memory model calls the fused
kernel directly, as the device would, and autograd saves what that kernel saves (its output
and per-row logsumexp):

* ``cpu``: ``_scaled_dot_product_flash_attention_for_cpu``, what sdpa runs on a CPU;
* ``cuda``: ``_scaled_dot_product_efficient_attention``, which every CUDA GPU has (the
  V100's only fused kernel; FlashAttention on sm80+ saves the same output and logsumexp).
  A fused backward's workspace is allocated inside one op, which no meta kernel reports:
  the GPU probes see it (memory.py, "What it cannot see").

Only inputs the device's kernel takes are rewritten (no dropout; a boolean mask becomes the
additive bias the real dispatcher makes of it); anything else runs as it would.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_aten = torch.ops.aten


class device_kernels(TorchFunctionMode):
    """``with device_kernels("cuda"):`` sdpa on meta runs the fused kernel of that device."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type: must be cpu or cuda, got {device_type!r}")
        self.device_type = device_type

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and torch.is_grad_enabled():
            fused = self._fused(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)

    def _fused(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor | None:
        if dropout_p or q.device.type != "meta":
            return None
        if enable_gqa and k.shape[1] != q.shape[1] and self.device_type == "cuda":
            # grouped-query heads: the CPU's flash kernel takes them as they are; on CUDA K
            # and V are repeated to every query head, as sdpa does for a kernel without
            # native groups (the memory efficient one): an upper bound where the kernel has
            # them (flash on sm80+)
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        if self.device_type == "cpu":
            out, _ = _aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale
            )
            return out
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:  # as sdpa converts a boolean mask
            bias = torch.zeros_like(bias, dtype=q.dtype).masked_fill(~bias, float("-inf"))
        out, *_ = _aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.0, is_causal, scale=scale
        )
        return out
