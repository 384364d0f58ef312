"""The row: what one measured cell leaves in ``cells.jsonl``, read and upgraded here.

:class:`Row` is a typed record whose fields are the table :data:`attnbench.row_fields.FIELDS`.
The runner assembles one, once, from what its steps returned
(:func:`attnbench.runner.found.assemble`, through :meth:`Row.new`); the sweep adds where and
when it was stored; :mod:`attnbench.store` writes it as one JSON line; :func:`read` turns
lines back into rows, checking every field against the schema and upgrading rows of older
schemas; reports and :func:`attnbench.load` read only rows.

Schema 2 (this version) against schema 1 (attnbench 0.1 before it):

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

from attnbench.measure.contention import is_busy
from attnbench.quality.tasks import check_figures
from attnbench.row_checks import shorten
from attnbench.row_fields import (  # noqa: F401 (STATUSES, MEMORY_SOURCES: the row's words)
    BY_NAME,
    FIELDS,
    MEMORY_SOURCES,
    REQUIRED,
    SCHEMA,
    STATUSES,
    extra_fields,
)
from attnbench.row_upgrade import later_settings, upgrade_1
from attnbench.store import json_line, numbered_lines

if TYPE_CHECKING:
    from attnbench.cell import Cell

NAMES = frozenset(BY_NAME)


class _Record:
    """What a :class:`Row` does beside holding its fields (which come from the table)."""

    # with Row's slots: a name no field has cannot be set (a typo raises); ``_extra`` holds
    # the values of plugins' fields (row_fields.register), which exist only once registered
    __slots__ = ("_extra",)

    def _extras(self) -> dict[str, Any]:
        try:
            return object.__getattribute__(self, "_extra")
        except AttributeError:
            object.__setattr__(self, "_extra", {})
            return object.__getattribute__(self, "_extra")

    def __getattr__(self, name: str) -> Any:  # only where no slot has the name
        if name.startswith("__") or (field := extra_fields().get(name)) is None:
            raise AttributeError(f"Row has no field {name!r}")
        return self._extras().get(name, field.missing)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in NAMES or name == "_extra":
            object.__setattr__(self, name, value)
        elif name in extra_fields():
            self._extras()[name] = value
        else:
            object.__setattr__(self, name, value)  # the slots' AttributeError

    @classmethod
    def _made(cls, values: dict[str, Any]) -> Row:
        """A row of ``values``, a plugin's fields among them set after the table's."""
        row = cls(**{k: v for k, v in values.items() if k in NAMES})
        for name in extra_fields():
            if name in values:
                setattr(row, name, values[name])
        return row

    def replaced(self, **values: Any) -> Row:
        """A copy with ``values`` set (``dataclasses.replace``, a plugin's fields kept)."""
        return type(self)._made({**self.to_dict(), **values})

    @classmethod
    def new(
        cls, cell: Cell, ceiling: int, overhead: int, env: dict[str, Any], **measured: Any
    ) -> Row:
        """The row of ``cell`` with the ``measured`` fields
        (:func:`attnbench.runner.found.assemble` names them); a field not given keeps its
        default (a failure row: status and reason)."""
        return cls._made(
            dict(
                attention=cell.attention,
                n=cell.n,
                dtype=cell.dtype,
                device=cell.device,
                params=dict(cell.params),
                k=cell.k,
                budget=cell.budget,
                mode=cell.mode,
                task=cell.task,
                **cell.settings,  # the workload's own (train: optimizer, checkpoint); else null
                compile=cell.compile,
                compile_mode=cell.compile_mode if cell.compile else None,
                allocator=cell.allocator,
                batch_asked=cell.batch,
                ceiling_bytes=ceiling,
                overhead_bytes=overhead,
                model=cell.shape,
                env=dict(env),
                **measured,
            )
        )

    def update(self, **values: Any) -> None:
        """Set several fields; a name that is not a field is a bug, not a new key."""
        for name, value in values.items():
            if name not in NAMES and name not in extra_fields():
                raise KeyError(f"Row has no field {name!r}")
            setattr(self, name, value)

    @property
    def busy(self) -> bool:
        """Timed on a contended CPU, or its samples spread by an order of magnitude
        (:mod:`attnbench.measure.contention`): its time is no figure to compare."""
        return is_busy(self.contention)  # type: ignore[attr-defined]

    def spread(self) -> float | None:
        """The timing's IQR over its median: above :data:`NOISY` a report flags the time."""
        median, iqr = self.time_median_s, self.time_iqr_s  # type: ignore[attr-defined]
        if not median or iqr is None:
            return None
        return iqr / median

    def to_dict(self) -> dict[str, Any]:
        """The row as stored: ``schema`` first, then every field."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        extra = {name: getattr(self, name) for name in extra_fields()}
        return {"schema": d.pop("schema"), **d, **extra}

    def to_json(self) -> str:
        return json_line(self.to_dict()).rstrip("\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """A row from its stored form, checked field by field (``ValueError``, one line
        naming the field, the value quoted and cut short) and upgraded from older schemas."""
        try:
            return cls._made(_checked(data))
        except (ValueError, OverflowError) as e:
            # the messages quote the value: a 100 kB string would be a 100 kB error line
            raise ValueError(shorten(str(e))) from None


def _field(f: Any) -> tuple[str, Any, Any]:
    if f.default is REQUIRED:
        return f.name, f.type, dataclasses.field()
    if isinstance(f.default, dict):
        return f.name, f.type, dataclasses.field(default_factory=dict)
    return f.name, f.type, dataclasses.field(default=f.default)


if TYPE_CHECKING:  # the fields, typed, for a type checker (generated from the table)
    from attnbench.row_static import Row
else:
    Row = dataclasses.make_dataclass(
        "Row", [_field(f) for f in FIELDS], bases=(_Record,), slots=True
    )
    Row.__module__ = __name__
    Row.__doc__ = """One cell's figures, a field per entry of
    :data:`attnbench.row_fields.FIELDS` (``row.max_batch``)."""


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The stored fields of ``data``, checked, upgraded and completed: a field not stored
    reads as its table's ``missing`` (None: unknown); keys no field names are dropped."""
    schema = data.get("schema", 1)
    if type(schema) is not int or schema not in (1, SCHEMA):
        raise ValueError(
            f"schema: this attnbench reads schemas 1 and {SCHEMA}, got {schema!r}"
            " (a newer attnbench wrote it?)"
        )
    extra = extra_fields()
    values = {k: v for k, v in data.items() if k in NAMES or k in extra}
    if schema == 1:
        values.update(upgrade_1(data))
    values["schema"] = SCHEMA
    values.update(later_settings(values))
    for f in FIELDS:
        if f.name in values:
            continue
        if f.default is REQUIRED:
            raise ValueError(f"{f.name}: missing")
        values[f.name] = dict(f.missing) if isinstance(f.missing, dict) else f.missing
    for name, value in values.items():
        (BY_NAME.get(name) or extra[name]).read_check(name, value)
    check_figures(values["task"], values["quality"])
    return values


class BadRow(ValueError):
    """A line of ``cells.jsonl`` that is not a row: the file, the line, what is wrong."""

    def __init__(self, path: Path, line_no: int, why: str) -> None:
        # a path may hold a newline too: quoted as repr quotes it, the message stays one line
        super().__init__(f"{printable(str(path))}:{line_no}: {why}")
        self.line_no = line_no


def printable(text: str) -> str:
    """``text`` on one line and shown as stored: every character ``str.isprintable``
    refuses (newline, CR, tab, NUL, ESC, bidi overrides like U+202E, lone surrogates) as its
    Python escape (``\\n``, ``\\x00``, ``\\u202e``). A row's free text is read as it is;
    whatever shows it (an error line, a report) passes it through this first, so no value
    can start a line of its own, drive a terminal or reorder what is around it."""
    if text.isprintable():  # nearly always: no copy
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# the most of one piece of text a report shows (a cell, a heading, a footnote, a line under
# a table): over twice the longest the report writes itself, so only a row's value is cut
SHOWN_CHARS = 1000


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as a reader sees it: :func:`printable`, and past ``limit`` characters cut
    with a mark that says so (:func:`shorten`). Whatever shows a row's text (a terminal, a
    page, a Markdown or LaTeX line, a plot, a line on stderr) passes it through this: a
    value can be megabytes, and a terminal wraps a long word in time that grows with its
    square. The data (``cells.jsonl``, :func:`attnbench.load`, ``report.json``, the CSV
    files) keeps it whole. Only the first ``limit + 1`` characters are read: the cost is
    bounded whatever the value's length."""
    head = printable(text[: limit + 1])
    if len(text) <= limit and len(head) <= limit:
        return head
    return shorten(head, limit, whole=len(text))


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
    if not Path(path).is_file():  # a FIFO would block, a directory or a symlink loop raise
        raise ValueError(f"{printable(str(path))}: no such file (or not a regular file)")
    rows = []
    for line_no, data in numbered_lines(path, strict=strict):
        try:
            rows.append((line_no, Row.from_dict(data)))
        except ValueError as e:
            raise BadRow(path, line_no, str(e)) from None
    return rows
