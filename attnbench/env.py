"""What a figure was measured with: the one machine fingerprint of attnbench.

Two consumers ask the same question in two shapes: a row records the environment it was
measured in (:func:`environment`, stored with every row and as a run's ``env.json``), and
the regression gate compares the machine a stored baseline was taken on with this one
(:func:`fingerprint`). Both read the CPU's name, the Python and torch versions from here, so
they cannot disagree on what "the same machine" means.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

import attnbench


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


@functools.cache
def git_revision() -> str | None:
    """HEAD of attnbench's own checkout; None for an install (inside a user's repo, say)."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            cwd=here,
            timeout=10,
        ).stdout.strip()
        if not top or Path(top).resolve() != here.parent:
            return None
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


@functools.cache
def environment() -> dict[str, Any]:
    """A row's ``env``: device, versions, git revision, threads."""
    cuda = torch.cuda.is_available()
    return {
        "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "attnbench": attnbench.__version__,
        "git_revision": git_revision(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def fingerprint(device: str, threads: int) -> dict[str, Any]:
    """What makes timings of two gate runs comparable: the machine and the software under
    it, for timing on ``device`` (cpu or cuda) with ``threads`` torch threads."""
    return {
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "system": platform.system(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
    }


# glibc serves big blocks (vanilla's (12, 512, 512) scores are 12.6 MB) by mmap and gives
# freed memory back by trimming, at thresholds that adapt to each process's history, so one
# process faults its pages in on every forward and the next does not: the same layer at
# n=512 ran 46-74 ms in six fresh processes, 46-49 ms with these fixed (docs/measurement.md,
# "Quieter timings"). Fixed thresholds (set by variable or by mallopt) switch the adaptation off.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
MALLOC_SWITCH = "ATTNBENCH_MALLOC_FIX"  # "0": leave glibc's adaptive thresholds alone
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # M_TRIM_/M_MMAP_


def with_malloc_fixed(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the malloc thresholds set, where the user has not set them already."""
    if env.get(MALLOC_SWITCH) == "0":
        return dict(env)
    return {**MALLOC, **env}


def fix_malloc() -> bool:
    """Fix the thresholds in this process (``mallopt``, so no restart is needed) and in
    every process it starts (the variables, read by glibc when a process starts: launcher
    workers, isolated cells). The user's own values win; ``ATTNBENCH_MALLOC_FIX=0`` leaves
    everything alone. Returns whether this process's thresholds are now fixed (False off
    glibc). Every command that times a cell calls it first."""
    if os.environ.get(MALLOC_SWITCH) == "0":
        return False
    os.environ.update(with_malloc_fixed(dict(os.environ)))
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to fix
        return False
    ok = True
    for name, param in _MALLOPT.items():
        value = min(int(os.environ[name]), 2**31 - 1)  # mallopt takes a C int
        ok = bool(mallopt(param, value)) and ok
    return ok
