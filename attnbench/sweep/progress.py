"""Progress across a whole sweep, under any launcher: a Hydra callback.

At the start of a multirun it records the command in each run directory it writes to; while
the jobs run, a thread redraws a rich progress bar (with ETA) and a live table of this
command's finished rows, fed by watching the run directories' ``cells.jsonl`` — so it works
under every launcher, jobs in this process or elsewhere; at the end it hands over to
:mod:`.finish` for the summary and the reports. With ``progress=false``, only the jobs' own
one-line reports.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from attnbench.measure.contention import is_busy
from attnbench.row import shown
from attnbench.store import RunStore, StoreError
from attnbench.sweep import claims, finish, slurm
from attnbench.sweep.job import StoreFailed, record_command
from attnbench.sweep.paths import run_dir


class Progress(Callback):
    """A rich progress bar (with ETA) and a live table of this command's finished rows, fed
    by watching the run directories' ``cells.jsonl`` (so it works under every launcher);
    with ``progress=false``, only the jobs' own one-line reports."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # launchers (joblib, submitit) pickle callbacks into jobs; the watcher stays

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        slurm.watch(config)  # under SLURM: the tasks recorded (to cancel) and watched
        plan = claims.plan()
        params = config.hydra.sweeper.params
        sweep = {
            "params": OmegaConf.to_container(params) if params else {},
            "overrides": list(config.hydra.overrides.task),
        }
        for d in {d for d, _ in plan} or {str(run_dir(config))}:
            try:
                record_command(RunStore(Path(d)), config, sweep)
            except StoreError as e:  # Hydra would only warn about a callback's error
                raise StoreFailed(str(e)) from None
        if plan:  # Hydra's own count is of jobs, not cells: it is not shown (config.yaml)
            stored = 0 if config.rerun else len(claims.rows_of(plan))
            print(plan_line(plan, stored), flush=True)
        if config.progress and plan:
            self._thread = threading.Thread(
                target=self._watch, args=(plan, config.rerun), daemon=True
            )
            self._thread.start()
            atexit.register(self._halt)  # a crashed sweep must not leave the cursor hidden

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._thread is not None:
            self._halt()
            print(flush=True)  # the live display's last frame ends without a newline
        finish.summary_and_reports(config)

    def _watch(self, plan: list[tuple[str, str]], rerun: bool) -> None:
        from rich.live import Live

        started = time.time()

        def finished() -> list[dict[str, Any]]:
            rows = claims.rows_of(plan)
            return [r for r in rows if r.get("finished_at", 0) >= started] if rerun else rows

        display = Display(len(plan), started, 0 if rerun else len(finished()))
        with Live(display.bar, refresh_per_second=2, transient=False) as live:
            while True:
                stopping = self._stop.wait(0.5)
                live.update(display.frame(finished(), claims.running(plan), time.time()))
                if stopping:  # one last frame with every row, then out
                    break


class Display:
    """The live display's frames: the bar (cells done of ``total``, ETA), a line per cell
    being measured (its label and how long it has run: the first cell of a sweep may take a
    minute before the ETA has anything to go by), and this command's last finished rows.
    :meth:`frame` is a pure function of what the watcher read, so a test feeds it."""

    def __init__(self, total: int, started: float, before: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.total, self.started = total, started
        self.bar = Bar(
            TextColumn("cells"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
        )
        self.task = self.bar.add_task("cells", total=total, completed=before, eta=eta_text(None))

    def frame(
        self, rows: list[dict[str, Any]], running: list[tuple[str, float]], now: float
    ) -> Any:
        """The display after ``rows`` (this command's, as stored) with ``running`` (label,
        since) being measured, at Unix time ``now``."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        done = [r["finished_at"] for r in rows if r.get("finished_at", 0) >= self.started]
        left = eta_s(self.started, done, self.total - len(rows), now)
        self.bar.update(self.task, completed=len(rows), eta=eta_text(left))
        table = Table(
            "attention", "n", "k", "status", "max b", "ms/seq", "memory",
            title="finished cells (last 8)",
        )  # fmt: skip
        for r in rows[-8:]:
            t = r.get("time_per_seq_s")
            table.add_row(
                str(r.get("attention")),
                str(r.get("n")),
                str(r.get("k")),
                str(r.get("status")),
                str(r.get("max_batch")),
                "-" if not t else f"{t * 1e3:.2f}" + _busy(r),
                str(r.get("memory_source")),
            )
        lines = [Text(line) for line in running_lines(running, now)]
        return Group(self.bar, *lines, table) if rows else Group(self.bar, *lines)


def running_lines(running: list[tuple[str, float]], now: float) -> list[str]:
    """``running 0:00:52: linformer (sharing=layerwise) n=512 k=128``, one per cell being
    measured (several under a parallel launcher), each label on one line, cut short."""
    return [
        f"running {eta_text(max(now - since, 0.0))}: {shown(label)}" for label, since in running
    ]


def plan_line(plan: list[tuple[str, str]], stored: int) -> str:
    """What a sweep is about to do, in its cells: ``attnbench: 42 cells to measure in DIR``,
    ``30 of 42`` where ``stored`` of them are in the run directory already (kept)."""
    where = ", ".join(sorted({d for d, _ in plan}))
    cells = f"{len(plan)} cell{'s' if len(plan) != 1 else ''}"
    if not stored:
        return f"attnbench: {cells} to measure in {where}"
    return (
        f"attnbench: {len(plan) - stored} of {cells} to measure in {where} "
        f"({stored} stored already: kept; rerun=true measures them again)"
    )


def eta_s(started: float, finished: list[float], left: int, now: float) -> float | None:
    """Seconds until the ``left`` cells are done, from the times this command's cells
    ``finished`` at (Unix times, this command ``started`` at): each cell left takes the
    mean time a finished one took (finishing times apart, so under a parallel launcher the
    cells running side by side count as the launcher runs them), less what the one running
    has had since the last finished. None before any has finished: nothing to estimate from.
    Every cell of the command counts, not the last 30 s of them: cells take from a
    fraction of a second (modeled only) to minutes (timed), so a window of recent ones
    reads nothing for most of a run and a burst of quick ones as the end."""
    if left <= 0:
        return 0.0
    if not finished:
        return None
    last = max(finished)
    per_cell = max(last - started, 0.0) / len(finished)
    return (left - 1) * per_cell + max(per_cell - (now - last), 0.0)


def eta_text(seconds: float | None) -> str:
    """``0:06:30``; before a cell has finished, what the estimate waits for."""
    if seconds is None:
        return "after the first cell"
    return str(datetime.timedelta(seconds=round(seconds)))


def _busy(row: dict[str, Any]) -> str:
    """`` busy`` after a time taken on a contended CPU (a stored row, as a dict)."""
    return " busy" if is_busy(row.get("contention")) else ""
