"""The cell: one point of a sweep.

A :class:`Cell` is a frozen, hashable spec — mechanism and its parameters, model shape, n, k,
batch, dtype, device preset, ceiling, mode, and how long to time it. This module makes one
from a row or a config (:meth:`Cell.from_dict`), validates it (:func:`validate`: one
``ValueError`` line naming the parameter, from the rules in :mod:`attnbench.cell_rules`:
the ceiling against the preset, ``k`` against ``n``, causal masking, the settings each
workload and task declares) and labels it (:func:`label`); the key a stored row is found by
is :mod:`attnbench.cell_key`'s. The runner measures a validated cell; the sweep builds cells
from configs; the gate builds its suite from them; reports label rows with the same
:func:`label`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from attnbench import registry
from attnbench.cell_rules import (
    budget_of,
    check_allocator,
    check_budget,
    check_causal,
    check_k,
    check_n_fits,
    check_settings,
    check_traceable,
    on_gpu,
    resolve_ceiling,
)
from attnbench.measure import presets
from attnbench.quality import tasks
from attnbench.settings import DEFAULTS, defaults
from attnbench.validators import check_choice, check_int
from attnbench.workload import DEFAULT as DEFAULT_MODE
from attnbench.workload import Workload
from attnbench.workload import find as find_workload
from attnbench.workload import get as get_workload

MODEL_FIELDS = ("layers", "d_model", "n_heads", "d_ff")


_D = DEFAULTS  # the model's, timing's and compiling's declared defaults (attnbench.settings)


@dataclass(frozen=True)
class Cell:
    attention: str
    n: int
    k: int | None = None  # the mechanism's budget (Linformer's k, Performer's nb_features)
    batch: int | str = "max"
    dtype: str = "fp16"
    device: str = "v100_16gb"
    ceiling_bytes: int | None = None  # default: the preset's whole memory
    params: tuple[tuple[str, Any], ...] = ()  # the mechanism's own, as sorted (key, value)
    layers: int = _D["layers"]
    d_model: int = _D["d_model"]
    n_heads: int = _D["n_heads"]
    d_ff: int = _D["d_ff"]
    min_repeats: int = _D["min_repeats"]
    min_seconds: float = _D["min_seconds"]
    cpu_batch: int = _D["cpu_batch"]
    time_budget_s: float = _D["time_budget_s"]
    flush_l2: bool = _D["flush_l2"]
    threads: int | None = _D["threads"]
    model_only: bool = False  # memory from the model alone, no real probes, no timing
    mode: str = DEFAULT_MODE  # the workload's name (attnbench.workload.names())
    # that workload's declared settings, as sorted (key, value), its defaults filled in; a
    # mapping is taken too: Cell("vanilla", 512, mode="train", mode_settings={"checkpoint": True})
    mode_settings: tuple[tuple[str, Any], ...] = ()
    kv_heads: int | None = _D["kv_heads"]
    compile: bool = _D["compile"]
    compile_mode: str = _D["compile_mode"]
    allocator: str = _D["allocator"]  # PyTorch's caching allocator's settings (see settings)
    task: str = "cost"  # or a quality task of quality.tasks.REGISTRY
    quality: tuple[tuple[str, Any], ...] = ()  # that task's settings, as sorted (key, value)

    def __post_init__(self) -> None:
        """Its workload's and its task's settings complete and sorted, so that a cell that
        names a default and one that leaves it out are one cell (one key, one hash)."""
        given = dict(self.mode_settings)
        work = find_workload(self.mode)
        if work is not None:
            given = {**defaults(work.settings), **given}
        object.__setattr__(self, "mode_settings", as_tuples(sorted(given.items())))
        if self.task != "cost" and self.task in tasks.names():
            quality = {**tasks.REGISTRY[self.task].defaults(), **dict(self.quality)}
            object.__setattr__(self, "quality", as_tuples(sorted(quality.items())))

    @property
    def budget(self) -> str | None:
        """The name of the mechanism's parameter that ``k`` sets (``k``, ``nb_features``),
        or None where it has none in use with the cell's parameters."""
        return budget_of(self.attention, dict(self.params))

    def mechanism_params(self) -> dict[str, Any]:
        """The mechanism's parameters with ``k`` mapped onto its budget parameter."""
        params = dict(self.params)
        if self.budget is not None and self.k is not None:
            params[self.budget] = self.k
        return params

    @property
    def workload(self) -> Workload:
        """What the cell measures (``mode``); an unknown mode is a one-line ``ValueError``."""
        return get_workload(self.mode)

    @property
    def settings(self) -> dict[str, Any]:
        """The cell's values of the settings its workload owns (train: optimizer, checkpoint)."""
        return dict(self.mode_settings)

    @property
    def shape(self) -> dict[str, int]:
        """The model's shape (stored as a row's ``model``); ``kv_heads`` only when set, so
        that the keys of cells from before grouped-query heads stay as they were."""
        shape = {f: getattr(self, f) for f in MODEL_FIELDS}
        return shape if self.kv_heads is None else {**shape, "kv_heads": self.kv_heads}

    @property
    def label(self) -> str:
        """``linformer (sharing=layerwise) n=512 k=128``: what progress lines print."""
        return " ".join(
            [label(self.attention, dict(self.params)), f"n={self.n}"]
            + ([f"k={self.k}"] if self.k is not None else [])
            + [w for w in [self.workload.label(self)] if w]
            + ([compiled_label(self.compile_mode)] if self.compile else [])
            + ([f"task={self.task}"] if self.task != "cost" else [])
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
        """The inverse of :func:`dataclasses.asdict` (JSON turns the params into lists, and
        the values in them: a carried ``listops`` block, MQAR's ``lrs``); a spec stored
        before the workload's settings were its set reads as the same cell."""
        pairs = {f: as_tuples(data.get(f, ())) for f in ("params", "quality", "mode_settings")}
        names = {f.name for f in fields(cls)}
        work = find_workload(data.get("mode", DEFAULT_MODE))
        if "mode_settings" not in data and work is not None:  # a spec stored before: the
            pairs["mode_settings"] = tuple(  # settings were fields of the cell
                (s.name, data[s.name]) for s in work.settings if s.name in data
            )
        return cls(**{k: v for k, v in {**data, **pairs}.items() if k in names})


def as_tuples(value: Any) -> Any:
    """Lists (JSON's arrays) as tuples, at every depth: a cell is hashable."""
    return tuple(as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def label(attention: str, params: dict[str, Any] | None = None) -> str:
    """A mechanism with its own parameters: ``linformer (kernel=eager, sharing=layerwise)``;
    a mechanism without parameters is its name alone. The one label of reports, the gate's
    cells and the sweep's progress lines."""
    inner = ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
    return f"{attention} ({inner})" if inner else attention


def compiled_label(mode: str) -> str:
    """What a label adds for a compiled cell or row: ``compiled``, with its mode unless it is
    the default (``compiled(max-autotune)``)."""
    return "compiled" if mode in (None, "default") else f"compiled({mode})"


@dataclass
class Resolved:
    """What validation learned about a cell, so measuring does not recompute it."""

    preset: presets.Preset
    ceiling: int
    on_gpu: bool
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> int:
        """What torch's allocator may hand out: the ceiling less the preset's overhead."""
        return self.ceiling - self.preset.overhead_bytes


_VALIDATED: dict[tuple[Cell, str], Resolved] = {}


def validate(cell: Cell, preset: presets.Preset | None = None) -> Resolved:
    """One ``ValueError`` line naming the first bad parameter; nothing is run.

    ``preset`` is the device as composed by Hydra (so a user's own preset from
    ``--config-dir`` works); by default it is read from conf/device/ by name. A cell is
    validated once per process: the sweep checks every cell before Hydra starts, and each
    job that then measures one in the same process gets that answer again.
    """
    if preset is None:
        return _validate(cell, None)
    memo = (cell, repr(preset))
    if memo not in _VALIDATED:
        _VALIDATED[memo] = _validate(cell, preset)
    return _VALIDATED[memo]


def _validate(cell: Cell, preset: presets.Preset | None) -> Resolved:
    registry.info(cell.attention)  # unknown mechanism
    check_int("n", cell.n)
    if isinstance(cell.batch, str) and cell.batch != "max":
        raise ValueError(f"batch: must be 'max' or an integer >= 1, got {cell.batch!r}")
    if cell.batch != "max":
        check_int("batch", cell.batch)
    work = cell.workload  # an unknown mode: one line naming the workloads
    if why := work.refuses(registry.info(cell.attention)):  # before causal: decode sets it
        raise ValueError(f"mode: attention={cell.attention} {why}")
    check_k(cell.attention, cell.n, cell.k, dict(cell.params))
    check_budget(cell)
    check_causal(cell)
    check_settings(cell)
    check_choice("task", cell.task, tasks.names())
    if cell.task != "cost" and cell.mode != DEFAULT_MODE:
        raise ValueError(
            f"mode: task={cell.task} measures a quality, not a {work.what}; use {DEFAULT_MODE}"
        )
    if cell.task != "cost":
        tasks.validate(cell)
    preset = preset or presets.load(cell.device)
    preset.check_dtype(cell.dtype)
    ceiling = resolve_ceiling(cell.ceiling_bytes, preset)
    check_n_fits(cell, ceiling - preset.overhead_bytes)
    params = cell.mechanism_params()
    # builds the layer's config and shape checks (d_model % n_heads, kv_heads, ...) on meta
    with torch.device("meta"):
        layer = registry.create(
            cell.attention,
            d_model=cell.d_model,
            n_heads=cell.n_heads,
            max_seq_len=cell.n,
            kv_heads=cell.kv_heads,
            **params,
        )
    work.check(cell, params, ceiling - preset.overhead_bytes)
    check_traceable(cell, layer)  # after the workload's check: a draw is checked there
    gpu = on_gpu(cell, preset)
    check_allocator(cell, preset, gpu)
    if not gpu and (why := work.refuses_on_cpu(registry.info(cell.attention))):
        raise ValueError(f"mode: attention={cell.attention} {why}")
    if why := layer.refuses(cell.dtype, preset.is_gpu):  # a kernel's own dtypes and devices
        raise ValueError(why)
    resolved = Resolved(preset, ceiling, gpu, params)
    if gpu and resolved.usable > (here := torch.cuda.get_device_properties(0).total_memory):
        raise ValueError(
            f"ceiling: {ceiling} bytes less the {preset.overhead_bytes}-byte "
            f"overhead exceed this GPU's {here} bytes"
        )
    return resolved


def spec(cell: Cell, preset: presets.Preset) -> dict[str, Any]:
    """The cell as stored with its row: the ceiling resolved, the model shape grouped."""
    out = asdict(cell)
    out["ceiling_bytes"] = resolve_ceiling(cell.ceiling_bytes, preset)
    out["model"] = cell.shape
    if cell.ceiling_bytes is not None and preset.machine_memory:
        out["ceiling_given"] = True  # not the machine's memory: keyed by its bytes
    return out
