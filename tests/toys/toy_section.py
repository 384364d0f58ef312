"""A report section, and a document of its own, added from this file alone.

The toy is "one line per mechanism: its rows, those ``ok``, its modes": a table of every row,
so that whatever else a run holds (a cost cell, a decode cell, a quality task), the section
has something to show. Loaded as a plugin (``ATTNBENCH_PLUGINS=tests.toys.toy_section``), it
writes ``toy.md`` and ``toy.tex`` beside the built-in documents, a table on the page and its
records under ``report.json``'s ``toy_census`` key, after the built-in keys.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from attnbench.report.grid import Grid
from attnbench.report.outline import Basis, Document, Part, Section, register, register_document

if TYPE_CHECKING:  # plugins load while attnbench.row is imported: no import of it here
    from attnbench.row import Row

TITLE = "Rows per mechanism (toy)"


def census(basis: Basis) -> list[Part]:
    """One line per mechanism, in the order the rows first name it."""
    by: dict[str, list[Row]] = {}
    for r in basis.rows:
        by.setdefault(r.attention, []).append(r)
    body = [
        [name, str(len(rows)), str(sum(r.status == "ok" for r in rows)),
         ", ".join(sorted({r.mode if r.task == "cost" else r.task for r in rows}))]
        for name, rows in by.items()
    ]  # fmt: skip
    grid = Grid(TITLE, ["mechanism", "rows", "ok", "modes"], body, [])
    return [Part(TITLE, grid, (dataclasses.asdict(grid),))]


DOCUMENT = Document("toy", " Toy: one line per mechanism.", ("toy_census",))
SECTION = Section("toy-census", TITLE, lambda r: True, census, DOCUMENT.name, "toy_census")

register_document(DOCUMENT)
register(SECTION)
