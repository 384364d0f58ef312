"""A cell's modeled inference peak beside the CPU profiler's, for the tests that hold a new
shape (a mechanism's form, a head width, a schedule) to the independent instrument."""

from __future__ import annotations

import torch

from attnbench.cell import Cell
from attnbench.measure.memory import module_bytes, profiled_peak, rounded
from attnbench.plan import validate
from attnbench.runner import build, modeled_peak


def peaks(cell: Cell, b: int) -> tuple[int, int]:
    """(modeled, profiled) bytes of one inference forward of ``cell`` at batch ``b`` on the
    CPU in fp32, both without the weights and the input: the memory model's meta trace
    against ``torch.profiler``'s allocation events over a real forward (after a warm one)."""
    res = validate(cell)
    model = build(res.cell, res, "cpu", torch.float32)
    meta = build(res.cell, res, "meta", torch.float32)
    x = torch.randn(b, cell.n, cell.model.d_model)
    with torch.inference_mode():
        model(x)
        real = profiled_peak(lambda: model(x))
    modeled = modeled_peak(meta, res.cell, b, overhead=0) - module_bytes(meta) - rounded(x.nbytes)
    return modeled, real
