"""A decode step modeled where it is not timed: a roofline over the preset's datasheet.

A decode step reads every sequence's cache or state and the weights once and does little
arithmetic with them, so on a GPU it is bound by memory bandwidth unless its FLOPs at the
preset's peak take longer (MLA's absorbed form at 128 heads and a long context can). The
model says which bound it took and leaves out everything a kernel adds above both: its
efficiency (a copy reached 79 % of the H200's 4.8 TB/s, results/gpu_check), launches,
and an MoE's expert weights beyond the active ones. It is a lower bound on the step, and a
row that carries it says so; results/gpu_check's decode steps, timed on an H200, took 1.4×
to 24× as long.
"""

from __future__ import annotations

from typing import Any

HOW = (
    "roofline over the preset's datasheet: the larger of the bytes a step reads over its"
    " bandwidth and its FLOPs over its peak; no kernel efficiency, launch, MoE expert"
    " weights beyond the active ones, embedding or vocabulary head: a lower bound"
)


def roofline(
    read_bytes: int, flops: int, bandwidth: float, peak_flops: float | None
) -> dict[str, Any]:
    """One step's modeled seconds: memory time (``read_bytes / bandwidth``), compute time
    (``flops / peak_flops``, 0 where the preset has no peak for the dtype) and the larger,
    with which bound it was."""
    memory_s = read_bytes / bandwidth
    compute_s = flops / peak_flops if peak_flops else 0.0
    return {
        "memory_s": memory_s,
        "compute_s": compute_s,
        "step_s": max(memory_s, compute_s),
        "bound": "memory" if memory_s >= compute_s else "compute",
    }
