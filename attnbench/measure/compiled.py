"""Compiled cells: ``torch.compile`` of each encoder layer, its first call timed apart from
the figures, and no recompilation while they are taken.

Each layer is compiled, not the whole encoder ("regional compilation", PyTorch's recipe for
repeated blocks): the twelve layers share one code object, so Dynamo traces and Inductor
compiles the layer once and every other layer reuses it (with ``inline_inbuilt_nn_modules``,
the default since torch 2.5, parameters are graph inputs, not constants). Compiling the
encoder whole would unroll twelve layers into one graph, twelve times the compile time for
the same kernels; and a compiled layer is what a user puts in their own model.

Shapes are static (``dynamic=False``) where a step has one shape (a forward, a training
step): a new batch is a new compilation, never a slower dynamic kernel. A decode step's
context grows each token, so decode compiles with automatic dynamic shapes (``None``): the
lengths seen to change become symbolic, and the warm-up (:meth:`Work.warm`) runs until they
have. Recompiling while timing raises (``error_on_recompile``), and hitting the recompile
limit raises instead of falling back to eager silently (``fail_on_recompile_limit_hit``): a
compiled figure is of compiled code, or the cell is an error row.

The gate's worker (:mod:`attnbench.check.worker`) loads this file by path to compile its
compiled cells, inside a process whose ``attnbench`` is the version under test: it must
import nothing of attnbench at run time (tests/test_check_gate.py checks).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from attnbench.workload import Work

# recompilations allowed per code object: probing the max batch on a GPU compiles once per
# batch probed (static shapes), a dozen at most; past it, an error, never eager code
RECOMPILE_LIMIT = 64


def compile_layers(model: nn.Module, mode: str, dynamic: bool | None) -> None:
    """Compile each of ``model.layers`` in place (``nn.Module.compile``)."""
    for layer in model.layers:
        layer.compile(mode=mode, dynamic=dynamic)


def graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (every recompilation counts)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextmanager
def strict(timing: bool) -> Iterator[None]:
    """No silent fallback to eager: the recompile limit raises; with ``timing``, so does
    any recompilation."""
    import torch._dynamo.config as dynamo

    with dynamo.patch(
        recompile_limit=RECOMPILE_LIMIT,
        fail_on_recompile_limit_hit=True,
        error_on_recompile=timing,
    ):
        yield


def reset() -> None:
    """Drop every compiled graph: the next call compiles afresh (a cell's compile time is
    its own, not a previous cell's cache hit in memory; Inductor's disk cache stays, as it
    does for a user's second run)."""
    torch.compiler.reset()


@dataclass(frozen=True)
class Warm:
    """The compiled step's first call: seconds (compilation included) and graphs compiled."""

    seconds: float
    graphs: int


def warm(work: Work, device: torch.device, *, grad: bool) -> Warm:
    """Run the step until it is compiled (:meth:`Work.warm`), timed with a device sync."""
    before = graphs()
    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with strict(timing=False), ctx:
        start = time.perf_counter()
        work.warm()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    return Warm(seconds, graphs() - before)


def timed(work: Work, device: torch.device, **timing: Any) -> tuple[list[Any], int]:
    """``work.time`` under :func:`strict` (a recompilation raises), and the graphs compiled
    while timing (0, or it raised)."""
    before = graphs()
    with strict(timing=True):
        out = work.time(device, **timing)
    return out, graphs() - before
