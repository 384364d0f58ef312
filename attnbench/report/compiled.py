"""Compiled cells (``compile=true``) and ``flex``: the compiled document's tables, pure
functions of rows.

A compiled row (each encoder layer under ``torch.compile``) is set beside its **eager
twin**, the row of the same mechanism, k, n and setting with ``compile`` false (:func:`twin`);
``flex`` compiles its own kernel whatever ``compile`` says (``row.compiled == "kernel"``), so
its eager twin is its kernel in the eager model. Every ratio is
:func:`attnbench.report.ratio.ratio` (busy, skipped or out-of-memory rows are no figure):
:func:`side_by_side` (eager and compiled time, the speed-up from compiling = eager ÷
compiled, compile, kernel compile and mask build times, compilations), :func:`compiled_lengths`
(efficiency lengths against the baseline compiled the same way and against sdpa),
:func:`short_n` (where compiling starts to pay); the profiler's compiled peak against the
eager one is :mod:`attnbench.report.compiled_memory`'s, flex beside local
:mod:`attnbench.report.flex`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from attnbench.report.efficiency import budgeted, crossing, efficiency_lengths
from attnbench.report.efficiency import grid as lengths_grid
from attnbench.report.grid import Grid, sig
from attnbench.report.marks import BUSY, MISSING, OOM, SKIPPED
from attnbench.report.ratio import (
    compiled,
    eager,
    group,
    is_baseline,
    ratio,
    unnamed,
)
from attnbench.report.tables import context, marked, superscript
from attnbench.row import Row, as_rows, printable
from attnbench.workload import label_of

FLEX, LOCAL, SDPA = "flex", "local", "sdpa"
KERNEL = "kernel"  # row.compiled of a mechanism that compiles its own kernel (flex)


def applies(row: Row) -> bool:
    """A row the compiled sections read: a cost row (eager ones are compiled ones' twins)."""
    return row.task == "cost"


def wanted(row: Row) -> bool:
    """A row the compiled sections are made for: compiled, or flex (its kernel compiled in
    an eager model); a report without one has none of them."""
    return applies(row) and (
        compiled(row) is not None
        or row.attention == FLEX
        or getattr(row, "compiled", None) is not None
    )


def plain(row: Row) -> str:
    """A mechanism's name in these tables, as stored: its name, eager, with its k."""
    return budgeted(eager(row))


def twin(row: Row) -> tuple:
    """What a row and its eager twin share: the mechanism, k, state dtype and group."""
    return (plain(row), getattr(row, "state_dtype", None), group(eager(row)))


def where(row: Row) -> str:
    """The words a table's title says of its rows: the work, dtype and preset."""
    return printable(f"{label_of(row)}, {row.dtype}, preset {row.device}")


def ms(row: Row | None) -> str:
    """A row's time per sequence in ms, or what it has instead: ``-`` (no row), ``OOM``,
    ``error``, ``n/m`` (not timed), ``busy`` (timed on a contended CPU: no figure)."""
    if row is None:
        return MISSING
    if row.status != "ok":
        return OOM if row.status == "oom" else row.status if row.status == "error" else SKIPPED
    if not row.time_per_seq_s:
        return SKIPPED
    return BUSY if row.busy else sig(row.time_per_seq_s * 1e3)


def _s(v: float | None) -> str:
    return MISSING if v is None else sig(v)


class Marks:
    """A table's footnotes: one mark per distinct note, in order."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    def __call__(self, note: str) -> str:
        return self.notes.setdefault(printable(note), superscript(len(self.notes) + 1))

    def lines(self) -> list[str]:
        return [f"{m} {t}" for t, m in self.notes.items()]


def against(r: Row, b: Row | None, mark: Marks, words: tuple[str, str]) -> tuple[str, Any]:
    """:func:`~attnbench.report.ratio.ratio` of ``r``'s time against ``b``'s, its notes
    marked, "the baseline" and "this mechanism" in them said as ``words``."""
    if b is None:
        return marked(SKIPPED, mark(f"no row of {words[0]} beside it")), None
    got = ratio("time", r, b)
    notes = (
        n.replace("the baseline", words[0]).replace("this mechanism", words[1]) for n in got.notes
    )
    return marked(got.text, *map(mark, notes)), got.value


EAGER = ("the eager model", "the compiled model")


def compiled_sets(rows: list[Row]) -> dict[tuple, list[Row]]:
    """The compiled rows by what one table shares: :func:`~attnbench.report.ratio.unnamed`
    and how they were compiled."""
    out: dict[tuple, list[Row]] = {}
    for r in rows:
        if c := compiled(r):
            out.setdefault((unnamed(r), c), []).append(r)
    return out


def side_by_side(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setting and compile mode: a row per mechanism and n, eager beside compiled."""
    rows = [r for r in as_rows(rows) if applies(r)]
    eagers = {twin(r): r for r in rows if not compiled(r)}
    sets = compiled_sets(rows)
    kernel = [r for r in rows if getattr(r, "compiled", None) == KERNEL and not compiled(r)]
    for r in kernel:  # flex never compiled but its kernel: a table all the same
        if not any(w == unnamed(r) for w, _ in sets):
            sets[(unnamed(r), "compiled")] = []
    out = []
    for (at, c), here in sets.items():
        comp = {twin(r): r for r in here}
        mechs = {plain(r) for r in here} | {plain(r) for r in kernel if unnamed(r) == at}
        order = list(dict.fromkeys(plain(r) for r in [*here, *kernel] if plain(r) in mechs))
        keys = dict.fromkeys([*comp, *(k for k, r in eagers.items() if unnamed(r) == at)])
        keys = sorted(
            (k for k in keys if k[0] in mechs), key=lambda k: (order.index(k[0]), k[2][0], str(k))
        )
        mark, body = Marks(), []
        for k in keys:
            cr, er = comp.get(k), eagers.get(k)
            speed = against(cr, er, mark, EAGER)[0] if cr is not None else MISSING
            body.append(
                [
                    printable(k[0]),
                    str(k[2][0]),
                    ms(er),
                    ms(cr),
                    speed,
                    _s(cr.compile_s if cr is not None else None),
                    _s(er.compile_s if er is not None else None),
                    _s(next((x.mask_build_s for x in (cr, er) if x and x.mask_build_s), None)),
                    str(next((x.compilations for x in (cr, er) if x and x.compilations), MISSING)),
                ]
            )
        head = ["mechanism", "n", "eager (ms)", f"{c} (ms)", *SIDE_HEAD]
        keep = [i for i in range(len(head)) if i < 6 or any(b[i] != MISSING for b in body)]
        first = (here or [r for r in rows if unnamed(r) == at])[0]
        out.append(
            Grid(
                f"Eager and {c} side by side: {where(first)}",
                [head[i] for i in keep],
                [[b[i] for i in keep] for b in body],
                [SIDE, *mark.lines(), context([first, *(r for r in rows if unnamed(r) == at)])],
            )
        )
    return out


SIDE_HEAD = ("speed-up", "compile (s)", "kernel compile (s)", "mask build (s)", "compilations")
SIDE = (
    "Time per sequence (ms); speed-up from compiling = eager ÷ compiled at the same n, dtype, "
    "preset, batch and work (> 1: compiling pays); compile: the first call at the timed "
    "batch, compilation included; kernel compile: flex's own kernel, compiled in the eager "
    "model; mask build: flex's block mask, once per n and pattern; compilations: graphs "
    "compiled for the cell. busy: timed on a contended CPU, no figure; -: no such row."
)


def compiled_lengths(rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla") -> list[Grid]:
    """Per setting and compile mode: each compiled mechanism's time efficiency length
    against ``baseline`` compiled the same way and against sdpa (compiled where the rows
    have it there, else eager sdpa)."""
    rows = [r for r in as_rows(rows) if applies(r)]
    out = []
    for (at, c), here in compiled_sets(rows).items():
        got = efficiency_lengths(here, (baseline,), kinds=("time",), label=plain)
        lengths = [dataclasses.replace(x, baseline=f"{x.baseline} {c}") for x in got]
        if baseline != SDPA:
            if any(is_baseline(r, SDPA) for r in here):
                theirs, tag = here, f"{SDPA} {c}"
            else:  # eager sdpa, set in the compiled rows' groups: said in the heading
                mode = {"compile": True, "compile_mode": here[0].compile_mode}
                subs = [
                    dataclasses.replace(r, **mode)
                    for r in rows
                    if is_baseline(r, SDPA) and not compiled(r) and unnamed(r) == at
                ]
                theirs, tag = here + subs, f"{SDPA} (eager)"
            got = efficiency_lengths(theirs, (SDPA,), kinds=("time",), label=plain)
            lengths += [dataclasses.replace(x, baseline=tag) for x in got]
        if lengths:
            out.append(
                lengths_grid(
                    lengths,
                    title=f"Efficiency length, {c}: the shortest n at which each compiled "
                    f"mechanism is faster ({where(here[0])})",
                    heads={"time": "faster than {}"},
                    legend=(LENGTHS.format(baseline, c),),
                )
            )
    return out


LENGTHS = (
    "Time only (the time ratio at each n), of compiled rows: against {0} {1} (each encoder "
    "layer compiled the same way), and against sdpa, compiled where the rows have it, else "
    "sdpa eager (the heading says which)."
)


def short_n(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setting and compile mode: each compiled mechanism's speed-up from compiling at
    its smallest and largest n and the smallest n from which compiling pays."""
    rows = [r for r in as_rows(rows) if applies(r)]
    eagers = {twin(r): r for r in rows if not compiled(r)}
    out = []
    for (_, c), here in compiled_sets(rows).items():
        by: dict[str, list[Row]] = {}
        for r in here:
            by.setdefault(plain(r), []).append(r)
        notes: list[str] = []
        body = []
        for mech, mine in by.items():
            points: list[tuple[int, float]] = []
            busy, compile_at = [], {}
            for r in sorted(mine, key=lambda r: r.n):
                e = eagers.get(twin(r))
                got = None if e is None else ratio("time", r, e)
                if got is not None and got.text == BUSY:
                    busy.append(r.n)
                elif got is not None and got.value is not None:
                    points.append((r.n, got.value))
                    compile_at[r.n] = r.compile_s
            _, text, _, note = crossing(points)
            if busy:
                gone = f"n = {', '.join(map(str, busy))} left out: machine busy"
                note = "; ".join(filter(None, [note, gone]))
            if note:
                notes.append(f"({len(notes) + 1}) {printable(mech)}: {note}")
                text += f" ({len(notes)})"
            ends = [points[0], points[-1]] if points else []
            cells = [x for n, v in ends for x in (str(n), f"{v:.2f}x")] or [MISSING] * 4
            first = _s(compile_at.get(points[0][0])) if points else MISSING
            body.append([printable(mech), *cells[:2], first, text, *cells[2:]])
        title = f"The short-n end, {c}: where compiling pays ({where(here[0])})"
        out.append(Grid(title, SHORT_HEAD, body, [SHORT, *notes]))
    return out


SHORT_HEAD = ["mechanism", "smallest n", "speed-up", "compile (s)", "compiling pays from n",
              "largest n", "speed-up"]  # fmt: skip
SHORT = (
    "Speed-up from compiling = eager ÷ compiled time per sequence at the same n (the first "
    "table's); compile: the first call at the smallest n, compilation included (s); pays "
    "from: the smallest n at which the speed-up is over 1, ≈ interpolated between two swept "
    "n (log n against log speed-up), ≤ over 1 already at the smallest n, > over 1 at no n "
    "compared (the largest given)."
)
