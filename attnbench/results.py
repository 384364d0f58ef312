"""Results as a DataFrame: :func:`load` reads run directories into one tidy pandas table.

One DataFrame row per stored row of ``cells.jsonl``, each read through
:func:`attnbench.row.read`, so every line is checked against the schema and rows of older
schemas are upgraded; a bad line raises the row module's one-line ``ValueError``
(``FILE:LINE: FIELD: ...``) unchanged.

Columns, in the row's own order:

* every scalar field of the row (``attention``, ``n``, ``k``, ``status``, ``max_batch``,
  ``time_per_seq_s``, ...); the row's ``schema`` is left out (after reading it is always
  the current one, whatever the file held);
* the nested ones flattened: ``params.<name>`` (each mechanism's own, as found in the rows),
  ``model.layers``, ``model.d_model``, ``model.n_heads``, ``model.d_ff``, ``env.device_name``,
  ``env.torch``, ``env.cuda``, ``env.attnbench``, ``env.git_revision``, ``env.threads``,
  ``env.python``, ``env.tf32_matmul``, ``env.tf32_cudnn``, ``env.triton_fp32_dot`` (and
  any other key found);
* of the stored ``cell``, only what no other column says — how it was timed:
  ``cell.min_repeats``, ``cell.min_seconds``, ``cell.cpu_batch``, ``cell.time_budget_s``,
  ``cell.flush_l2``, ``cell.model_only``; the rest of it repeats the row's own fields;
* ``run_dir``: the directory the row's file is in, as the path was given.

Types: integers as pandas' nullable ``Int64`` (``<NA>`` where a cell has none, e.g. ``k``
for vanilla; a column with gaps stays integer, never 512.0), other numbers ``float64`` (NaN
where absent), text as pandas' ``string`` dtype (``<NA>`` where absent), flags as
``boolean``; ``status`` and
``memory_source`` categoricals with their fields' fixed categories, all of them always, in
the order of :data:`attnbench.row.fields.STATUSES` and ``MEMORY_SOURCES``; ``attention``,
``dtype``, ``device``, ``mode`` and ``time_device`` categoricals of the values found, in the
order they first appear (a sweep's order: vanilla before linformer). ``batch_asked`` is text,
``"max"`` or the number as written (``"8"``), so the column has one type
(``pd.to_numeric(df.batch_asked, errors="coerce")`` for the numbers). ``time_samples_s``
stays a list of seconds per cell (an ``object`` column, None where none were kept).
Nested keys of unknown type (a plugin's parameters) take the type their values share; an
integer no float can hold (``10**400``, in a plugin's parameter or an unknown ``env`` key)
makes its column ``object``, never an ``OverflowError``. Text is as stored (a newline stays
a newline): escaping is for reports, not for the data.
An empty run has every column but ``params.*``, which only the rows name.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.row import Row, printable, read
from attnbench.row.checks import ENV_FIELDS
from attnbench.row.fields import FIELDS, Field, extra_fields
from attnbench.store import CELLS

if TYPE_CHECKING:
    import pandas as pd

OBJECT = "object"
_PLAIN = {"int": "Int64", "float": "float64", "str": "string", "bool": "boolean"}
_INFERRED = ("boolean", "Int64", "float64", "string")  # the first that fits every value
# a row's env (attnbench.env.environment()): the columns every DataFrame has, empty or not
ENV = {key: _PLAIN[t.__name__] for key, t in ENV_FIELDS.items()}


def load(
    *paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], strict: bool = True
) -> pd.DataFrame:
    """Every row of the given runs as one DataFrame (columns: see the module's docstring).

    Each path is a run directory (its ``cells.jsonl``), a ``cells.jsonl`` file (any file of
    rows), or a directory of runs: every ``cells.jsonl`` below it, at any depth (so
    ``load("results")`` takes ``results/<sweep>/<run>/`` and ``results/reference/<run>/``
    alike), in path order. Several paths (``load(a, b)`` or ``load([a, b])``) give their
    rows one after the other; a file reached twice is read once. An empty ``cells.jsonl``
    gives no rows and the same columns. A path that does not exist or holds no
    ``cells.jsonl``: ``ValueError`` naming it. ``strict=False`` leaves out a last line
    without its newline (a run being written), as :func:`attnbench.row.read` does.
    """
    import pandas as pd  # ~0.2 s: paid by who loads results, not by every import attnbench

    rows: list[tuple[Row, str]] = []
    for file in _files(paths):
        run_dir = str(file.parent)
        rows.extend((row, run_dir) for row in read(file, strict=strict))
    flat = [_flatten(row, run_dir) for row, run_dir in rows]
    columns = _columns(flat)
    return pd.DataFrame(
        {name: _array(pd, [r.get(name) for r in flat], kind) for name, kind in columns.items()},
        index=pd.RangeIndex(len(flat)),
    )


# --- where the rows are ----------------------------------------------------------------------


def _paths(paths: Iterable[Any]) -> Iterator[Path]:
    for p in paths:
        if isinstance(p, (str, os.PathLike)):
            yield Path(p)
        elif isinstance(p, Iterable):
            yield from _paths(p)
        else:
            raise ValueError(f"load: a path must be a str or a path, got {p!r}")


def _files(paths: Iterable[Any]) -> list[Path]:
    given = list(_paths(paths))
    if not given:
        raise ValueError("load: no path given (a run directory, a cells.jsonl, a runs directory)")
    files: dict[Path, Path] = {}  # resolved -> as given, first one kept
    for path in given:
        if not path.exists():  # a symlink loop too
            raise ValueError(f"{printable(str(path))}: no such file or directory")
        if path.is_file():
            found = [path]
        elif (path / CELLS).is_file():
            found = [path / CELLS]
        else:
            found = sorted(p for p in path.rglob(CELLS) if p.is_file())
            if not found:
                raise ValueError(
                    f"{printable(str(path))}: holds no {CELLS} (neither a run directory nor a"
                    " directory of runs)"
                )
        for f in found:
            files.setdefault(f.resolve(), f)
    return list(files.values())


# --- rows to columns -------------------------------------------------------------------------


def _kind(annotation: Any) -> str | None:
    """The column type of a type (``int``, ``float | None``) or of its name, as a dataclass
    of ``from __future__ import annotations`` holds it (``"float | None"``)."""
    args = [t for t in typing.get_args(annotation) or (annotation,) if t is not type(None)]
    if len(args) == 1 and isinstance(args[0], type):
        return _PLAIN.get(args[0].__name__)
    return _PLAIN.get(str(annotation).replace(" | None", "").strip())


def _column(f: Field) -> Any:
    """A fixed column's kind: a dtype name, the tuple of a field's fixed categories, "seen"
    (a categorical of the values found) or, for a nested field, a dict of its keys' kinds."""
    if f.column == "category":
        return f.choices
    if f.column != "nested":
        return f.column or _kind(f.type) or OBJECT
    from attnbench.cell import MODEL_FIELDS, SHAPE_FIELDS, STORED, Cell, Shape, TimingSpec

    if f.name == "model":
        return dict.fromkeys(MODEL_FIELDS, "Int64")
    if f.name == "env":
        return dict(ENV)
    if f.name == "cell":  # only how it was timed: the rest repeats the row's fields
        # mode_settings: the workload's settings, which are row fields of their own; the
        # shape's are the row's model
        dup = {*(g.name for g in FIELDS), *SHAPE_FIELDS, "mode_settings"}
        types = {
            g.name: g.type for part in (Cell, Shape, TimingSpec) for g in dataclasses.fields(part)
        }
        return {name: _kind(types[name]) or OBJECT for name in STORED if name not in dup}
    return {}  # params: each mechanism's own, as found in the rows


@functools.cache
def _schema() -> dict[str, Any]:
    """Every fixed column and its kind, in the row's order; the row's ``schema`` is left out
    (after reading it is always the current one)."""
    return {f.name: _column(f) for f in FIELDS if f.name != "schema"}


def _flatten(row: Row, run_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in _schema().items():
        value = getattr(row, name)
        if isinstance(kind, dict):
            for key, v in (value or {}).items():
                if name != "cell" or key in kind:
                    out[f"{name}.{key}"] = v
        elif name == "batch_asked":
            out[name] = str(value)
        else:
            out[name] = value
    out.update({name: getattr(row, name) for name in extra_fields()})  # a plugin's fields
    out["run_dir"] = run_dir
    return out


def _columns(flat: list[dict[str, Any]]) -> dict[str, Any]:
    """The columns in the row's order, nested keys in place: the fixed ones, then any other
    key found in the rows."""
    found: dict[str, None] = {}
    for r in flat:
        found.update(dict.fromkeys(r))
    columns: dict[str, Any] = {}
    for name, kind in _schema().items():
        if not isinstance(kind, dict):
            columns[name] = kind
            continue
        columns.update({f"{name}.{key}": k for key, k in kind.items()})
        prefix = f"{name}."
        columns.update({c: None for c in found if c.startswith(prefix) and c not in columns})
    columns.update({f.name: _column(f) for f in extra_fields().values()})
    columns["run_dir"] = "string"
    return columns


def _fits(kind: str, v: Any) -> bool:
    if kind == "boolean":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if kind == "Int64":
        return isinstance(v, int) and -(2**63) <= v < 2**63
    if kind == "float64":  # an integer past a float's range (10**400) is an object
        return isinstance(v, float) or (isinstance(v, int) and abs(v) <= 2**1023)
    return kind == "string" and isinstance(v, str)


def _array(pd: Any, values: list[Any], kind: Any) -> Any:
    present = [v for v in values if v is not None]
    if isinstance(kind, tuple) or kind == "seen":
        categories = kind if isinstance(kind, tuple) else list(dict.fromkeys(present))
        return pd.Categorical(values, categories=categories)
    if kind is not None and kind != OBJECT and not all(_fits(kind, v) for v in present):
        kind = None  # not what attnbench writes there: take what the values share
    if kind is None:
        shared = [k for k in _INFERRED if present and all(_fits(k, v) for v in present)]
        kind = shared[0] if shared else OBJECT
    if kind == OBJECT:
        array = pd.array([None] * len(values), dtype=object)
        array[:] = values  # lists stay lists (a list given whole would become a 2-D array)
        return array
    return pd.array(values, dtype=kind)
