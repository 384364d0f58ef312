"""What a CUDA run allocates that the meta-device trace does not show, each cited to the
kernel or library that allocates it: for a replay of the caching allocator
(:mod:`attnbench.measure.allocator`) over the trace of a cell that runs on a GPU preset.

The memory model traces the step on ``meta`` tensors, where ``scaled_dot_product_attention``
stays one call (:data:`attnbench.measure.memory.KEEP_WHOLE`) and returns a contiguous
(b, h, n, dh) output: merging the heads then copies it. On CUDA the fused kernels write
their output as (b, n, h, dh) and hand back its transposed view, so the merge is a view, and
they allocate their own temporaries. A live-bytes model barely notices (one transient among
many); the allocator's reserved peak does, because each transient is one more block of a size
the next request may not reuse. :class:`CudaLayouts`, entered inside the tracker
(:func:`attnbench.measure.memory.traced`), replaces each such call on meta by the
allocations the CUDA kernel makes, in its order; :func:`persistent_workspaces` are the
blocks cuBLAS keeps from the first matmul on. The memory model
(:class:`attnbench.runner.memory_model.MemoryModel`) traces every GPU preset's step under both, for
the card the preset names (its ``compute_capability``), as ``scripts/allocator_check.py``
does for the H200 of the GPU check's rows. :class:`CudaBackwardTemporaries`, the one a
backward kernel makes that decides a training step's peak, is counted by every training step
modeled for a GPU preset (:class:`attnbench.workload.train.StepWork`); a CPU preset's figures
pass through none.

Sources (PyTorch, ``aten/src/ATen``):

* backend choice: ``native/transformers/cuda/sdp_utils.cpp`` (``priority_order``: cuDNN
  first on sm90 and sm100, ``check_prefer_cudnn_attention``, a mask taken; then flash where
  it can run: sm80 to sm121 (``check_flash_attention_hardware_support``), fp16/bf16, head
  dim ≤ 256, no ``attn_mask``; then memory-efficient, sm50 on, its head dim aligned
  (``minimum_gemm_alignment``): an older card such as the V100 (sm70) and a masked call
  before sm90; else math), each passed over where ``sdpa_kernel`` turned it off;
  ``native/transformers/attention.cpp`` (flash's ``pad_last_dim<8>`` of q, k, v;
  ``convert_boolean_attn_mask_cudnn``);
* cuDNN: ``native/cudnn/MHA.cpp`` (``run_cudnn_SDP_fprop``: ``o`` by
  ``alloc_with_matching_layout(q, …)``, q's (b, n, h, dh) memory order; ``softmaxstats``
  only when it returns them, for a backward: none in a forward);
* flash: ``native/transformers/cuda/flash_attn/flash_api.cpp`` (``mha_fwd``: ``out =
  at::empty_like(q)`` on q transposed to (b, n, h, dh), then ``softmax_lse`` fp32 (b, h, n));
  ``native/transformers/cuda/attention.cu`` (``_scaled_dot_product_flash_attention_cuda``
  returns ``out.transpose(1, 2)``); ``native/transformers/attention.cpp``
  (``scaled_dot_product_attention`` keeps element 0 of the result, so the log-sum-exp is
  freed when the call returns);
* memory-efficient: ``attention.cu`` (``_efficient_attention_forward``: ``res`` (b, n, h,
  dh), ``logsumexp`` fp32 (b, h, ⌈n / 32⌉·32) only when it computes one: for a backward),
  ``attention.cpp`` (``convert_boolean_attn_mask``: a boolean mask becomes ``where(
  mask.logical_not(), -inf, 0)`` in the query's dtype; ``preprocess_mask``/``pad_bias``: a
  bias whose strides are not multiples of 8 elements is copied into a padded one);
* cuBLAS: ``cuda/CublasHandlePool.cpp`` (``parseChosenWorkspaceSize``: 4096 KiB × 8 = 32 MiB
  on compute capability majors 9 to 12, ``4096 KiB × 2 + 16 KiB × 8`` before;
  ``parseCUDABlasLtWorkspaceSize``: 1024 KiB for cuBLASLt, which ``addmm``'s bias epilogue
  uses, its own allocation until ``unified_cublas_and_lt_workspaces`` (torch 2.12) made it
  cuBLAS's; from the caching allocator, ``getNewWorkspace``/``getNewCUDABlasLtWorkspace``,
  kept per handle and stream).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_MASK_ALIGN = 8  # attention.cpp preprocess_mask: mem_eff_alignment

# CublasHandlePool.cpp parseChosenWorkspaceSize / parseCUDABlasLtWorkspaceSize defaults
CUBLAS_WORKSPACE_LARGE = 4096 * 8 * 1024  # Hopper, Blackwell, Thor: major 9 to 12
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_WORKSPACE = 1024 * 1024
_UNIFIED_FROM = (2, 12)  # the cuBLASLt workspace is the cuBLAS one's (below)


def cublaslt_unified(version: str = torch.__version__) -> bool:
    """Whether cuBLASLt reuses cuBLAS's workspace rather than allocating its own 1 MiB:
    ``unified_cublas_and_lt_workspaces`` (CublasHandlePool.cpp), on by default in open-source
    builds, and ``getCUDABlasLtWorkspace`` returning the cuBLAS workspace of the handle and
    stream (torch 2.12 on; ``torch.backends.cuda.blas_workspace_size``'s note). Earlier
    releases allocated the two apart, as the GPU check's rows (torch 2.11) show to the byte.
    ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`` keeps them apart."""
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in ("0", "false"):
        return False
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    return (major, minor) >= _UNIFIED_FROM


def persistent_workspaces(
    capability: tuple[int, int], unified: bool | None = None
) -> tuple[int, ...]:
    """Bytes of the workspaces cuBLAS (and, where not ``unified``, cuBLASLt) take from the
    caching allocator at the first matmul and keep (one stream, one handle): allocated before
    any probe's step. ``unified`` None: as the torch installed here does it."""
    large = 9 <= capability[0] <= 12
    cublas = CUBLAS_WORKSPACE_LARGE if large else CUBLAS_WORKSPACE_OTHER
    unified = cublaslt_unified() if unified is None else unified
    return (cublas,) if unified else (cublas, CUBLASLT_WORKSPACE)


def _gemm_alignment(capability: tuple[int, int], half: bool) -> int:
    """``minimum_gemm_alignment`` (sdp_utils.cpp): the head dim's alignment the
    memory-efficient kernel needs, 8 for half precision on tensor cores, 4 (sm80 on) or 1
    for fp32."""
    align = 4 if capability[0] >= 8 else 1
    tensor_cores = capability[0] >= 8 or (capability[0] >= 7 and half)
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def _enabled(backend: str) -> bool:
    """Whether ``sdpa_kernel`` (or ``torch.backends.cuda.enable_*_sdp``) leaves a backend on,
    as ``select_sdp_backend`` asks before any other check (a pinned ``sdpa`` backend)."""
    cuda = torch.backends.cuda
    return {"cudnn": cuda.cudnn_sdp_enabled, "flash": cuda.flash_sdp_enabled,
            "efficient": cuda.mem_efficient_sdp_enabled}[backend]()  # fmt: skip


def sdpa_backend(capability: tuple[int, int], q: torch.Tensor, mask: Any) -> str:
    """The kernel ``select_sdp_backend`` (sdp_utils.cpp) runs for a forward on a card of
    ``capability``, in ``priority_order``: cuDNN first where it is preferred (sm90 and
    sm100, ``check_prefer_cudnn_attention``: fp16/bf16, a head dim ≤ 128 and a multiple of 8;
    a mask is taken), then flash (sm80 to sm121, ``check_flash_attention_hardware_support``:
    fp16/bf16, head dim ≤ 256, no mask), then memory-efficient (sm50 on; its head dim
    aligned, ``check_head_dim_size_mem_efficient``), else ``math``: the call as meta
    decomposes it. A backend turned off (``sdpa_kernel``) is passed over."""
    dh, half = q.shape[-1], q.dtype in _FLASH_DTYPES
    if capability in ((9, 0), (10, 0)) and half and dh <= 128 and dh % 8 == 0 and _enabled("cudnn"):
        return "cudnn"
    if (8, 0) <= capability <= (12, 1) and half and dh <= 256 and mask is None:
        if _enabled("flash"):
            return "flash"
    if dh % _gemm_alignment(capability, half) == 0 and _enabled("efficient"):
        return "efficient"
    return "math"


class CudaLayouts(TorchDispatchMode):
    """On meta, a forward's ``scaled_dot_product_attention`` as its CUDA kernel allocates on
    a card of ``capability`` (:func:`sdpa_backend`): a (b, n, h, dh) output handed back
    transposed, the kernel's own temporaries in its order. cuDNN's forward keeps no
    log-sum-exp; flash allocates one and drops it; memory-efficient computes none without a
    backward, but first makes a boolean mask an additive bias.

    Inference only: under autograd the call is decomposed before any mode sees it (meta
    then runs the memory-efficient kernel's meta function, which already writes the CUDA
    layout). Enter it inside the tracker, so that what it allocates is traced.
    """

    def __init__(self, capability: tuple[int, int]) -> None:
        super().__init__()
        self.capability = capability

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        q, _, v, *rest = args
        names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        mask = (dict(zip(names, rest, strict=False)) | kwargs).get("attn_mask")
        b, h, n, dv = *q.shape[:-1], v.shape[-1]
        backend = sdpa_backend(self.capability, q, mask)
        if backend == "math":  # no fused kernel takes it: the call as meta runs it
            return func(*args, **kwargs)
        if backend == "flash":
            dh = q.shape[-1]
            if dh % 8:  # attention.cpp pad_last_dim<8>: q, k and v copied, padded
                padded = [t.new_empty((*t.shape[:-1], -(-dh // 8) * 8)) for t in args[:3]]
                del padded  # freed when the call returns, the output sliced back (a view)
            out = q.new_empty((b, n, h, dv))  # flash's mha_fwd: empty_like(q) as (b, n, h, d)
            lse = q.new_empty((b, h, n), dtype=torch.float32)  # softmax_lse, always
            del lse  # dropped by scaled_dot_product_attention with the rest of the tuple
            return out.transpose(1, 2)
        if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask(_cudnn)
            inverted = mask.logical_not()
            if backend == "cudnn":  # where(…, -65504, a host scalar 0): its output alone
                mask = torch.empty_like(inverted, dtype=q.dtype)
            else:
                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                mask = torch.where(inverted, -math.inf, zero)
            del inverted
        if backend == "efficient" and mask is not None:
            if any(s % _MASK_ALIGN for s in mask.stride()[:-1] if s):
                padded = -(-mask.shape[-1] // _MASK_ALIGN) * _MASK_ALIGN  # pad_bias
                mask = mask.new_empty((*mask.shape[:-1], padded))[..., : mask.shape[-1]]
        out = q.new_empty((b, n, h, dv))  # cuDNN: o as q's layout; efficient: res
        if backend == "efficient" and q.dtype in _FLASH_DTYPES and dv > 128:
            # kNeedsOutputAccumulatorBuffer: a head dim past one pass accumulates in fp32
            accum = q.new_empty((b, n, h, dv), dtype=torch.float32)
            del accum
        del mask  # the converted or padded bias lives as long as the call
        return out.transpose(1, 2)


_SOFTMAX_BACKWARD = torch.ops.aten._softmax_backward_data.default


class CudaBackwardTemporaries(TorchDispatchMode):
    """On meta, the temporaries a CUDA backward kernel allocates and frees inside one op,
    which the op's meta kernel does not: entered *inside* a :class:`MemoryTracker`, so that
    what it allocates is counted, by a training step that models a GPU.

    Why it matters: CUDA's softmax backward (``softmax_backward_cuda_out`` in
    ``aten/src/ATen/native/cuda/SoftMax.cu``) first computes ``tmp = grad * output``, a whole
    tensor of the gradient's size, then hands it to ``host_softmax_backward``, which also
    takes ``output_.contiguous()``. Under fp16 autocast the gradient is fp32, so a vanilla
    layer's backward holds one more fp32 (b, h, n, n) block than its meta kernel shows,
    beside the saved probabilities and the gradient: with checkpointing that block is a
    fifth of the step's peak (an H200 row of n = 1024: 58 sequences fit, 87 modeled). The
    CPU's kernel (``softmax_backward_cpu_out`` in ``aten/src/ATen/native/SoftMax.cpp``)
    makes no such product, which is why the CPU profiler agrees with the model there.

    The kernel's order is kept: the gradient's output (allocated before the kernel body
    runs, as a structured kernel's is), then ``tmp``, then the contiguous copy of
    ``output`` where it is not contiguous; the two go when the op returns.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # through the tracker below: the op's own output
        if func is _SOFTMAX_BACKWARD:
            grad, output = args[0], args[1]
            shape = torch.broadcast_shapes(grad.shape, output.shape)
            product = grad.new_empty(shape, dtype=torch.result_type(grad, output))
            copy = output if output.is_contiguous() else output.contiguous()
            del product, copy
        return out
