r"""Speed of the memory model: one model-only cell, end to end (pytest-benchmark).

A model-only cell builds the encoder on meta tensors, solves for the max batch in four meta
forwards and records the modeled peak; a 1000-cell model-only sweep is this times 1000.
The targets (for inference): the 12-layer encoder ≤ 0.5 s a cell, the tiny model
≤ 0.1 s; a training cell is timed beside them (no target: it runs forward and backward).
No speed is asserted here (shared machines); the figures go to docs/measurement.md.

    pytest tests/benchmarks/test_model_speed.py --benchmark-enable --benchmark-only
"""

from __future__ import annotations

import pytest

from attnbench.cell import Cell, Part, Shape
from attnbench.runner import run_cell

CELLS = {
    "tiny": Cell(
        "vanilla", n=18, model=Shape(layers=2, d_model=64, n_heads=4, d_ff=128), model_only=True
    ),
    "base-vanilla-512": Cell("vanilla", n=512, model_only=True),
    "base-linformer-4096-k256": Cell("linformer", n=4096, k=256, model_only=True),
    "base-sdpa-2048": Cell("sdpa", n=2048, model_only=True),
    # a training step on meta: autograd, the optimizer's first step, the emulated autocast
    "base-vanilla-512-train": Cell("vanilla", n=512, workload=Part("train"), model_only=True),
    "base-linformer-4096-k256-train": Cell(
        "linformer", n=4096, k=256, workload=Part("train"), model_only=True
    ),
}


@pytest.mark.parametrize("name", CELLS)
def test_model_only_cell(benchmark, name: str) -> None:
    cell = CELLS[name]
    if benchmark.enabled:  # untimed (the default test run), the one run below is the test
        run_cell(cell)  # warm: imports, the registry, lazily built kernels
    row = benchmark.pedantic(run_cell, args=(cell,), rounds=5, warmup_rounds=1, iterations=1)
    assert row.status == "ok" and row.max_batch > 0
    benchmark.extra_info.update(max_batch=row.max_batch)
