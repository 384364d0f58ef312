"""A cell's step timed, what the timing found returned in the runner's record
(:class:`~attnbench.runner.found.Found`, given and handed back with the figures added): the
step made ready (:mod:`attnbench.runner.prepare`: per-length structures, the compile), then
timed at the batch the runner chose, on the preset's GPU or on this CPU.

On a CPU (no GPU of the preset's kind here) the step is timed in fp32 at the workload's
``cpu_batch``, and only if its cost, estimated from this CPU's quiet GEMM rate
(:mod:`attnbench.measure.gemm`), fits ``time_budget_s`` (:func:`budget_verdict`); a cell
over budget says so in ``reason``, and a cell timed or skipped because the CPU was
contended says that instead. The runner keeps the memory model, the max batch and the GPU's
probes; this module is what it calls to time.
"""

from __future__ import annotations

from typing import Any

import torch

from attnbench.cell import Cell
from attnbench.env import environment
from attnbench.measure import gemm
from attnbench.measure.contention import SKIPPED_FOR_LOAD, TIMED_UNDER_LOAD
from attnbench.measure.timing import StepTiming
from attnbench.plan import Resolved
from attnbench.runner import prepare
from attnbench.runner.found import Found, Memory, carried
from attnbench.workload import Work, random_input
from attnbench.workload import get as get_workload

# A contended CPU may stretch a cell's timing to this many times ``time_budget_s``: a
# cell that fits the budget on a quiet CPU is timed under load up to there (its samples
# judged one by one, busy if too few ran uncontended), and beyond, skipped for the load.
LOAD_STRETCH = 2.0


def budget_verdict(timing_s: float, slowdown: float, budget_s: float) -> str | None:
    """Whether a CPU cell is timed (None) or why not: ``cost`` where its timing, estimated
    at this CPU's quiet rate, is over ``budget_s``; ``load`` where it fits on a quiet CPU
    but the contention read (``slowdown``: the quiet rate over the rate read now) would make
    it over :data:`LOAD_STRETCH` budgets. Decided on the quiet rate, so that a busy machine
    still times what it can, and a cell is never called too costly for the load's sake."""
    if timing_s > budget_s:
        return "cost"
    if timing_s * slowdown > LOAD_STRETCH * budget_s:
        return "load"
    return None


def time_on_cpu(cell: Cell, res: Resolved, found: Found, meta: torch.nn.Module) -> Found:
    """The cell's step timed on this CPU in fp32, if its estimated cost (from ``meta``, the
    memory model's encoder) fits ``time_budget_s`` (:func:`budget_verdict`); a cell timed
    or skipped under load says so in its reason. ``found`` back with what it found."""
    workload = res.workload
    b = workload.cpu_batch(cell)
    if b is None:
        return found.add(reason=f"time not measured: {workload.no_cpu_time}")
    rate = gemm.cpu_matmul_rate()
    # estimated at the CPU's own rate: the seconds of a step, and of the whole timing
    step_s, timing_s = workload.cost_s(meta, cell, b, rate.quiet)
    budget_s = cell.timing.time_budget_s
    verdict = budget_verdict(timing_s, rate.slowdown, budget_s)
    share = f"its GEMM rate read at {1 / rate.slowdown:.0%} of its own"
    if verdict == "cost":
        return found.add(
            reason=f"time skipped: ~{step_s:.1f} s per {workload.what} at b={b} on this CPU; "
            f"its timing (~{timing_s:.0f} s) would exceed time_budget_s={budget_s:g}"
        )
    if verdict == "load":
        return found.add(
            reason=f"{SKIPPED_FOR_LOAD}: its timing (~{timing_s:.0f} s on this CPU, quiet) "
            f"fits time_budget_s={budget_s:g}, but the CPU was contended ({share}): "
            f"~{timing_s * rate.slowdown:.0f} s now; measure it again on a quieter machine",
            contention={"busy": True, "why": f"the CPU was contended ({share}): not timed"},
        )
    model = workload.build(cell, res.params, "cpu", torch.float32)
    x = random_input(workload, cell, b, "cpu", torch.float32)
    min_seconds = min(cell.timing.min_seconds, budget_s / 2)
    work = workload.work(model, cell, x, "cpu", gpu=False)
    cpu = torch.device("cpu")
    try:  # what the steps below found, kept if a later one raises
        found = ready(found, cell, model, work, cpu, profile=cell.compile)
        if cell.compile:  # the profiler's peak of the compiled step, at the batch timed
            found = found.add(memory=Memory("profiled", b, prepare.profiled(work, workload.grad)))
        found = time_at(
            found,
            work,
            cell=cell,
            res=res,
            device=cpu,
            batch=b,
            where="cpu",
            dtype="fp32",
            min_seconds=min_seconds,
            # contended repeats are taken again within what is left of the budget, and for no
            # longer than ten times the timing's own length: a busy machine slows a sweep
            # boundedly, and says so, rather than holding it until the machine is quiet
            patience_s=min(cell.timing.time_budget_s - timing_s, max(10 * min_seconds, 1.0)),
        )
    except Exception as e:
        raise carried(found, e) from e
    if rate.busy and found.reason is None:  # a figure, but taken while the machine was loaded
        found = found.add(
            reason=f"{TIMED_UNDER_LOAD}: the CPU was contended when it began ({share})"
        )
    return found


def ready(
    found: Found,
    cell: Cell,
    model: torch.nn.Module,
    work: Work,
    device: torch.device,
    *,
    profile: bool,
) -> Found:
    """Get the step ready to time (:mod:`attnbench.runner.prepare`): per-length structures
    built, then, where compiled code runs, the step compiled; with ``profile`` (a compiled cell
    on a CPU), the eager step's profiled peak first. Each figure is kept as its step returns, so
    that a failure midway leaves the figures before it in the row."""
    found = found.add(mask_build_s=prepare.per_length(cell, model, device))
    if not prepare.runs_compiled(cell):
        return found
    try:
        if profile:
            found = found.add(
                eager_peak_bytes=prepare.eager_peak(work, get_workload(cell.mode).grad)
            )
        return found.add(compiled=prepare.compile_step(cell, model, work, device))
    except Exception as e:
        raise carried(found, e) from e


def time_at(
    found: Found,
    work: Work,
    *,
    cell: Cell,
    res: Resolved,
    device: torch.device,
    batch: int,
    where: str,
    dtype: str,
    **timing: Any,
) -> Found:
    """Time the step at ``batch`` (``where``: ``cuda`` or ``cpu``, in ``dtype``; ``timing``:
    :meth:`Work.time`'s settings), then keep what the workload's step found of its own
    (decode: the prefill, the bandwidth)."""
    timings, recompiled = prepare.time_step(
        work,
        device,
        compiled_code=found.compiled is not None,
        grad=res.workload.grad,
        min_repeats=cell.timing.min_repeats,
        **timing,
    )
    # % of peak only on the preset's own GPU: an H100 standing in for a V100 would read 400 %
    same_gpu = where == "cuda" and res.preset.gpu == environment()["device_name"]
    assert found.flops is not None  # counted before anything is timed
    step = StepTiming(
        whole=timings[-1],
        parts=dict(zip(res.workload.parts, timings[:-1], strict=True)),
        batch=batch,
        device=where,
        dtype=dtype,
        flops=found.flops.per_sequence * batch,
        peak_flops=res.preset.peak_flops.get(dtype) if same_gpu else None,
    )
    found = found.add(timing=step, recompiled=recompiled)
    if (share := timings[-1].contention) is not None:
        found = found.add(contention=share.as_dict())
    try:  # the workload's figures read after its timing (decode: a copy's bandwidth)
        return found.add(workload={**found.workload, **work.row_fields()})
    except Exception as e:
        raise carried(found, e) from e
