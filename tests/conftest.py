"""Shared fixtures. Everything runs on CPU; GPU-only tests skip themselves with a reason."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """``attnbench ARGS`` in a fresh process (``python -m attnbench.cli``), as a user runs it:
    the end-to-end tests' one way to call the CLI. ``env`` is added to this environment."""
    return subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
