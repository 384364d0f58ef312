"""What a cell's measuring steps return, and :func:`assemble`, the one place a row is made of it.

Each step of :mod:`attnbench.runner.run` returns a value: the model's FLOPs, the max batch, the
memory figure, what compiling cost, the step's timing (:class:`~attnbench.measure.timing.
StepTiming`), the workload's own figures. The function that calls a step keeps its value in
the cell's :class:`Found`, a frozen record it replaces with :meth:`Found.add` as each step
returns, and hands the record back to its own caller: a figure reaches the row only as a
value handed back, never by a step writing into a shared holder.

A step that raises leaves the figures of the steps before it in the row, beside the status
and reason its exception gave. The top, which makes the row, does not hold the latest record
(the function that called the step does), so each function that adds to the record raises
what is raised after its first figure (by its own steps or a function it calls) as
:class:`Unfinished`, carrying its latest record (:func:`carried`), out to
:func:`attnbench.runner.run.run_cell`, which makes the row of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnbench.measure.timing import StepTiming
from attnbench.row import Row
from attnbench.row.fields import DERIVE

if TYPE_CHECKING:
    from attnbench.cell import Cell
    from attnbench.plan import Resolved


@dataclass(frozen=True)
class Flops:
    """Matmul FLOPs per sequence: the forward's, the backward's (None: no backward) and,
    where the kernel skips blocks (flex), the forward's as dense attention computes them."""

    forward: int
    backward: int | None
    dense: int | None = None

    @property
    def per_sequence(self) -> int:
        """What one sequence of a step costs: forward and backward."""
        return self.forward + (self.backward or 0)


@dataclass(frozen=True)
class MaxBatch:
    """The largest batch under the ceiling: the memory model's prediction, and what real
    probes found of it (``probes`` of them; None and 0 where none ran)."""

    predicted: int
    probed: int | None = None
    probes: int = 0
    allocated: int | None = None  # the allocation-only answer, beside the replayed one

    @property
    def model_error(self) -> int | None:
        """The prediction less what the probes found."""
        return None if self.probed is None else self.predicted - self.probed


@dataclass(frozen=True)
class Memory:
    """The memory figure: where it comes from (``measured``, ``modeled``, ``profiled``), the
    batch it is of, its peak and the allocator's reserved peak (on CUDA, measured; modeled,
    replayed: :mod:`attnbench.measure.allocator`; None: not taken)."""

    source: str
    batch: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    fragmentation: float | None = None  # modeled: the replay's reserved over allocated, less 1


@dataclass(frozen=True)
class Compiled:
    """What ran compiled (``layers``, or ``kernel``: a mechanism that compiles its own), and
    the first call at the timed batch: its seconds, compilation included, and the graphs."""

    what: str
    seconds: float
    graphs: int


@dataclass(frozen=True, slots=True)
class Found:
    """What a cell's steps have returned so far; frozen, so that a figure reaches the row only
    as a value handed back (:meth:`add`, whose misspelt name raises). A step that stops the
    cell says why (:meth:`stopped`); ``status`` stays ``ok`` otherwise, and a ``reason``
    beside it is a note (no time measured, and why)."""

    status: str = "ok"
    reason: str | None = None
    threads: tuple[int, int] | None = None  # torch's threads and the CPUs given, when set
    quality: dict[str, Any] | None = None
    flops: Flops | None = None
    attention_params: int | None = None  # the model's attention weights (model.attention_params)
    max_batch: MaxBatch | None = None
    memory: Memory | None = None
    mask_build_s: float | None = None
    eager_peak_bytes: int | None = None
    compiled: Compiled | None = None
    warmup_s: float | None = None  # a GPU's warm-ups at each new batch (prepare.warms)
    timing: StepTiming | None = None
    recompiled: int = 0  # graphs compiled while timing (compiled code only; 0, or it raised)
    contention: dict[str, Any] | None = None
    workload: dict[str, Any] = field(default_factory=dict)  # its own fields (describe, row_fields)

    def add(self, **figures: Any) -> Found:
        """This record with ``figures`` (field names) replaced."""
        return dataclasses.replace(self, **figures)

    def stopped(self, status: str, reason: str) -> Found:
        """This record, ended early: ``status`` (``oom``, ``skipped``, ``error``) and why."""
        return self.add(status=status, reason=reason)

    def warmed(self, seconds: float | None) -> Found:
        """This record with a warm-up's ``seconds`` added to ``warmup_s`` (None: none ran)."""
        if seconds is None:
            return self
        return self.add(warmup_s=(self.warmup_s or 0.0) + seconds)


class Unfinished(Exception):
    """A step raised ``cause`` after the cell had found ``found``: the exception as it leaves
    the steps around it, so that the row keeps the figures found before it."""

    def __init__(self, found: Found, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.found, self.cause = found, cause


def carried(found: Found, e: Exception) -> Unfinished:
    """``e`` as it leaves a function whose latest record is ``found`` (raised ``from e``); one
    that already carries a record keeps it: a step inside had found more than its caller."""
    if isinstance(e, Unfinished):
        return Unfinished(e.found, e.cause)
    return Unfinished(found, e)


def assemble(cell: Cell, res: Resolved, env: dict[str, Any], found: Found) -> Row:
    """The row of ``cell`` from what its steps found; a figure no step returned keeps its
    field's default (a failure row: the cell's fields and the reason)."""
    fields: dict[str, Any] = {"status": found.status, "reason": found.reason, **found.workload}
    if found.threads is not None:
        env = {**env, "threads": found.threads[0], "cpus": found.threads[1]}
    if found.quality is not None:
        fields["quality"] = found.quality
    if (flops := found.flops) is not None:
        fields.update(flops=flops.forward, flops_backward=flops.backward)
        if flops.dense is not None:
            fields["flops_dense"] = flops.dense
    if found.attention_params is not None:
        fields["attention_params"] = found.attention_params
    fields.update(_memory_fields(found.memory, found.max_batch))
    if found.mask_build_s is not None:
        fields["mask_build_s"] = found.mask_build_s
    if found.eager_peak_bytes is not None:
        fields["eager_peak_bytes"] = found.eager_peak_bytes
    if (compiled := found.compiled) is not None:
        fields.update(
            compiled=compiled.what,
            compile_s=compiled.seconds,
            compilations=compiled.graphs + found.recompiled,
        )
    if found.warmup_s is not None:
        fields["warmup_s"] = found.warmup_s
    if (timing := found.timing) is not None:
        fields.update(_timing_fields(timing))
        env = {**env, "threads": timing.whole.threads}
    if found.contention is not None:
        fields["contention"] = found.contention
    for name, derive in DERIVE.items():  # a plugin's fields, from the figures found (a
        fields[name] = derive(fields)  # failure row's are fewer: derive reads them with get)
    return Row.new(cell, res.ceiling, res.preset.overhead_bytes, env, **fields)


def _memory_fields(memory: Memory | None, max_batch: MaxBatch | None) -> dict[str, Any]:
    """The max batch (probed where it was, else the model's where memory is modeled) and the
    memory figures at the batch they were taken at."""
    fields: dict[str, Any] = {}
    if max_batch is not None:
        fields["predicted_max_batch"] = max_batch.predicted
        fields["allocated_max_batch"] = max_batch.allocated
        if max_batch.probed is not None:
            fields.update(
                max_batch=max_batch.probed,
                probes=max_batch.probes,
                model_error=max_batch.model_error,
            )
        elif memory is not None and memory.source == "modeled":  # the model's is the figure
            fields["max_batch"] = max_batch.predicted
    if memory is not None:
        fields.update(
            memory_source=memory.source,
            batch=memory.batch,
            peak_bytes=memory.peak_bytes,
            peak_reserved_bytes=memory.reserved_bytes,
            fragmentation=memory.fragmentation,
        )
    return fields


def _timing_fields(timing: StepTiming) -> dict[str, Any]:
    """The step's time and what derives from it; each part's where it has several."""
    fields: dict[str, Any] = dict(
        time_median_s=timing.whole.median,
        time_iqr_s=timing.whole.iqr,
        repeats=timing.whole.repeats,
        time_per_seq_s=timing.per_seq_s,
        time_batch=timing.batch,
        time_device=timing.device,
        time_dtype=timing.dtype,
        time_method=timing.whole.method,
        time_samples_s=list(timing.whole.samples),
        flops_per_s=timing.flops_per_s,
        pct_of_peak=timing.pct_of_peak,
    )
    if timing.parts:
        fields["time_parts"] = {
            name: {"median_s": t.median, "iqr_s": t.iqr, "samples_s": list(t.samples)}
            for name, t in timing.parts.items()
        }
    return fields
