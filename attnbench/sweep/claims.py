"""This command's plan and claims, shared with every job of it, and their clean-up.

``attnbench run`` writes its plan (the (run dir, cell key) pairs :func:`config.prevalidate`
found) to a file in the temp directory and gives every job — also in launcher subprocesses —
its path and a command id through the environment. A claim is a file per (command, key):
vanilla ignores k, so a sweep over k launches the same cell several times, and parallel
launchers would otherwise run the copies at once. Both go when the command ends, however it
ends short of SIGKILL; what a SIGKILLed command left is swept by the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from attnbench.store import RunStore, read_rows

INVOCATION_ENV = "ATTNBENCH_INVOCATION"  # one id per `attnbench run` command
PLAN_ENV = "ATTNBENCH_SWEEP_PLAN"  # a JSON file: the (run dir, key) pairs of this command
PLAN_PREFIX = "attnbench-plan-"
CLAIMS_PREFIX = "attnbench-"


def begin(plan: list[tuple[str, str]]) -> None:
    """Publish this command's plan and id to its jobs (through ``os.environ``)."""
    sweep_stale()
    fd, path = tempfile.mkstemp(prefix=f"{PLAN_PREFIX}{os.getpid()}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    os.environ[PLAN_ENV] = path
    os.environ[INVOCATION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex}"


def plan() -> list[tuple[str, str]]:
    """This command's (run dir, key) pairs; empty outside ``attnbench run``."""
    path = os.environ.get(PLAN_ENV)
    return [tuple(p) for p in json.loads(Path(path).read_text())] if path else []


def rows_of(plan: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """This command's rows as stored, from every run directory it writes to (a half-written
    last line, a job killed mid-append, is left out)."""
    wanted = set(plan)
    rows = []
    for d in sorted({d for d, _ in plan}):
        rows += [
            r
            for r in read_rows(RunStore(Path(d)).cells, strict=False)
            if (d, r.get("key")) in wanted
        ]
    return rows


def invocation() -> str | None:
    return os.environ.get(INVOCATION_ENV)


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


def end() -> None:
    """Remove this command's plan file and claim directory (temp files only)."""
    inv = os.environ.pop(INVOCATION_ENV, None)
    if inv:
        shutil.rmtree(_claims_dir(inv), ignore_errors=True)
    path = os.environ.pop(PLAN_ENV, None)
    if path:
        Path(path).unlink(missing_ok=True)


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
    longer alive (SIGKILLed: nothing of theirs could clean up). Each name carries its
    command's pid; one whose pid is alive, or that is younger than ``min_age_s`` (a pid
    reused at once), is left alone. Returns what was removed."""
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
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
