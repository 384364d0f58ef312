"""SLURM's side of ``attnbench run`` under hydra-submitit-launcher: the command knows its job
array, has it watched without an accounting daemon, and takes it with it when it stops.

Why a module of its own: submitit waits on each task's result file and asks
``sacct`` for the task's state in between. Without accounting ``sacct`` fails, every state
reads UNKNOWN ("not finished"), and a task cancelled while pending, which never writes a
result, was waited for for ever. And nothing cancelled the array when the command was
interrupted: its queued tasks ran anyway, and one on another node, which cannot see that the
command has ended (:func:`claims.command_alive`), would store rows after the command said it
stopped.

So, at the start of a sweep under a submitit launcher (:func:`watch`, from the progress
callback), the tasks are recorded as sbatch returns them (Ctrl-C and SIGTERM held meanwhile,
so that no array escapes unrecorded) and watched by :class:`~.slurm_watch.Watcher`, which
reads ``squeue`` (no accounting needed) and ends the command — :class:`~.slurm_watch.Failed`,
one line naming the cell and the job — as soon as a task has ended without a result. On the
command's way out :func:`cancel` cancels the pending tasks, kills the running ones' step at
once (submitit's task ignores SIGTERM, its preemption signal, until SLURM's KillWait),
cancels the rest and waits until squeue lists none of them: after the command's last line,
no task of it runs on any node. submitit is imported only here and in :mod:`.slurm_watch`,
and only under its launcher (the extra ``slurm``).
"""

from __future__ import annotations

import io
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stderr
from typing import Any

from omegaconf import DictConfig

from attnbench.sweep import launchers, slurm_watch
from attnbench.sweep.slurm_watch import Failed, Task, Watcher

CANCEL_WAIT_S = 60.0  # how long cancel() waits for its tasks to leave the queue


def runs_elsewhere(launcher: str) -> bool:
    """Do the jobs of Hydra launcher ``launcher`` (its ``_target_``) run on other machines,
    whose CPUs this process cannot see? SLURM's do; submitit_local's, like every other
    launcher's, run here."""
    return "submitit" in launcher and not launchers.is_submitit_local(launcher)


def watch(config: DictConfig) -> None:
    """Under a submitit launcher, record every task this command submits and watch it with
    :class:`~.slurm_watch.Watcher`; under any other launcher, nothing."""
    slurm_watch.tasks.clear()
    if "submitit" not in str(config.hydra.launcher.get("_target_", "")):
        return
    import submitit

    if not getattr(submitit.AutoExecutor.map_array, "attnbench", False):
        submitit.AutoExecutor.map_array = _recording(submitit.AutoExecutor.map_array)


def _recording(map_array: Any) -> Any:
    """submitit's ``map_array`` (the launcher's one call that submits), recording the SLURM
    tasks it submits; sbatch's refusal becomes :class:`~.slurm_watch.Failed`."""
    from submitit.core.utils import FailedJobError
    from submitit.slurm.slurm import SlurmJob

    watcher = Watcher()

    def recorded(self: Any, fn: Any, *iterables: Any) -> list[Any]:
        with _signals_held(), redirect_stderr(io.StringIO()) as err:
            try:
                jobs = map_array(self, fn, *iterables)
            except FailedJobError as e:  # submitit's message is sbatch's stderr
                why = (str(e).strip().splitlines() or ["no reason given"])[-1]
                raise Failed(f"sbatch refused the sweep: {why}", 2) from None
            cells = _cells(iterables[0] if iterables else ())
            for i, job in enumerate(jobs):
                if isinstance(job, SlurmJob):
                    slurm_watch.tasks[job.job_id] = Task(job, cells[i] if i < len(cells) else "?")
                    job.watcher = watcher  # its states from squeue, see Watcher
            watcher.started()
        sys.stderr.write(err.getvalue())
        return jobs

    recorded.attnbench = True  # type: ignore[attr-defined]
    return recorded


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends, then take effect: sbatch's job ids must
    be recorded before the command can stop, or it could not cancel them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if got:
            signal.raise_signal(got[0])


def _cells(overrides: Sequence[Any]) -> list[str]:
    """Each job's overrides less those every job has: what names its cell (``attention=linformer
    n=128``). The launcher's first argument per job is its list of overrides."""
    lists = [[str(o) for o in x] if isinstance(x, (list, tuple)) else [str(x)] for x in overrides]
    common = set.intersection(*map(set, lists)) if len(lists) > 1 else set()
    return [" ".join(o for o in x if o not in common) or " ".join(x) for x in lists]


def cancel(wait_s: float = CANCEL_WAIT_S) -> str:
    """Cancel every task of this command still in SLURM's queue and wait, up to ``wait_s``,
    until squeue lists none: called before the command's last line, so that no task stores a
    row after it, on any node. Returns what that line must add ('' when all are gone)."""
    arrays = slurm_watch.arrays(slurm_watch.tasks)
    slurm_watch.tasks.clear()
    if not arrays:
        return ""
    slurm_watch.call(["scancel", "--state=PENDING", *arrays])  # first: none starts from now on
    running = [i for i, s in (slurm_watch.queue(arrays, "RUNNING") or {}).items() if s == "RUNNING"]
    if running:  # submitit's task ignores SIGTERM until KillWait: its step is killed now
        slurm_watch.call(["scancel", "--signal=KILL", *(f"{i}.0" for i in running)])
    # the rest: a batch script that has not started its step yet
    slurm_watch.call(["scancel", *arrays])
    deadline = time.monotonic() + wait_s
    while (left := slurm_watch.queue(arrays, "")) and time.monotonic() < deadline:
        time.sleep(0.2)
    jobs = ",".join(arrays)
    if left is None:
        return f"; SLURM did not answer: see squeue --jobs={jobs}"
    if left:
        return f"; {len(left)} of its SLURM tasks (job {jobs}) were still ending after {wait_s:g} s"
    return ""
