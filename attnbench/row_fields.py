"""The row's schema, declared once: :data:`FIELDS`, a table of :class:`Field` entries.

From the table come the :class:`attnbench.row.Row` record's fields (name, type, default),
the check reading applies to each stored value (:func:`attnbench.row.read`: a type, a range, a
finite number, an identifier, one of a few choices; the one line that refuses it), what a
field not stored reads as, the pandas column of :func:`attnbench.load`, and the schema table
of docs/architecture.md (:func:`markdown_table`; a test keeps the page in step). A quality
task's figures are declared by the task (:mod:`attnbench.quality.tasks`) and checked here too.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.quality.tasks import TASKS
from attnbench.registry import DTYPES
from attnbench.validators import check_bool, check_choice, check_int, check_number

__all__ = ["FIELDS", "MEMORY_SOURCES", "SCHEMA", "STATUSES", "TASKS", "Field", "shorten"]

SCHEMA = 2
STATUSES = ("ok", "oom", "skipped", "error")
MEMORY_SOURCES = ("measured", "modeled")
# the typed entries of ``env`` (attnbench.env.environment); other keys are kept as they are
ENV_FIELDS = {
    "device_name": str,
    "torch": str,
    "cuda": str,
    "attnbench": str,
    "git_revision": str,
    "threads": int,
    "python": str,
}
# a message quotes the bad value; past this many characters it is cut (one readable line)
MESSAGE_CHARS = 300
# no run finished after the year 9999: datetime (the report's date) cannot show a later one
LAST_TIME = 253402300799.0
REQUIRED = object()  # the default of a field every stored row must have


def shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one ``…``): an error line quotes
    values, and a hostile value can be a megabyte long."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the checks ------------------------------------------------------------------------------


def _str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string, got {value!r}")


def _identifier(name: str, value: Any) -> None:
    """A mechanism, budget or parameter name: the registry registers only identifiers
    (``register``), so anything else cannot have been written by attnbench."""
    _str(name, value)
    if not value.isidentifier():
        raise ValueError(f"{name}: must be an identifier (a name like linformer), got {value!r}")


def _dict(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be an object, got {value!r}")


def _params(name: str, value: Any) -> None:
    """A mechanism's own parameters: names are config fields (identifiers); values are
    free (a plugin's may be anything JSON holds) and are only ever shown, escaped."""
    _dict(name, value)
    for key in value:
        if not key.isidentifier():
            raise ValueError(f"{name}: a parameter name must be an identifier, got {key!r}")


def _model(name: str, value: Any) -> None:
    """The model's shape: every entry a positive integer (``layers``, ``d_model``, ...)."""
    _dict(name, value)
    for key, v in value.items():
        if not key.isidentifier():
            raise ValueError(f"{name}: a field name must be an identifier, got {key!r}")
        _positive(f"{name}.{key}", v)


def _env(name: str, value: Any) -> None:
    _dict(name, value)
    for key, v in value.items():
        if v is not None and ENV_FIELDS.get(key) is int:
            _positive(f"{name}.{key}", v)
        elif v is not None and key in ENV_FIELDS:
            _str(f"{name}.{key}", v)


def _count(name: str, value: Any, low: int = 0) -> None:
    check_int(name, value, low=low)
    if value >= 2**63:  # no figure is this large, and pandas' Int64 could not hold it
        raise ValueError(f"{name}: must be an integer below 2**63, got {value!r}")


def _positive(name: str, value: Any) -> None:
    _count(name, value, low=1)


def _seconds(name: str, value: Any, high: float | None = None) -> None:
    """A finite number >= 0. An integer too large for a float (10**400) is refused here:
    ``check_number``'s ``math.isfinite`` would raise ``OverflowError`` on it."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise ValueError(
                f"{name}: must be a number >= 0 that a float can hold, got {value!r}"
            ) from None
    check_number(name, value, low=0, high=high)


def _timestamp(name: str, value: Any) -> None:
    """Seconds since 1970 that a date can be made of (the report prints the day)."""
    _seconds(name, value, high=LAST_TIME)


def _samples(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{name}: must be a list of seconds, got {value!r}")
    for v in value:
        _seconds(name, v)


def _batch_asked(name: str, value: Any) -> None:
    if value != "max":
        _positive(name, value)


def _model_error(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) < value < 2**63:
        raise ValueError(f"{name}: must be an integer between -2**63 and 2**63, got {value!r}")


def _parts(name: str, value: Any) -> None:
    """``{"forward": {"median_s": .., "iqr_s": .., "samples_s": [..]}, ...}``."""
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a mapping of step parts, got {shorten(repr(value))}")
    for part, figures in value.items():
        _identifier(f"{name} part", part)
        if not isinstance(figures, dict) or set(figures) != {"median_s", "iqr_s", "samples_s"}:
            got = shorten(repr(figures))
            raise ValueError(f"{name}.{part}: must hold median_s, iqr_s and samples_s, got {got}")
        _seconds(f"{name}.{part}.median_s", figures["median_s"])
        _seconds(f"{name}.{part}.iqr_s", figures["iqr_s"])
        _samples(f"{name}.{part}.samples_s", figures["samples_s"])


def _json(name: str, value: Any) -> None:
    """Numbers, text, lists or mappings of them as JSON holds them (a report shows them
    escaped): names are identifiers, a number is finite."""
    stack = [(name, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise ValueError(f"{where}: a name must be an identifier, got {key!r}")
                stack.append((f"{where}.{key}", item))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}: must be a finite number, got {v!r}")
        elif v is not None and not isinstance(v, (str, int, float)):
            raise ValueError(f"{where}: must be a JSON value, got {shorten(repr(v))}")


def _quality(name: str, value: Any) -> None:
    """A quality task's figures: any JSON (:func:`_json`); those its task declares are
    checked again with the row's task (:func:`attnbench.quality.tasks.check_figures`)."""
    _dict(name, value)
    _json(name, value)


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One stored field. ``check`` refuses a bad stored value (None is allowed where the
    type allows it; ``choices`` add a check_choice); ``missing`` is what a row that does not
    store it reads as (None: unknown, never a made-up 0 or ``ok``); ``column`` overrides the
    pandas column the type gives (``seen``: a categorical of the values found, ``category``:
    one of ``choices``, ``nested``: a column per key)."""

    name: str
    type: Any
    check: Callable[[str, Any], None] | None
    unit: str
    group: str
    doc: str
    default: Any = None
    missing: Any = None
    choices: tuple[str, ...] = ()
    column: str | None = None

    def read_check(self, name: str, value: Any) -> None:
        if value is None and type(None) in typing.get_args(self.type):
            return
        if self.choices:
            check_choice(name, value, self.choices)
        if self.check is not None:
            self.check(name, value)

    def type_text(self) -> str:
        """The type as the docs say it: ``int or null``, ``object``, ``list of float``."""
        union = isinstance(self.type, types.UnionType)
        return " or ".join(
            _type_text(t) for t in (typing.get_args(self.type) if union else (self.type,))
        )


def _type_text(t: Any) -> str:
    origin = typing.get_origin(t)
    if t is type(None):
        return "null"
    if origin is dict or t is dict:
        return "object"
    if origin is list:
        return f"list of {typing.get_args(t)[0].__name__}"
    return t.__name__


def _f(name: str, type_: Any, check: Any, unit: str, group: str, doc: str, **kw: Any) -> Field:
    return Field(name, type_, check, unit, group, doc, **kw)


# the schema: every field a row has, in the order a row stores it (``schema`` is moved first)
FIELDS: tuple[Field, ...] = (
    _f("attention", str, _identifier, "", "cell", "the mechanism", default=REQUIRED, column="seen"),
    _f("n", int, _positive, "", "cell", "sequence length", default=REQUIRED),
    _f("dtype", str, None, "", "cell", "the cell's dtype", default=REQUIRED, choices=DTYPES,
       column="seen"),
    _f("device", str, _str, "", "cell", "the cell's device preset", default=REQUIRED,
       column="seen"),
    _f("params", dict[str, Any], _params, "", "cell", "the mechanism's own parameters",
       default={}, missing={}, column="nested"),
    _f("k", int | None, _positive, "", "cell", "the budget's value"),
    _f("budget", str | None, _identifier, "", "cell",
       "the name of the parameter k sets (`k`, `nb_features`)"),
    _f("mode", str, _str, "", "cell", "`inference` or `train`", default="inference",
       missing="inference", column="seen"),
    _f("task", str, None, "", "cell", "`cost`, or the quality task whose figures `quality` holds",
       default="cost", missing="cost", choices=TASKS),
    _f("optimizer", str | None, _str, "", "cell", "train rows: `adamw`, `sgd`, `none`"),
    _f("checkpoint", bool | None, check_bool, "", "cell", "train rows: activation checkpointing"),
    _f("batch_asked", int | str, _batch_asked, "", "cell", "the batch the cell asked: `max` or a"
       " number", default="max", missing="max", column="string"),
    _f("ceiling_bytes", int | None, _positive, "bytes", "cell", "the resolved memory ceiling"),
    _f("overhead_bytes", int | None, _count, "bytes", "cell", "the preset's fixed overhead"),
    _f("model", dict[str, int], _model, "", "cell", "layers, d_model, n_heads, d_ff", default={},
       missing={}, column="nested"),
    _f("status", str | None, None, "", "outcome", "`ok`, `oom`, `skipped` or `error`",
       default="ok", choices=STATUSES, column="category"),
    _f("reason", str | None, _str, "", "outcome", "why it is not ok, or a note on it"),
    _f("max_batch", int | None, _count, "", "memory", "the largest batch under the ceiling"),
    _f("batch", int | None, _count, "", "memory", "the batch the memory figures were taken at"),
    _f("predicted_max_batch", int | None, _count, "", "memory", "the modeled max batch"),
    _f("probes", int | None, _count, "", "memory", "real probes (CUDA) confirming it", default=0),
    _f("model_error", int | None, _model_error, "", "memory", "prediction less the max batch"),
    _f("peak_bytes", int | None, _count, "bytes", "memory", "peak allocated memory at `batch`"),
    _f("peak_reserved_bytes", int | None, _count, "bytes", "memory", "peak reserved memory"),
    _f("memory_source", str | None, None, "", "memory", "`measured` (CUDA) or `modeled`",
       choices=MEMORY_SOURCES, column="category"),
    _f("time_median_s", float | None, _seconds, "s", "time", "median time of a forward (step)"),
    _f("time_iqr_s", float | None, _seconds, "s", "time", "its interquartile range"),
    _f("repeats", int | None, _count, "", "time", "samples taken", default=0),
    _f("time_per_seq_s", float | None, _seconds, "s", "time", "time per sequence"),
    _f("time_batch", int | None, _count, "", "time", "the batch it was timed at"),
    _f("time_device", str | None, _str, "", "time", "where it was timed", column="seen"),
    _f("time_dtype", str | None, _str, "", "time", "the dtype it was timed in"),
    _f("time_method", str | None, _str, "", "time", "how it was timed"),
    _f("time_samples_s", list[float] | None, _samples, "s", "time", "every sample kept"),
    _f("flops", int | None, _count, "FLOP", "time", "forward matmul FLOPs per sequence"),
    _f("flops_backward", int | None, _count, "FLOP", "time", "train rows: backward FLOPs per"
       " sequence"),
    _f("time_parts", dict[str, dict[str, Any]] | None, _parts, "s", "time", "train rows:"
       " `forward`, `backward`, `optimizer`, each `median_s`, `iqr_s`, `samples_s`; their"
       " per-repeat sum is `time_samples_s`"),
    _f("quality", dict[str, Any] | None, _quality, "", "quality", "a quality task's figures"
       " (declared by the task: attnbench/quality/tasks.py)"),
    _f("flops_per_s", float | None, _seconds, "FLOP/s", "time", "achieved rate over forward and"
       " backward"),
    _f("pct_of_peak", float | None, _seconds, "%", "time", "of the preset's peak (on its own GPU"
       " only)"),
    _f("env", dict[str, Any], _env, "", "stored", "device name, torch, CUDA, attnbench, git"
       " revision, threads, python", default={}, missing={}, column="nested"),
    _f("key", str | None, _str, "", "stored", "the cell's key"),
    _f("sweep", str | None, _str, "", "stored", "the sweep's name"),
    _f("wall_s", float | None, _seconds, "s", "stored", "the cell's wall time"),
    _f("finished_at", float | None, _timestamp, "s", "stored", "when it was stored (Unix time)"),
    _f("invocation", str | None, _str, "", "stored", "the command that stored it"),
    _f("cell", dict[str, Any] | None, _dict, "", "stored", "the full cell spec",
       column="nested"),
    _f("schema", int, _count, "", "stored", f"{SCHEMA} (a row without it is schema 1, upgraded on"
       " reading)", default=SCHEMA),
)  # fmt: skip
BY_NAME = {f.name: f for f in FIELDS}


def markdown_table() -> str:
    """The schema as docs/architecture.md shows it, ``schema`` first as a row stores it."""
    order = [BY_NAME["schema"], *(f for f in FIELDS if f.name != "schema")]
    lines = ["| field | type | unit | group | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in order:
        lines.append(f"| `{f.name}` | {f.type_text()} | {f.unit} | {f.group} | {f.doc} |")
    return "\n".join(lines)
