"""The memory model of one cell: its workload's step on meta tensors at any batch, what is
live before it, the step's allocator calls in order (for :mod:`attnbench.measure.fit`'s
replay of the caching allocator) and the encoder and inputs the runner builds for it, on
any device. :mod:`attnbench.runner.run` measures with it; tests and scripts model with it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Literal

import torch

from attnbench.cell import Cell
from attnbench.cell_rules import complete
from attnbench.measure import fit
from attnbench.measure.allocator_rules import from_setting
from attnbench.measure.cuda_layouts import CudaLayouts, persistent_workspaces
from attnbench.measure.memory import Event, module_bytes, rounded, traced, tracked_peak
from attnbench.plan import Resolved
from attnbench.workload import DTYPES, Work, random_input
from attnbench.workload import get as get_workload


def build(cell: Cell, res: Resolved, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The cell's encoder as its workload builds it, on ``device`` in ``dtype`` (a cell not
    planned: its workload's defaults filled in first)."""
    return res.workload.build(complete(cell), res.params, device, dtype)


def make_input(b: int, cell: Cell, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Random (never zero) inputs of batch b, as the cell's workload takes them."""
    cell = complete(cell)  # a cell not planned: its workload's defaults filled in
    return random_input(get_workload(cell.mode), cell, b, device, dtype)


def feed(work: Work, cell: Cell, b: int, device: str) -> None:
    """A new input of batch b for ``work``; the previous one goes first, so that only the
    step's own input is live when its peak is taken."""
    work.x = None
    work.x = make_input(b, cell, device, DTYPES[cell.dtype])


def _modeled(work: Work, cell: Cell, b: int, fixed: int) -> int:
    """The tracked peak of ``work`` (on meta) at batch b above ``fixed`` bytes plus its input."""
    feed(work, cell, b, "meta")
    base = fixed + rounded(work.x.nbytes)
    own = work.modeled_peak(base)
    return own if own is not None else tracked_peak(work, base, grad=get_workload(cell.mode).grad)


Capability = tuple[int, int] | None  # a CUDA compute capability; None: meta's own trace


class MemoryModel:
    """The modeled peak of one cell at any batch: its workload's step on meta tensors, plus
    what is live before it: weights, what a first step leaves (an optimizer's state, as in a
    real run after step one), the input and the preset's overhead. Where the runner tracks
    one call of the step (``replays``), the call's allocations in order too (:meth:`trace`),
    for the allocator's replay; the peak is then the trace's, one meta pass for both.

    A GPU preset's trace is the card's (:mod:`attnbench.measure.cuda_layouts`): cuBLAS's
    workspaces are held from the first matmul, and attention's fused kernel allocates as it
    does on a card of ``capability`` (by default the card this runs on, where the cell runs on
    one, else the preset's); ``capability=None`` traces the step as meta runs it. ``unified``:
    whether cuBLASLt shares cuBLAS's workspace (None: as the torch installed here does)."""

    def __init__(
        self,
        cell: Cell,
        res: Resolved,
        capability: Capability | Literal["card"] = "card",
        unified: bool | None = None,
    ) -> None:
        cell = complete(cell)  # modeled as given with ``res``, its workload's defaults filled
        self.cell, self.overhead = cell, res.preset.overhead_bytes
        self.workload = res.workload
        self.replays = self.workload.replays
        # the caching allocator's replay decides its max batch: a GPU preset, one traced call
        self.replayed = self.replays and res.preset.is_gpu
        if capability == "card":  # the trace decides the replay's figures: no replay, no card
            capability = card_capability(res) if self.replayed else None
        self.capability = capability if res.preset.is_gpu else None
        dtype = DTYPES[cell.dtype]
        self.model = build(cell, res, "meta", dtype)
        held = [*self.model.parameters(), *self.model.buffers()]
        x = make_input(1, cell, "meta", dtype)
        self.work = self.workload.work(self.model, cell, x, "meta", gpu=res.preset.is_gpu)
        if self.workload.primes:
            self.work()  # makes the state every later step keeps
            held += self.work.state_tensors()
        storages = {id(t.untyped_storage()): t.untyped_storage() for t in held}
        self.held = [s.nbytes() for s in storages.values()]  # each its own allocation
        # cuBLAS's, held from the first matmul: last of what is live before the step
        cap = self.capability
        self.workspaces = persistent_workspaces(cap, unified) if cap is not None else ()
        self.held += self.workspaces
        self.fixed = sum(rounded(n) for n in self.held) + self.overhead

    @functools.cache  # noqa: B019 (one model per cell, dropped with it)
    def peak(self, b: int) -> int:
        if not self.replays:  # the workload's own scenario (decode: the larger of two)
            return _modeled(self.work, self.cell, b, self.fixed)
        return fit.live_peak(self.trace(b)) + self.overhead  # one meta pass for both

    @functools.cache  # noqa: B019
    def trace(self, b: int) -> list[Event]:
        """The step's allocator calls at batch b, what is held before it first."""
        return self.trace_at(b)

    def trace_at(self, b: int) -> list[Event]:
        """:meth:`trace`, made anew on each call."""
        feed(self.work, self.cell, b, "meta")
        work, held = self.work, [*self.held, self.work.x.untyped_storage().nbytes()]
        cap = self.capability

        def step() -> Any:  # the card's kernels' allocations, inside the tracker
            with CudaLayouts(cap) if cap is not None else contextlib.nullcontext():
                return work()

        return traced(step, held, grad=self.workload.grad)

    def replayed_max_batch(self, allocated: int, cap: int, allocator: str) -> int:
        """The largest batch whose calls the caching allocator serves under ``cap`` bytes
        (:func:`attnbench.measure.fit.replayed_max_batch`), searched from ``allocated``."""
        return fit.replayed_max_batch(self.trace, cap, from_setting(allocator), allocated)


def card_capability(res: Resolved) -> Capability:
    """The compute capability whose kernels a cell's model traces: the card the cell runs on
    (its probes then check the model on that card), else the preset's own."""
    if res.on_gpu:  # None where a test drives the GPU path with the CPU standing in
        return torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return res.preset.capability


def modeled_peak(model: torch.nn.Module, cell: Cell, b: int, overhead: int) -> int:
    """Peak bytes of the cell's step at batch b on ``model`` (on meta): the step + weights
    + input + the preset's fixed overhead (a workload that primes: without its state)."""
    cell = complete(cell)
    work = get_workload(cell.mode).work(
        model, cell, make_input(b, cell, "meta", DTYPES[cell.dtype]), "meta", gpu=False
    )
    return _modeled(work, cell, b, module_bytes(model) + overhead)
