"""The memory model against an independent instrument: the CPU profiler's allocation events.

``test_measure.py`` holds the model (meta tensors) against the tracker on real tensors; both
share the tracker's blind spots, so that test alone cannot catch what the tracker misses (it
missed the copy ``matmul`` makes inside itself at b ≥ 2: a 4 % undercount). Here the
reference is what c10's CPU allocator was asked for, as the profiler recorded it.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.cell import Cell, Shape
from attnbench.measure.memory import module_bytes, profiled_peak, rounded
from attnbench.plan import validate
from attnbench.runner import build, modeled_peak
from tests.conftest import mechanism_variants, param_ids

VARIANTS = mechanism_variants((("kernel", "sdpa"),), (("projection", "conv"),))
SHAPES = {  # (layers, d_model, heads, d_ff, n): one base-sized layer, and a 12-layer encoder
    "layer": (1, 768, 12, 3072, 512),
    "encoder12": (12, 128, 4, 512, 256),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=param_ids)
def test_modeled_peak_equals_the_profilers(name: str, params: tuple, shape: str) -> None:
    layers, d, h, ff, n = SHAPES[shape]
    k = 64 if name in ("linformer",) else None
    cell = Cell(
        name,
        n=n,
        k=k,
        dtype="fp32",
        device="cpu",
        model=Shape(layers=layers, d_model=d, n_heads=h, d_ff=ff),
        params=params,
    )
    res = validate(cell)
    cell = res.cell  # planned: its workload's settings complete
    model = build(cell, res, "cpu", torch.float32)
    meta = build(cell, res, "meta", torch.float32)
    for b in (1, 2, 3):
        x = torch.randn(b, n, d)
        with torch.inference_mode():
            model(x)  # warm: one-time buffers (thread pools, caches) are not the forward's
            real = profiled_peak(lambda: model(x))  # noqa: B023 (called at once)
        modeled = modeled_peak(meta, cell, b, overhead=0) - module_bytes(meta) - rounded(x.nbytes)
        assert abs(modeled - real) <= 0.01 * real, (b, modeled, real)


def test_a_layer_frees_the_attentions_output_before_its_ffn() -> None:
    """Where the attention is cheap (Linformer, k = 8) the encoder peaks in a layer's FFN,
    holding the layer's input, the normed sum, fc1's output and GELU's: 2·d + 2·d_ff floats
    per token (the first layer's input is the caller's, so the second layer peaks). The
    attention's output is freed once added (``EncoderLayer.forward`` says why). A hand
    count, against the profiler."""
    from attnbench.model import build_model

    b, n, d, ff = 2, 256, 64, 256
    model = build_model("linformer", layers=2, d_model=d, n_heads=4, d_ff=ff, max_seq_len=n, k=8)
    x = torch.randn(b, n, d)
    with torch.inference_mode():
        model(x)  # warm, as above
        peak = profiled_peak(lambda: model(x))
    assert peak == 4 * b * n * (2 * d + 2 * ff)


def test_the_profiler_leaves_stderr_quiet() -> None:
    """kineto's per-use "USDT: ... profiler_start" lines would fill a sweep's log."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\nfrom attnbench.measure.memory import profiled_peak\n"
        "print(profiled_peak(lambda: torch.ones(64, 64) @ torch.ones(64, 64)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert int(done.stdout) >= 64 * 64 * 4  # it did profile: the product's bytes
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr
