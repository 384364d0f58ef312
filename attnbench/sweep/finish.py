"""The end of a sweep: one summary line, and the report of each run directory it wrote to.

The rows are already safe on disk when this runs, so a report that cannot be made (no
baseline rows, no matplotlib) is one line naming the command that makes it later, never a
failed sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from attnbench.measure.contention import is_busy
from attnbench.row.fields import STATUSES
from attnbench.sweep import claims


def summary_and_reports(config: DictConfig) -> None:
    """``attnbench: 9 of 10 cells in DIR (8 ok, 1 oom)``, then each run dir's report, then,
    if the machine was busy, a line saying so."""
    plan = claims.plan()
    rows = claims.rows_of(plan) if plan else []
    counts = {s: sum(r.get("status") == s for r in rows) for s in STATUSES}
    dirs = sorted({d for d, _ in plan})
    print(
        f"attnbench: {len(rows)} of {len(plan)} cells in {', '.join(dirs)} "
        f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)})",
        flush=True,
    )
    if config.report:
        for d in dirs:
            write_report(Path(d), config.report_baseline, show=config.progress)
    if line := busy_line(rows):  # last, so that it is the line a reader sees
        print(line, flush=True)


def busy_line(rows: list[dict[str, Any]]) -> str | None:
    """What the end of a sweep says when the machine was busy: how many of its timings were
    taken on a contended CPU (no figure: left out of ratios, efficiency lengths and plots)
    or not taken because the CPU was contended when its cost was estimated (skipped for
    the load, not for its cost: busy, no time)."""
    marked = [r for r in rows if is_busy(r.get("contention"))]
    unread = sum(not r.get("time_per_seq_s") for r in marked)
    busy = len(marked) - unread
    if not marked:
        return None
    what = []
    if busy:
        what.append(f"{busy} timings taken on a contended CPU (shown as busy, not as figures)")
    if unread:
        what.append(f"{unread} not taken (skipped for the load, not for their cost)")
    return (
        f"attnbench: machine busy: {' and '.join(what)}; measure them again on a quiet "
        "machine with rerun=true"
    )


def write_report(run: Path, baseline: str, show: bool) -> None:
    """The report of a sweep's run dir. Its rows are already safe on disk, so a report that
    cannot be made (no baseline rows, no matplotlib) is one line, not a failed sweep."""
    from rich.console import Console

    from attnbench.report import files, terminal

    try:
        report = files.build(run, baseline)
        for line in files.said(report):  # a row in no table, say a failed quality task's
            print(line, flush=True)
        if show:
            terminal.print_tables(report, Console())
        out = files.default_out(run)
        files.write(files.render(report), out)
    except Exception as e:  # the sweep's rows stand: say why, go on
        later = files.command_for(run, baseline)
        print(f"attnbench: no report for {run}: {e} (make it later: {later})", flush=True)
        return
    print(f"attnbench: report in {out}/index.html", flush=True)
