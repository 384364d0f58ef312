"""SLURM's side of ``attnbench run`` under hydra-submitit-launcher: the command knows its job
array, watches it without an accounting daemon, and takes it with it when it stops.

Why a module of its own: submitit waits on each task's result file and asks
``sacct`` for the task's state in between. Without accounting ``sacct`` fails, every state
reads UNKNOWN ("not finished"), and a task cancelled while pending, which never writes a
result, was waited for for ever. And nothing cancelled the array when the command was
interrupted: its queued tasks ran anyway, and one on another node, which cannot see that the
command has ended (:func:`claims.command_alive`), would store rows after the command said it
stopped.

So, at the start of a sweep under a submitit launcher (:func:`watch`, from the progress
callback), the tasks are recorded as sbatch returns them (Ctrl-C and SIGTERM held meanwhile,
so that no array escapes unrecorded) and watched by :class:`Watcher`, which reads ``squeue``
(no accounting needed; ``sacct`` only for a task squeue no longer lists, where it answers) and
ends the command — :class:`Failed`, one line naming the cell and the job — as soon as a task
has ended without a result. On the command's way out :func:`cancel` cancels the pending
tasks, kills the running ones' step at once (submitit's task ignores SIGTERM, its preemption
signal, until SLURM's KillWait), cancels the rest and waits until squeue lists none of them:
after the command's last line, no task of it runs on any node. submitit is imported only
here, and only under its launcher (the extra ``slurm``).
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

POLL_S = 10.0  # the longest between two looks at the queue (submitit: 600 s, with sacct)
CANCEL_WAIT_S = 60.0  # how long cancel() waits for its tasks to leave the queue
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


_tasks: dict[str, Task] = {}  # this command's, by job id ("123_4")


class Failed(BaseException):
    """The sweep cannot go on under SLURM: sbatch refused it (``code`` 2) or a task ended
    without its result (1). A BaseException, so that Hydra's error handler (which catches
    Exception and prints a trace) lets it through to the command, which says it in one line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def runs_elsewhere(launcher: str) -> bool:
    """Do the jobs of Hydra launcher ``launcher`` (its ``_target_``) run on other machines,
    whose CPUs this process cannot see? SLURM's do; submitit_local's, like every other
    launcher's, run here."""
    return "submitit" in launcher and "Local" not in launcher


def watch(config: DictConfig) -> None:
    """Under a submitit launcher, record every task this command submits and watch it with
    :class:`Watcher`; under any other launcher, nothing."""
    _tasks.clear()
    if "submitit" not in str(config.hydra.launcher.get("_target_", "")):
        return
    import submitit

    if not getattr(submitit.AutoExecutor.map_array, "attnbench", False):
        submitit.AutoExecutor.map_array = _recording(submitit.AutoExecutor.map_array)


def _recording(map_array: Any) -> Any:
    """submitit's ``map_array`` (the launcher's one call that submits), recording the SLURM
    tasks it submits; sbatch's refusal becomes :class:`Failed`."""
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
                    _tasks[job.job_id] = Task(job, cells[i] if i < len(cells) else "?")
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
        """(submitit's jobs register themselves; this one knows its tasks from :func:`watch`.)"""

    def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
        return {"State": self.get_state(job_id, mode)}

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        if mode != "cache":
            self.update(force=mode == "force")
        task = _tasks.get(job_id)
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
        open_ = {i: t for i, t in _tasks.items() if _unfinished(t)}
        queued = _queue(_arrays(open_))
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
            f"--jobs={','.join(_arrays(job_ids))}",
        ]
        done = _run(command)
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


def _arrays(job_ids: Any) -> list[str]:
    """The job (array) ids of ``job_ids``: "123" for "123_4"."""
    return sorted({i.split("_")[0] for i in job_ids})


def _run(command: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Run a SLURM client; None if it cannot run or does not answer within ``CALL_S``."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=CALL_S)
    except (OSError, subprocess.SubprocessError):
        return None


def _queue(arrays: list[str], states: str = "all") -> dict[str, str] | None:
    """What the controller holds of ``arrays`` — every task, or those in ``states`` ("" for
    squeue's default: pending, running, completing) — by job id; None if it did not answer."""
    if not arrays:
        return {}
    command = ["squeue", "--noheader", "--array", "--format=%i|%T", f"--jobs={','.join(arrays)}"]
    done = _run([*command, f"--states={states}"] if states else command)
    if done is None:
        return None
    if done.returncode != 0:  # every one of them gone from the controller: "Invalid job id"
        return {} if "Invalid job id" in done.stderr else None
    return dict(line.split("|", 1) for line in done.stdout.split() if "|" in line)


def cancel(wait_s: float = CANCEL_WAIT_S) -> str:
    """Cancel every task of this command still in SLURM's queue and wait, up to ``wait_s``,
    until squeue lists none: called before the command's last line, so that no task stores a
    row after it, on any node. Returns what that line must add ('' when all are gone)."""
    arrays = _arrays(_tasks)
    _tasks.clear()
    if not arrays:
        return ""
    _run(["scancel", "--state=PENDING", *arrays])  # first: none starts from now on
    running = [i for i, s in (_queue(arrays, "RUNNING") or {}).items() if s == "RUNNING"]
    if running:  # submitit's task ignores SIGTERM until KillWait: its step is killed now
        _run(["scancel", "--signal=KILL", *(f"{i}.0" for i in running)])
    _run(["scancel", *arrays])  # the rest: a batch script that has not started its step yet
    deadline = time.monotonic() + wait_s
    while (left := _queue(arrays, "")) and time.monotonic() < deadline:
        time.sleep(0.2)
    jobs = ",".join(arrays)
    if left is None:
        return f"; SLURM did not answer: see squeue --jobs={jobs}"
    if left:
        return f"; {len(left)} of its SLURM tasks (job {jobs}) were still ending after {wait_s:g} s"
    return ""
