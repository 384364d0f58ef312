"""The row: what one measured cell leaves in ``cells.jsonl``, read and upgraded here.

:class:`Row` is a typed record whose fields are the table :data:`attnbench.row.fields.FIELDS`.
The runner assembles one, once, from what its steps returned
(:func:`attnbench.runner.found.assemble`, through :meth:`Row.new`); the sweep adds where and
when it was stored; :mod:`attnbench.store` writes it as one JSON line; :func:`read` turns
lines back into rows, checking every field against the schema and upgrading rows of older
schemas; reports and :func:`attnbench.load` read only rows.

Its parts, each importing only those after it (pyproject.toml's contracts hold them so;
none imports this module, which imports them):

* :mod:`.static` — the row's fields typed for a type checker, generated from the table.
* :mod:`.record` — what a row does beside holding its fields, and a stored row checked.
* :mod:`.text` — a row's free text as a reader sees it (:func:`printable`, :func:`shown`).
* :mod:`.fields` — the schema, declared once (:data:`~.fields.FIELDS`); :mod:`.upgrade` —
  what reading a row of an older schema adds.
* :mod:`.nested` — the objects a row stores a workload's figures in.
* :mod:`.checks` — the check each kind of stored value is read with.

Schema 3 (this version) stores what schema 2 stored, without copies: the cell's spec once
(``cell``), and beside it only what the spec does not give. The mechanism, its parameters
and ``k``, n, dtype, device, ``mode`` and the workload's settings, ``task``, compiling,
``batch_asked``, the resolved ceiling and ``model`` are read back from the spec
(:func:`attnbench.store_read.flat`), and another workload's settings (null) are left out;
every figure is kept, null where none was taken (:meth:`Row.stored`). In memory,
and in :func:`attnbench.load`'s frame, a row is flat as before, whichever schema stored it.

Schema 2 against schema 1 (attnbench 0.1 before it):

* ``batch_asked`` is the batch the cell asked for (``"max"`` or a number); ``batch`` is the
  batch the row's memory figure was taken at. Schema 1 kept the first only inside ``cell``.
* ``budget`` names the mechanism parameter that ``k`` set (``k``, ``nb_features``; None
  where there is none), so a report needs no registry to head its columns.
* ``mode`` names the row's workload (:mod:`attnbench.workload`), whose own settings are
  fields that other rows read as null. A train row adds ``optimizer``, ``checkpoint``,
  ``flops_backward`` (per sequence) and ``time_parts``: the median, IQR and samples of the
  step's forward, backward and optimizer parts, whose per-repeat sum is ``time_samples_s``
  (fields a row without them, inference or older, reads as null).
* ``task`` is ``cost`` (time and memory: every row written before it existed reads so) or a
  quality task of :data:`attnbench.quality.tasks.REGISTRY`, whose figures are in ``quality``
  (a mapping of JSON values).

Reading is strict where a figure would be wrong and tolerant where nothing is lost: a
missing or mistyped field, a NaN, infinite or negative time, a number too large for a float,
n < 1, an unknown status or dtype, a mechanism, budget or parameter name that is not an
identifier, a ``model`` that is not a set of positive integers or an ``env`` entry of the
wrong type is refused with the file, the line and the field, in one line however hostile
the value (it is quoted with ``repr`` and cut short); keys this version does not know are
ignored. Free text (``device``, ``mode``, ``reason``, ``time_device``, the strings of
``env`` and the values of ``params``, ...) is read as it is, newlines, markup and all:
a report escapes it for each format it writes (:mod:`attnbench.report.text`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.row.checks import shorten
from attnbench.row.fields import (
    FIELDS,
    MEMORY_SOURCES,
    REQUIRED,
    SCHEMA,
    STATUSES,
)
from attnbench.row.record import _Record
from attnbench.row.text import SHOWN_CHARS, printable, shown
from attnbench.store import numbered_lines

__all__ = [
    "MEMORY_SOURCES",
    "SCHEMA",
    "SHOWN_CHARS",
    "STATUSES",
    "BadRow",
    "Row",
    "as_rows",
    "printable",
    "read",
    "read_numbered",
    "shorten",
    "shown",
]


def _field(f: Any) -> tuple[str, Any, Any]:
    if f.default is REQUIRED:
        return f.name, f.type, dataclasses.field()
    if isinstance(f.default, dict):
        return f.name, f.type, dataclasses.field(default_factory=dict)
    return f.name, f.type, dataclasses.field(default=f.default)


if TYPE_CHECKING:  # the fields, typed, for a type checker (generated from the table)
    from attnbench.row.static import Row
else:
    Row = dataclasses.make_dataclass(
        "Row", [_field(f) for f in FIELDS], bases=(_Record,), slots=True
    )
    Row.__module__ = __name__
    Row.__doc__ = """One cell's figures, a field per entry of
    :data:`attnbench.row.fields.FIELDS` (``row.max_batch``)."""


class BadRow(ValueError):
    """A line of ``cells.jsonl`` that is not a row: the file, the line, what is wrong."""

    def __init__(self, path: Path, line_no: int, why: str) -> None:
        # a path may hold a newline too: quoted as repr quotes it, the message stays one line
        super().__init__(f"{printable(str(path))}:{line_no}: {why}")
        self.line_no = line_no


def as_rows(rows: Iterable[Row | dict[str, Any]]) -> list[Row]:
    """Rows from rows or from their stored (JSON) form: the pure functions of reports take
    either, checking a plain dict as a stored line is checked."""
    return [r if isinstance(r, Row) else Row.from_dict(r) for r in rows]


def read(path: Path, *, strict: bool = True) -> list[Row]:
    """Every row of a ``cells.jsonl``, checked against the schema; the first bad line
    raises :class:`BadRow` (a ``ValueError``) naming the file, the line and the field.
    With ``strict=False`` only a last line without its newline (a writer killed mid-line)
    is left out."""
    return [r for _, r in read_numbered(path, strict=strict)]


def read_numbered(path: Path, *, strict: bool = True) -> list[tuple[int, Row]]:
    """:func:`read`'s rows with their line numbers, for a reader that must name a line
    (two rows of one cell, say)."""
    path = Path(path)  # a str too, as attnbench.load takes one
    if not path.is_file():  # a FIFO would block, a directory or a symlink loop raise
        raise ValueError(f"{printable(str(path))}: no such file (or not a regular file)")
    rows = []
    for line_no, data in numbered_lines(path, strict=strict):
        try:
            rows.append((line_no, Row.from_dict(data)))
        except ValueError as e:
            raise BadRow(path, line_no, str(e)) from None
    return rows
