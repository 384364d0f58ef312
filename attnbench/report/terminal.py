"""A report's tables in the terminal, with rich: each section's tables in the report's
order; of the paper beside a measured table, the quotient measured ÷ paper."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnbench.report.grid import Grid
from attnbench.report.paper import Beside
from attnbench.report.tables import RatioTable, heading

if TYPE_CHECKING:
    from attnbench.report.files import Report


def print_tables(report: Report, console: Any) -> None:
    """Every table of ``report`` on ``console``: grids, measured ratios, then measured ÷
    paper where it applies."""
    from rich.markup import escape
    from rich.table import Table

    def show(t: RatioTable, title: str) -> None:
        # title and notes outside the table: inside, rich wraps them to the table's width
        table = Table("n", *(heading(t, k) for k in t.ks))
        for n in t.ns:
            table.add_row(str(n), *(t.text[(n, k)] for k in t.ks))
        console.print(
            f"[bold]{escape(title)}[/bold]",
            table,
            *map(escape, t.footnotes),
            f"[dim]{escape(t.context)}[/dim]",
            "",
            sep="\n",
        )

    for _, parts in report.made:
        for part in parts:
            body = part.body
            if isinstance(body, Grid):
                table = Table(*body.head)
                for r in body.body:
                    table.add_row(*r)
                console.print(
                    f"[bold]{escape(body.title)}[/bold]", table, *map(escape, body.notes), ""
                )
            elif isinstance(body, Beside):
                q = body.quotient
                show(q, f"{q.kind} ratio, {body.measured.source} ÷ paper's Table 3")
            elif isinstance(body, RatioTable):
                show(body, f"{body.kind} ratio: {body.mechanism}")
