"""Table 3 as the paper lays it out: rows n, columns k, ratios against the baseline.

Pure functions of rows (``cells.jsonl``): no measuring, no files. For each efficient
mechanism (with its parameters) against the baseline at the same n, dtype, device and model
(:func:`attnbench.report.ratio.group`), each cell is :func:`attnbench.report.ratio.ratio`:
a number only where both rows measured it, else the status that left it undefined with a
footnote. A cell with no row at all (k >= n) is ``-``, as in the paper.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from attnbench import cell
from attnbench.report.ratio import SKIPPED, group, ratio, setting
from attnbench.row import Row, as_rows, printable, shorten
from attnbench.workload import caption_of

MISSING = "-"  # no such cell (e.g. k >= n), as in the paper


@dataclass(frozen=True)
class RatioTable:
    """One of Table 3's two halves for one mechanism: ``text[(n, k)]`` is what to print,
    ``value[(n, k)]`` the number behind it (None where there is none)."""

    mechanism: str
    kind: str  # "time" or "memory"
    ns: tuple[int, ...]
    ks: tuple[int, ...]
    text: dict[tuple[int, int], str]
    value: dict[tuple[int, int], float | None]
    footnotes: tuple[str, ...] = field(default=())
    context: str = ""
    attention: str = ""  # the registry name behind ``mechanism`` (which carries its params)
    column: str = "k"  # what the columns are: the mechanism's budget (k, nb_features)
    mode: str = "inference"  # or "train": a training step's table (the paper has none)


def heading(t: RatioTable, k: int | None) -> str:
    """A column's heading: ``k=128``; ``ratio`` for a mechanism without a budget."""
    return "ratio" if k is None else f"{t.column}={k}"


def _context(rows: list[Row]) -> str:
    first = rows[0]
    model = first.model or {}
    env = first.env or {}
    shape = ", ".join(f"{k} {v}" for k, v in model.items())
    date = ""
    if first.finished_at:
        when = datetime.datetime.fromtimestamp(first.finished_at, datetime.timezone.utc)
        date = when.strftime("%Y-%m-%d")
    batch = str(first.batch_asked)
    caption = caption_of(first)
    work = f"{caption}, " if caption else ""
    return printable(
        work + f"preset {first.device}, run on {env.get('device_name', '?')}, {first.dtype}, "
        f"model {shape}, ceiling {first.ceiling_bytes} bytes, "
        + ("" if batch == "max" else f"fixed batch {batch}, ")
        + f"attnbench {env.get('attnbench', '?')}"
        + (f", {date}" if date else "")
    )


def ratio_tables(
    rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla"
) -> list[RatioTable]:
    """Time and memory ratio tables for every mechanism other than ``baseline``."""
    rows = as_rows(rows)
    base = {group(r): r for r in rows if r.attention == baseline}
    if not base:
        have = sorted({r.attention for r in rows})
        raise ValueError(
            f"baseline: no rows of {shorten(repr(baseline), 80)}; the rows have "
            f"{', '.join(shorten(a, 80) for a in have[:20])}{', ...' if len(have) > 20 else ''}"
        )
    # one table per mechanism and setting: a run dir that holds fp16 and fp32 rows (or two
    # ceilings) gives two tables, never one that silently mixes them; grouped by the label
    # as stored, so that two values that print alike ("a\nb" and "a\\nb") stay apart
    by_mech: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.attention != baseline:
            by_mech.setdefault((cell.label(r.attention, r.params), setting(r)), []).append(r)
    tables = []
    for (raw, where), mrows in by_mech.items():
        mech = printable(raw)
        ns = tuple(sorted({r.n for r in mrows} | {b[0] for b in base if b[1:] == where}))
        # a mechanism without a budget (sdpa, xformers) gets one column, headed "ratio"
        ks = tuple(sorted({r.k for r in mrows if r.k is not None})) or (None,)
        for kind in ("time", "memory"):
            tables.append(_table(mech, kind, ns, ks, mrows, base))
    return tables


def _table(
    mech: str,
    kind: str,
    ns: tuple[int, ...],
    ks: tuple[int, ...],
    mrows: list[Row],
    base: dict[tuple, Row],
) -> RatioTable:
    text: dict[tuple[int, int], str] = {}
    value: dict[tuple[int, int], float | None] = {}
    notes: dict[str, str] = {}  # footnote text -> its mark

    def mark(note: str) -> str:  # a note quotes a row's reason and names: one line, always
        return notes.setdefault(printable(note), superscript(len(notes) + 1))

    cells = {(r.n, r.k): r for r in mrows}
    for n in ns:
        for k in ks:
            r = cells.get((n, k))
            value[(n, k)] = None
            if r is None:
                text[(n, k)] = MISSING
                continue
            b = base.get(group(r))
            if b is None:
                text[(n, k)] = SKIPPED + mark(f"no {r.attention} baseline row at n={n}")
                continue
            got = ratio(kind, r, b)
            text[(n, k)] = got.text + "".join(map(mark, got.notes))
            value[(n, k)] = got.value
    return RatioTable(
        mech,
        kind,
        ns,
        ks,
        text,
        value,
        tuple(f"{m} {t}" for t, m in notes.items()),
        _context(mrows),
        attention=mrows[0].attention,
        column=mrows[0].budget or "k",
        mode=mrows[0].mode,
    )


MARKS = "⁰¹²³⁴⁵⁶⁷⁸⁹"  # footnote marks are superscript digits
SUPERSCRIPT = str.maketrans("0123456789", MARKS)


def superscript(i: int) -> str:
    return str(i).translate(SUPERSCRIPT)
