"""What a row does beside holding its fields, and how a stored row is checked on reading.

:class:`_Record` is the base of :class:`attnbench.row.Row`, whose fields are made from the
table (:data:`attnbench.row.fields.FIELDS`) and, for a type checker, written out in
:mod:`attnbench.row.static`. It lives apart from ``Row`` so that the generated module can
name it without importing the module that makes ``Row``, which imports the generated one
for its types: the methods return ``Row`` through a type variable bound here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, TypeVar

from attnbench.measure.contention import is_busy
from attnbench.quality.tasks import check_figures
from attnbench.row.checks import shorten
from attnbench.row.fields import BY_NAME, FIELDS, REQUIRED, SCHEMA, extra_fields
from attnbench.row.upgrade import later_settings, upgrade_1
from attnbench.store import json_line
from attnbench.store_read import SPEC_SCHEMA, flat, spec_fields

if TYPE_CHECKING:
    from attnbench.cell import Cell

NAMES = frozenset(BY_NAME)

# the row class a method is called on (Row, made from the table): what it returns
R = TypeVar("R", bound="_Record")


class _Record:
    """What a :class:`~attnbench.row.Row` does beside holding its fields (which come from
    the table)."""

    # with Row's slots: a name no field has cannot be set (a typo raises); ``_extra`` holds
    # the values of plugins' fields (fields.register), which exist only once registered
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
    def _made(cls: type[R], values: dict[str, Any]) -> R:
        """A row of ``values``, a plugin's fields among them set after the table's."""
        row = cls(**{k: v for k, v in values.items() if k in NAMES})
        for name in extra_fields():
            if name in values:
                setattr(row, name, values[name])
        return row

    def replaced(self: R, **values: Any) -> R:
        """A copy with ``values`` set (``dataclasses.replace``, a plugin's fields kept)."""
        return type(self)._made({**self.to_dict(), **values})

    @classmethod
    def new(
        cls: type[R], cell: Cell, ceiling: int, overhead: int, env: dict[str, Any], **measured: Any
    ) -> R:
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
                task=cell.task.name,
                **cell.settings,  # the workload's own (train: optimizer, checkpoint); else null
                compile=cell.compile,
                compile_mode=cell.compile_mode if cell.compile else None,
                allocator=cell.allocator,
                batch_asked=cell.batch,
                ceiling_bytes=ceiling,
                overhead_bytes=overhead,
                model=cell.model.shape,
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
        """The timing's IQR over its median: above :data:`attnbench.measure.timing.NOISY`
        a report flags the time."""
        median, iqr = self.time_median_s, self.time_iqr_s  # type: ignore[attr-defined]
        if not median or iqr is None:
            return None
        return iqr / median

    def to_dict(self) -> dict[str, Any]:
        """The row as stored: ``schema`` first, then every field."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        extra = {name: getattr(self, name) for name in extra_fields()}
        return {"schema": d.pop("schema"), **d, **extra}

    def stored(self) -> dict[str, Any]:
        """The row as a line of ``cells.jsonl`` stores it (schema 3): ``schema`` first, the
        spec once (``cell``), and beside it what was measured. A field the spec gives
        (:func:`attnbench.store_read.spec_fields`) is left out, and so is a null field of
        the cell's group (another workload's setting) beside a spec. Every figure is kept,
        null or not: a line says what was not measured; a row without a spec (a script's, a
        cell run from Python) is stored whole. Reading a line puts both back, so
        :meth:`from_dict` of it is this row."""
        given = spec_fields(self.cell)  # type: ignore[attr-defined]
        out = {}
        for name, value in self.to_dict().items():
            if name in given and _same(value, given[name]):
                continue
            field = BY_NAME.get(name)
            if given and field is not None and field.group == "cell" and value is None:
                continue  # another workload's setting: its spec says whose row it is
            out[name] = value
        return {"schema": SCHEMA, **out}

    def to_json(self) -> str:
        """The stored line (:meth:`stored`), without its newline."""
        return json_line(self.stored()).rstrip("\n")

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """A row from its stored form, checked field by field (``ValueError``, one line
        naming the field, the value quoted and cut short) and upgraded from older schemas."""
        try:
            return cls._made(_checked(data))
        except (ValueError, OverflowError) as e:
            # the messages quote the value: a 100 kB string would be a 100 kB error line
            raise ValueError(shorten(str(e))) from None


def _same(a: Any, b: Any) -> bool:
    """Equal as stored (a tuple and a list of the same values are one value; a mapping's
    order is none), and of one JSON type."""
    return _canonical(a) == _canonical(b)


def _canonical(value: Any) -> str:
    """JSON text with sorted keys: ``true`` is not ``1``, nor ``1`` ``1.0``, as they are not
    one value once read back."""
    return json.dumps(json.loads(json_line({"v": value})), sort_keys=True)


READS = (1, 2, SPEC_SCHEMA)  # the schemas this version reads; it writes the last


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The stored fields of ``data``, checked, upgraded and completed: a schema-3 line's
    fields from its spec put back (:func:`attnbench.store_read.flat`), a field not stored
    read as its table's ``missing`` (None: unknown); keys no field names are dropped."""
    schema = data.get("schema", 1)
    if type(schema) is not int or schema not in READS:
        raise ValueError(
            f"schema: this attnbench reads schemas {', '.join(map(str, READS))}, got {schema!r}"
            " (a newer attnbench wrote it?)"
        )
    data = flat(data)
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
