"""The end of a sweep: one summary line, and the report of each run directory it wrote to.

The rows are already safe on disk when this runs, so a report that cannot be made (no
baseline rows, no matplotlib) is one line naming the command that makes it later, never a
failed sweep.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from attnbench.row_fields import STATUSES
from attnbench.sweep import claims


def summary_and_reports(config: DictConfig) -> None:
    """``attnbench: 9 of 10 cells in DIR (8 ok, 1 oom)``, then each run dir's report."""
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


def write_report(run: Path, baseline: str, show: bool) -> None:
    """The report of a sweep's run dir. Its rows are already safe on disk, so a report that
    cannot be made (no baseline rows, no matplotlib) is one line, not a failed sweep."""
    from rich.console import Console

    from attnbench.report import files

    try:
        report = files.build(run, baseline)
        if show:
            files.print_tables(report, Console())
        out = files.default_out(run)
        files.write(files.render(report), out)
    except Exception as e:  # the sweep's rows stand: say why, go on
        print(
            f"attnbench: no report for {run}: {e} (make it later: attnbench report {run})",
            flush=True,
        )
        return
    print(f"attnbench: report in {out}/index.html", flush=True)
