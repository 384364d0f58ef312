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
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from attnbench.measure.contention import is_busy
from attnbench.store import RunStore, StoreError
from attnbench.sweep import claims, finish, slurm
from attnbench.sweep.config import run_dir
from attnbench.sweep.job import StoreFailed, record_command


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
        from rich.console import Group
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar
        from rich.table import Table

        started = time.time()

        def finished() -> list[dict[str, Any]]:
            rows = claims.rows_of(plan)
            return [r for r in rows if r.get("finished_at", 0) >= started] if rerun else rows

        before = 0 if rerun else len(finished())
        bar = Bar(
            TextColumn("cells"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        task = bar.add_task("cells", total=len(plan), completed=before)
        with Live(Group(bar), refresh_per_second=2, transient=False) as live:
            while True:
                stopping = self._stop.wait(0.5)
                rows = finished()
                bar.update(task, completed=len(rows))
                table = Table(
                    "attention",
                    "n",
                    "k",
                    "status",
                    "max b",
                    "ms/seq",
                    "memory",
                    title="finished cells (last 8)",
                )
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
                live.update(Group(bar, table))
                if stopping:  # one last frame with every row, then out
                    break


def _busy(row: dict[str, Any]) -> str:
    """`` busy`` after a time taken on a contended CPU (a stored row, as a dict)."""
    return " busy" if is_busy(row.get("contention")) else ""
