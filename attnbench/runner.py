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

import torch

from attnbench import registry
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
from attnbench.measure.timing import Timing, time_forward
from attnbench.prepare import prepare, time_step
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
    row = Row.new(cell, res.ceiling, res.preset.overhead_bytes, environment())
    before = torch.get_num_threads()
    try:
        row.env = {**row.env, "threads": use_threads(cell.threads), "cpus": allocated()[0]}
        _run(cell, res, row)
    except ValueError as e:  # timing.threads above what this process was given
        row.update(status="error", reason=str(e))
    finally:
        torch.set_num_threads(before)
    return row


def _run(cell: Cell, res: Resolved, row: Row) -> None:
    why = registry.info(cell.attention).unavailable
    if why is not None:  # its forward cannot run here, not even on meta tensors
        row.update(status="skipped", reason=why)
        return
    try:
        if cell.task != "cost":  # a quality beside the cost
            row.update(quality=tasks.run(cell))
        else:
            _measure(cell, res, row)
    except torch.OutOfMemoryError as e:
        row.update(status="oom", reason=_first_line(e))
    except Exception as e:  # a row with the reason, never a hole in the sweep
        row.update(status="error", reason=f"{type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [repr(e)])[0][:300]


def _measure(cell: Cell, res: Resolved, row: Row) -> None:
    memory = MemoryModel(cell, res)
    row.flops, row.flops_backward = cell.workload.flops(memory.model, cell)  # per sequence
    if registry.info(cell.attention).compiles:  # flex: the kernel computes whole blocks only
        row.flops_dense = memory.model.dense_flops(1, cell.n)
    row.update(**cell.workload.describe(memory.model, cell))
    if cell.batch == "max":
        # meta forwards cost the same at any b; the search's last one is the row's peak
        predicted, _ = solve_affine(memory.peak, res.ceiling, memory.fixed)
        row.predicted_max_batch = predicted
    else:
        predicted = None

    if res.on_gpu:
        with compiled.strict(timing=False):  # a compiled probe never falls back to eager
            _measure_gpu(cell, res, row, predicted)
        return
    if cell.compile and not cell.model_only:
        # the meta model traces the eager graph: a compiled cell's memory is what the profiler
        # sees of the compiled step where it is timed, never the eager model's figure
        _time_on_cpu(cell, res, row, memory.model)
        return
    # no GPU of the preset's kind here (or model_only): memory from the model, time from the CPU
    b = predicted if cell.batch == "max" else cell.batch
    row.update(max_batch=predicted, memory_source="modeled", batch=b)
    if b == 0:
        row.update(status="oom", reason=f"modeled: b=1 does not fit under {res.ceiling} bytes")
        return
    row.peak_bytes = memory.peak(b)
    if row.peak_bytes > res.ceiling:
        row.update(
            status="oom",
            reason=f"modeled: b={b} peaks at {row.peak_bytes} bytes, "
            f"over the ceiling of {res.ceiling}",
        )
        return
    if cell.model_only:
        row.reason = "model only: no time measured"
        return
    _time_on_cpu(cell, res, row, memory.model)


def _measure_gpu(cell: Cell, res: Resolved, row: Row, predicted: int | None) -> None:
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
        row.update(status="oom", reason="b=1 does not fit", memory_source="measured")
        return
    if cell.batch == "max":
        b, probes = largest_fitting(lambda b: _cuda_fits(work, cell, res, b), max(predicted, 1))
        row.update(max_batch=b, probes=probes, model_error=predicted - b)
    else:
        b = cell.batch
        row.max_batch = None
    if b == 0:
        row.update(
            status="oom",
            reason=f"b=1 does not fit under {res.ceiling} bytes",
            memory_source="measured",
        )
        return
    _feed(work, cell, b, GPU)
    prepare(cell, model, work, dev, row, profile=False)  # afresh at b: its compile time
    try:
        peak = measured_peak_cuda(work, dev, res.usable, grad=workload.grad)
    except torch.OutOfMemoryError:
        why = (
            "passed its probe but ran out of memory when run again (allocator fragmentation)"
            if cell.batch == "max"
            else "does not fit under the ceiling"
        )
        row.update(status="oom", batch=b, memory_source="measured", reason=f"b={b} {why}")
        return
    row.update(
        batch=b,
        peak_bytes=peak.bytes + overhead,
        memory_source="measured",
        peak_reserved_bytes=None if peak.reserved is None else peak.reserved + overhead,
    )
    timings = time_step(
        work,
        dev,
        row,
        grad=workload.grad,
        min_repeats=cell.min_repeats,
        min_seconds=cell.min_seconds,
        flush_l2=cell.flush_l2,
    )
    _put_timing(row, timings, b, "cuda", cell.dtype, cell, res)
    row.update(**work.row_fields())
    if row.contention is not None:  # other processes on the GPU: what torch can read of them
        row.contention[contention.GPU_OTHERS] = contention.gpu_others_bytes(dev)


def _time_on_cpu(cell: Cell, res: Resolved, row: Row, meta: torch.nn.Module) -> None:
    """The cell's step timed on this CPU in fp32, if its estimated cost (from ``meta``, the
    memory model's encoder) fits ``time_budget_s``."""
    workload = cell.workload
    b = workload.cpu_batch(cell)
    if b is None:
        row.reason = f"time not measured: {workload.no_cpu_time}"
        return
    rate, busy = cpu_matmul_rate()
    step_s, timing_s = workload.cost_s(meta, cell, b, rate)  # a step, and the whole timing
    if timing_s > cell.time_budget_s:
        row.reason = (
            f"time skipped: ~{step_s:.1f} s per {workload.what} at b={b} on this CPU; "
            f"its timing (~{timing_s:.0f} s) would exceed time_budget_s={cell.time_budget_s:g}"
        )
        if busy:  # the estimate may be the contention's, not the cell's: say so
            row.reason += "; machine busy: the CPU's rate was measured while contended"
            why = "the GEMM rate that estimates the cell's cost was read on a contended CPU"
            row.contention = {"busy": True, "why": why}
        return
    model = build(cell, res, "cpu", torch.float32)
    x = make_input(b, cell, "cpu", torch.float32)
    min_seconds = min(cell.min_seconds, cell.time_budget_s / 2)
    step = workload.work(model, cell, x, "cpu", gpu=False)
    cpu = torch.device("cpu")
    if prepare(cell, model, step, cpu, row, profile=cell.compile) and cell.compile:
        row.update(batch=b, memory_source="profiled")
    timings = time_step(
        step,
        cpu,
        row,
        grad=workload.grad,
        min_repeats=cell.min_repeats,
        min_seconds=min_seconds,
        # contended repeats are taken again within what is left of the budget, and for no
        # longer than ten times the timing's own length: a busy machine slows a sweep
        # boundedly, and says so, rather than holding it until the machine is quiet
        patience_s=min(cell.time_budget_s - timing_s, max(10 * min_seconds, 1.0)),
    )
    _put_timing(row, timings, b, "cpu", "fp32", cell, res)
    row.update(**step.row_fields())


def _put_timing(
    row: Row, timings: list[Timing], b: int, device: str, dtype: str, cell: Cell, res: Resolved
) -> None:
    """The step's figures from :func:`time_parts`' timings (the last is the whole step's);
    a workload's named parts go to ``time_parts`` by name."""
    timing = timings[-1]
    flops_per_step = (row.flops + (row.flops_backward or 0)) * b  # row.flops is per sequence
    # % of peak only on the preset's own GPU: an H100 standing in for a V100 would read 400 %
    same_gpu = device == "cuda" and res.preset.gpu == row.env["device_name"]
    peak = res.preset.peak_flops.get(dtype) if same_gpu else None
    row.update(
        time_median_s=timing.median,
        time_iqr_s=timing.iqr,
        repeats=timing.repeats,
        time_per_seq_s=timing.median / b,
        time_batch=b,
        time_device=device,
        time_dtype=dtype,
        time_method=timing.method,
        time_samples_s=list(timing.samples),
        flops_per_s=timing.flops_per_s(flops_per_step),
        pct_of_peak=timing.pct_of_peak(flops_per_step, peak),
    )
    if cell.workload.parts:
        row.time_parts = {
            name: {"median_s": t.median, "iqr_s": t.iqr, "samples_s": list(t.samples)}
            for name, t in zip(cell.workload.parts, timings[:-1], strict=True)
        }
    row.env = {**row.env, "threads": timing.threads}
    if timing.contention is not None:
        row.contention = timing.contention.as_dict()


__all__ = ["Cell", "MemoryModel", "modeled_peak", "run_cell", "validate"]
