"""This command's SLURM tasks, watched as submitit's jobs ask their watcher: each task's state
read from ``squeue --states=all``, which the controller answers with or without accounting
(``sacct`` only for a task squeue no longer lists, and only where it answers), and the
command ended — :class:`Failed`, one line naming the cell and the job — as soon as a task has
ended without its result.

:mod:`attnbench.sweep.slurm` records the tasks in :data:`tasks` as sbatch returns them and
cancels them on the command's way out, with the same SLURM clients (:func:`call`,
:func:`queue`); this module knows nothing of submitting or of the command's end.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Any

POLL_S = 10.0  # the longest between two looks at the queue (submitit: 600 s, with sacct)
CALL_S = 30.0  # the longest one squeue, sacct or scancel may take
# states in which a task may still write its result: submitit's list, and squeue's own
UNFINISHED = frozenset(
    "READY PENDING RUNNING UNKNOWN REQUEUED COMPLETING PREEMPTED CONFIGURING RESIZING "
    "SUSPENDED STOPPED SIGNALING STAGE_OUT REQUEUE_FED REQUEUE_HOLD".split()
)
LEFT = "LEFT_QUEUE"  # a task that squeue no longer lists, and of which sacct cannot tell


@dataclass
class Task:
    """One SLURM task of this command: submitit's job, its cell, what SLURM last said."""

    job: Any  # submitit.slurm.slurm.SlurmJob
    cell: str  # the launcher's overrides that set this cell apart
    state: str = "UNKNOWN"
    ran: bool = False  # seen running, or it has a log: it started


tasks: dict[str, Task] = {}  # this command's, by job id ("123_4")


class Failed(BaseException):
    """The sweep cannot go on under SLURM: sbatch refused it (``code`` 2) or a task ended
    without its result (1). A BaseException, so that Hydra's error handler (which catches
    Exception and prints a trace) lets it through to the command, which says it in one line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Watcher:
    """What submitit's job asks its watcher (``is_done``, ``get_state``, ``get_info``,
    ``register_job``), answered from ``squeue --states=all``, which the controller answers
    with or without accounting; ``sacct`` only for the tasks squeue no longer lists (ended a
    while ago: MinJobAge), and only until it fails (no accounting). Looks at most every 2 s
    at first, then every half of the time since the submission, capped at ``POLL_S``.
    A task that ended without its result file ends the command: :class:`Failed`."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._last = float("-inf")
        self._sacct = True  # until it fails: a cluster without accounting

    def started(self) -> None:
        """Tasks were just submitted: look at them soon."""
        self._since, self._last = time.monotonic(), float("-inf")

    def register_job(self, job_id: str) -> None:
        """(submitit's jobs register themselves; this one knows its tasks from :data:`tasks`.)"""

    def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
        return {"State": self.get_state(job_id, mode)}

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        if mode != "cache":
            self.update(force=mode == "force")
        task = tasks.get(job_id)
        return task.state if task else "UNKNOWN"

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id, mode).split(" ")[0] not in UNFINISHED

    def update(self, force: bool = False) -> None:
        """Ask SLURM, when it is time to (always if ``force``), and raise :class:`Failed` for
        the first task that has ended without its result."""
        now = time.monotonic()
        if not force and now - self._last < min(POLL_S, max(2.0, (now - self._since) / 2)):
            return
        self._last = now
        open_ = {i: t for i, t in tasks.items() if _unfinished(t)}
        queued = queue(arrays(open_))
        if queued is None:  # the controller did not answer: judge nothing, ask again later
            return
        gone = [i for i in open_ if i not in queued and i.split("_")[0] not in queued]
        accounted = self._accounted(gone)
        for job_id, task in open_.items():
            # an array's pending tasks cancelled together are one line: the array's id
            task.state = (
                queued.get(job_id)
                or queued.get(job_id.split("_")[0])
                or accounted.get(job_id, LEFT)
            )
            task.ran = (
                task.ran
                or task.state in ("RUNNING", "COMPLETING")
                or task.job.paths.stdout.exists()
            )
        for job_id, task in open_.items():
            if _ended_without_result(task):
                raise Failed(_why(job_id, task), 1)

    def _accounted(self, job_ids: list[str]) -> dict[str, str]:
        """The states sacct gives ``job_ids`` ({} without accounting)."""
        if not (job_ids and self._sacct):
            return {}
        from submitit.slurm.slurm import SlurmInfoWatcher

        command = [
            "sacct",
            "--parsable2",
            "--format=JobID,State",
            f"--jobs={','.join(arrays(job_ids))}",
        ]
        done = call(command)
        if done is None or done.returncode != 0:
            self._sacct = False  # "Slurm accounting storage is disabled"
            return {}
        return {
            i: s.get("State", LEFT) for i, s in SlurmInfoWatcher().read_info(done.stdout).items()
        }


def _unfinished(task: Task) -> bool:
    return task.state.split(" ")[0] in UNFINISHED


def _ended_without_result(task: Task) -> bool:
    """Ended, not COMPLETED (that one submitit judges itself, waiting for a slow file
    system), and no result file: the task will never give one."""
    state = task.state.split(" ")[0]
    return (
        state not in UNFINISHED
        and state != "COMPLETED"
        and not task.job.paths.result_pickle.exists()
    )


def _why(job_id: str, task: Task) -> str:
    """One line: which task, which cell, what became of it."""
    who = f"SLURM job {job_id} ({task.cell})"
    if task.state == LEFT or task.state.startswith("CANCELLED"):
        if not task.ran:
            return f"{who} was cancelled before it ran"
        if task.state != LEFT:
            return f"{who} was cancelled while it ran"
        return f"{who} left SLURM's queue without its result (log: {task.job.paths.stderr})"
    return f"{who} ended {task.state} without its result (log: {task.job.paths.stderr})"


def arrays(job_ids: Any) -> list[str]:
    """The job (array) ids of ``job_ids``: "123" for "123_4"."""
    return sorted({i.split("_")[0] for i in job_ids})


def call(command: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run a SLURM client; None if it cannot run or does not answer within ``CALL_S``."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=CALL_S)
    except (OSError, subprocess.SubprocessError):
        return None


def queue(arrays: list[str], states: str = "all") -> dict[str, str] | None:
    """What the controller holds of ``arrays`` — every task, or those in ``states`` ("" for
    squeue's default: pending, running, completing) — by job id; None if it did not answer."""
    if not arrays:
        return {}
    command = ["squeue", "--noheader", "--array", "--format=%i|%T", f"--jobs={','.join(arrays)}"]
    done = call([*command, f"--states={states}"] if states else command)
    if done is None:
        return None
    if done.returncode != 0:  # every one of them gone from the controller: "Invalid job id"
        return {} if "Invalid job id" in done.stderr else None
    return dict(line.split("|", 1) for line in done.stdout.split() if "|" in line)
