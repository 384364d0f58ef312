"""This command's plan, its claims on cells, and what it leaves behind, however it ends.

``attnbench run`` writes its plan (the (run dir, cell key) pairs :func:`config.prevalidate`
found) to a temp file and gives every job — also in launcher subprocesses — its path and a
command id through the environment. Two claims keep a cell from being measured twice:
:func:`claim`, a temp file per (command, key), for the copies of one cell in one command
(vanilla ignores k, so a sweep over k launches it several times); :func:`hold`, an ``flock``
in the run directory held while the cell is measured and stored, for other commands, which
wait for the cell and find it stored instead of timing it against it on the same cores.

A command's processes die with it: loky workers outlived a SIGKILLed command and went on
appending rows. Each command starts a reaper (:func:`start_reaper`) that waits for its end,
however it ends, kills every process carrying its id in the environment and tidies. This
module imports only the standard library at load, so that the reaper starts in milliseconds.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

INVOCATION_ENV = "ATTNBENCH_INVOCATION"  # one id per `attnbench run` command: "PID-hex"
STARTED_ENV = "ATTNBENCH_STARTED"  # when and where the command started: see begin()
PLAN_ENV = "ATTNBENCH_SWEEP_PLAN"  # a JSON file: the (run dir, key) pairs of this command
PLAN_PREFIX = "attnbench-plan-"
CLAIMS_PREFIX = "attnbench-"
RUN_CLAIMS = ".claims"  # in a run directory: one lock file per cell being measured
_reaper: subprocess.Popen | None = None
_lifeline: int | None = None  # the reaper's pipe: its EOF says this command has ended


def begin(plan: list[tuple[str, str]]) -> None:
    """Publish this command's plan and id to its jobs (through ``os.environ``), and start
    the reaper that takes this command's processes with it when it ends. Claims nobody
    holds in its run directories go first: a command SIGKILLed with its reaper left them."""
    sweep_stale()
    free_unheld(sorted({d for d, _ in plan}))
    fd, path = tempfile.mkstemp(prefix=f"{PLAN_PREFIX}{os.getpid()}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    os.environ[PLAN_ENV] = path
    os.environ[INVOCATION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex}"
    # wall time; start in clock ticks since boot and the pid space it counts in, both for
    # command_alive()
    os.environ[STARTED_ENV] = f"{time.time()!r} {_start_ticks(os.getpid()) or '-'} {_pid_space()}"
    start_reaper()


def plan() -> list[tuple[str, str]]:
    """This command's (run dir, key) pairs; empty outside ``attnbench run``."""
    path = os.environ.get(PLAN_ENV)
    return [tuple(p) for p in json.loads(Path(path).read_text())] if path else []


def rows_of(plan: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """This command's rows, flat (:func:`attnbench.store_read.flat`), from every run
    directory it writes to (a half-written last line, a job killed mid-append, is left
    out)."""
    from attnbench.cell_key import stored_key  # not at the top: the reaper loads us alone
    from attnbench.store import RunStore

    wanted = set(plan)
    rows = []
    for d in sorted({d for d, _ in plan}):
        rows += [r for r in RunStore(Path(d), rekey=stored_key).rows() if (d, r["key"]) in wanted]
    return rows


def invocation() -> str | None:
    return os.environ.get(INVOCATION_ENV)


def started() -> float | None:
    """When this command started (wall clock); None outside ``attnbench run``."""
    value = os.environ.get(STARTED_ENV)
    return float(value.split()[0]) if value else None


def _start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc); None if it is gone,
    a zombie, or there is no /proc. With the pid, it names a process for good: a pid can be
    reused, a (pid, start) pair cannot."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _pid_space() -> str:
    """The machine's boot and the pid namespace this process sees: a job with another
    (SLURM, another container) cannot look the command's pid up."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}".replace(" ", "")
    except OSError:
        return "-"


def command_alive() -> bool:
    """Is the ``attnbench run`` command this job belongs to still running? A job checks
    right before it stores a row: an orphaned worker must not write to a run that its command
    no longer owns. The pid alone is not enough (it may be reused by then): its start time
    must match the one the command published."""
    inv = invocation()
    if not inv:
        return True  # not in a command
    pid = int(inv.split("-", 1)[0])
    if pid == os.getpid():
        return True
    _, ticks, space = os.environ.get(STARTED_ENV, "0 - -").split()
    if space != _pid_space():
        return True  # another machine or container: it cannot tell, so it does not judge
    if ticks != "-":
        return _start_ticks(pid) == ticks
    return _alive(pid)  # no /proc: the pid is all there is


def _claims_dir(invocation_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{CLAIMS_PREFIX}{invocation_id}"


def claim(key: str) -> bool:
    """Is this the first job of this command to reach ``key``? (Always, outside a command.)"""
    inv = invocation()
    if not inv:
        return True
    claims = _claims_dir(inv)
    claims.mkdir(exist_ok=True)
    try:
        os.close(os.open(claims / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


@contextmanager
def hold(
    run_dir: Path, key: str, waiting: Callable[[str], None], label: str = ""
) -> Iterator[None]:
    """Hold the claim on ``key`` in ``run_dir`` — across commands — while the cell is
    measured and stored. When another process holds it, call ``waiting`` once (with who
    holds it) and wait: the holder stores the cell, and the caller, looking again, finds it
    stored. An ``flock``, so a holder that dies (even SIGKILLed) releases it at once; the
    file is unlinked by its holder, and an acquirer that locked a file unlinked meanwhile
    starts over, so two can never hold the same key. The file holds the holder's command
    and the cell's ``label``: what the progress display says is running (:func:`running`)."""
    path = Path(run_dir) / RUN_CLAIMS / key
    told = False
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its directory was just removed by a releaser
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:  # the holder's command, if it has written it yet
                    told = True
                    held = os.pread(fd, 100, 0).decode(errors="replace").split("\n")[0]
                    pid = held.strip().split("-")[0]
                    waiting(f"pid {pid}" if pid.isdigit() else "another process")
                fcntl.flock(fd, fcntl.LOCK_EX)  # Ctrl-C and SIGTERM still interrupt this
            if _same_file(path, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # unlinked by its last holder while we waited: take the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{invocation() or os.getpid()}\n{label}\n".encode(), 0)
        yield
    finally:
        _release(path, fd)


def running(plan: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """The cells of ``plan`` this command is measuring now: (label, since when, Unix time),
    read from the claims its jobs hold (:func:`hold`), under any launcher. A claim another
    command holds is that command's cell (this one waits for it, and says so)."""
    inv = invocation()
    wanted = set(plan)
    found = []
    for d in sorted({d for d, _ in plan}) if inv else []:
        try:  # one listing per run directory, not a look per cell of the plan
            held = [p for p in (Path(d) / RUN_CLAIMS).iterdir() if (d, p.name) in wanted]
        except OSError:  # nothing claimed there
            continue
        for path in held:
            try:
                with path.open("rb") as f:
                    holder, _, label = f.read(4096).decode(errors="replace").partition("\n")
                since = path.stat().st_mtime
            except OSError:  # stored and released meanwhile
                continue
            if holder.strip() == inv and label.strip():
                found.append((label.strip(), since))
    return sorted(found, key=lambda x: x[1])


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _release(path: Path, fd: int) -> None:
    """Unlink a held claim file, then unlock it (in this order: see :func:`hold`)."""
    path.unlink(missing_ok=True)
    with suppress(OSError):  # not empty: other cells are claimed
        path.parent.rmdir()
    os.close(fd)


def _free_run_claims(pairs: list[tuple[str, str]]) -> None:
    """Remove the run-directory claim files of ``pairs`` that nobody holds (a job killed
    while it measured leaves its file, unlocked)."""
    for d, key in pairs:
        path = Path(d) / RUN_CLAIMS / key
        with suppress(OSError):  # no such file, or held by a live job of some command
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not _same_file(path, fd):
                    raise FileNotFoundError
            except OSError:
                os.close(fd)
                raise
            _release(path, fd)


def free_unheld(run_dirs: list[str]) -> None:
    """Remove every claim file in ``run_dirs`` that nobody holds, whichever command left
    it: one SIGKILLed together with its reaper (``kill -9`` to its process group) could not
    tidy, and its plan, which names its claims, may be gone or too young to sweep. A held
    claim is left alone (:func:`_free_run_claims` only takes an unlocked one)."""
    for d in run_dirs:
        try:
            keys = [p.name for p in (Path(d) / RUN_CLAIMS).iterdir()]
        except OSError:  # no claims there (or no run directory yet)
            continue
        _free_run_claims([(d, key) for key in keys])


def end() -> None:
    """Remove this command's plan file and claim directory (temp files only) and the
    run-directory claims its killed jobs left."""
    inv = os.environ.pop(INVOCATION_ENV, None)
    os.environ.pop(STARTED_ENV, None)
    path = os.environ.pop(PLAN_ENV, None)
    _tidy(inv, path)


def _tidy(inv: str | None, plan_path: str | None) -> None:
    if inv:
        shutil.rmtree(_claims_dir(inv), ignore_errors=True)
    if plan_path:
        with suppress(OSError, ValueError):
            _free_run_claims([tuple(p) for p in json.loads(Path(plan_path).read_text())])
        Path(plan_path).unlink(missing_ok=True)


def start_reaper() -> None:
    """Start this command's reaper (:func:`reap`): ``python -I -S`` running this file alone,
    in milliseconds. It learns of the command's end by the EOF of a pipe only the command
    holds (close-on-exec, so no worker inherits it) and by being re-parented."""
    global _reaper, _lifeline
    if _lifeline is not None:  # a command before this one in the same process: it is over
        os.close(_lifeline)
    read, _lifeline = os.pipe()
    boot = (
        "import importlib.util as u, sys\n"
        "s = u.spec_from_file_location('attnbench_reaper', sys.argv[1])\n"
        "m = u.module_from_spec(s)\n"
        "s.loader.exec_module(m)\n"
        "m.reap(*sys.argv[2:])\n"
    )
    args = [str(os.getpid()), str(read), invocation() or "", os.environ.get(PLAN_ENV, "")]
    _reaper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", boot, __file__, *args],
        pass_fds=(read,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(read)


def stop_processes() -> list[int]:
    """Kill this command's other processes now (on Ctrl-C or SIGTERM, before the command
    says what is stored): its workers must not store a row after that line. Resource
    trackers are left: they go by themselves when this command exits."""
    inv = invocation()
    spare = (_reaper.pid,) if _reaper is not None else ()
    return kill_processes(inv, spare, grace_s=None) if inv else []


def reap(command: str, lifeline: str, inv: str, plan_path: str) -> None:
    """The reaper's life: wait for the command's end, however it ends (SIGKILL included),
    then kill every process carrying its id and remove what it left in the temp directory
    and in its run directories. It ignores Ctrl-C, SIGTERM and SIGHUP: those end the command,
    and the reaper must outlive it to do its work."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while os.getppid() == int(command) and not select.select([int(lifeline)], [], [], 0.5)[0]:
        pass
    if inv:
        kill_processes(inv)
        _tidy(inv, plan_path or None)


def _marked(marker: bytes) -> Iterator[tuple[int, bytes]]:
    """(pid, command line) of every process with ``marker`` in its environment (processes
    of other users, and zombies, whose environment reads empty, never match)."""
    for entry in Path("/proc").iterdir():
        with suppress(OSError):  # gone meanwhile, or another user's
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                yield int(entry.name), (entry / "cmdline").read_bytes()


def _signal(pid: int, marker: bytes, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it still carries ``marker``: looked at and signalled
    through a pidfd (Linux 5.3), so that a pid reused since it was listed is never hit."""
    try:
        pidfd = os.pidfd_open(pid)
    except AttributeError:  # no pidfd here: the pid it is
        with suppress(OSError):
            os.kill(pid, sig)
        return
    except OSError:
        return
    with suppress(OSError):
        if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            signal.pidfd_send_signal(pidfd, sig)
    os.close(pidfd)


def kill_processes(inv: str, spare: Collection[int] = (), grace_s: float | None = 3.0) -> list[int]:
    """SIGKILL every process with this command's id in its environment — joblib's workers,
    the cell each is measuring, submitit's jobs — but this one and ``spare``. Resource
    trackers are given ``grace_s`` to go by themselves (None: left alone): they clean up
    what they track when the last process holding their pipe is gone, and killing them
    would leak it. Returns the pids killed. Without /proc (not Linux), nothing is found."""
    marker = f"{INVOCATION_ENV}={inv}".encode()
    spare = {os.getpid(), *spare}
    killed: set[int] = set()
    deadline = time.monotonic() + (grace_s or 0.0)
    while time.monotonic() < deadline + 2:  # one that will not die is left, not waited on
        try:
            found = [(p, cmd) for p, cmd in _marked(marker) if p not in spare]
        except OSError:  # no /proc
            break
        late = grace_s is not None and time.monotonic() > deadline
        targets = [p for p, cmd in found if late or b"resource_tracker" not in cmd]
        if not targets and (grace_s is None or not found):
            break
        # all frozen, then killed: no worker sees its cell die first and stores an error row
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in targets:
                _signal(pid, marker, sig)
        killed.update(targets)
        time.sleep(0.05)
    return sorted(killed)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_stale(min_age_s: float = 60.0) -> list[Path]:
    """Remove the plan files and claim directories of ``attnbench run`` commands that are no
    longer alive (SIGKILLed with their reaper: nothing of theirs could clean up), and the
    unheld claims a plan names in its run directories. Each name
    carries its command's pid; one whose pid is alive, or that is younger than ``min_age_s``
    (a pid reused at once), is left alone. Returns what was removed."""
    removed = []
    tmp = Path(tempfile.gettempdir())
    found = [(p, p.name.removeprefix(PLAN_PREFIX)) for p in tmp.glob(f"{PLAN_PREFIX}*.json")]
    found += [
        (p, p.name.removeprefix(CLAIMS_PREFIX))
        for p in tmp.glob(f"{CLAIMS_PREFIX}*-*")
        if p.is_dir()  # the claim directories (attnbench-check-* worktrees have no pid)
    ]
    for path, name in found:
        pid = name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            young = time.time() - path.stat().st_mtime < min_age_s
        except OSError:
            continue
        if young or _alive(int(pid)):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:  # its run directories' claims nobody holds go with it
            _tidy(None, str(path))
        removed.append(path)
    return removed
