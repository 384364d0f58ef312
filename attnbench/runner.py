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

import contextlib
import functools
import gc
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

import attnbench
from attnbench.cell import Cell, Resolved, validate
from attnbench.env import environment
from attnbench.measure.autocast import emulated_autocast
from attnbench.measure.fused import device_kernels
from attnbench.measure.memory import measured_peak_cuda, module_bytes, rounded, tracked_peak
from attnbench.measure.search import largest_fitting, solve_affine
from attnbench.measure.timing import Timing, time_forward, time_parts
from attnbench.row import Row
from attnbench.train import PARTS, TrainStep

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


GPU = "cuda"  # the device real GPU runs use (tests put "cpu" here to drive that branch)


def _build(cell: Cell, res: Resolved, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The encoder in ``dtype`` on ``device``, weights from a fixed seed.

    On meta it is built in place (no memory at any size). Otherwise it is built on the CPU
    and moved and cast in one step: building in fp32 on the GPU and casting there would
    leave the freed fp32 blocks stranded in the caching allocator, under the ceiling.
    """
    torch.manual_seed(0)
    with torch.device("meta" if device == "meta" else "cpu"):
        model = attnbench.build_model(
            cell.attention,
            layers=cell.layers,
            d_model=cell.d_model,
            n_heads=cell.n_heads,
            d_ff=cell.d_ff,
            max_seq_len=cell.n,
            **res.params,
        )
    if cell.mode == "inference":
        return model.to(device=device, dtype=dtype).eval()
    model.checkpoint = cell.checkpoint
    return model.to(device=device, dtype=torch.float32).train()  # fp32 master weights


def _input(b: int, cell: Cell, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Random (never zero) embeddings from a fixed seed; fp32 for training (an embedding's
    output under mixed precision: autocast casts it where an op asks)."""
    dtype = torch.float32 if cell.mode == "train" else dtype
    if device == "meta":
        return torch.empty(b, cell.n, cell.d_model, device="meta", dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    return torch.randn(b, cell.n, cell.d_model, generator=gen, device=device, dtype=dtype)


def modeled_peak(model: torch.nn.Module, cell: Cell, b: int, overhead: int) -> int:
    """Peak bytes of a forward at batch b on the preset: meta forward + weights + input +
    the preset's fixed overhead."""
    dtype = DTYPES[cell.dtype]
    x = _input(b, cell, "meta", dtype)
    base = module_bytes(model) + rounded(x.nbytes) + overhead
    return tracked_peak(lambda: model(x), base)


def train_step(
    model: torch.nn.Module, cell: Cell, x: torch.Tensor, device: str, *, gpu: bool
) -> TrainStep:
    """The cell's training step on ``device`` (``meta``, ``cpu`` or the GPU).

    Mixed precision on the GPU: ``torch.autocast`` (and a GradScaler for fp16); on meta,
    the emulation of the GPU's autocast (:class:`MemoryModel` enters it around a
    checkpointed layer's recompute too). The CPU times fp32, no autocast. ``gpu``: the step
    is (or models) one on a GPU, where PyTorch's optimizers default to ``foreach`` and the
    fused attention kernels run.
    """
    low = DTYPES[cell.dtype]
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    scaler = None
    if low != torch.float32 and device == "meta":
        autocast = functools.partial(emulated_autocast, "cuda", low)
    elif low != torch.float32 and device != "cpu":
        autocast = functools.partial(torch.autocast, "cuda", dtype=low)
        scaler = torch.amp.GradScaler("cuda") if low == torch.float16 else None
    return TrainStep(model, x, cell.optimizer, foreach=gpu, autocast=autocast, scaler=scaler)


@contextlib.contextmanager
def _entered(*contexts: AbstractContextManager[Any]) -> Any:
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


class MemoryModel:
    """The modeled peak of one cell at any batch: a meta forward (inference) or a meta
    training step, plus what is live before it: weights, the optimizer's state (made by one
    first step, as in a real run after step one), the input and the preset's overhead."""

    def __init__(self, cell: Cell, res: Resolved) -> None:
        self.cell, self.overhead = cell, res.preset.overhead_bytes
        self.model = _build(cell, res, "meta", DTYPES[cell.dtype])
        self.fixed = module_bytes(self.model) + self.overhead
        self.step: TrainStep | None = None
        self.kernels = "cuda" if res.preset.is_gpu else "cpu"
        if cell.mode == "train":
            self.step = train_step(self.model, cell, self._x(1), "meta", gpu=res.preset.is_gpu)
            # a checkpointed layer's second run, in the backward: the same kernels and casts
            self.model.recompute_context = lambda: _entered(
                device_kernels(self.kernels), self.step.autocast()
            )
            with device_kernels(self.kernels):
                self.step()  # makes the optimizer's state
            on_host = res.preset.is_gpu  # Adam's step counters live on the host
            state = self.step.state_tensors(host_steps=on_host)
            self.fixed += sum(rounded(t.untyped_storage().nbytes()) for t in state)

    def _x(self, b: int) -> torch.Tensor:
        return _input(b, self.cell, "meta", DTYPES[self.cell.dtype])

    @functools.cache  # noqa: B019 (one model per cell, dropped with it)
    def peak(self, b: int) -> int:
        if self.step is None:
            return modeled_peak(self.model, self.cell, b, self.overhead)
        self.step.x = self._x(b).requires_grad_(True)
        with device_kernels(self.kernels):
            return tracked_peak(self.step, self.fixed + rounded(self.step.x.nbytes), grad=True)


def _gpu_work(
    model: torch.nn.Module, step: TrainStep | None, cell: Cell, b: int
) -> Callable[[], Any]:
    """What one GPU probe runs at batch b: the forward, or the training step (whose
    optimizer state is already there) on a new input."""
    x = _input(b, cell, GPU, DTYPES[cell.dtype])
    if step is None:
        return lambda: model(x)
    step.x = x.requires_grad_(True)
    return step


def _cuda_fits(
    model: torch.nn.Module, step: TrainStep | None, cell: Cell, res: Resolved, b: int
) -> bool:
    """A real forward (or training step) at b under the ceiling less the fixed overhead;
    OOM is caught, the input's allocation included."""
    dev = torch.device(GPU)
    work = None
    try:
        work = _gpu_work(model, step, cell, b)
        measured_peak_cuda(work, dev, res.usable, grad=step is not None)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        work = None
        gc.collect()
        torch.cuda.empty_cache()


@functools.cache
def cpu_matmul_rate() -> float:
    """fp32 GEMM FLOP/s of this CPU, measured once, to estimate a CPU forward's cost."""
    a, w = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = time_forward(lambda: a @ w, torch.device("cpu"), min_repeats=5, min_seconds=0.2)
    return 2 * 1024**3 / t.median


def run_cell(cell: Cell, res: Resolved | None = None) -> Row:
    """Measure one cell; always a row (see the module docstring). Validates first."""
    res = res or validate(cell)
    row = Row.new(cell, res.ceiling, res.preset.overhead_bytes, environment())
    why = attnbench.info(cell.attention).unavailable
    if why is not None:  # its forward cannot run here, not even on meta tensors
        row.update(status="skipped", reason=why)
        return row
    try:
        if cell.task != "cost":  # a quality beside the cost (issue #13)
            from attnbench.quality import tasks

            row.update(quality=tasks.run(cell))
        else:
            _measure(cell, res, row)
    except torch.OutOfMemoryError as e:
        row.update(status="oom", reason=_first_line(e))
    except Exception as e:  # a row with the reason, never a hole in the sweep
        row.update(status="error", reason=f"{type(e).__name__}: {_first_line(e)}")
    return row


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [repr(e)])[0][:300]


def _measure(cell: Cell, res: Resolved, row: Row) -> None:
    memory = MemoryModel(cell, res)
    row.flops = memory.model.flops(1, cell.n)  # per sequence; per forward below
    if cell.mode == "train":
        row.flops_backward = memory.model.flops_backward(1, cell.n)
    if cell.batch == "max":
        # meta forwards cost the same at any b; the search's last one is the row's peak
        predicted, _ = solve_affine(memory.peak, res.ceiling, memory.fixed)
        row.predicted_max_batch = predicted
    else:
        predicted = None

    if res.on_gpu:
        _measure_gpu(cell, res, row, predicted)
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
    _time_on_cpu(cell, res, row)


def _measure_gpu(cell: Cell, res: Resolved, row: Row, predicted: int | None) -> None:
    """Real probes confirm or correct the model's max batch; then peak memory and time at
    that batch, on the GPU. A training step's optimizer state is made first, by one step
    at b = 1, as it exists in every step after a real run's first."""
    dtype, dev, train = DTYPES[cell.dtype], torch.device(GPU), cell.mode == "train"
    overhead = res.preset.overhead_bytes
    model = _build(cell, res, GPU, dtype)
    step = None
    if train:
        step = train_step(model, cell, _input(1, cell, GPU, dtype), GPU, gpu=True)
        if not _cuda_fits(model, step, cell, res, 1):
            row.update(status="oom", reason="b=1 does not fit", memory_source="measured")
            return
    if cell.batch == "max":
        b, probes = largest_fitting(
            lambda b: _cuda_fits(model, step, cell, res, b), max(predicted, 1)
        )
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
    work = _gpu_work(model, step, cell, b)
    try:
        peak = measured_peak_cuda(work, dev, res.usable, grad=train)
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
    parts = work.parts if train else [work]
    timings = time_parts(
        parts,
        dev,
        grad=train,
        min_repeats=cell.min_repeats,
        min_seconds=cell.min_seconds,
        flush_l2=cell.flush_l2,
    )
    _put_timing(row, timings, b, "cuda", cell.dtype, cell, res)


def _time_on_cpu(cell: Cell, res: Resolved, row: Row) -> None:
    b = cell.cpu_batch
    flops = row.flops + (row.flops_backward or 0)
    estimate = flops * b / cpu_matmul_rate()  # seconds per step, at the GEMM rate
    work = estimate * (2 + cell.min_repeats)  # warm-up and repeats
    what = "training step" if cell.mode == "train" else "forward"
    if work > cell.time_budget_s:
        row.reason = (
            f"time skipped: ~{estimate:.1f} s per {what} at b={b} on this CPU; "
            f"{2 + cell.min_repeats} {what}s exceed time_budget_s="
            f"{cell.time_budget_s:g}"
        )
        return
    model = _build(cell, res, "cpu", torch.float32)
    x = _input(b, cell, "cpu", torch.float32)
    train = cell.mode == "train"
    parts = train_step(model, cell, x, "cpu", gpu=False).parts if train else [lambda: model(x)]
    timings = time_parts(
        parts,
        torch.device("cpu"),
        grad=train,
        min_repeats=cell.min_repeats,
        min_seconds=min(cell.min_seconds, cell.time_budget_s / 2),
    )
    _put_timing(row, timings, b, "cpu", "fp32", cell, res)


def _put_timing(
    row: Row, timings: list[Timing], b: int, device: str, dtype: str, cell: Cell, res: Resolved
) -> None:
    """The step's figures from :func:`time_parts`' timings (the last is the whole step's);
    a training step's parts go to ``time_parts`` by name."""
    timing = timings[-1]
    flops_per_step = (row.flops + (row.flops_backward or 0)) * b  # row.flops is per sequence
    rate = flops_per_step / timing.median
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
        flops_per_s=rate,
        pct_of_peak=None if peak is None else 100 * rate / peak,
    )
    if cell.mode == "train":
        row.time_parts = {
            name: {"median_s": t.median, "iqr_s": t.iqr, "samples_s": list(t.samples)}
            for name, t in zip(PARTS, timings[:-1], strict=True)
        }
    row.env = {**row.env, "threads": timing.threads}


__all__ = ["Cell", "modeled_peak", "run_cell", "validate"]
