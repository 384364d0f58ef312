"""A cell's step made ready to time, and timed: what a mechanism builds per length (flex's
block masks, their build time apart), the layers compiled where the cell asks (the first call
timed as the compile, the graphs counted), and the timing guarded against recompilation.
Each step returns its figure; :mod:`attnbench.runner.run`, which orchestrates a cell, keeps it,
so that the GPU and the CPU branches get a step ready the one way."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from attnbench import registry
from attnbench.cell import Cell
from attnbench.measure import compiled
from attnbench.measure.memory import profiled_peak
from attnbench.measure.timing import Timing
from attnbench.runner.found import Compiled
from attnbench.schedule import Layer, layers_of
from attnbench.workload import Work
from attnbench.workload import get as get_workload


def per_length(cell: Cell, model: torch.nn.Module, device: torch.device) -> float | None:
    """Build what the mechanism needs per length (flex's block masks); the seconds it took
    where the mechanism compiles its own kernel (its row's ``mask_build_s``), else None."""
    seconds = model.prepare(cell.n, device)
    return seconds if any(registry.info(k.attention).compiles for k in _kinds(cell)) else None


def _kinds(cell: Cell) -> list[Layer]:
    """The kinds of the cell's layers, once each: its own mechanism's, and a schedule's."""
    return list({k.kind: k for k in layers_of(cell)}.values())


def runs_compiled(cell: Cell) -> bool:
    """Whether the step runs compiled code: compiled layers, or a layer whose mechanism
    compiles its own kernel (a schedule's kind's too)."""
    return cell.compile or any(registry.info(k.attention).compiles for k in _kinds(cell))


def warms(cell: Cell) -> bool:
    """Whether the step's first call at a batch it has not run at does more than the step,
    so that a GPU runs it once at each batch before measuring there (:func:`warm`): compiled
    code compiles (static shapes: a new batch is a new graph, whose Triton kernels Inductor
    may then benchmark) and ``kernel=fla``'s Triton kernels autotune, keyed on the batch,
    each configuration timed beside a 256 MB buffer that flushes the L2 cache."""
    return runs_compiled(cell) or any(dict(k.params).get("kernel") == "fla" for k in _kinds(cell))


def warm(work: Work, device: torch.device, *, grad: bool) -> float:
    """Run the step once as a probe runs it, unmeasured; its seconds (a device sync
    included): what autotuning or compiling at this batch cost beside one step."""
    start = time.perf_counter()
    with autograd(grad):
        work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def eager_peak(work: Work, grad: bool) -> int:
    """The profiler's peak of the eager step, after a first step (what that leaves, an
    optimizer's state, is not the peak)."""
    with autograd(grad):
        work()
    return profiled(work, grad)


def compile_step(cell: Cell, model: torch.nn.Module, work: Work, device: torch.device) -> Compiled:
    """Compile (``compile=true``: the layers) and run the step until compiled; what that
    cost. The cache is reset first: this cell's compile time, not a hit of an earlier cell's."""
    compiled.reset()
    workload = get_workload(cell.mode)
    if cell.compile:
        compiled.compile_layers(model, cell.compile_mode, workload.compile_dynamic)
    warm = compiled.warm(work, device, grad=workload.grad)
    return Compiled("layers" if cell.compile else "kernel", warm.seconds, warm.graphs)


def autograd(grad: bool) -> contextlib.AbstractContextManager[None]:
    """How a step runs when timed: with autograd (a training step) or in inference mode."""
    return torch.enable_grad() if grad else torch.inference_mode()


def profiled(work: Work, grad: bool) -> int:
    """The CPU profiler's peak of one step, as a step runs when timed."""
    with autograd(grad):
        return profiled_peak(work)


def time_step(
    work: Work, device: torch.device, *, compiled_code: bool, **timing: Any
) -> tuple[list[Timing], int]:
    """``work.time``, and the graphs compiled while timing; where compiled code runs, no
    recompilation is allowed (it raises: the row is an error, not a figure of code compiled
    on the clock)."""
    if not compiled_code:
        return work.time(device, **timing), 0
    return compiled.timed(work, device, **timing)
