"""One row per cell in a report, and a word for every row that does not count.

A run's store writes a cell once and a rerun replaces it in place, so two rows of one cell
(one ``key``) in what a report reads come from outside attnbench: files joined by hand, a
line pasted twice, ``--also`` naming a run already read. The rule: **the later row counts**
(the later line of a file, the later of the files in the order given: the run dir, then
each ``--also``), as a rerun would have left it; an exact copy of a row counts once. Every
row left out is said, with where it was: a report never silently chooses between figures.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.row import Row, printable


def distinct(
    read: list[tuple[Path, list[tuple[int, Row]]]],
) -> tuple[list[Row], list[str]]:
    """The rows that count (in the order read, a replaced row's place taken by the row that
    replaced it) and one line per row left out, given each file's rows with their line
    numbers; a file named twice (the same file through two paths) is read once."""
    chosen: dict[object, tuple[str, Row]] = {}
    said: list[str] = []
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
                    said.append(f"{where} repeats {before} exactly: counted once")
                else:
                    said.append(
                        f"{where} and {before} are the same cell ({_cell(r)}) with "
                        f"different figures: {where} counts, the later (docs/reports.md, "
                        "'Two rows of one cell')"
                    )
                chosen.pop(key)  # re-inserted below: a later row takes the later place
            chosen[key] = (where, r)
    return [r for _, r in chosen.values()], said


def _shown(path: Path) -> str:
    return printable(str(path))


def _cell(r: Row) -> str:
    k = f" k={r.k}" if r.k is not None else ""
    return f"{r.attention}{k} n={r.n} {r.mode}"
