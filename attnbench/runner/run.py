"""One cell in, one row out: max batch, time, peak memory and FLOPs of the Table 3 encoder.

A cell is a frozen, hashable spec: (mechanism + its parameters, model shape, n, k, b, dtype,
device preset, ceiling). :func:`attnbench.plan.validate` refuses bad cells with one
``ValueError`` line before anything runs and plans the rest; :func:`run_cell` measures the
plan and always returns a row, whose ``status`` says
``ok``, ``oom`` (even b = 1 does not fit, or the fixed b does not), ``skipped`` (cannot run
here, with the reason) or ``error`` (the forward raised, with the message).

Where the cell's preset is a GPU and CUDA is here, everything is real: the model predicts the
max batch, real probes under the ceiling confirm or correct it, and timing is on the GPU at
that batch. Each probe frees what it allocated before the next, and a step whose first call
at a new batch autotunes or compiles makes that call outside the ceiling first. Without
CUDA, memory comes from the model (labelled ``modeled``) and time per sequence is measured
on this CPU in fp32 at ``cpu_batch``, if its estimated cost fits ``time_budget_s``; a cell
over budget says so in ``reason``. The timing, on either device,
is :mod:`attnbench.runner.timed`'s.
"""

from __future__ import annotations

import dataclasses
import gc

import torch

from attnbench import plugins, registry
from attnbench.attention.base import indexed_device
from attnbench.cell import Cell
from attnbench.cell_rules import complete
from attnbench.env import allocated, environment, use_threads
from attnbench.measure import compiled, contention
from attnbench.measure.allocator import replay
from attnbench.measure.allocator_rules import from_setting
from attnbench.measure.memory import measured_peak_cuda
from attnbench.measure.search import largest_fitting, solve_affine
from attnbench.plan import Resolved, validate
from attnbench.quality import tasks
from attnbench.row import Row
from attnbench.runner import prepare, timed
from attnbench.runner.found import Flops, Found, MaxBatch, Memory, Unfinished, assemble, carried
from attnbench.runner.memory_model import MemoryModel, build, feed, make_input
from attnbench.workload import DTYPES, Work

GPU = "cuda"  # the device real GPU runs use (tests put "cpu" here to drive that branch)


def _cuda_fits(work: Work, cell: Cell, res: Resolved, b: int, found: Found) -> tuple[bool, Found]:
    """A real step at b under the ceiling less the fixed overhead, warmed first where it
    autotunes or compiles (:func:`_warm`); OOM is caught, the input's allocation included.
    Fit or not, what the probe allocated is freed before anything else runs. Whether it fit,
    and ``found`` with the warm-up's seconds added."""
    dev = indexed_device(GPU)
    try:
        feed(work, cell, b, GPU)
        found = found.warmed(_warm(work, res, dev))
        measured_peak_cuda(work, dev, res.usable, grad=res.workload.grad)
        return True, found
    except torch.OutOfMemoryError:
        return False, found
    except Exception as e:
        raise carried(found, e) from e
    finally:
        work.x = None
        _release(work)


def _release(work: Work) -> None:
    """Free what a step left (a failed probe's states or gradients, :meth:`Work.release`),
    then the allocator's cached blocks: the next peak is read over the weights alone."""
    work.release()
    gc.collect()  # a traceback's frames hold a failed step's tensors in cycles
    torch.cuda.empty_cache()


def _warm(work: Work, res: Resolved, device: torch.device) -> float | None:
    """Where the step's first call at a new batch autotunes or compiles
    (:func:`prepare.warms`), make that call here: outside the memory cap, before the peak
    statistics are reset, apart from the timing. Its seconds (None: no call was made), which
    add up in ``warmup_s``."""
    if not prepare.warms(res.cell):
        return None
    seconds = prepare.warm(work, device, grad=res.workload.grad)
    _release(work)
    return seconds


def run_cell(cell: Cell, res: Resolved | None = None) -> Row:
    """Measure one cell; always a row (see the module docstring). Validates first. Timed on
    the CPUs this process was given (or fewer, if ``timing.threads`` says so); the caller's
    thread count is back as it was afterwards."""
    res = res or validate(cell)
    cell = complete(cell)  # measured as given with ``res``, its owners' defaults filled in
    env, found = environment(), Found()
    before = torch.get_num_threads()
    try:
        found = Found(threads=(use_threads(cell.timing.threads), allocated()[0]))
        found = _run(cell, res, found)
    except ValueError as e:  # timing.threads above what this process was given
        found = found.stopped("error", str(e))
    finally:
        torch.set_num_threads(before)
    return assemble(cell, res, env, found)


def _run(cell: Cell, res: Resolved, found: Found) -> Found:
    """The cell's figures; a step that raises ends it with what was found before it (the
    record its exception carried out, :class:`~.found.Unfinished`), its status and reason."""
    why = registry.info(cell.attention).unavailable
    if why is not None:  # its forward cannot run here, not even on meta tensors
        return found.stopped("skipped", why)
    try:
        if cell.task.name != "cost":  # a quality beside the cost
            return found.add(quality=tasks.run(cell))
        return _measure(cell, res, found)
    except Exception as e:  # a row with the reason, never a hole in the sweep
        cause = e
        if isinstance(e, Unfinished):
            found, cause = e.found, e.cause
        if isinstance(cause, torch.OutOfMemoryError):
            return found.stopped("oom", _first_line(cause))
        blamed = plugins.fault(cause)  # a plugin's mechanism at fault: named, in its words
        return found.stopped("error", blamed or f"{type(cause).__name__}: {_first_line(cause)}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [repr(e)])[0][:300]


def _measure(cell: Cell, res: Resolved, found: Found) -> Found:
    """The cost cell's figures, each kept as its step returns: FLOPs, the modeled max batch,
    then memory and time on the preset's GPU (:func:`_measure_gpu`), or modeled and on this
    CPU (:func:`_measure_modeled`)."""
    modeled = MemoryModel(cell, res)
    forward, backward = res.workload.flops(modeled.model, cell)  # per sequence
    # flex: the kernel computes whole blocks only; dense attention's count beside it
    dense = modeled.model.dense_flops(1, cell.n) if registry.info(cell.attention).compiles else None
    found = found.add(flops=Flops(forward, backward, dense))
    try:
        found = found.add(attention_params=modeled.model.attention_params())
        found = found.add(workload=res.workload.describe(modeled.model, cell))
        predicted = None
        if cell.batch == "max":
            # meta forwards cost the same at any b; the search's last one is the row's peak. The
            # allocation-only answer bounds what the allocator's replay lets fit (measure/fit.py)
            allocated, _ = solve_affine(modeled.peak, res.ceiling, modeled.fixed)
            predicted = allocated
            if modeled.replayed:  # a CPU has no caching allocator; decode models its own peak
                predicted = modeled.replayed_max_batch(allocated, res.usable, cell.allocator)
            found = found.add(max_batch=MaxBatch(predicted, allocated=allocated))
        b = predicted if cell.batch == "max" else cell.batch
        extra = res.workload.modeled(modeled.model, cell, b, res.preset)  # a GPU step, modeled
        found = found.add(workload={**found.workload, **extra})
        if res.on_gpu:
            with compiled.strict(timing=False):  # a compiled probe never falls back to eager
                return _measure_gpu(cell, res, found, predicted)
        if cell.compile and not cell.model_only:
            # the meta model traces the eager graph: a compiled cell's memory is what the
            # profiler sees of the compiled step where it is timed, never the eager model's
            return timed.time_on_cpu(cell, res, found, modeled.model)
        # no GPU of the preset's kind here (or model_only): memory modeled, time from the CPU
        return _measure_modeled(cell, res, found, modeled, b)
    except Exception as e:
        raise carried(found, e) from e


def _measure_modeled(
    cell: Cell, res: Resolved, found: Found, modeled: MemoryModel, b: int
) -> Found:
    """The memory at b modeled (its peak, and on a GPU preset what the caching allocator
    reserves of it, replayed), then the step timed on this CPU."""
    found = found.add(memory=Memory("modeled", b))
    if b == 0:
        fits_live = found.max_batch is not None and bool(found.max_batch.allocated)
        how = "fits in live bytes, but the caching allocator (replayed) cannot reserve it"
        what = how if fits_live else "does not fit"
        return found.stopped("oom", f"modeled: b=1 {what} under {res.ceiling} bytes")
    try:
        peak = modeled.peak(b)
        found = found.add(memory=Memory("modeled", b, peak))
        if peak > res.ceiling:
            why = f"peaks at {peak} bytes, over the ceiling of {res.ceiling}"
            return found.stopped("oom", f"modeled: b={b} {why}")
        if modeled.replayed:  # what the allocator reserves, and fits?
            again = replay(modeled.trace(b), res.usable, from_setting(cell.allocator))
            reserved = again.peak_reserved + modeled.overhead
            found = found.add(memory=Memory("modeled", b, peak, reserved, again.fragmentation))
            if not again.fits:
                why = "but the caching allocator (replayed) cannot reserve it under the ceiling"
                why = f"fits in {peak} bytes, {why} of {res.ceiling}"
                return found.stopped("oom", f"modeled: b={b} {why}")
        if cell.model_only:
            return found.add(reason="model only: no time measured")
        return timed.time_on_cpu(cell, res, found, modeled.model)
    except Exception as e:
        raise carried(found, e) from e


def _measure_gpu(cell: Cell, res: Resolved, found: Found, predicted: int | None) -> Found:
    """Real probes confirm or correct the model's max batch; then peak memory and time at
    that batch, on the GPU (:func:`_measure_gpu_at`). A workload that primes (a training
    step's optimizer state) runs one step at b = 1 first, as that state exists in every step
    after a real run's first."""
    dtype, workload = DTYPES[cell.dtype], res.workload
    try:
        model = build(cell, res, GPU, dtype)
        work = workload.work(model, cell, make_input(1, cell, GPU, dtype), GPU, gpu=True)
        if cell.compile:  # the probes run the compiled step: its memory, not the eager one's
            compiled.compile_layers(model, cell.compile_mode, workload.compile_dynamic)

        def fits(b: int) -> bool:  # a probe, whose warm-up's seconds are kept as it returns
            nonlocal found
            fit, found = _cuda_fits(work, cell, res, b, found)
            return fit

        if workload.primes and not fits(1):
            return found.add(memory=Memory("measured")).stopped("oom", "b=1 does not fit")
        if predicted is not None:  # batch=max
            b, probes = largest_fitting(fits, max(predicted, 1))
            assert found.max_batch is not None  # the model's, found before any probe
            found = found.add(
                max_batch=dataclasses.replace(found.max_batch, probed=b, probes=probes)
            )
        else:
            b = cell.batch
        if b == 0:
            why = f"b=1 does not fit under {res.ceiling} bytes"
            return found.add(memory=Memory("measured")).stopped("oom", why)
        return _measure_gpu_at(cell, res, found, model, work, b)
    except Exception as e:
        raise carried(found, e) from e


def _measure_gpu_at(
    cell: Cell, res: Resolved, found: Found, model: torch.nn.Module, work: Work, b: int
) -> Found:
    """Peak memory and time at b on the GPU, the step made ready afresh at b (its compile
    time) and warmed there first (:func:`_warm`)."""
    dev, overhead = indexed_device(GPU), res.preset.overhead_bytes
    feed(work, cell, b, GPU)
    try:
        found = timed.ready(found, cell, model, work, dev, profile=False)
        try:
            found = found.warmed(_warm(work, res, dev))
            peak = measured_peak_cuda(work, dev, res.usable, grad=res.workload.grad)
        except torch.OutOfMemoryError:
            why = (
                "passed its probe but ran out of memory when run again (allocator fragmentation)"
                if cell.batch == "max"
                else "does not fit under the ceiling"
            )
            return found.add(memory=Memory("measured", b)).stopped("oom", f"b={b} {why}")
        reserved = None if peak.reserved is None else peak.reserved + overhead
        found = found.add(memory=Memory("measured", b, peak.bytes + overhead, reserved))
        found = timed.time_at(
            found,
            work,
            cell=cell,
            res=res,
            device=dev,
            batch=b,
            where="cuda",
            dtype=cell.dtype,
            min_seconds=cell.timing.min_seconds,
            flush_l2=cell.timing.flush_l2,
        )
        if found.contention is not None:  # other processes on the GPU: what torch reads of them
            others = contention.gpu_others_bytes(dev)
            found = found.add(contention={**found.contention, contention.GPU_OTHERS: others})
        return found
    except Exception as e:
        raise carried(found, e) from e


__all__ = ["run_cell"]
