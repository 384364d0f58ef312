"""The CUDA allocations a GPU preset's memory model traces (attnbench/measure/cuda_layouts.py):
which SDPA kernel a card runs, what each allocates, and cuBLAS's workspaces, each against
the rule of the PyTorch source it cites. The whole replay is held to a real card's rows in
``test_allocator_check.py``; here each rule alone, on meta tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.measure.cuda_layouts import (
    CudaLayouts,
    cublaslt_unified,
    persistent_workspaces,
    sdpa_backend,
)
from attnbench.measure.memory import traced

V100, A100, H100, B200, RTX = (7, 0), (8, 0), (9, 0), (10, 0), (12, 0)
HALF, FP32 = torch.float16, torch.float32


def _q(dh: int = 64, dtype: torch.dtype = HALF) -> torch.Tensor:
    return torch.empty(2, 3, 16, dh, device="meta", dtype=dtype)


@pytest.mark.parametrize(
    ("capability", "dtype", "dh", "masked", "backend"),
    [
        (V100, HALF, 64, False, "efficient"),  # no flash before sm80, no cuDNN preference
        (V100, HALF, 60, False, "math"),  # fp16 on tensor cores: head dim aligned to 8
        (V100, FP32, 60, False, "efficient"),  # fp32 on sm70: any head dim
        (A100, HALF, 64, False, "flash"),
        (A100, HALF, 64, True, "efficient"),  # flash takes no mask
        (A100, FP32, 64, False, "efficient"),  # flash is fp16/bf16 only
        (A100, FP32, 62, False, "math"),  # fp32 on sm80: aligned to 4
        (A100, HALF, 60, False, "flash"),  # flash pads a head dim that is not a multiple of 8
        (H100, HALF, 64, False, "cudnn"),
        (H100, HALF, 64, True, "cudnn"),  # cuDNN takes a mask
        (H100, HALF, 256, False, "flash"),  # past cuDNN's 128, within flash's 256
        (B200, HALF, 64, False, "cudnn"),
        (RTX, HALF, 64, False, "flash"),  # sm120: flash, no cuDNN preference
    ],
)
def test_the_kernel_each_card_runs(capability, dtype, dh, masked, backend) -> None:
    mask = torch.ones(2, 1, 16, 16, device="meta", dtype=torch.bool) if masked else None
    assert sdpa_backend(capability, _q(dh, dtype), mask) == backend


def test_a_pinned_backend_is_the_one_traced() -> None:
    """``sdpa_kernel`` turns the others off, as ``select_sdp_backend`` reads them first."""
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_backend(H100, _q(), None) == "math"
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert sdpa_backend(A100, _q(), None) == "efficient"


def test_what_each_kernel_allocates() -> None:
    b, h, n, dh = 2, 3, 16, 64
    q = _q()
    out, lse = b * n * h * dh * 2, b * h * n * 4
    mask = torch.ones(b, 1, n, n, device="meta", dtype=torch.bool)

    def run(capability, *, mask=None, dh_q=None) -> list:
        x = q if dh_q is None else _q(dh_q)

        def step() -> torch.Tensor:
            with CudaLayouts(capability):
                return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)

        with torch.inference_mode():
            return [e[2] for e in traced(step) if e[0] == "alloc"]

    assert run(A100) == [out, lse]  # flash: the output, its log-sum-exp dropped
    assert run(H100) == [out]  # cuDNN: the output alone
    # cuDNN's mask: logical_not, then where over two host scalars: no device scalars
    assert run(H100, mask=mask) == [b * n * n, b * n * n * 2, out]
    # flash pads q, k and v of head dim 60 to 64 (three copies), then its output
    padded = b * h * n * 64 * 2
    assert run(A100, dh_q=60) == [padded] * 3 + [b * n * h * 60 * 2, b * h * n * 4]
    # memory-efficient past one pass's head dim: an fp32 accumulator beside the output
    wide = b * n * h * 256
    assert run(V100, dh_q=256) == [wide * 2, wide * 4]
    # fp16 of an unaligned head dim on a V100: no fused kernel, the call as meta runs it
    x = _q(60)
    with torch.inference_mode():
        plain = traced(lambda: F.scaled_dot_product_attention(x, x, x))
    assert run(V100, dh_q=60) == [e[2] for e in plain if e[0] == "alloc"]


def test_cublas_workspaces_per_card_and_torch_version(monkeypatch) -> None:
    """``parseChosenWorkspaceSize``: 32 MiB on majors 9 to 12, 8 MiB + 128 KiB before;
    cuBLASLt's 1 MiB its own until torch 2.12 unified the two, unless the variable says no."""
    assert persistent_workspaces(H100, unified=True) == (32 << 20,)
    assert persistent_workspaces(V100, unified=False) == ((8 << 20) + (128 << 10), 1 << 20)
    assert persistent_workspaces(RTX, unified=True) == (32 << 20,)
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    assert cublaslt_unified("2.13.0+cpu") and cublaslt_unified("2.12.1")
    assert not cublaslt_unified("2.11.0+cu130") and not cublaslt_unified("1.13.1")
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    assert not cublaslt_unified("2.13.0")
