"""One cell in, one row out: max batch, time, peak memory and FLOPs of the Table 3 encoder.

A cell is a frozen, hashable spec: (mechanism + its parameters, model shape, n, k, b, dtype,
device preset, ceiling). :func:`validate` refuses bad cells with one ``ValueError`` line
before anything runs; :func:`run_cell` then always returns a row, whose ``status`` says
``ok``, ``oom`` (even b = 1 does not fit, or the fixed b does not), ``skipped`` (cannot run
here, with the reason) or ``error`` (the forward raised, with the message).

Where the cell's preset is a GPU and CUDA is here, everything is real: the model predicts the
max batch, real probes under the ceiling confirm or correct it, and timing is on the GPU at
that batch. Without CUDA, memory comes from the model (labelled ``modeled``) and time per
sequence is measured on this CPU in fp32 at ``cpu_batch``, if its estimated cost fits
``time_budget_s``; a cell over budget says so in ``reason``.
"""

from __future__ import annotations

import functools
import gc
from typing import Any

import torch

from attnbench import prepare, registry
from attnbench.attention.base import indexed_device
from attnbench.cell import Cell, Resolved, validate
from attnbench.env import allocated, environment, use_threads
from attnbench.measure import compiled, contention
from attnbench.measure.memory import (
    measured_peak_cuda,
    module_bytes,
    rounded,
    tracked_peak,
)
from attnbench.measure.search import largest_fitting, solve_affine
from attnbench.measure.timing import StepTiming, time_forward
from attnbench.measured import Flops, Found, MaxBatch, Memory, assemble
from attnbench.quality import tasks
from attnbench.row import Row
from attnbench.workload import DTYPES, Work, random_input

GPU = "cuda"  # the device real GPU runs use (tests put "cpu" here to drive that branch)


def build(cell: Cell, res: Resolved, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The cell's encoder as its workload builds it, on ``device`` in ``dtype``."""
    return cell.workload.build(cell, res.params, device, dtype)


def make_input(b: int, cell: Cell, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Random (never zero) inputs of batch b, as the cell's workload takes them."""
    return random_input(cell.workload, cell, b, device, dtype)


def _feed(work: Work, cell: Cell, b: int, device: str) -> None:
    """A new input of batch b for ``work``; the previous one goes first, so that only the
    step's own input is live when its peak is taken."""
    work.x = None
    work.x = make_input(b, cell, device, DTYPES[cell.dtype])


def _modeled(work: Work, cell: Cell, b: int, fixed: int) -> int:
    """The tracked peak of ``work`` (on meta) at batch b above ``fixed`` bytes plus its input."""
    _feed(work, cell, b, "meta")
    base = fixed + rounded(work.x.nbytes)
    own = work.modeled_peak(base)
    return own if own is not None else tracked_peak(work, base, grad=cell.workload.grad)


class MemoryModel:
    """The modeled peak of one cell at any batch: its workload's step on meta tensors, plus
    what is live before it: weights, what a first step leaves (an optimizer's state, as in a
    real run after step one), the input and the preset's overhead."""

    def __init__(self, cell: Cell, res: Resolved) -> None:
        self.cell, self.overhead = cell, res.preset.overhead_bytes
        dtype = DTYPES[cell.dtype]
        self.model = build(cell, res, "meta", dtype)
        self.fixed = module_bytes(self.model) + self.overhead
        x = make_input(1, cell, "meta", dtype)
        self.work = cell.workload.work(self.model, cell, x, "meta", gpu=res.preset.is_gpu)
        if cell.workload.primes:
            self.work()  # makes the state every later step keeps
            state = self.work.state_tensors()
            self.fixed += sum(rounded(t.untyped_storage().nbytes()) for t in state)

    @functools.cache  # noqa: B019 (one model per cell, dropped with it)
    def peak(self, b: int) -> int:
        return _modeled(self.work, self.cell, b, self.fixed)


def modeled_peak(model: torch.nn.Module, cell: Cell, b: int, overhead: int) -> int:
    """Peak bytes of the cell's step at batch b on ``model`` (on meta): the step + weights
    + input + the preset's fixed overhead (a workload that primes: without its state)."""
    work = cell.workload.work(
        model, cell, make_input(b, cell, "meta", DTYPES[cell.dtype]), "meta", gpu=False
    )
    return _modeled(work, cell, b, module_bytes(model) + overhead)


def _cuda_fits(work: Work, cell: Cell, res: Resolved, b: int) -> bool:
    """A real step at b under the ceiling less the fixed overhead; OOM is caught, the
    input's allocation included."""
    dev = indexed_device(GPU)
    try:
        _feed(work, cell, b, GPU)
        measured_peak_cuda(work, dev, res.usable, grad=cell.workload.grad)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        work.x = None
        gc.collect()
        torch.cuda.empty_cache()


_RATES: dict[int, float] = {}  # threads -> fp32 GEMM FLOP/s, once measured uncontended


def cpu_matmul_rate() -> tuple[float, bool]:
    """fp32 GEMM FLOP/s of this CPU at the threads in use, to estimate a CPU forward's cost,
    and whether the CPU was busy when it was measured. Kept for the process once measured
    on a quiet CPU; a busy reading is used once and measured again for the next cell, so
    that one contended moment cannot skip the time of a whole sweep."""
    threads = torch.get_num_threads()
    if threads in _RATES:
        return _RATES[threads], False
    a, w = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = time_forward(
        lambda: a @ w, torch.device("cpu"), min_repeats=5, min_seconds=0.2, patience_s=2.0
    )
    rate = 2 * 1024**3 / t.median
    if not t.busy:
        _RATES[threads] = rate
    return rate, t.busy


def run_cell(cell: Cell, res: Resolved | None = None) -> Row:
    """Measure one cell; always a row (see the module docstring). Validates first. Timed on
    the CPUs this process was given (or fewer, if ``timing.threads`` says so); the caller's
    thread count is back as it was afterwards."""
    res = res or validate(cell)
    env, found = environment(), Found()
    before = torch.get_num_threads()
    try:
        found.threads = (use_threads(cell.threads), allocated()[0])
        _run(cell, res, found)
    except ValueError as e:  # timing.threads above what this process was given
        found.stop("error", str(e))
    finally:
        torch.set_num_threads(before)
    return assemble(cell, res, env, found)


def _run(cell: Cell, res: Resolved, found: Found) -> None:
    why = registry.info(cell.attention).unavailable
    if why is not None:  # its forward cannot run here, not even on meta tensors
        found.stop("skipped", why)
        return
    try:
        if cell.task != "cost":  # a quality beside the cost
            found.quality = tasks.run(cell)
        else:
            _measure(cell, res, found)
    except torch.OutOfMemoryError as e:
        found.stop("oom", _first_line(e))
    except Exception as e:  # a row with the reason, never a hole in the sweep
        found.stop("error", f"{type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [repr(e)])[0][:300]


def _measure(cell: Cell, res: Resolved, found: Found) -> None:
    modeled = MemoryModel(cell, res)
    forward, backward = cell.workload.flops(modeled.model, cell)  # per sequence
    # flex: the kernel computes whole blocks only; dense attention's count beside it
    dense = modeled.model.dense_flops(1, cell.n) if registry.info(cell.attention).compiles else None
    found.flops = Flops(forward, backward, dense)
    found.workload = cell.workload.describe(modeled.model, cell)
    if cell.batch == "max":
        # meta forwards cost the same at any b; the search's last one is the row's peak
        predicted, _ = solve_affine(modeled.peak, res.ceiling, modeled.fixed)
        found.max_batch = MaxBatch(predicted)
    else:
        predicted = None

    if res.on_gpu:
        with compiled.strict(timing=False):  # a compiled probe never falls back to eager
            _measure_gpu(cell, res, found, predicted)
        return
    if cell.compile and not cell.model_only:
        # the meta model traces the eager graph: a compiled cell's memory is what the profiler
        # sees of the compiled step where it is timed, never the eager model's figure
        _time_on_cpu(cell, res, found, modeled.model)
        return
    # no GPU of the preset's kind here (or model_only): memory from the model, time from the CPU
    b = predicted if cell.batch == "max" else cell.batch
    found.memory = Memory("modeled", b)
    if b == 0:
        found.stop("oom", f"modeled: b=1 does not fit under {res.ceiling} bytes")
        return
    peak = modeled.peak(b)
    found.memory = Memory("modeled", b, peak)
    if peak > res.ceiling:
        found.stop(
            "oom", f"modeled: b={b} peaks at {peak} bytes, over the ceiling of {res.ceiling}"
        )
        return
    if cell.model_only:
        found.reason = "model only: no time measured"
        return
    _time_on_cpu(cell, res, found, modeled.model)


def _measure_gpu(cell: Cell, res: Resolved, found: Found, predicted: int | None) -> None:
    """Real probes confirm or correct the model's max batch; then peak memory and time at
    that batch, on the GPU. A workload that primes (a training step's optimizer state) runs
    one step at b = 1 first, as that state exists in every step after a real run's first."""
    dtype, dev, workload = DTYPES[cell.dtype], indexed_device(GPU), cell.workload
    overhead = res.preset.overhead_bytes
    model = build(cell, res, GPU, dtype)
    work = workload.work(model, cell, make_input(1, cell, GPU, dtype), GPU, gpu=True)
    if cell.compile:  # the probes run the compiled step: its memory, not the eager one's
        compiled.compile_layers(model, cell.compile_mode, workload.compile_dynamic)
    if workload.primes and not _cuda_fits(work, cell, res, 1):
        found.memory = Memory("measured")
        found.stop("oom", "b=1 does not fit")
        return
    if predicted is not None:  # batch=max
        b, probes = largest_fitting(lambda b: _cuda_fits(work, cell, res, b), max(predicted, 1))
        found.max_batch = MaxBatch(predicted, b, probes)
    else:
        b = cell.batch
    if b == 0:
        found.memory = Memory("measured")
        found.stop("oom", f"b=1 does not fit under {res.ceiling} bytes")
        return
    _feed(work, cell, b, GPU)
    _prepare(found, cell, model, work, dev, profile=False)  # afresh at b: its compile time
    try:
        peak = measured_peak_cuda(work, dev, res.usable, grad=workload.grad)
    except torch.OutOfMemoryError:
        why = (
            "passed its probe but ran out of memory when run again (allocator fragmentation)"
            if cell.batch == "max"
            else "does not fit under the ceiling"
        )
        found.memory = Memory("measured", b)
        found.stop("oom", f"b={b} {why}")
        return
    reserved = None if peak.reserved is None else peak.reserved + overhead
    found.memory = Memory("measured", b, peak.bytes + overhead, reserved)
    _time(
        found, cell, res, work, dev, b, "cuda", cell.dtype,
        min_seconds=cell.min_seconds, flush_l2=cell.flush_l2,
    )  # fmt: skip
    if found.contention is not None:  # other processes on the GPU: what torch can read of them
        others = contention.gpu_others_bytes(dev)
        found.contention = {**found.contention, contention.GPU_OTHERS: others}


def _time_on_cpu(cell: Cell, res: Resolved, found: Found, meta: torch.nn.Module) -> None:
    """The cell's step timed on this CPU in fp32, if its estimated cost (from ``meta``, the
    memory model's encoder) fits ``time_budget_s``."""
    workload = cell.workload
    b = workload.cpu_batch(cell)
    if b is None:
        found.reason = f"time not measured: {workload.no_cpu_time}"
        return
    rate, busy = cpu_matmul_rate()
    # estimated: the seconds of a step, and of the whole timing
    step_s, timing_s = workload.cost_s(meta, cell, b, rate)
    if timing_s > cell.time_budget_s:
        found.reason = (
            f"time skipped: ~{step_s:.1f} s per {workload.what} at b={b} on this CPU; "
            f"its timing (~{timing_s:.0f} s) would exceed time_budget_s={cell.time_budget_s:g}"
        )
        if busy:  # the estimate may be the contention's, not the cell's: say so
            found.reason += "; machine busy: the CPU's rate was measured while contended"
            why = "the GEMM rate that estimates the cell's cost was read on a contended CPU"
            found.contention = {"busy": True, "why": why}
        return
    model = build(cell, res, "cpu", torch.float32)
    x = make_input(b, cell, "cpu", torch.float32)
    min_seconds = min(cell.min_seconds, cell.time_budget_s / 2)
    work = workload.work(model, cell, x, "cpu", gpu=False)
    cpu = torch.device("cpu")
    _prepare(found, cell, model, work, cpu, profile=cell.compile)
    if cell.compile:  # the profiler's peak of the compiled step, at the batch timed
        found.memory = Memory("profiled", b, prepare.profiled(work, workload.grad))
    _time(
        found, cell, res, work, cpu, b, "cpu", "fp32",
        min_seconds=min_seconds,
        # contended repeats are taken again within what is left of the budget, and for no
        # longer than ten times the timing's own length: a busy machine slows a sweep
        # boundedly, and says so, rather than holding it until the machine is quiet
        patience_s=min(cell.time_budget_s - timing_s, max(10 * min_seconds, 1.0)),
    )  # fmt: skip


def _prepare(
    found: Found,
    cell: Cell,
    model: torch.nn.Module,
    work: Work,
    device: torch.device,
    *,
    profile: bool,
) -> None:
    """Get the step ready to time (:mod:`attnbench.prepare`): per-length structures built,
    then, where compiled code runs, the step compiled; with ``profile`` (a compiled cell on a
    CPU), the eager step's profiled peak first. Each figure is kept as its step returns, so
    that a failure midway leaves the figures before it in the row."""
    found.mask_build_s = prepare.per_length(cell, model, device)
    if not prepare.runs_compiled(cell):
        return
    if profile:
        found.eager_peak_bytes = prepare.eager_peak(work, cell.workload.grad)
    found.compiled = prepare.compile_step(cell, model, work, device)


def _time(
    found: Found,
    cell: Cell,
    res: Resolved,
    work: Work,
    device: torch.device,
    b: int,
    where: str,
    dtype: str,
    **timing: Any,
) -> None:
    """Time the step at batch b (``where``: ``cuda`` or ``cpu``, in ``dtype``), then keep
    what the workload's step found of its own (decode: the prefill, the bandwidth)."""
    timings, found.recompiled = prepare.time_step(
        work,
        device,
        compiled_code=found.compiled is not None,
        grad=cell.workload.grad,
        min_repeats=cell.min_repeats,
        **timing,
    )
    # % of peak only on the preset's own GPU: an H100 standing in for a V100 would read 400 %
    same_gpu = where == "cuda" and res.preset.gpu == environment()["device_name"]
    assert found.flops is not None  # counted before anything is timed
    found.timing = StepTiming(
        whole=timings[-1],
        parts=dict(zip(cell.workload.parts, timings[:-1], strict=True)),
        batch=b,
        device=where,
        dtype=dtype,
        flops=found.flops.per_sequence * b,
        peak_flops=res.preset.peak_flops.get(dtype) if same_gpu else None,
    )
    if (share := timings[-1].contention) is not None:
        found.contention = share.as_dict()
    found.workload = {**found.workload, **work.row_fields()}


__all__ = ["Cell", "MemoryModel", "modeled_peak", "run_cell", "validate"]
