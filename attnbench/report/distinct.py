"""One row per cell in a report, and a word for every row that does not count.

A run's store writes a cell once and a rerun replaces it in place, so two rows of one cell
(one ``key``) in what a report reads come from outside attnbench: files joined by hand, a
line pasted twice, ``--also`` naming a run already read. The rule: **the later row counts**
(the later line of a file, the later of the files in the order given: the run dir, then
each ``--also``), as a rerun would have left it; an exact copy of a row counts once. Every
row left out is said, with where it was: a report never silently chooses between figures.

So is every row no table can use (:func:`unusable`): a row with no status, a quality row
that failed or holds no figures, a cost row without the settings of its workload (a decode
row without ``decode_tokens``: which rows it is set beside is unknown). Such a row is left
out of every table, by name, rather than left to make a table of its own whose footnote
blames a baseline that is there.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.report import outline
from attnbench.report import sections as _builtins  # noqa: F401 (registers the built-ins)
from attnbench.row import Row, printable
from attnbench.workload import find


def distinct(
    read: list[tuple[Path, list[tuple[int, Row]]]],
) -> tuple[list[Row], list[str]]:
    """The rows that count (in the order read, a replaced row's place taken by the row that
    replaced it) and one line per row left out (past :data:`SAY_EACH` rows of a file that
    repeat cells read before, one line with their count), given each file's rows with their
    line numbers; a file named twice (the same file through two paths) is read once, a row no
    table can use (:func:`unusable`) is left out by name."""
    chosen: dict[object, tuple[str, Row]] = {}
    said: list[str | tuple[Path, str]] = []  # a line, or where a file's repeats are said
    again: dict[tuple[Path, str], list[tuple[str, str]]] = {}
    seen_files: dict[Path, Path] = {}
    for path, rows in read:
        same = seen_files.setdefault(path.resolve(), path)
        if same is not path:
            said.append(f"{_shown(path)} is named more than once: read once")
            continue
        for line_no, r in rows:
            where = f"{_shown(path)}:{line_no}"
            key = r.key if r.key is not None else (where,)  # a row without a key is its own
            if key in chosen:
                before, old = chosen[key]
                if old.to_dict() == r.to_dict():
                    kind, first = "exact", f"{where} repeats {before}"
                    line = f"{first} exactly: counted once"
                else:
                    kind, first = "differ", f"{where} and {before}, {cell_words(r)}"
                    line = (
                        f"{where} and {before} are the same cell ({cell_words(r)}) with "
                        f"different figures: {where} counts, the later (docs/reports.md, "
                        "'Two rows of one cell')"
                    )
                if (path, kind) not in again:
                    said.append((path, kind))
                again.setdefault((path, kind), []).append((line, first))
                chosen.pop(key)  # re-inserted below: a later row takes the later place
            chosen[key] = (where, r)
    lines = [line for s in said for line in ([s] if isinstance(s, str) else _again(*s, again[s]))]
    tables = [s for s in outline.sections() if s.document is not None]
    kept = []
    for where, r in chosen.values():
        why = unusable(r)
        if why is None and not any(s.applies(r) for s in tables):
            why = f"no table reads task={r.task} rows (a plugin's, not loaded here?)"
        if why is None:
            kept.append(r)
        else:
            lines.append(f"{where}: {cell_words(r)} ({r.task}) is in no table: {why}")
    return kept, lines


SAY_EACH = 3  # a file's rows of cells read before, said one by one up to this many


def _again(path: Path, kind: str, rows: list[tuple[str, str]]) -> list[str]:
    """One file's rows of cells read before (``exact``: copies of the earlier row;
    ``differ``: other figures), given as (the line for one, a few words for the first): a
    line each, or past :data:`SAY_EACH` one line with their count and the first, so that a
    file of one row pasted 12 000 times is one line, not 12 000 (docs/reports.md, 'Two rows
    of one cell')."""
    if len(rows) <= SAY_EACH:
        return [line for line, _ in rows]
    what = {
        "exact": "repeat a row read before exactly: each counted once",
        "differ": "are cells read before with different figures: each counts, not the earlier",
    }[kind]
    return [f"{_shown(path)}: {len(rows)} rows {what} (the first: {rows[0][1]})"]


def unusable(row: Row) -> str | None:
    """Why no table can use ``row``, or None where one can. A cost row that failed is
    used (its cell shows the status, its footnote the reason); a quality row that failed
    has no figure to show. A workload's settings (:attr:`attnbench.workload.Workload.
    settings`) are what its rows are compared by (:func:`attnbench.report.ratio.group`):
    a row without one cannot be set beside any baseline."""
    if row.status is None:
        return "no status: nothing was measured"
    if row.task != "cost":
        if row.status != "ok":
            return f"{row.status}: {row.reason or 'no reason given'}"
        return None if row.quality else "no quality figures"
    work = find(row.mode)
    missing = [  # a setting whose default is null (packed's explicit lengths) may be null
        s.name
        for s in (work.settings if work else ())
        if getattr(row, s.name) is None and s.default is not None
    ]
    if missing:
        return f"no {', '.join(missing)}: a {row.mode} row is compared by its workload's settings"
    return None


def _shown(path: Path) -> str:
    return printable(str(path))


def cell_words(r: Row) -> str:
    """A row's cell in a few words: ``linformer k=128 n=512 inference``."""
    k = f" k={r.k}" if r.k is not None else ""
    return f"{r.attention}{k} n={r.n} {r.mode}"
