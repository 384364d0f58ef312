"""What every workload is made of: :class:`Work` (the step it times), :class:`Workload` (what
differs between timing a forward, a training step or decode), the encoder it builds and its
random inputs. The built-ins and a plugin's workload import this module; the package
(:mod:`attnbench.workload`) registers them and finds them by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnbench.measure.timing import Timing, time_parts
from attnbench.model import cell_encoder as encoder  # the workloads' encoder of a cell
from attnbench.registry import Info
from attnbench.settings import DEFAULT_MODE, Setting

if TYPE_CHECKING:
    from attnbench.cell import Cell
    from attnbench.measure.presets import Preset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# the paper's workload: its cells leave ``mode`` out of their key (cells from before workloads
# existed were all of it, and their run directories still resume), and only its tables stand
# beside the paper's
DEFAULT = DEFAULT_MODE
# The most Python-level steps (a chunk of a recurrence, a packed document, a prefill call;
# each a handful of ops) one step may take over every layer where no time estimate sees them:
# the memory model traces them one at a time on meta (:func:`attnbench.cell_rules.
# check_traceable`), 3-5 traced steps per cell before the time budget is consulted. Measured
# on a 2-core CPU: 2.4 ms a step for retnet's forward, 7 ms for deltanet's training step, so
# at this bound about 2 minutes of modeling for a forward and 8 for a training step.
MAX_LOOP_STEPS = 1 << 14


class TooLarge(ValueError):
    """A cell that cannot hold even its smallest case under its ceiling (decode: the weights
    and one sequence's state): a single cell is refused in one line; a sweep leaves it out
    beside the cells that fit, as it leaves out k >= n, and says so once."""


class Work:
    """What one step of a workload runs, as the parts it is timed in.

    ``x`` is the step's input; the runner sets a new one for each batch it probes.
    :meth:`__call__` runs every part in order (a memory probe, a GPU probe); timing times
    each part apart and their sum. A workload with one part (a forward) has ``parts`` of
    length one and no names for them.
    """

    def __init__(self, model: nn.Module, x: Tensor) -> None:
        self.model, self.x = model, x

    @property
    def parts(self) -> Sequence[Callable[[], Any]]:
        return (self,)

    def __call__(self) -> Any:
        return self.model(self.x)

    def warm(self) -> None:
        """Run the step until a compiled model has compiled every graph timing will run: once,
        for a step of one shape (decode: until its growing lengths have turned symbolic)."""
        self()

    def state_tensors(self) -> list[Tensor]:
        """Tensors a first step made that every later step keeps (an optimizer's state)."""
        return []

    def release(self) -> None:
        """Drop what a step keeps on this object and a step that stopped midway (out of
        memory in a probe) left behind, so that the next probe's peak is not read with it
        alive; what :meth:`state_tensors` holds stays. A forward keeps nothing."""

    def modeled_peak(self, base: int) -> int | None:
        """The step's peak on meta above nothing, ``base`` bytes counted live, where tracking
        one call of it is not the figure (decode: the larger of two scenarios); None: the
        runner tracks one call."""
        return None

    def time(self, device: torch.device, **timing: Any) -> list[Timing]:
        """Time the step: one :class:`~attnbench.measure.timing.Timing` per part, then the
        whole step's (``time_parts``' contract); ``timing`` are its keyword arguments."""
        return time_parts(self.parts, device, **timing)

    def row_fields(self) -> dict[str, Any]:
        """Row fields of the workload's own that timing the step found (decode: the prefill's
        time, the bandwidth), set on the row after the step's time."""
        return {}


class Workload:
    """One kind of measurement. Subclasses set the class attributes and override what
    differs; the defaults describe a plain forward of the encoder.

    ``settings`` declare what this workload takes beyond every cell's fields (train:
    ``optimizer``, ``checkpoint``), each a top-level config key with its default, check and
    doc (:class:`~attnbench.settings.Setting`). A cell carries their values as this
    workload's set (``Cell.workload``); those in use (:meth:`in_use`) and not at their
    default enter its key (so two settings never share a stored row, and a setting added
    with a default leaves every key as it was: :func:`attnbench.cell_key.key`) and are row
    fields of their own, null in other workloads' rows. A setting's null is its default:
    no setting may take null for another value (a row stored before a setting was declared,
    named in :attr:`later`, reads as its default).
    ``parts`` names the timed parts when there are several (they are stored in
    ``time_parts``); ``grad`` says whether a step needs autograd (memory is then
    tracked with it and timing leaves ``inference_mode`` off). ``primes``: a first step
    leaves state behind (an optimizer's), so it is run once, at b = 1, before any probe.
    """

    name: str = ""
    doc: str = ""  # one line: what is measured
    what: str = "forward"  # what one step is called in messages ("2 s per forward")
    grad: bool = False
    primes: bool = False
    settings: tuple[Setting, ...] = ()
    # settings declared after rows of this workload were stored: a row without one reads
    # as its default, which is what every row before it measured (decode's contexts); a
    # row without another of its settings is not a row of this workload (in no table)
    later: tuple[str, ...] = ()
    # its modeled peak is one traced call of the step, which the caching allocator's replay
    # follows (attnbench.measure.fit); False where the workload's work models its own
    # scenario (Work.modeled_peak: decode's larger of two), whose max batch is live bytes'
    replays: bool = True
    parts: tuple[str, ...] = ()
    # compile=true: torch.compile's ``dynamic`` for this step (attnbench.measure.compiled):
    # False, one shape per batch; None where a step's shapes change by design (decode)
    compile_dynamic: bool | None = False
    # True: it runs the causal model whatever the config's ``causal`` says (a decoder), so a
    # cell read from a config sets the mechanism's ``causal`` for it (attnbench.sweep.cells)
    causal: bool = False

    def refuses(self, info: Info) -> str | None:
        """Why a mechanism (by its registry info) cannot run this workload, or None."""
        return None

    def refuses_cell(self, cell: Cell) -> str | None:
        """Why a mechanism cannot run this workload with the cell's own settings (packed: a
        mechanism that cannot pack, at layout=packed), or None: a sweep leaves such a cell
        out, a single cell is refused."""
        return None

    def in_use(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Of a cell's (or a row's) values of this workload's settings, those its step uses:
        all of them, but another setting's value may leave one unused (decode's draw, with
        every prompt n). The one answer to "which settings does this cell use", asked by the
        cell's key and by reports grouping rows."""
        return settings

    def refuses_on_cpu(self, info: Info) -> str | None:
        """Why a mechanism cannot run this workload where its cell runs on the CPU (no GPU of
        the preset's here), or None: FlexAttention has no backward on a CPU."""
        return None

    def check(self, cell: Cell, params: dict[str, Any], usable: int) -> None:
        """Refuse, in one ``ValueError`` line, a cell this workload cannot measure beyond what
        every cell is checked for; ``usable``: the bytes its allocator may hand out."""

    def loop_steps(self, cell: Cell, layer: nn.Module) -> tuple[int, str]:
        """The Python-level steps one layer takes in one step of this workload
        (:meth:`~attnbench.attention.base.MultiHeadAttention.loop_steps`: a chunked
        recurrence's chunks, a packed row's documents), which the memory model traces on meta
        one by one, and the key that sets their number: ``n`` for a forward of n positions."""
        return layer.loop_steps(cell.n), "n"

    def input_shape(self, cell: Cell, b: int) -> tuple[int, ...]:
        """The step's input at batch b: b sequences of n embeddings."""
        return (b, cell.n, cell.model.d_model)

    def cpu_batch(self, cell: Cell) -> int | None:
        """The batch a CPU times when the preset's GPU is not here (``timing.cpu_batch``);
        None: this cell's time needs the preset's GPU (the reason is :attr:`no_cpu_time`)."""
        return cell.timing.cpu_batch

    no_cpu_time = ""  # why a cell whose cpu_batch is None is not timed on a CPU

    def cost_s(
        self, model: nn.Module, cell: Cell, b: int, flops_per_s: float
    ) -> tuple[float, float]:
        """Estimated seconds of one step at batch b on a CPU of ``flops_per_s`` (its matmul
        FLOPs at that rate), and of the whole timing (two warm-ups and ``min_repeats``
        steps): what ``time_budget_s`` is held against."""
        forward, backward = self.flops(model, cell)
        step = (forward + (backward or 0)) * b / flops_per_s
        return step, step * (2 + cell.timing.min_repeats)

    def label(self, cell: Cell) -> str | None:
        """What a progress line and a report add to the mechanism's label, or None. ``cell``
        may be a row too: read a setting with :func:`setting`."""
        return None

    def caption(self, row: Any) -> str | None:
        """What a ratio table's caption says first about rows of this workload, or None."""
        return f"{self.label(row) or self.name} (the paper has no such table)"

    def input_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The input's dtype for a cell of ``dtype``."""
        return dtype

    def build(
        self, cell: Cell, params: dict[str, Any], device: str, dtype: torch.dtype
    ) -> nn.Module:
        """The encoder in ``dtype`` on ``device``, weights from a fixed seed, in eval mode.

        On meta it is built in place (no memory at any size). Otherwise it is built on the
        CPU and moved and cast in one step: building in fp32 on the GPU and casting there
        would leave the freed fp32 blocks stranded in the caching allocator, under the
        ceiling.
        """
        return encoder(cell, params, device).to(device=device, dtype=dtype).eval()

    def work(self, model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool) -> Work:
        """The step on ``device`` (``meta``, ``cpu`` or the GPU). ``gpu``: the step is (or
        models) one on a GPU, where defaults differ (optimizers' ``foreach``, fused
        attention kernels)."""
        return Work(model, x)

    def flops(self, model: nn.Module, cell: Cell) -> tuple[int, int | None]:
        """Matmul FLOPs per sequence: the forward's, and the backward's (None: no backward)."""
        return model.flops(1, cell.n), None

    def describe(self, model: nn.Module, cell: Cell) -> dict[str, Any]:
        """Row fields of the workload's own known from the model alone (on meta, in the
        cell's dtype), set before anything is measured: none here."""
        return {}

    def modeled(
        self, model: nn.Module, cell: Cell, b: int | None, preset: Preset
    ) -> dict[str, Any]:
        """Row fields of the workload's own modeled at batch b on ``preset`` (the model on
        meta, in the cell's dtype), once the max batch is known: none here."""
        return {}


def setting(item: Any, name: str) -> Any:
    """A workload setting's value on a cell (its workload's set, ``Cell.settings``) or on a
    stored row (a field of its own): labels and captions name both alike."""
    values = getattr(item, "settings", None)
    return values[name] if isinstance(values, dict) else getattr(item, name, None)


def random_input(workload: Workload, cell: Cell, b: int, device: str, dtype: torch.dtype) -> Tensor:
    """Random (never zero) embeddings from a fixed seed, in the workload's input dtype; a
    workload with autograd gets an input that requires grad, as an embedding's output."""
    dtype, shape = workload.input_dtype(dtype), workload.input_shape(cell, b)
    if device == "meta":
        x = torch.empty(shape, device="meta", dtype=dtype)
    else:
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return x.requires_grad_(True) if workload.grad else x
