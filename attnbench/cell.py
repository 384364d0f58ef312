"""The cell: one point of a sweep, as a frozen, hashable spec.

A :class:`Cell` is what is asked for — the mechanism and its parameters, model shape, n,
k, batch, dtype, device preset, ceiling, how long to time it — and the names of its two
owned parts: its workload (``mode``, with that workload's settings) and its quality task
(``task``, with that task's settings). It knows no workload or task: the plan
(:mod:`attnbench.plan`) completes a cell's parts with their owners' defaults, validates and
resolves it once; the key a stored row is found by is :mod:`attnbench.cell_key`'s. This
module also holds the labels every report, progress line and gate cell names a mechanism by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from attnbench import registry
from attnbench.settings import COST, DEFAULT_MODE, DEFAULTS

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
    # that workload's settings, as sorted (key, value); a mapping is taken too:
    # Cell("vanilla", 512, mode="train", mode_settings={"checkpoint": True}). The plan fills
    # in the workload's defaults (attnbench.cell_rules.complete)
    mode_settings: tuple[tuple[str, Any], ...] = ()
    kv_heads: int | None = _D["kv_heads"]
    compile: bool = _D["compile"]
    compile_mode: str = _D["compile_mode"]
    allocator: str = _D["allocator"]  # PyTorch's caching allocator's settings (see settings)
    task: str = COST  # or a quality task of quality.tasks.REGISTRY
    quality: tuple[tuple[str, Any], ...] = ()  # that task's settings, as sorted (key, value)

    def __post_init__(self) -> None:
        """Both owned parts' settings as sorted tuples (a name given twice: the last value),
        so that a cell is hashable and the order they were given in does not make two."""
        for part in ("mode_settings", "quality"):
            given = getattr(self, part)
            object.__setattr__(self, part, as_tuples(sorted(dict(given).items())))

    @property
    def budget(self) -> str | None:
        """The name of the mechanism's parameter that ``k`` sets (``k``, ``nb_features``),
        or None where it has none in use with the cell's parameters."""
        return budget_of(self.attention, self.params)

    def mechanism_params(self) -> dict[str, Any]:
        """The mechanism's parameters with ``k`` mapped onto its budget parameter."""
        params = dict(self.params)
        if self.budget is not None and self.k is not None:
            params[self.budget] = self.k
        return params

    @property
    def settings(self) -> dict[str, Any]:
        """The cell's values of the settings its workload owns (train: optimizer, checkpoint):
        those given, and once planned every one (:func:`attnbench.cell_rules.complete`)."""
        return dict(self.mode_settings)

    @property
    def shape(self) -> dict[str, int]:
        """The model's shape (stored as a row's ``model``); ``kv_heads`` only when set, so
        that the keys of cells from before grouped-query heads stay as they were."""
        shape = {f: getattr(self, f) for f in MODEL_FIELDS}
        return shape if self.kv_heads is None else {**shape, "kv_heads": self.kv_heads}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
        """The inverse of :func:`dataclasses.asdict` (JSON turns the params into lists, and
        the values in them: a carried ``listops`` block, MQAR's ``lrs``); keys that are no
        field (a stored spec's resolved ``model``) are left out. A spec stored in an older
        form is brought forward by :func:`attnbench.cell_key.stored_cell`."""
        pairs = {f: as_tuples(data.get(f, ())) for f in ("params", "quality", "mode_settings")}
        names = {f.name for f in fields(cls)}
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
