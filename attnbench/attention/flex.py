"""PyTorch's FlexAttention (``torch.nn.attention.flex_attention``): the modern baseline.

FlexAttention computes softmax(QKᵀ/√d)V block by block, skipping the (query block, key
block) pairs its *block mask* says are empty and applying a ``mask_mod`` inside the pairs
only partly allowed. ``pattern``: ``full`` (every key; with ``causal=true`` the same as
``causal``), ``causal`` (j ≤ i) or ``window``, ``local``'s band with budget ``window`` = w
(the sweep's ``k``): |i − j| ≤ w/2 non-causal (w even), the w keys i − w < j ≤ i causal.

A block mask depends only on (n, pattern, window, causal, device): built once
(:meth:`FlexAttention.prepare`, timed apart: the runner records it as the mask build) and
shared by every layer and call. Key padding (True = padded) joins through the ``mask_mod``,
in a block mask with one batch entry per sequence made for that call (the masks, their
caches and the count of computed blocks: :mod:`attnbench.attention.block_masks`).
Grouped-query heads go to the kernel with ``enable_gqa=True``.

**It is only fast compiled, so it always compiles its kernel**: ``torch.compile(
flex_attention, dynamic=False)``, made once per process, whatever the cell's ``compile``
says (``info().compiles``); each new shape compiles on its first call (seconds on a CPU).
Uncompiled, PyTorch runs an unfused reference that materialises the n × n scores, which
attnbench never times. PyTorch 2.13's CPU kernel takes fp32, fp16 and bf16 only (float64 is
refused in one line, never run another way) and has no backward (``info().no_cpu_backward``:
training on a CPU is refused; on CUDA it trains like any mechanism). Below 64 positions
its compiled CPU kernel returned wrong rows, at times NaN, with heads of 8 or 16 (torch 2.13,
at n = 8, 24, 40, 56, from run to run): on a CPU such a sequence runs padded to 64 positions
(:data:`CPU_MIN_LEN`), the added keys masked, and only its own rows kept.

FLOPs are counted as the block-sparse kernel computes them (as tritonbench and attention-gym
count FlexAttention): every block pair the block mask computes, a partly masked pair at its
whole size (a sequence's last block only as long as the sequence), 4·d per query-key pair;
``dense_attention_flops`` keeps the dense count beside it. The count is arithmetic (no mask
built), so it holds on meta tensors too.

On meta tensors (the memory model) no block mask is built and the kernel does not run: the
fused kernel's allocations stand in through ``scaled_dot_product_attention`` on the same
q, k, v (its output; in a training step what the device's fused kernel saves, and its
backward), which the memory model already follows for ``sdpa``: a fused kernel that, like
FlexAttention, never makes the n × n scores. A padded or packed call's per-call block mask
(small: blocks, not pairs) is not modeled.

``gate`` is the output gate of :mod:`attnbench.attention.sinks_gate`. ``sinks=true``: the
kernel is asked for its rows' log-sum-exp L as well (``return_aux=AuxRequest(lse=True)``)
and its output is scaled by σ(L − s_h), which is the softmax with the sink in its
denominator exactly (:func:`~attnbench.attention.sinks_gate.lse_sink_scale`), with no
extra pass over the keys. Torch 2.13's compiled CPU kernel returns no log-sum-exp
("return_lse is not supported yet"), so a CPU cell of flex with sinks is refused
(:meth:`FlexAttention.refuses`); a layer called directly on a CPU then runs the unfused
eager ``flex_attention`` (n × n, never timed), so that its result is still right. On meta the
log-sum-exp is an fp32 (b, h, n) tensor beside the stand-in's output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from attnbench.attention import block_masks
from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.attention.block_masks import BLOCK, computed_blocks
from attnbench.attention.cache import kv_elements
from attnbench.attention.packing import Packing
from attnbench.attention.sinks_gate import SinksGateConfig, lse_sink_scale
from attnbench.validators import check_bool, check_choice, check_int

PATTERNS = ("full", "causal", "window")
NO_CPU_BACKWARD = "FlexAttention has no backward on CPU in torch 2.13"
RECOMPILE_LIMIT = 64  # compiled shapes per process (Dynamo's default is 8)
CPU_MIN_LEN = 64  # a shorter sequence runs on the CPU padded to this (FlexAttention.attend)

_kernel: Callable[..., Tensor] | None = None  # torch.compile(flex_attention), made on first use


def kernel() -> Callable[..., Tensor]:
    """The compiled kernel, one per process (each shape compiles once, on its first call)."""
    global _kernel
    if _kernel is None:
        _kernel = torch.compile(flex_attention, dynamic=False)
    return _kernel


def run_kernel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: BlockMask,
    scale: float,
    gqa: bool,
    sinks: Tensor | None = None,
) -> Tensor:
    """The compiled kernel on (b, h, n, dh) queries and (b, kv_heads, n, dh) keys and values;
    with ``sinks`` (h,), its output scaled by σ(lse − s_h) from the log-sum-exp it returns
    (:func:`~attnbench.attention.sinks_gate.lse_sink_scale`).

    Inside a region compiled around it (a cell with ``compile=true``) ``flex_attention`` is
    traced into that region's graph. Otherwise each new shape compiles once, and past
    Dynamo's recompile limit it would run the unfused eager ``flex_attention`` instead,
    silently (n × n scores: another figure), so the limit is raised for this call
    (:data:`RECOMPILE_LIMIT`) and hitting it is an error. Under a TorchDispatchMode on real
    tensors (FlopCounterMode, attnbench's memory tracker) Dynamo runs eager, which fails and
    leaves FlexAttention broken for the rest of the process: refused in one line first."""
    if torch.compiler.is_compiling():
        # traced into a layer compiled around it: Inductor's CPU flex template (torch 2.13)
        # reads each of q, k, v as a 4-D buffer of its own and fails on the views of the
        # projection's 2-D output that fusion hands it ("not enough values to unpack"), so
        # each is made a buffer first, as in an eager call
        q, k, v = (t.contiguous() for t in (q, k, v))
        return _with_sinks(flex_attention, q, k, v, mask, scale, gqa, sinks)
    if sinks is not None and q.device.type == "cpu":
        # the compiled CPU kernel returns no log-sum-exp (torch 2.13); a CPU cell with sinks
        # is refused (FlexAttention.refuses), a direct call gets the eager reference's answer
        return _with_sinks(flex_attention, q, k, v, mask, scale, gqa, sinks)
    if is_in_torch_dispatch_mode(include_infra_modes=False):
        raise RuntimeError(
            "flex: its compiled kernel cannot run under a TorchDispatchMode (a FLOP counter, "
            "the memory tracker) on real tensors; run it on meta tensors or use the profiler"
        )
    dynamo = torch._dynamo.config
    limits = dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit
    dynamo.recompile_limit = max(limits[0], RECOMPILE_LIMIT)
    dynamo.fail_on_recompile_limit_hit = True
    try:
        return _with_sinks(kernel(), q, k, v, mask, scale, gqa, sinks)
    finally:
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = limits


def _with_sinks(
    run: Callable[..., Any],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: BlockMask,
    scale: float,
    gqa: bool,
    sinks: Tensor | None,
) -> Tensor:
    """``run`` (flex_attention, compiled or not) on q, k, v; with ``sinks`` its log-sum-exp
    asked for too and the output scaled by σ(lse − s_h)."""
    if sinks is None:
        return run(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)
    out, aux = run(
        q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True)
    )
    return lse_sink_scale(out, aux.lse, sinks)


def _check_dtype(x: Tensor) -> None:
    """The CPU kernel's dtypes, refused in one line before anything runs."""
    if x.device.type == "cpu" and x.dtype == torch.float64:
        raise ValueError(
            "dtype: flex's compiled CPU kernel takes float32, float16 or bfloat16 "
            "(PyTorch 2.13), got float64"
        )


@dataclass
class FlexConfig(SinksGateConfig):
    pattern: str = "full"
    window: int = 256  # w, used by pattern=window: the same budget as local's
    causal: bool = False

    def __post_init__(self) -> None:
        check_choice("pattern", self.pattern, PATTERNS)
        check_int("window", self.window)
        check_bool("causal", self.causal)
        super().__post_init__()
        if self.pattern == "window" and not self.causal and self.window % 2:
            raise ValueError(
                f"window: must be even when pattern=window and causal=false (w/2 keys on each "
                f"side of a query, as local's), got {self.window}"
            )

    @property
    def is_causal(self) -> bool:
        """pattern=causal is full attention with causal=true."""
        return self.causal or self.pattern == "causal"

    def span(self) -> tuple[float, float]:
        """The allowed i − j, [lo, hi]: key j is seen by query i when lo ≤ i − j ≤ hi."""
        inf = float("inf")
        if self.pattern == "window":
            w = self.window
            return (0, w - 1) if self.is_causal else (-(w // 2), w // 2)
        return (0, inf) if self.is_causal else (-inf, inf)

    def key(self) -> tuple[str, int | None, bool]:
        """What a block mask depends on besides n and the device (window only for window)."""
        pattern = "window" if self.pattern == "window" else "full"
        return pattern, self.window if pattern == "window" else None, self.is_causal


@declare(
    "flex",
    config=FlexConfig,
    causal=True,
    budget="window",
    budget_when=("pattern", "window"),
    gqa=True,
    head_dim=True,
    compiles=True,
    no_cpu_backward=NO_CPU_BACKWARD,
    cannot_train=None,
    cannot_decode=(
        "has no incremental form here: a decode step is one query over a K/V cache, with no "
        "block sparsity to exploit (vanilla and sdpa serve it exactly)"
    ),
    summary="torch FlexAttention (compiled, block-sparse): pattern full|causal|window",
    packs="one kernel call over the row: a document block mask keeps the pattern inside each "
    "document and skips the blocks across two",
)
class FlexAttention(MultiHeadAttention):
    packs_in_one_pass = True  # one kernel call over the row, a document block mask

    def refuses(self, dtype: str, gpu: bool) -> str | None:
        """Sinks on a CPU: the compiled CPU kernel returns no log-sum-exp (torch 2.13)."""
        if self.sinks is not None and not gpu:
            return (
                "sinks: flex's compiled CPU kernel returns no log-sum-exp (torch 2.13), which "
                "its sinks are applied with; run it on CUDA, or use sinks=true with vanilla, "
                "sdpa or local"
            )
        return None

    def _meta_kernel(self, q: Tensor, k: Tensor, v: Tensor, gqa: bool) -> Tensor:
        """On meta, a fused kernel's allocations stand in (never n × n): its output, and with
        sinks the fp32 (b, h, n) log-sum-exp and the scaling by it."""
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.cfg.is_causal, enable_gqa=gqa)
        if self.sinks is None:
            return out
        lse = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
        return lse_sink_scale(out, lse, self.sinks)

    def prepare(self, n: int, device: torch.device | str) -> float:
        """Build and cache the block mask at length n (:func:`block_masks.prepare`): the
        seconds it took, 0.0 when it was cached already (by this layer or another) and on
        meta (where none is built)."""
        return block_masks.prepare(n, self.cfg, device)

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        _check_dtype(x)
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh); k, v (b, kv_heads, n, dh)
        gqa = self.kv_heads != self.n_heads
        if x.device.type == "meta":  # the fused kernel's allocations, never n × n
            return self.merge_heads(self._meta_kernel(q, k, v, gqa))
        n = x.shape[1]
        if x.device.type == "cpu" and n < CPU_MIN_LEN and not torch.compiler.is_compiling():
            # torch 2.13's compiled CPU kernel returns wrong rows, NaN at times, below 64
            # positions with heads of 8 or 16 (seen at n = 8, 24, 40, 56; never from 64 on):
            # it runs at 64, the added keys masked as padding, and the first n rows are kept
            grow = CPU_MIN_LEN - n
            q, k, v = (F.pad(t, (0, 0, 0, grow)) for t in (q, k, v))
            real = torch.zeros(x.shape[0], n, dtype=torch.bool, device=x.device)
            padding = real if key_padding_mask is None else key_padding_mask
            key_padding_mask = F.pad(padding, (0, grow), value=True)
        mask = block_masks.block_mask(q.shape[-2], self.cfg, x.device, key_padding_mask)
        out = run_kernel(q, k, v, mask, self.scale, gqa, self.sinks)[..., :n, :]
        return self.merge_heads(out)  # (b, n, d)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """One kernel call over the packed rows with a document mask: the pattern's band
        kept inside each document (:func:`block_masks.document_block_mask`), the blocks
        across two documents skipped. On meta, a fused kernel over the row stands in, as
        for :meth:`attend`; on a CPU a row shorter than :data:`CPU_MIN_LEN` is lengthened
        by a filler document and only its own rows kept."""
        _check_dtype(x)
        q, k, v = self.qkv_heads(x)
        gqa = self.kv_heads != self.n_heads
        if x.device.type == "meta":
            return self.merge_heads(self._meta_kernel(q, k, v, gqa))
        t, rows = x.shape[1], packing.rows
        if x.device.type == "cpu" and t < CPU_MIN_LEN and not torch.compiler.is_compiling():
            grow = CPU_MIN_LEN - t  # see attend: the CPU kernel's wrong rows below 64
            q, k, v = (F.pad(u, (0, 0, 0, grow)) for u in (q, k, v))
            rows = tuple((*row, grow) for row in rows)
        mask = block_masks.document_block_mask(rows, self.cfg, x.device)
        out = run_kernel(q, k, v, mask, self.scale, gqa, self.sinks)[..., :t, :]
        return self.merge_heads(out)

    def packed_attention_flops(self, packing: Packing) -> int:
        """QKᵀ and P·V over every block pair the document block mask computes, 4·d per
        query-key pair (:func:`block_masks.document_pairs`: the band's blocks that hold a
        common document)."""
        rows = Counter(packing.rows)
        pairs = sum(c * block_masks.document_pairs((row,), self.cfg) for row, c in rows.items())
        return 4 * pairs * self.width

    def packed_flops_backward(self, packing: Packing) -> int:
        """One pass over the row, backward as :meth:`flops_backward`: twice the forward and
        the block-sparse QKᵀ recomputed (a CUDA figure: no CPU backward)."""
        return 2 * self.packed_flops(packing) + self.packed_attention_flops(packing) // 2

    def context_elements(self, n: int) -> int:
        """Keys and values as the pattern keeps them: ``window`` min(w, n) of every key/value
        head (as ``local``'s: the non-causal band's w + 1 counted as w), ``full`` and ``causal``
        all n (the K/V cache at n)."""
        slots = min(self.cfg.window, n) if self.cfg.pattern == "window" else n
        return kv_elements(slots, self.kv_heads, self.head_dim)

    def attention_flops(self, b: int, n: int) -> int:
        """QKᵀ and P·V over every block pair the block mask computes (the kernel's count):
        each query against the keys of its block's computed key blocks, 4·d per pair."""
        rows = [min(n, (t + 1) * BLOCK) - t * BLOCK for t in range(-(-n // BLOCK))]
        pairs = sum(
            r * (last - first + 1)
            for r, (first, last) in zip(rows, computed_blocks(n, self.cfg), strict=True)
        )
        return 4 * b * pairs * self.width

    def recomputed_flops(self, b: int, n: int) -> int:
        """Its backward recomputes the block-sparse QKᵀ, as flash attention's does."""
        return self.attention_flops(b, n) // 2
