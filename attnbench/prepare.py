"""A cell's step made ready to time, and timed: what a mechanism builds per length (flex's
block masks, their build time apart), the layers compiled where the cell asks (the first call
timed as the compile, the graphs counted), and the timing guarded against recompilation.
Apart from :mod:`attnbench.runner`, which orchestrates a cell, so that the GPU and the CPU
branches get a step ready the one way."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from attnbench import registry
from attnbench.cell import Cell
from attnbench.measure import compiled
from attnbench.measure.memory import profiled_peak
from attnbench.measure.timing import Timing
from attnbench.row import Row
from attnbench.workload import Work


def prepare(
    cell: Cell, model: torch.nn.Module, work: Work, device: torch.device, row: Row, *, profile: bool
) -> bool:
    """Get the step ready to time: per-length structures built (flex's block masks, their
    time apart), then, for a compiled cell, its layers compiled and the step run until
    compiled (the compile time and graphs in the row). With ``profile`` (a CPU), the
    profiler's peak of the eager step and then of the compiled one, at the same batch.
    Returns whether the step runs compiled code (compiled layers, or a mechanism that
    compiles its own kernel)."""
    grad = cell.workload.grad
    own = registry.info(cell.attention).compiles
    seconds = model.prepare(cell.n, device)
    if own:
        row.mask_build_s = seconds
    if not (cell.compile or own):
        return False
    if profile:
        with autograd(grad):  # a first eager step: what it leaves (an optimizer's state)
            work()  # is not the peak
        row.eager_peak_bytes = _profiled(work, grad)
    compiled.reset()  # this cell's compile time, not a cache hit of an earlier cell's
    if cell.compile:
        compiled.compile_layers(model, cell.compile_mode, cell.workload.compile_dynamic)
    warm = compiled.warm(work, device, grad=grad)
    row.update(
        compiled="layers" if cell.compile else "kernel",
        compile_s=warm.seconds,
        compilations=warm.graphs,
    )
    if profile:
        row.peak_bytes = _profiled(work, grad)
    return True


def autograd(grad: bool) -> contextlib.AbstractContextManager[None]:
    """How a step runs when timed: with autograd (a training step) or in inference mode."""
    return torch.enable_grad() if grad else torch.inference_mode()


def _profiled(work: Work, grad: bool) -> int:
    """The CPU profiler's peak of one step, as a step runs when timed."""
    with autograd(grad):
        return profiled_peak(work)


def time_step(work: Work, device: torch.device, row: Row, **timing: Any) -> list[Timing]:
    """``work.time``; where compiled code runs, no recompilation allowed while timing (it
    raises: the row is an error, not a figure of code compiled on the clock)."""
    if row.compiled is None:
        return work.time(device, **timing)
    timings, graphs = compiled.timed(work, device, **timing)
    row.compilations = (row.compilations or 0) + graphs
    return timings
