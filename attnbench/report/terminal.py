"""A report's tables in the terminal, with rich: each section's tables in the report's
order; of the paper beside a measured table, the quotient measured ÷ paper.

Every piece of text, a table's cells and headings too, is cut short and escaped
(:func:`show`): rich reads ``[...]`` as markup (a stray ``[/x]`` raises), and wraps a long
word in time that grows with its square."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnbench.report.grid import Grid
from attnbench.report.marks import LEGEND
from attnbench.report.paper import Beside
from attnbench.report.tables import RatioTable, heading
from attnbench.row import shown

if TYPE_CHECKING:
    from attnbench.report.files import Report


def show(text: str) -> str:
    """``text`` as rich prints it literally: cut short (:func:`attnbench.row.shown`),
    every ``[`` escaped."""
    from rich.markup import escape

    return escape(shown(text))


def print_tables(report: Report, console: Any) -> None:
    """Every table of ``report`` on ``console``: grids, measured ratios, then measured ÷
    paper where it applies."""
    from rich.table import Table

    def table(head: list[str], body: list[list[str]]) -> Table:
        made = Table(*map(show, head))
        for r in body:
            made.add_row(*map(show, r))
        return made

    def ratios(t: RatioTable, title: str) -> None:
        # title and notes outside the table: inside, rich wraps them to the table's width
        body = [[str(n), *(t.text[(n, k)] for k in t.ks)] for n in t.ns]
        console.print(
            f"[bold]{show(title)}[/bold]",
            table(["n", *(heading(t, k) for k in t.ks)], body),
            *map(show, t.footnotes),
            f"[dim]{show(t.context)}[/dim]",
            "",
            sep="\n",
        )

    for _, parts in report.made:
        for part in parts:
            body = part.body
            if isinstance(body, Grid):
                console.print(
                    f"[bold]{show(body.title)}[/bold]",
                    table(body.head, body.body),
                    *map(show, body.notes),
                    "",
                )
            elif isinstance(body, Beside):
                q = body.quotient
                ratios(q, f"{q.kind} ratio, {body.measured.source} ÷ paper's Table 3")
            elif isinstance(body, RatioTable):
                ratios(body, f"{body.kind} ratio: {body.mechanism}")
    if any(parts for _, parts in report.made):  # what the marks in the tables above mean
        console.print(f"[dim]{show(LEGEND)}[/dim]")
