"""Table 3 as the paper lays it out: rows n, columns k, ratios against the baseline.

Pure functions of rows (``cells.jsonl``): no measuring, no files. For each efficient
mechanism (with its parameters) against the baseline at the same n, dtype, device and model
(:func:`attnbench.report.ratio.group`), each cell is :func:`attnbench.report.ratio.ratio`:
a number only where both rows measured it, else the status that left it undefined with a
footnote. A cell with no row at all (k >= n) is ``-``, as in the paper (the marks:
:mod:`attnbench.report.marks`).

Escaping: a row's free text (a device, a reason, a parameter's value) may hold anything a
JSON string can. It reaches a table through :func:`attnbench.row.printable`, once, where
the table is made (mechanism label, footnotes, context): every character that is not
printable (newline, CR, NUL, ESC, bidi overrides, lone surrogates) becomes its Python escape
(``\\n``, ``\\x00``, ``\\u202e``), so no value can start a line of its own in any format.
Each writer then escapes what is special to its format (:mod:`attnbench.report.text`,
:mod:`attnbench.report.html`).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from attnbench.report.marks import MISSING, SKIPPED
from attnbench.report.ratio import (
    baselines,
    compared,
    compiled,
    group,
    name,
    ratio,
    setting,
)
from attnbench.row import Row, as_rows, printable, shorten
from attnbench.workload import caption_of


@dataclass(frozen=True)
class RatioTable:
    """One of Table 3's two halves for one mechanism: ``text[(n, k)]`` is what to print,
    ``value[(n, k)]`` the number behind it (None where there is none). A table whose
    columns are mechanisms rather than budgets (serving's) has their labels for ``ks``."""

    mechanism: str
    kind: str  # "time" or "memory"
    ns: tuple[int, ...]
    ks: tuple[Any, ...]  # budgets (int, None: no budget), or the columns' labels (str)
    text: dict[tuple[int, Any], str]
    value: dict[tuple[int, Any], float | None]
    footnotes: tuple[str, ...] = field(default=())
    context: str = ""
    attention: str = ""  # the registry name behind ``mechanism`` (which carries its params)
    column: str = "k"  # what the columns are: the mechanism's budget (k, nb_features)
    mode: str = "inference"  # its rows' workload (train: a table the paper has none of)
    compiled: str = ""  # its rows' ratio.compiled (``compiled``), "" eager (as the paper's)
    source: str = "measured"  # how its figures were had: measured, modeled (:func:`source`)


def heading(t: RatioTable, k: Any) -> str:
    """A column's heading: ``k=128``; ``ratio`` for a mechanism without a budget; a
    column's label as it is where columns are mechanisms."""
    if isinstance(k, str):
        return k
    return "ratio" if k is None else f"{t.column}={k}"


def source(kind: str, pairs: Iterable[tuple[Row, Row]]) -> str:
    """How a table's figures were had, for a heading that must not call a model's figure
    measured: a time is always measured; a max batch is the ``memory_source`` of the rows
    of each (mechanism, baseline) pair that gives a ratio (``modeled`` on a machine without
    the preset's GPU), both where the figures are of both."""
    if kind != "memory":
        return "measured"
    found = {
        x.memory_source
        for r, b in pairs
        if r.status == b.status == "ok" and r.max_batch and b.max_batch
        for x in (r, b)
    }
    return " and ".join(sorted(s for s in found if s)) or "measured"


def compiling(row: Row) -> str:
    """What a table's context says of a row compiled (``compiled (torch.compile, each
    encoder layer), ``), of a mechanism that compiles its own kernel in the eager model
    (flex), or nothing (eager)."""
    if c := compiled(row):
        return f"{c} (torch.compile, each encoder layer, the baseline's too), "
    if getattr(row, "compiled", None) == "kernel":
        return "its kernel compiled (torch.compile) in the eager model, "
    return ""


def timed(rows: Iterable[Row]) -> str:
    """How the rows' times were taken, read from the rows (their ``time_device``,
    ``time_dtype`` and ``time_batch``), never from the preset: ``timed on cpu in fp32 at
    b = 1`` (a CPU stands in for the preset's GPU in fp32 at its own batch); each way where
    they differ; ``no time measured`` where none was."""
    ways: dict[tuple[str, str], set[int]] = {}
    for r in rows:
        if r.time_per_seq_s and r.time_device:
            batches = ways.setdefault((r.time_device, r.time_dtype or "?"), set())
            batches |= {r.time_batch} if isinstance(r.time_batch, int) else set()
    if not ways:
        return "no time measured"
    said = []
    for (device, dtype), batches in ways.items():
        low, high = min(batches, default=None), max(batches, default=None)
        at = "" if low is None else f" at b = {low}" + (f" to {high}" if high != low else "")
        said.append(f"{device} in {dtype}{at}")
    return "timed on " + " and ".join(said)


def about(rows: Iterable[Row]) -> str:
    """What a report's rows are, for its title: ``sweep table3, preset v100_16gb (ceiling
    15.8 GiB), timed on cpu``, each value read from the rows; a run with no time measured
    says nothing of times."""
    rows = list(rows)
    sweeps, presets = _named(r.sweep for r in rows), _named(r.device for r in rows)
    devices = _named(r.time_device for r in rows if r.time_per_seq_s)
    ceilings = {r.ceiling_bytes for r in rows}
    ceiling = next(iter(ceilings)) if len(ceilings) == 1 else None
    said = [
        sweeps and f"sweep {sweeps}",
        presets
        and f"preset {presets}"
        + (f" (ceiling {ceiling / 2**30:.1f} GiB)" if isinstance(ceiling, int) else ""),
        devices and f"timed on {devices}",
    ]
    return printable(", ".join(s for s in said if s))


def _named(values: Iterable[Any]) -> str:
    """The distinct values, in order: ``a, b, c``; past three, ``a, b, c and 4 more``."""
    found = list(dict.fromkeys(str(v) for v in values if v is not None))
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return ", ".join(found[:3]) + more


def context(rows: list[Row], work: str | None = None) -> str:
    """What a table's rows were measured on, in a line under it: ``work`` first (else the
    workload's caption), then how it was compiled (:func:`compiling`), the preset with the
    dtype, ceiling and batch its memory figures are for, the model, how the times were taken
    (:func:`timed`, of every row given: a CPU times in fp32 at b = 1 what the preset's
    figures are in fp16 at max batch), the machine, the version and the first row's date."""
    first = rows[0]
    model = first.model or {}
    env = first.env or {}
    # grouped-query heads are the mechanism's (its label says them), not the model's shape
    shape = ", ".join(f"{k} {v}" for k, v in model.items() if k != "kv_heads")
    date = ""
    if first.finished_at:
        when = datetime.datetime.fromtimestamp(first.finished_at, datetime.timezone.utc)
        date = when.strftime("%Y-%m-%d")
    batch = str(first.batch_asked)
    if work is None:
        caption = caption_of(first)
        work = f"{caption}, " if caption else ""
    return printable(
        work
        + compiling(first)
        + f"preset {first.device} ({first.dtype}, ceiling {first.ceiling_bytes} bytes"
        + ("" if batch == "max" else f", fixed batch {batch}")
        + f"), model {shape}; {timed(rows)}, run on {env.get('device_name', '?')}; "
        f"attnbench {env.get('attnbench', '?')}" + (f", {date}" if date else "")
    )


def need_baseline(rows: list[Row], baseline: str) -> dict[tuple, Row]:
    """The baseline rows of ``rows`` (:func:`~attnbench.report.ratio.baselines`); where
    there are none, ValueError naming the mechanisms the rows have: every ratio against it
    would be undefined (a name no row has is a typo, say)."""
    base = baselines(rows, baseline)
    if not base:
        have = sorted({r.attention for r in rows})
        raise ValueError(
            f"baseline: no rows of {shorten(repr(baseline), 80)}; the rows have "
            f"{', '.join(shorten(a, 80) for a in have[:20])}{', ...' if len(have) > 20 else ''}"
        )
    return base


def ratio_tables(
    rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla"
) -> list[RatioTable]:
    """Time and memory ratio tables for every mechanism other than ``baseline``."""
    rows = as_rows(rows)
    base = need_baseline(rows, baseline)
    # one table per mechanism and setting: a run dir that holds fp16 and fp32 rows (or two
    # ceilings) gives two tables, never one that silently mixes them; grouped by the label
    # as stored, so that two values that print alike ("a\nb" and "a\\nb") stay apart
    by_mech: dict[tuple, list[Row]] = {}
    for r in compared(rows, baseline):
        by_mech.setdefault((name(r), setting(r)), []).append(r)
    tables = []
    for (raw, where), mrows in by_mech.items():
        mech = printable(raw)
        ns = tuple(sorted({r.n for r in mrows} | {b[0] for b in base if b[1:] == where}))
        # a mechanism without a budget (sdpa, xformers) gets one column, headed "ratio"
        ks = tuple(sorted({r.k for r in mrows if r.k is not None})) or (None,)
        cells = {(r.n, r.k): r for r in mrows}
        pairs = [(r, base[group(r)]) for r in mrows if group(r) in base]
        for kind in ("time", "memory"):
            text, value, notes = fill(kind, ns, ks, cells, base, baseline)
            tables.append(
                RatioTable(
                    mech,
                    kind,
                    ns,
                    ks,
                    text,
                    value,
                    notes,
                    context([*mrows, *(b for _, b in pairs)]),
                    attention=mrows[0].attention,
                    column=mrows[0].budget or "k",
                    mode=mrows[0].mode,
                    compiled=compiled(mrows[0]) or "",
                    source=source(kind, pairs),
                )
            )
    return tables


def fill(
    kind: str,
    ns: tuple[int, ...],
    columns: tuple[Any, ...],
    cells: dict[tuple[int, Any], Row],
    base: dict[tuple, Row],
    baseline: str,
) -> tuple[dict[tuple[int, Any], str], dict[tuple[int, Any], float | None], tuple[str, ...]]:
    """A ratio table's cells, ``text`` and ``value`` by (n, column), and its footnotes: each
    row of ``cells`` against its baseline in ``base`` (:func:`~attnbench.report.ratio.
    baselines`) by :func:`~attnbench.report.ratio.ratio`; ``-`` where there is no row, a
    footnoted ``n/m`` where its baseline has none. One footnote per distinct note, marked
    in order."""
    text: dict[tuple[int, Any], str] = {}
    value: dict[tuple[int, Any], float | None] = {}
    notes: dict[str, str] = {}  # footnote text -> its mark

    def mark(note: str) -> str:  # a note quotes a row's reason and names: one line, always
        return notes.setdefault(printable(note), superscript(len(notes) + 1))

    for n in ns:
        for k in columns:
            r = cells.get((n, k))
            value[(n, k)] = None
            if r is None:
                text[(n, k)] = MISSING
                continue
            b = base.get(group(r))
            if b is None:
                text[(n, k)] = marked(SKIPPED, mark(f"no {baseline} baseline row at n={n}"))
                continue
            got = ratio(kind, r, b)
            text[(n, k)] = marked(got.text, *map(mark, got.notes))
            value[(n, k)] = got.value
    return text, value, tuple(f"{m} {t}" for t, m in notes.items())


MARKS = "⁰¹²³⁴⁵⁶⁷⁸⁹"  # footnote marks are superscript digits
SUPERSCRIPT = str.maketrans("0123456789", MARKS)
# between two marks on one cell: ``1.14x¹,²`` is footnotes one and two, ``1.14x¹²`` twelve
MARK_SEP = ","
_TRAILING_MARKS = re.compile(f"[{MARKS}]+(?:{MARK_SEP}[{MARKS}]+)*$")


def superscript(i: int) -> str:
    return str(i).translate(SUPERSCRIPT)


def marked(text: str, *marks: str) -> str:
    """``text`` with footnote ``marks`` after those it has already, :data:`MARK_SEP` between
    any two: the one way a cell gets a mark, so that two marks never read as one number."""
    body, before = split_marks(text)
    return body + MARK_SEP.join([*before, *marks])


def split_marks(text: str) -> tuple[str, list[str]]:
    """A cell's text and its footnote marks: ``1.14x¹,²`` -> (``1.14x``, [``¹``, ``²``])."""
    found = _TRAILING_MARKS.search(text)
    if found is None:
        return text, []
    return text[: found.start()], found.group().split(MARK_SEP)
