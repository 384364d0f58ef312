"""Shared fixtures. Everything runs on CPU; GPU-only tests skip themselves with a reason."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnbench


def runnable_here() -> list[str]:
    """Mechanisms that can run on this machine (CPU), per the registry's own info()."""
    return [
        n
        for n in attnbench.names()
        if attnbench.info(n).unavailable is None and "cpu" in attnbench.info(n).devices
    ]


def mechanism_variants(*linformer: tuple[tuple[str, object], ...]) -> list[tuple[str, tuple]]:
    """(name, params) for every mechanism that runs here at its defaults, Linformer with
    each sharing, and Linformer with each of ``linformer``'s parameter sets: what the
    memory-model tests hold against the profiler."""
    sharings = [(("sharing", s),) for s in ("layerwise", "headwise", "kv", "none")]
    return [(name, ()) for name in runnable_here() if name != "linformer"] + [
        ("linformer", params) for params in (*sharings, *linformer)
    ]


def param_ids(v: object) -> str:
    """A test id for a (key, value) tuple of parameters: ``sharing=kv``."""
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        return "-".join(f"{k}={x}" for k, x in v)
    return str(v)


def assert_peaks_match_the_profiler(attention: str, **params: object) -> None:
    """``attention`` with ``params`` in a 2-layer d128 encoder at n = 256, b = 2: the modeled
    peak (meta) of a forward and of a training step against the CPU profiler's, within 1 %.
    For variants the generic memory tests (run at each mechanism's defaults) do not reach,
    such as the causal prefix-sum loops of linear and performer."""
    from attnbench.cell import Cell, validate
    from attnbench.measure.memory import module_bytes, profiled_peak, rounded
    from attnbench.runner import MemoryModel, build, make_input, modeled_peak
    from attnbench.workload.train import train_step

    def cell(mode: str) -> Cell:
        return Cell(
            attention, n=256, k=None, dtype="fp32", device="cpu", layers=2, d_model=128,
            n_heads=4, d_ff=512, params=tuple(params.items()), mode=mode,
        )  # fmt: skip

    c = cell("inference")
    res = validate(c)
    model, meta = build(c, res, "cpu", torch.float32), build(c, res, "meta", torch.float32)
    x = torch.randn(2, 256, 128)
    with torch.inference_mode():
        model(x)
        real = profiled_peak(lambda: model(x))
    modeled = modeled_peak(meta, c, 2, overhead=0) - module_bytes(meta) - rounded(x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, ("inference", modeled, real)

    c = cell("train")
    res = validate(c)
    memory, model = MemoryModel(c, res), build(c, res, "cpu", torch.float32)
    step = train_step(model, c, make_input(2, c, "cpu", torch.float32), "cpu", gpu=False)
    step()
    step()
    real = profiled_peak(step)
    modeled = memory.peak(2) - memory.fixed - rounded(step.x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, ("train", modeled, real)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: int = 300,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``attnbench ARGS`` in a fresh process (``python -m attnbench.cli``), as a user runs it:
    the end-to-end tests' one way to call the CLI. ``env`` is added to this environment;
    ``preexec_fn`` runs in the child first (to pin it to CPUs, say)."""
    return subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )


def processes_with(needle: str) -> list[int]:
    """Live processes whose environment holds ``needle`` (a command's and its workers')."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
