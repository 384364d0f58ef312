"""FLOPs of a forward, counted by ``torch.utils.flop_counter.FlopCounterMode``.

PyTorch's counter has formulas for the CUDA SDPA kernels but not for the CPU flash kernel
that ``scaled_dot_product_attention`` dispatches to on CPU, so a CPU count would silently
miss all of sdpa's attention (and Linformer's inner softmax). We give the CPU op the same
formula as its CUDA twin: 4·b·h·n_q·n_k·d, two matmuls of 2·n_q·n_k·d each; its backward
the CUDA flash backward's (which recomputes the scores: 5 such matmuls, not 4).

Its convolution backward counts the weight gradient as a dense convolution over every
(input, output) channel pair, ignoring ``groups``: for a depthwise convolution (Nyströmformer's
residual on V, Linformer's ``projection=conv`` per head) that is d times the work done. Each
gradient of a convolution costs what its forward does, so we count that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter

_aten = torch.ops.aten
_TWINS = {  # op the counter misses -> op with the same signature head and the right formula
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": (
        "_scaled_dot_product_flash_attention_backward"
    ),
}
for _op, _twin in _TWINS.items():
    if hasattr(_aten, _op) and getattr(_aten, _op) not in flop_counter.flop_registry:
        flop_counter.flop_registry[getattr(_aten, _op)] = flop_counter.flop_registry[
            getattr(_aten, _twin)
        ]


def _conv_backward_flops(
    grad_out_shape: Any, x_shape: Any, w_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """Input and weight gradients (as ``output_mask`` asks), each costing the forward:
    2 · batch · output positions · weight size (the weight is already per group)."""
    forward = 2 * grad_out_shape[0] * math.prod(grad_out_shape[2:]) * math.prod(w_shape)
    output_mask = args[7]  # convolution_backward(..., transposed, output_padding, groups, mask)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


flop_counter.flop_registry[_aten.convolution_backward] = flop_counter.shape_wrapper(
    _conv_backward_flops
)


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Total FLOPs (multiply and add counted separately) of ``fn(*args, **kwargs)``."""
    with flop_counter.FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()
