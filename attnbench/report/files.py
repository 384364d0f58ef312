"""A run directory's report on disk and in the terminal.

:func:`build` reads ``cells.jsonl`` (a corrupt line is an error naming its number, never
dropped) and makes every table; :func:`render` turns a report into file contents, all in
memory; :func:`write` puts them in place in one step, so a crash or a plotting error leaves
the previous report whole rather than half of a new one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench import row
from attnbench.report import html, plots
from attnbench.report.paper import compares_with_paper, load_paper, paper_table, quotient
from attnbench.report.tables import (
    RatioTable,
    heading,
    ratio_tables,
    to_csv,
    to_latex,
    to_markdown,
)
from attnbench.store import RunStore


@dataclass(frozen=True)
class Report:
    run_dir: Path
    baseline: str
    rows: list[row.Row]
    tables: list[RatioTable]
    # (measured, paper, measured ÷ paper) for every table the paper's Table 3 speaks to
    beside_paper: list[tuple[RatioTable, RatioTable, RatioTable]]


def default_out(run_dir: Path) -> Path:
    """Beside the rows it was made from: ``<run dir>/report``."""
    return Path(run_dir) / "report"


def build(run_dir: Path, baseline: str = "vanilla") -> Report:
    """Every table of ``run_dir``'s rows; ValueError (one line) if there is nothing to report."""
    run_dir = Path(run_dir)
    path = RunStore(run_dir).cells
    if not path.is_file():
        raise ValueError(
            f"run dir: no cells.jsonl in {run_dir} (is it a directory that 'attnbench run' wrote?)"
        )
    rows = [r for r in row.read(path) if r.status is not None]
    if not rows:
        raise ValueError(f"run dir: {path} holds no rows yet")
    tables = ratio_tables(rows, baseline)
    paper = load_paper()
    beside = []
    for t in tables:
        if compares_with_paper(t):
            p = paper_table(t, paper)
            beside.append((t, p, quotient(t, p)))
    return Report(run_dir, baseline, rows, tables, beside)


def slug(text: str) -> str:
    """A file name from a mechanism label: ``linformer-kernel-eager-sharing-layerwise``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _figures(report: Report) -> list[tuple[str, Any, str]]:
    """(file stem, figure, caption) for each plot the rows hold data for."""
    out = [
        (
            "time-vs-n",
            plots.time_vs_n(report.rows),
            "Time per sequence against n (log-log), one line per mechanism and k.",
        ),
        (
            "batch-vs-n",
            plots.batch_vs_n(report.rows),
            "Maximum batch size under the ceiling against n.",
        ),
        (
            "memory-modeled-vs-measured",
            plots.modeled_vs_measured(report.rows),
            "Max batch predicted by the memory model against the one measured on the device.",
        ),
    ]
    for i, t in enumerate(report.tables):
        if t.kind == "time":
            out.append(
                (
                    f"speedup-{_stem(report, t, i)}",
                    plots.speedup_heatmap(t),
                    f"Speed-up over n x k: {t.mechanism}.",
                )
            )
    return [(stem, fig, cap) for stem, fig, cap in out if fig is not None]


def render(report: Report, *, with_plots: bool = True) -> dict[str, bytes]:
    """Every file of the report, by relative path: Markdown, CSV, LaTeX, plots, HTML."""
    files: dict[str, bytes] = {}
    title = f"attnbench report: {report.run_dir.name}"
    intro = [
        f"Rows: {report.run_dir / 'cells.jsonl'} ({len(report.rows)} cells). Time ratio "
        f"= {report.baseline} time per sequence / mechanism's; memory ratio = mechanism "
        f"max batch / {report.baseline}'s; each model at its own max batch (Linformer "
        "paper, section 5.3)."
    ]
    md = [f"# {title}", "", *intro, ""]
    tex = [f"% {title}", r"% needs \usepackage{booktabs}", ""]
    sections: list[tuple[str, list[str]]] = []
    for i, t in enumerate(report.tables):
        files[f"{_stem(report, t, i)}-{t.kind}.csv"] = to_csv(t).encode()
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
            "run_dir": str(report.run_dir),
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
        },
        indent=1,
    ).encode()
    return files


def _stem(report: Report, t: RatioTable, i: int) -> str:
    """A file name per table; two settings (dtype, ceiling) of one mechanism get a number."""
    twice = sum(x.mechanism == t.mechanism and x.kind == t.kind for x in report.tables) > 1
    return slug(t.mechanism) + (f"-{i // 2}" if twice else "")  # tables come in pairs


def check_out(out: Path) -> Path:
    """``out`` resolved, if it may be replaced: absent, empty, or an earlier report. Anything
    else (a run directory, ``results/``, a file) is refused, never deleted."""
    out = Path(out).resolve()
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "report.json").is_file())
    ):
        raise ValueError(
            f"--out: {out} exists and is not an attnbench report (no "
            "report.json); refusing to replace it: name a new directory"
        )
    return out


def write(files: dict[str, bytes], out: Path) -> Path:
    """Replace ``out`` with ``files`` in one rename: never a half-written report."""
    out = check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the report from other users
    try:
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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

    for t in report.tables:
        show(t, f"{t.kind} ratio: {t.mechanism}")
    for _, _, q in report.beside_paper:
        show(q, f"{q.kind} ratio, measured ÷ paper's Table 3")
