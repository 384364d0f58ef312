"""What a figure was measured with: the one machine fingerprint of attnbench, and the CPUs.

Two consumers ask the same question in two shapes: a row records the environment it was
measured in (:func:`environment`, stored with every row and as a run's ``env.json``), and
the regression gate compares the machine a stored baseline was taken on with this one
(:func:`fingerprint`). Both read the CPU's name, the Python and torch versions from here, so
they cannot disagree on what "the same machine" means.

A CPU timing uses as many threads as the CPUs this process was given (:func:`use_threads`).
torch starts as many intra-op threads as the machine has cores, whatever the process was
allotted: under SLURM with one CPU per task it still ran two threads on a 2-core node, and
per-cell times doubled or worse from the oversubscription. A benchmark times on exactly the
CPUs it was given, and says how many: the CPU affinity the process runs under (which a
SLURM task, ``taskset`` or a container's cpuset sets), narrowed by ``SLURM_CPUS_PER_TASK``
where a scheduler says less than the affinity shows (a node without SLURM's affinity
plugin), unless ``timing.threads`` asks for fewer.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from attnbench.validators import check_int
from attnbench.version import __version__


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


SLURM_CPUS = "SLURM_CPUS_PER_TASK"


def allocated() -> tuple[int, str]:
    """(CPUs this process may run on, where that number comes from)."""
    try:
        cpus, source = len(os.sched_getaffinity(0)), "its CPU affinity"
    except AttributeError:  # no sched_getaffinity (macOS): every CPU
        cpus, source = os.cpu_count() or 1, "the CPU count"
    slurm = os.environ.get(SLURM_CPUS, "")
    if slurm.isdigit() and 0 < int(slurm) < cpus:
        cpus, source = int(slurm), SLURM_CPUS
    return cpus, source


def memory_bytes() -> int:
    """The memory this machine has: its physical memory, or its cgroup's limit where that is
    lower (a container's, a SLURM job's), which is what a process here can use."""
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return have
    return min(have, int(limit)) if limit.isdigit() else have


def resolve_threads(requested: int | None) -> int:
    """The thread count for ``timing.threads`` (None: follow the allocation). More threads
    than CPUs would time the threads' contention with each other, not the mechanism: one
    line naming the key, what was asked and what is allowed."""
    cpus, source = allocated()
    if requested is None:
        return cpus
    check_int("timing.threads", requested)
    if requested > cpus:
        raise ValueError(
            f"timing.threads: {requested} threads asked, but this process may run on {cpus} "
            f"CPUs ({source}); allowed: 1 to {cpus}, or null to use them all"
        )
    return requested


def use_threads(requested: int | None) -> int:
    """Set torch's intra-op threads for ``timing.threads`` (see :func:`resolve_threads`); returns
    the count now in use."""
    threads = resolve_threads(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def environment() -> dict[str, Any]:
    """A row's ``env``: device, versions, git revision, threads, the CPUs given (a timed
    row's ``threads`` and ``cpus`` are those of its timing: the runner sets them), and the
    float32 arithmetic of this machine's GPU as it is when the row is made (a user's code
    may change torch's flags between cells): :func:`fp32_arithmetic`."""
    return {**machine(), **fp32_arithmetic()}


# Triton's tl.dot on fp32 inputs: TF32 on GPUs that have it (compute capability 8.0 on),
# unless TRITON_F32_DEFAULT says otherwise; exact fp32 before them
TRITON_F32 = "TRITON_F32_DEFAULT"


def fp32_arithmetic() -> dict[str, Any]:
    """How fp32 matmuls run on this machine's GPU, for both kernels a row may compare:
    ``tf32_matmul`` and ``tf32_cudnn``, whether torch lets cuBLAS and cuDNN round fp32
    inputs to TF32 (ours: off and on by default), and ``triton_fp32_dot``, what Triton's
    ``tl.dot`` does with them (``kernel=fla``'s kernels, which leave it at Triton's
    default: ``tf32`` from Ampere on). None for each without CUDA."""
    if not torch.cuda.is_available():
        return dict.fromkeys(("tf32_matmul", "tf32_cudnn", "triton_fp32_dot"))
    major, _ = torch.cuda.get_device_capability()
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "triton_fp32_dot": (os.environ.get(TRITON_F32) or "tf32") if major >= 8 else "ieee",
    }


@functools.cache
def machine() -> dict[str, Any]:
    """What does not change while a process runs."""
    cuda = torch.cuda.is_available()
    return {
        "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "attnbench": __version__,
        "git_revision": git_revision(),
        "threads": torch.get_num_threads(),
        "cpus": allocated()[0],
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
