"""A run directory's report on disk and in the terminal.

:func:`build` reads ``cells.jsonl`` (a corrupt line is an error naming its number, never
dropped) and makes every table; :func:`render` turns a report into file contents, all in
memory; :func:`write` (:mod:`attnbench.report.replace`) puts them in place in one step, so
a crash or a plotting error leaves the previous report whole rather than half of a new one,
and one writer at a time, so that two reports of one run (a sweep's end and a user's
``attnbench report``) never collide.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench import row
from attnbench.report import efficiency, html, plots, quality
from attnbench.report.paper import compares_with_paper, load_paper, paper_table, quotient
from attnbench.report.replace import check_out as check_out
from attnbench.report.replace import os_error
from attnbench.report.replace import write as write
from attnbench.report.tables import (
    RatioTable,
    comment,
    grid_markdown,
    heading,
    markdown,
    ratio_tables,
    to_csv,
    to_latex,
    to_markdown,
)
from attnbench.row import printable
from attnbench.store import RunStore


@dataclass(frozen=True)
class Report:
    run_dir: Path
    baseline: str
    rows: list[row.Row]
    tables: list[RatioTable]
    # (measured, paper, measured ÷ paper) for every table the paper's Table 3 speaks to
    beside_paper: list[tuple[RatioTable, RatioTable, RatioTable]]
    # each mechanism's shortest n ahead of the baseline and of sdpa (where the rows have it)
    lengths: list[efficiency.Length]
    # quality beside cost: approximation error and ListOps tables (issue #13)
    quality: list[quality.Grid]


def default_out(run_dir: Path) -> Path:
    """Beside the rows it was made from: ``<run dir>/report``."""
    return Path(run_dir) / "report"


def _rows_file(run_dir: Path) -> Path:
    """``run_dir``'s ``cells.jsonl`` if it is a regular file; else ValueError, one line that
    says what is there instead (nothing, a file for a run dir, a directory, a FIFO that
    would block the read, a symlink loop)."""
    path = RunStore(run_dir).cells
    shown = printable(str(run_dir))
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise ValueError(
                f"run dir: no cells.jsonl in {shown} (is it a directory that 'attnbench run'"
                " wrote?)"
            ) from None
        if e.errno == errno.ENOTDIR:
            raise ValueError(f"run dir: {shown} is a file, not a run directory") from None
        if e.errno == errno.ELOOP:
            raise ValueError(f"run dir: {printable(str(path))} is a symlink loop") from None
        raise ValueError(f"run dir: {printable(str(path))}: {os_error(e)}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"run dir: {printable(str(path))} is not a regular file of rows")
    return path


def build(run_dir: Path, baseline: str = "vanilla", also: Sequence[Path] = ()) -> Report:
    """Every table of ``run_dir``'s rows, and of the rows of the run dirs ``also`` names
    (say, inference and training runs of one grid, so the max-batch plot has both);
    ValueError (one line) if there is nothing to report."""
    run_dir = Path(run_dir)
    path, *more = (_rows_file(Path(d)) for d in (run_dir, *also))
    rows = [r for p in (path, *more) for r in row.read(p) if r.status is not None]
    if not rows:
        raise ValueError(f"run dir: {printable(str(path))} holds no rows yet")
    cost = [r for r in rows if r.task == "cost"]  # quality rows have no time or memory
    tables = ratio_tables(cost, baseline) if cost else []
    paper = load_paper()
    beside = []
    for t in tables:
        if compares_with_paper(t):
            p = paper_table(t, paper)
            beside.append((t, p, quotient(t, p)))
    lengths = efficiency.efficiency_lengths(cost, dict.fromkeys((baseline, "sdpa")))
    return Report(run_dir, baseline, rows, tables, beside, lengths, quality.quality_grids(rows))


# a file name from a label is cut here (and a hash of the whole added): names over 255
# bytes are refused by every common file system, and a parameter's value can be a megabyte
SLUG_CHARS = 100


def slug(text: str) -> str:
    """A file name from a mechanism label: ``linformer-kernel-eager-sharing-layerwise``;
    only ``[a-z0-9-]``, never empty, never longer than :data:`SLUG_CHARS` + 9."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "mechanism"
    if len(name) > SLUG_CHARS:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[:SLUG_CHARS].rstrip('-')}-{digest}"
    return name


def _plain_grids(report: Report) -> list[tuple[str, quality.Grid]]:
    """The tables of plain text, each with its HTML section's name: the efficiency lengths,
    then the quality tables. Every format prints them the same way, from here."""
    out = []
    if report.lengths:
        grid = quality.Grid(efficiency.TITLE, *efficiency.grid(report.lengths))
        out.append(("efficiency length", grid))
    return out + [(g.title, g) for g in report.quality]


def _figures(report: Report) -> list[tuple[str, Any, str]]:
    """(file stem, figure, caption) for each plot the rows hold data for."""
    out = []
    cost = [r for r in report.rows if r.task == "cost"]
    # causal rows get figures of their own: one figure of every mechanism twice is unreadable
    causal = [r for r in cost if (r.params or {}).get("causal")]
    for suffix, rows, what in (
        ("", [r for r in cost if r not in causal], ""),
        ("-causal", causal, " Causal (masked) attention."),
    ):
        out += [
            (
                f"time-vs-n{suffix}",
                plots.time_vs_n(rows),
                f"Time per sequence against n (log-log), one line per mechanism and k.{what}",
            ),
            (
                f"batch-vs-n{suffix}",
                plots.batch_vs_n(rows),
                f"Maximum batch size under the ceiling against n.{what}",
            ),
        ]
    out += [
        (
            "memory-modeled-vs-measured",
            plots.modeled_vs_measured(report.rows),
            "Max batch predicted by the memory model against the one measured on the device.",
        ),
    ]
    for t, stem in zip(report.tables, _stems(report.tables), strict=True):
        if t.kind == "time":
            out.append(
                (
                    f"speedup-{stem}",
                    plots.speedup_heatmap(t),
                    f"Speed-up over n x k: {t.mechanism}.",
                )
            )
    out += quality.approx_vs_budget(report.rows)
    out += quality.spectrum_figures(report.rows)
    out += quality.pareto_figures(report.rows)
    return [(stem, fig, cap) for stem, fig, cap in out if fig is not None]


def render(report: Report, *, with_plots: bool = True) -> dict[str, bytes]:
    """Every file of the report, by relative path: Markdown, CSV, LaTeX, plots, HTML."""
    files: dict[str, bytes] = {}
    # a directory's name can hold a newline too: every format gets it on one line
    title = printable(f"attnbench report: {report.run_dir.name}")
    rows_file = printable(str(report.run_dir / "cells.jsonl"))
    intro = [
        f"Rows: {rows_file} ({len(report.rows)} cells)."
        + (
            f" Time ratio = {report.baseline} time per sequence / mechanism's; memory ratio "
            f"= mechanism max batch / {report.baseline}'s; each model at its own max batch "
            "(Linformer paper, section 5.3)."
            if report.tables
            else " Quality rows: no time or memory ratios."
        )
    ]
    md = [f"# {markdown(title)}", "", *map(markdown, intro), ""]
    tex = [comment(title), r"% needs \usepackage{booktabs}", ""]
    sections: list[tuple[str, list[str]]] = []
    for section, g in _plain_grids(report):
        text = grid_markdown(g.title, g.head, g.body, g.notes)
        md += [text, ""]
        tex += [*(comment(line) for line in text.splitlines()), ""]
        sections.append((section, [html.plain_table_html(g.title, g.head, g.body, g.notes)]))
    for t, stem in zip(report.tables, _stems(report.tables), strict=True):
        files[f"{stem}-{t.kind}.csv"] = to_csv(t).encode()
        md += [to_markdown(t), ""]
        tex += [to_latex(t), ""]
        sections.append((f"{t.kind} ratio: {t.mechanism}", [html.table_html(t)]))
    for measured, paper, q in report.beside_paper:
        md += [to_markdown(paper), "", to_markdown(q), ""]
        tex += [to_latex(paper), "", to_latex(q), ""]
        sections.append(
            (
                f"{measured.kind} ratio beside the paper: {measured.mechanism}",
                [
                    '<div class="side">'
                    + html.table_html(measured, "measured")
                    + html.table_html(paper, "paper (Wang et al. 2020, Table 3)")
                    + html.table_html(q, "measured ÷ paper")
                    + "</div>"
                ],
            )
        )
    figures = []
    why_no_plots = plots.available() if with_plots else "plots not asked for"
    if why_no_plots is None:
        for stem, fig, caption in _figures(report):
            made = plots.save(fig, f"plots/{stem}")
            files.update(made)
            figures.append(
                html.figure_html(
                    stem, made[f"plots/{stem}.svg"], made[f"plots/{stem}.png"], caption
                )
            )
    sections.append(("plots", figures or [f"<p>no plots: {why_no_plots or 'nothing to draw'}</p>"]))
    files["table3.md"] = "\n".join(md).encode()
    files["table3.tex"] = "\n".join(tex).encode()
    files["index.html"] = html.page(title, intro, sections).encode()
    files["report.json"] = json.dumps(
        {
            "run_dir": printable(str(report.run_dir)),
            "baseline": report.baseline,
            "rows": len(report.rows),
            "tables": [
                {
                    "mechanism": t.mechanism,
                    "kind": t.kind,
                    "column": t.column,
                    "cells": [
                        {"n": n, "k": k, "text": t.text[(n, k)], "value": t.value[(n, k)]}
                        for n in t.ns
                        for k in t.ks
                    ],
                    "footnotes": list(t.footnotes),
                    "context": t.context,
                }
                for t in report.tables
            ],
            "efficiency_lengths": [dataclasses.asdict(x) for x in report.lengths],
            "quality": [dataclasses.asdict(g) for g in report.quality],
        },
        indent=1,
    ).encode()
    return files


def _stems(tables: list[RatioTable]) -> list[str]:
    """A file name per table, none twice for one kind: two settings (dtype, ceiling) of one
    mechanism, or two labels that slug alike (``a (x=A)``, ``a (x=a)``), get a number;
    were a name still taken (a label that slugs to ``a-1``), a further one. Without this a
    table's CSV would silently overwrite another's."""
    slugs = [slug(t.mechanism + (" train" if t.mode == "train" else "")) for t in tables]
    used: set[tuple[str, str]] = set()
    stems = []
    for i, (t, name) in enumerate(zip(tables, slugs, strict=True)):
        twice = sum(s == name and x.kind == t.kind for s, x in zip(slugs, tables, strict=True)) > 1
        stem = name + (f"-{i // 2}" if twice else "")  # tables come in pairs
        extra = 0
        while (stem, t.kind) in used:
            extra += 1
            stem = f"{name}-{i // 2}-{extra}"
        used.add((stem, t.kind))
        stems.append(stem)
    return stems


def print_tables(report: Report, console: Any) -> None:
    """The tables in the terminal with rich: measured, then measured ÷ paper where it applies."""
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

    for _, g in _plain_grids(report):
        table = Table(*g.head)
        for r in g.body:
            table.add_row(*r)
        console.print(f"[bold]{escape(g.title)}[/bold]", table, *map(escape, g.notes), "")
    for t in report.tables:
        show(t, f"{t.kind} ratio: {t.mechanism}")
    for _, _, q in report.beside_paper:
        show(q, f"{q.kind} ratio, measured ÷ paper's Table 3")
