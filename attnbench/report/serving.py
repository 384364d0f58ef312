"""Serving (``mode=decode``): the report's serving tables, pure functions of rows.

A decode row's time is one generated token of each of ``time_batch`` sequences (its
``time_per_seq_s``: per token per sequence), its ``max_batch`` (``batch=max`` rows) the most
sequences whose caches or states fit the ceiling. The tables are Table 3's layout turned
about: rows n, a column per mechanism configuration (its parameters, grouped-query heads and
the state's dtype: ``vanilla (kv_heads=3)``, ``linear (state=fp32)``), each cell
:func:`attnbench.report.ratio.ratio` against the baseline with its full cache at the same
n, dtype, preset, decode tokens, state dtype and batch (:func:`attnbench.report.ratio.group`,
:func:`~attnbench.report.ratio.is_baseline`), filled by :func:`attnbench.report.tables.fill`,
the Table 3 tables' own:

* the **time-per-token ratio** at each fixed batch (1, 8): the baseline's time ÷ the
  mechanism's;
* the **max-batch ratio** (``batch=max`` rows): the mechanism's max batch ÷ the baseline's.

The efficiency lengths are :func:`attnbench.report.efficiency.efficiency_lengths` on the
same rows: the shortest n at which a token is faster (batch 1), at which more sequences fit,
and the n at which fewer fit (a fixed state bigger than the cache at short n). The grids
beside them, the bytes one sequence keeps and the bandwidth a batch-1 step achieved, are
:mod:`attnbench.report.serving_state`'s, over the same sets of rows (:func:`row_sets`) and
columns (:func:`columns`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from attnbench.report import models
from attnbench.report.efficiency import Length, efficiency_lengths
from attnbench.report.efficiency import grid as lengths_grid
from attnbench.report.grid import Grid
from attnbench.report.ratio import baselines, compared, compiled, kv_heads, setting
from attnbench.report.tables import RatioTable, context, fill
from attnbench.row import Row, as_rows, printable
from attnbench.workload.decode_mix import mix_label

MODE = "decode"
MAX = "max"


def applies(row: Row) -> bool:
    """A serving row: a cost row of the decode workload, not a named model's (those are
    compared with their twins: :mod:`attnbench.report.models`)."""
    return row.task == "cost" and row.mode == MODE and models.name(row) is None


def configuration(row: Row) -> str:
    """A column's label, as stored: the mechanism with its parameters (``causal`` aside:
    every decode row is causal), its grouped-query heads and its state's dtype where not
    the cell's (``auto``), compiled or not (:func:`~attnbench.report.ratio.compiled`), and
    its budget: ``local (window=256, state=fp32)``, ``linear compiled``."""
    inner = [f"{k}={v}" for k, v in sorted((row.params or {}).items()) if k != "causal"]
    if kv := kv_heads(row):
        inner.append(f"kv_heads={kv}")
    if row.state_dtype not in (None, "auto"):
        inner.append(f"state={row.state_dtype}")
    name = f"{row.attention} ({', '.join(inner)})" if inner else row.attention
    name += f" {c}" if (c := compiled(row)) else ""
    return name + (f" k={row.k}" if row.k else "")


def where(row: Row) -> tuple:
    """What one set of serving tables shares: :func:`~attnbench.report.ratio.setting` but
    the batch (a table per batch) and the state's dtype (a column's); compiled rows are a
    set of their own, against vanilla compiled."""
    return setting(dataclasses.replace(row, batch_asked="", state_dtype=""))


def row_sets(rows: Iterable[Row | dict[str, Any]]) -> list[list[Row]]:
    """The serving rows by :func:`where`, in the rows' order."""
    sets: dict[tuple, list[Row]] = {}
    for r in as_rows(rows):
        if applies(r):
            sets.setdefault(where(r), []).append(r)
    return list(sets.values())


def columns(rows: list[Row]) -> dict[str, str]:
    """Each configuration's column heading, in the rows' order: printable, and told apart
    where two print alike."""
    out: dict[str, str] = {}
    for raw in dict.fromkeys(map(configuration, rows)):
        shown = printable(raw)
        while shown in out.values():
            shown += " (2)"
        out[raw] = shown
    return out


def _batches(rows: list[Row]) -> list[int | str]:
    """The batches the rows asked: fixed ones in order, then ``max``."""
    fixed = sorted({r.batch_asked for r in rows if isinstance(r.batch_asked, int)})
    return [*fixed, *([MAX] if any(str(r.batch_asked) == MAX for r in rows) else [])]


def _context(rows: list[Row], batch: int | str, baseline: str) -> str:
    first = rows[0]
    chunk = f", prefill chunk {first.prefill_chunk}" if first.prefill_chunk else ""
    what = (
        "max batch: the most sequences whose caches or states fit the ceiling"
        if batch == MAX
        else f"time per generated token per sequence at batch {batch}"
    )
    return context(
        rows,
        f"serving, a prompt of n then {first.decode_tokens} tokens{chunk}; {what}; each "
        f"column against {baseline} with every head's cache, the same state dtype, ",
    )


def words(rows_here: list[Row], many: bool) -> str:
    """What tells one set of rows from the others where a report has several (a title's
    last words): the dtype, the tokens, the mix of prompts, compiled or not."""
    if not many:
        return ""
    first = rows_here[0]
    how = f", {c}" if (c := compiled(first)) else ""
    return f" ({first.dtype}, {first.decode_tokens} tokens{mix_label(first)}{how})"


def serving_tables(
    rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla"
) -> list[tuple[RatioTable, str]]:
    """Per set of rows (:func:`row_sets`): a time-per-token ratio table per fixed batch and
    the max-batch ratio table, each with the stem of its file (``serving-b1``, ``serving``);
    columns are configurations, the baseline's own not among them. A cell with no baseline
    row beside it is a footnoted ``n/m``."""
    sets = row_sets(rows)
    out = []
    for rows_here in sets:
        base = baselines(rows_here, baseline)
        mine = compared(rows_here, baseline)
        heads = columns(mine)
        many = words(rows_here, len(sets) > 1)
        for batch in _batches(rows_here):
            at = [r for r in mine if str(r.batch_asked) == str(batch)]
            if not at:
                continue
            kind = "memory" if batch == MAX else "time"
            ns = tuple(sorted({r.n for r in rows_here if str(r.batch_asked) == str(batch)}))
            cells = {(r.n, heads[configuration(r)]): r for r in at}
            cols = tuple(h for h in heads.values() if any(c == h for _, c in cells))
            text, value, notes = fill(kind, ns, cols, cells, base, baseline)
            what = "max batch" if batch == MAX else f"time per token at b={batch}"
            stem = "serving" + ("" if batch == MAX else f"-b{batch}")
            table = RatioTable(
                f"serving, {what}{many}",
                kind,
                ns,
                cols,
                text,
                value,
                notes,
                _context(at, batch, baseline),
                attention=baseline,
                column="mechanism",
                mode=MODE,
            )
            out.append((table, stem))
    return out


TITLE = "Serving: the shortest n at which each configuration beats {}"
HEADS = {
    "time": "faster per token than {} (b=1)",
    "memory": "more sequences fit than {} (max batch)",
}
BEHIND = "fewer fit than {} (its state bigger than the cache) at n"
LEGEND = (
    "Time: the time-per-token ratio at batch 1; memory: the max-batch ratio (batch=max "
    "rows). The last column lists the n compared at which the max-batch ratio is under 1 "
    "before it is first over 1: a fixed state (or a window) bigger than the baseline's cache "
    "at short n."
)


def serving_lengths(
    rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla"
) -> list[tuple[str, list[Length]]]:
    """Per set of rows (:func:`row_sets`): its :func:`words` and each configuration's
    efficiency lengths against the baseline, the time's at batch 1 and the max batch's;
    sets with none left out."""
    out = []
    sets = row_sets(rows)
    for rows_here in sets:
        one = [r for r in rows_here if str(r.batch_asked) == "1"]
        most = [r for r in rows_here if str(r.batch_asked) == MAX]
        got = efficiency_lengths(one, (baseline,), kinds=("time",), label=configuration)
        got += efficiency_lengths(most, (baseline,), kinds=("memory",), label=configuration)
        if got:
            order = list(columns(rows_here).values())  # the tables' order of columns
            ordered = sorted(
                got, key=lambda x: order.index(x.mechanism) if x.mechanism in order else len(order)
            )
            out.append((words(rows_here, len(sets) > 1), ordered))
    return out


def lengths_table(lengths: list[Length], words: str = "") -> Grid:
    """The efficiency lengths of one set of rows as the report prints them."""
    base = lengths[0].baseline
    return lengths_grid(
        lengths, title=TITLE.format(base) + words, heads=HEADS, behind=BEHIND, legend=(LEGEND,)
    )
