"""Peak memory of one forward: measured on CUDA, modeled anywhere.

The model runs the very same forward on ``meta`` tensors (shapes, no data) under a
``TorchDispatchMode`` that tracks the bytes of every live storage an op creates, each rounded
as PyTorch's CUDA caching allocator rounds a request (up to a multiple of 512 bytes). Its
peak, plus the weights, the input and the device preset's fixed overhead (CUDA context),
approximates ``torch.cuda.max_memory_allocated`` plus that overhead, without a GPU and in
well under a second. Run on real CPU tensors, the same tracker gives a CPU peak to check the
model against, and enforces an artificial ceiling by raising ``torch.OutOfMemoryError``.

Composite ops (``matmul``, ``linear``, ``layer_norm``, ``einsum`` …) are decomposed into
the ops they run, so a copy made and freed inside one is counted: under
``inference_mode`` they would otherwise arrive whole, and ``matmul`` at b ≥ 2 hides a
contiguous copy of a non-contiguous operand (4–5 % of a vanilla layer's peak).
``scaled_dot_product_attention`` stays whole: decomposed on meta it would take the math
path and count the n × n matrix that the fused kernels never make.

What it cannot see:
* memory allocated and freed inside one primitive op, e.g. cuBLAS workspaces or a fused
  kernel's per-row logsumexp; a training step that models a GPU adds the one that decides
  a peak, CUDA's softmax backward's gradient-sized product
  (:class:`attnbench.measure.cuda_layouts.CudaBackwardTemporaries`);
* the allocator's block sizes beyond the 512-byte rounding (a large block whose remainder is
  at most 1 MiB is not split) and fragmentation of its segments: :func:`traced` records the
  calls for :mod:`attnbench.measure.allocator` to replay them;
* what a GPU probe actually tests: ``set_per_process_memory_fraction`` limits *reserved*
  memory (whole segments, cached blocks included), so a real "fits" can be stricter than the
  modeled allocated peak. Real probes correct for all of these, and the row records how far
  the model was off (:mod:`attnbench.runner`).
"""

from __future__ import annotations

import functools
import gc
import itertools
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnbench.attention.base import indexed_device

ALLOC_ROUND = 512  # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, every block's granule

# one call the CUDA caching allocator would see: ("alloc", id, bytes requested) or ("free", id)
Event = tuple[str, int] | tuple[str, int, int]


# composite ops the tracker leaves whole (see the module docstring); every other one that
# has a CompositeImplicitAutograd decomposition is decomposed
KEEP_WHOLE = {torch.ops.aten.scaled_dot_product_attention}
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd


@functools.cache
def _decomposable(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` runs as a C++ composite of other ops (matmul, linear, layer_norm …).

    The C++ kernel is called directly, not ``func.decompose()``: that prefers a Python
    decomposition where one is registered (``matmul`` has one), which is 3× slower on meta and
    is not the code a CPU or GPU runs.
    """
    return func.overloadpacket not in KEEP_WHOLE and torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), _CIA
    )


def rounded(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``nbytes``."""
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND if nbytes else 0


class MemoryTracker(TorchDispatchMode):
    """Tracks live bytes of storages created while active; optionally enforces a ceiling.

    ``base`` counts what exists before the forward (weights, input). A storage is counted
    from the op that creates it until it is freed (a weakref finalizer on the storage), so
    the peak is the high-water mark of live bytes, as the allocator's own stat is.
    """

    def __init__(
        self, base: int = 0, ceiling: int | None = None, trace: list[Event] | None = None
    ) -> None:
        super().__init__()
        self.base = base
        self.live = base
        self.peak = base
        self.ceiling = ceiling
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # opt-in record of the allocator's calls (:func:`traced`); ids continue from the
        # events already there, so a trace that opens with the base's allocations stays unique
        self.trace = trace
        self._ids = itertools.count(len(trace)) if trace is not None else None

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def _free_traced(self, nbytes: int, ident: int) -> None:
        self.live -= nbytes
        self.trace.append(("free", ident))  # type: ignore[union-attr]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _decomposable(func):
            with self:  # the parts come back through this mode, each counted
                return func._op_dk(_CIA, *args, **kwargs)
        out = func(*args, **kwargs)
        inputs = {
            id(t.untyped_storage())
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            # a view or in-place result of an input (the weights and the model's input too,
            # which existed before the tracker), or of a storage already counted: nothing new
            if id(storage) in inputs or storage in self._seen:
                continue
            nbytes = rounded(storage.nbytes())
            self._seen[storage] = nbytes
            if self._ids is None or not nbytes:  # no trace, or nothing the allocator sees
                weakref.finalize(storage, self._free, nbytes)
            else:  # the request unrounded: the replay rounds as the allocator does
                ident = next(self._ids)
                self.trace.append(("alloc", ident, storage.nbytes()))  # type: ignore[union-attr]
                weakref.finalize(storage, self._free_traced, nbytes, ident)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            if self.ceiling is not None and self.live > self.ceiling:
                raise torch.OutOfMemoryError(
                    f"attnbench tracker: {self.live} bytes live exceed the ceiling of "
                    f"{self.ceiling} bytes"
                )
        return out


def module_bytes(module: nn.Module) -> int:
    """Weights and buffers as the allocator holds them (shared tensors once)."""
    storages = {
        id(t.untyped_storage()): t.untyped_storage()
        for t in (*module.parameters(), *module.buffers())
    }
    return sum(rounded(s.nbytes()) for s in storages.values())


@dataclass(frozen=True)
class Peak:
    """Peak bytes of one forward; ``source`` is ``modeled`` (meta), ``tracked`` (real tensors
    under the tracker) or ``measured`` (CUDA allocator statistics)."""

    bytes: int
    source: str
    reserved: int | None = None


def tracked_peak(
    forward: Callable[[], Any], base: int, ceiling: int | None = None, *, grad: bool = False
) -> int:
    """Peak live bytes of ``forward()`` under the tracker, counting ``base`` as already live.

    ``grad=False`` runs it under ``inference_mode`` (a forward); ``grad=True`` with autograd
    (a training step: autograd runs on meta tensors too, and its saved activations and
    gradients are storages like any other). Raises ``torch.OutOfMemoryError`` past
    ``ceiling``. Whatever the forward left behind is released before returning or raising,
    so a failed probe leaves no memory behind.
    """
    tracker = MemoryTracker(base=base, ceiling=ceiling)
    try:
        with _no_grad_unless(grad), tracker:
            out = forward()
        del out
        return tracker.peak
    except BaseException:
        gc.collect()  # the traceback's frames hold the forward's tensors: free them now
        raise


def traced(
    forward: Callable[[], Any], base_sizes: Sequence[int] = (), *, grad: bool = False
) -> list[Event]:
    """The allocator's calls of one modeled ``forward()``, in order: what
    :mod:`attnbench.measure.allocator` replays to see fragmentation, which live bytes alone
    cannot show.

    ``base_sizes`` (bytes of the weights, the input, anything live before the forward) open
    the trace as allocations never freed, ids 0, 1, …; the forward's own follow, as the same
    tracker that :func:`tracked_peak` runs records them (so the running sum of their rounded
    sizes peaks at its figure). The output's frees come last, after ``forward`` returns.
    ``grad`` as in :func:`tracked_peak`.
    """
    events: list[Event] = [("alloc", i, n) for i, n in enumerate(base_sizes)]
    base = sum(rounded(n) for n in base_sizes)
    tracker = MemoryTracker(base=base, trace=events)
    try:
        with _no_grad_unless(grad), tracker:
            out = forward()
        del out
        return events
    except BaseException:
        gc.collect()  # the traceback's frames hold the forward's tensors: free them now
        raise


def profiled_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes that ``fn()`` allocates on the CPU above what was live before it, from the
    CPU profiler's allocation events — an instrument independent of the tracker.

    The tracker and the model share one blind spot by construction (what an op allocates
    and frees inside itself); the profiler sees every allocation c10's CPU allocator makes,
    so tests hold the model against it. Each event is rounded as the tracker rounds
    (:func:`rounded`), so the two count the same granules.
    """
    from torch.profiler import ProfilerActivity, profile

    # kineto (torch 2.13) prints two "USDT: ... profiler_start/stop" lines on stderr per use,
    # hundreds in a sweep's log. Level 6 (above USDT = 5, ERROR = 4) quiets them, and kineto's
    # own error lines with them: this profiler only counts CPU allocations, and a failure
    # still raises. Kineto reads the variable at its first use in the process, so it works
    # where attnbench profiles first (every attnbench command). A user's own setting wins
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        nbytes = e.nbytes()
        live += rounded(nbytes) if nbytes > 0 else -rounded(-nbytes)
        peak = max(peak, live)
    return peak


def _no_grad_unless(grad: bool) -> AbstractContextManager[Any]:
    """A forward runs under ``inference_mode``; a training step needs autograd."""
    return nullcontext() if grad else torch.inference_mode()


@contextmanager
def _cuda_ceiling(ceiling: int | None, device: torch.device) -> Iterator[None]:
    """Cap this process's CUDA memory at ``ceiling`` bytes, restoring the cap afterwards."""
    if ceiling is None:
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, ceiling / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def measured_peak_cuda(
    forward: Callable[[], Any],
    device: torch.device,
    ceiling: int | None = None,
    *,
    grad: bool = False,
) -> Peak:
    """Peak allocated and reserved bytes of one real CUDA forward, stats reset before it.

    Includes what already lives on the device (weights, input), as a user's OOM does.
    """
    device = indexed_device(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with _cuda_ceiling(ceiling, device), _no_grad_unless(grad):
            out = forward()
            torch.cuda.synchronize(device)
        del out
        return Peak(
            torch.cuda.max_memory_allocated(device),
            "measured",
            torch.cuda.max_memory_reserved(device),
        )
    finally:
        gc.collect()
        torch.cuda.empty_cache()
