"""The cell: one point of a sweep, as a frozen, hashable spec.

A :class:`Cell` is what is asked for — the mechanism and its parameters, n, k, batch, dtype,
device preset, ceiling — and its parts: the model's shape (:class:`Shape`), its timing
(:class:`TimingSpec`) and the two parts their owners declare (:class:`Part`), its workload
(``mode=``, with that workload's settings) and its quality task (``task=``, with that task's
settings). It knows no workload or task: the plan
(:mod:`attnbench.plan`) completes a cell's parts with their owners' defaults, validates and
resolves it once; the key a stored row is found by is :mod:`attnbench.cell_key`'s. This
module also holds the labels every report, progress line and gate cell names a mechanism by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from attnbench import registry
from attnbench.schedule import canonical, frozen, normal, thawed
from attnbench.settings import COST, DEFAULT_MODE, DEFAULTS

MODEL_FIELDS = ("layers", "d_model", "n_heads", "d_ff")
OPTIONAL_SHAPE = ("kv_heads", "head_dim", "name")  # in a row's ``model`` only where set
SCHEDULE_FIELDS = ("schedule", "kinds")  # the layer schedule (attnbench.schedule)
SHAPE_FIELDS = (*MODEL_FIELDS, *OPTIONAL_SHAPE, *SCHEDULE_FIELDS)
# the timing part's fields, as the stored spec names them
TIMING_FIELDS = ("min_repeats", "min_seconds", "cpu_batch", "time_budget_s", "flush_l2", "threads")


_D = DEFAULTS  # the model's, timing's and compiling's declared defaults (attnbench.settings)


def as_tuples(value: Any) -> Any:
    """Lists (JSON's arrays) as tuples, at every depth: a cell is hashable."""
    return tuple(as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Part:
    """A part of a cell that an owner declares: its name (a workload's, ``mode=``; a quality
    task's, ``task=``) and that owner's settings. The settings are kept as sorted (key, value)
    pairs, a name given twice its last value, so that a cell is hashable and the order they
    were given in does not make two; a mapping is taken too: ``Part("train", {"checkpoint":
    True})``. The owner validates, completes, keys and labels them
    (:mod:`attnbench.cell_rules`, :mod:`attnbench.cell_key`)."""

    name: str
    settings: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", as_tuples(sorted(dict(self.settings).items())))

    def values(self) -> dict[str, Any]:
        """The settings as a mapping."""
        return dict(self.settings)


@dataclass(frozen=True)
class Shape:
    """The model's shape: the stack every layer of a cell is built into."""

    layers: int = _D["layers"]
    d_model: int = _D["d_model"]
    n_heads: int = _D["n_heads"]
    d_ff: int = _D["d_ff"]
    kv_heads: int | None = _D["kv_heads"]  # grouped-query key/value heads; None: n_heads
    head_dim: int | None = _D["head_dim"]  # each head's width; None: d_model / n_heads
    # which mechanism each layer runs (attnbench.schedule): a pattern of kinds, and the kinds
    # it names but the cell's own; None: every layer the cell's mechanism
    schedule: str | None = _D["schedule"]
    kinds: tuple[tuple[str, Any], ...] = ()
    name: str | None = _D["name"]  # a label (a published preset's); None: none

    def __post_init__(self) -> None:
        """A head_dim of d_model / n_heads is the default's: one shape, one key. A schedule
        in its one form (:func:`attnbench.schedule.normal`: however it was written, one
        key; every layer the cell's own mechanism: none), its kinds those it uses, as sorted
        pairs at every depth; a malformed one is one line naming its key."""
        if isinstance(self.head_dim, int) and self.head_dim * self.n_heads == self.d_model:
            object.__setattr__(self, "head_dim", None)
        if isinstance(self.layers, int) and self.layers >= 1:  # else validation names it
            schedule, kinds = normal(self.schedule, self.kinds, self.layers, self.n_heads)
            object.__setattr__(self, "schedule", schedule)  # one schedule, one form (its key)
            object.__setattr__(self, "kinds", frozen(kinds))
        else:
            object.__setattr__(self, "kinds", frozen(self.kinds or ()))

    @property
    def shape(self) -> dict[str, int]:
        """The shape as a row stores it (``model``); ``kv_heads``, ``head_dim`` and ``name``
        only when set, so that the keys of cells from before any existed stay as they were."""
        shape = {f: getattr(self, f) for f in MODEL_FIELDS}
        optional = {f: getattr(self, f) for f in OPTIONAL_SHAPE if getattr(self, f) is not None}
        if self.schedule is not None:  # one line: the pattern and its kinds (its key)
            optional["schedule"] = canonical(self.schedule, self.kinds)
        return {**shape, **optional}


@dataclass(frozen=True)
class TimingSpec:
    """How long a cell is timed, and where: what a key leaves out but a thread count."""

    min_repeats: int = _D["min_repeats"]
    min_seconds: float = _D["min_seconds"]
    cpu_batch: int = _D["cpu_batch"]
    time_budget_s: float = _D["time_budget_s"]
    flush_l2: bool = _D["flush_l2"]
    threads: int | None = _D["threads"]


@dataclass(frozen=True)
class Cell:
    """What every cell has (the mechanism and its parameters, n, its budget ``k``, batch,
    dtype, device preset, ceiling), the model's shape, its timing, how it is compiled and
    allocated, and its two owned parts: the workload and the quality task."""

    attention: str
    n: int
    k: int | None = None  # the mechanism's budget (Linformer's k, Performer's nb_features)
    batch: int | str = "max"
    dtype: str = "fp16"
    device: str = "v100_16gb"
    ceiling_bytes: int | None = None  # default: the preset's whole memory
    params: tuple[tuple[str, Any], ...] = ()  # the mechanism's own, as sorted (key, value)
    model: Shape = Shape()
    timing: TimingSpec = TimingSpec()
    model_only: bool = False  # memory from the model alone, no real probes, no timing
    compile: bool = _D["compile"]
    compile_mode: str = _D["compile_mode"]
    allocator: str = _D["allocator"]  # PyTorch's caching allocator's settings (see settings)
    # the workload (attnbench.workload.names()) and its settings; the plan fills in the
    # workload's defaults (attnbench.cell_rules.complete)
    workload: Part = Part(DEFAULT_MODE)
    task: Part = Part(COST)  # "cost", or a quality task of quality.tasks.REGISTRY

    def __post_init__(self) -> None:
        """The parameters sorted, a name given twice its last value (as a part's settings); a
        part given as anything but its type is a programming error, caught here rather than as
        a name compared with a part."""
        for name, kind in (
            ("model", Shape),
            ("timing", TimingSpec),
            ("workload", Part),
            ("task", Part),
        ):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"Cell.{name}: a {kind.__name__}, got {getattr(self, name)!r}")
        object.__setattr__(self, "params", as_tuples(sorted(dict(self.params).items())))

    @property
    def mode(self) -> str:
        """The workload's name, as rows, keys and config keys call it (``mode=``)."""
        return self.workload.name

    @property
    def settings(self) -> dict[str, Any]:
        """The cell's values of the settings its workload owns (train: optimizer, checkpoint):
        those given, and once planned every one (:func:`attnbench.cell_rules.complete`)."""
        return self.workload.values()

    @property
    def budget(self) -> str | None:
        """The name of the mechanism's parameter that ``k`` sets (``k``, ``nb_features``),
        or None where it has none in use with the cell's parameters."""
        return budget_of(self.attention, self.params)

    def value(self, name: str) -> Any:
        """A declared setting's value (:data:`attnbench.settings.CELL_FIELDS`: the model's,
        timing's, compiling's, the allocator's) by its name, from the part that holds it."""
        for part in (self.model, self.timing, self):
            if name in {f.name for f in fields(part)} - _PARTS:
                return getattr(part, name)
        raise KeyError(f"Cell has no setting {name!r}")

    def mechanism_params(self) -> dict[str, Any]:
        """The mechanism's parameters with ``k`` mapped onto its budget parameter."""
        params = dict(self.params)
        if self.budget is not None and self.k is not None:
            params[self.budget] = self.k
        return params

    def to_dict(self) -> dict[str, Any]:
        """The cell in its stored form, one level: every part's fields beside the cell's own
        (the model's and timing's by their names, the workload as ``mode`` and
        ``mode_settings``, the task as ``task`` and ``quality``), as every stored run holds
        it, so that rows and keys read the same whatever the form in memory."""
        values = {
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PARTS},
            **asdict(self.model),
            "kinds": thawed(self.model.kinds),  # mappings, as a config declares them
            **asdict(self.timing),
            "mode": self.workload.name,
            "mode_settings": self.workload.settings,
            "task": self.task.name,
            "quality": self.task.settings,
        }
        return {name: values[name] for name in STORED}

    @classmethod
    def of(cls, attention: str, n: int, **flat: Any) -> Cell:
        """A cell from its fields named one level, as :meth:`to_dict` names them:
        ``Cell.of("vanilla", 512, mode="train", layers=2, min_repeats=3)``. A name that is
        no field is refused (it would be dropped: a typo measures the default)."""
        unknown = sorted(set(flat) - _FLAT)
        if unknown:
            raise TypeError(
                f"Cell.of: no such field {', '.join(unknown)}; allowed: {sorted(_FLAT)}"
            )
        return cls.from_dict({"attention": attention, "n": n, **flat})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
        """The inverse of :meth:`to_dict` (JSON turns the params into lists, and the values in
        them: a carried ``listops`` block, MQAR's ``lrs``); keys that are no field (a stored
        spec's resolved ``model``) are left out. A spec stored in an older form is brought
        forward by :func:`attnbench.cell_key.stored_cell`."""
        names = {f.name for f in fields(cls)} - _PARTS
        own = {k: v for k, v in data.items() if k in names}
        return cls(
            **{**own, "params": as_tuples(data.get("params", ()))},
            model=Shape(
                **{
                    f: data[f]
                    for f in (*MODEL_FIELDS, *OPTIONAL_SHAPE, *SCHEDULE_FIELDS)
                    if f in data
                }
            ),
            timing=TimingSpec(**{f: data[f] for f in TIMING_FIELDS if f in data}),
            workload=Part(data.get("mode", DEFAULT_MODE), as_tuples(data.get("mode_settings", ()))),
            task=Part(data.get("task", COST), as_tuples(data.get("quality", ()))),
        )


_PARTS = {"model", "timing", "workload", "task"}
# the stored form's names, one level, in the order every stored run holds them (those
# declared since, after)
STORED = (
    "attention", "n", "k", "batch", "dtype", "device", "ceiling_bytes", "params", *MODEL_FIELDS,
    *TIMING_FIELDS, "model_only", "mode", "mode_settings", "kv_heads", "compile",
    "compile_mode", "allocator", "task", "quality", "head_dim", "schedule", "kinds", "name",
)  # fmt: skip
_FLAT = set(STORED)  # what Cell.of takes


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


def budget_of(attention: str, params: Mapping[str, Any] | Any = ()) -> str | None:
    """The parameter ``k`` sets for ``attention`` with these parameters (a mapping or sorted
    pairs), or None: it has no budget, or none in use with them (FlexAttention's window with
    pattern=full)."""
    info = registry.info(attention)
    if info.budget is None or info.budget_when is None:
        return info.budget
    field, value = info.budget_when
    return info.budget if setting_of(info, field, params) == value else None


def setting_of(info: registry.Info, field: str, params: Mapping[str, Any] | Any) -> Any:
    """The value ``field`` takes in a cell: the cell's own parameter, else the default."""
    return dict(params).get(field, info.params.get(field))
