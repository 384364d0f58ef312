"""A command's processes and claims: a killed `attnbench run` takes its workers with it and no
row is stored after it ended; two commands on one run directory measure each cell once. The
CLI in subprocesses, real files, each test its own TMPDIR; the claims' parts in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnbench.sweep import claims
from tests.conftest import CLI as ATTNBENCH
from tests.conftest import reaped, wait_for

CLI = (*ATTNBENCH, "run")
TINY = ("model=tiny", "dtype=fp32", "ceiling=1GB", "progress=false", "report=false")


def _env(tmp: Path, mark: str) -> dict[str, str]:
    """The test's own temp dir, and a marker every process of the command inherits."""
    (tmp / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp / "tmp"), "ATTNBENCH_TEST_MARK": mark}


def _marked(mark: str) -> dict[int, bytes]:
    """pid -> command line of every live process carrying ``mark`` in its environment."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"ATTNBENCH_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


def _rows(tmp: Path) -> list[dict]:
    found = list(tmp.glob("results/single/*/cells.jsonl"))
    return [json.loads(line) for line in found[0].read_text().splitlines()] if found else []


def _leftovers(tmp: Path) -> list[str]:
    temp = [p.name for p in (tmp / "tmp").iterdir() if p.name.startswith("attnbench-")]
    return temp + [str(p) for p in tmp.glob("results/**/.claims")]


# joblib's workers whatever the CPUs the test was given: with one, joblib runs cells inline
JOBS = "hydra.launcher.n_jobs=2"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_command_takes_its_workers_with_it(tmp_path: Path, sig: int) -> None:
    """The signal goes to the command's pid only, not to its group: an orphaning kill.
    Before, joblib's loky workers (and their resource trackers) outlived it for minutes and
    kept appending rows."""
    mark = uuid.uuid4().hex
    n = "n=" + ",".join(str(v) for v in range(32, 160, 16))  # 8 cells, 2 workers
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:  # a file: orphans holding a pipe would hang the test
        proc = subprocess.Popen(
            [*CLI, "-m", *TINY, n, "timing.min_seconds=1.5", "hydra/launcher=joblib", JOBS],
            cwd=tmp_path,
            env=_env(tmp_path, mark),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        in_flight = lambda: any(b"--cell" in cmd for cmd in _marked(mark).values())  # noqa: E731
        wait_for(in_flight, "a cell is in flight", alive=proc)
        time.sleep(1.5)  # timing for a while already (8 cells of 1.5 s on 2 workers are left)
        assert proc.poll() is None, err.read_text()
        before = _marked(mark)
        assert len(before) >= 4, before  # the command, its reaper, workers, their cells
        os.kill(proc.pid, sig)
        proc.wait()
        stored = len(_rows(tmp_path))
        if sig == signal.SIGTERM:
            assert proc.returncode == 143, err.read_text()
            assert "attnbench run: interrupted;" in err.read_text(), err.read_text()
            assert "Traceback" not in err.read_text(), err.read_text()
        # every process of the command gone once its reaper is (each carries the mark, orphans
        # included): none is left that could store a row, so the rows are final now
        assert reaped(f"ATTNBENCH_TEST_MARK={mark}") == [], "a process of the command survived it"
        assert len(_rows(tmp_path)) == stored, "a row was stored after its command ended"
        assert stored < 8
        assert _leftovers(tmp_path) == []
    finally:  # a failing run leaves no orphans behind either
        proc.kill()
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_two_identical_commands_measure_each_cell_once(tmp_path: Path) -> None:
    """Started at once on one run directory: every cell measured once, by one of them; the
    other waits for it and finds it stored. rerun=true: measured again once, not twice."""
    mark = uuid.uuid4().hex
    args = [*CLI, "-m", *TINY, "n=32,48,64", "timing.min_seconds=0.5"]
    for extra in ([], ["rerun=true"]):
        start = time.time()
        procs = [
            subprocess.Popen(
                args + extra,
                cwd=tmp_path,
                env=_env(tmp_path, mark),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
        stdout = "".join(out for out, _ in outs)
        assert stdout.count("  ok ") == 3, stdout
        assert stdout.count("  done before: ") == 3, stdout
        rows = _rows(tmp_path)
        assert len(rows) == 3 and len({r["key"] for r in rows}) == 3
        assert all(r["finished_at"] > start for r in rows)  # the rerun measured them all again
        by = {r["invocation"] for r in rows}
        assert {i.split("-")[0] for i in by} <= {str(p.pid) for p in procs}, by
        assert _leftovers(tmp_path) == []


def test_a_claim_is_held_by_one_at_a_time_and_waiters_are_told(tmp_path: Path) -> None:
    inside, most, told = [0], [0], []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            with claims.hold(tmp_path, "k", told.append):
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == [1] and told and all(w.startswith(("pid ", "another")) for w in told)
    assert not (tmp_path / claims.RUN_CLAIMS).exists()  # unlinked by its last holder


def test_a_killed_holder_releases_its_claim_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / claims.RUN_CLAIMS / "k"
    path.parent.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, b'4242-abc\\n')\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    claims._free_run_claims([(str(tmp_path), "k")])
    assert path.exists(), "a held claim is never removed"
    told: list[str] = []
    killing = threading.Event()

    def waiting(who: str) -> None:  # told it is held: its holder SIGKILLed (no tidying) soon
        told.append(who)
        threading.Timer(0.5, lambda: (killing.set(), holder.kill())).start()

    # "at once": the wait is on the lock, which the kernel drops at its holder's death, never
    # on a clock (a poll or a staleness age would sleep in claims' code): whatever the load
    slept: list[float] = []
    monkeypatch.setattr(claims, "time", SimpleNamespace(**{**vars(time), "sleep": slept.append}))
    with claims.hold(tmp_path, "k", waiting):
        assert killing.is_set(), "taken while its holder lived"
    holder.wait()
    assert told == ["pid 4242"] and slept == []
    assert not path.parent.exists()
    path.parent.mkdir()
    path.touch()  # what a SIGKILLed job leaves: an unlocked file
    claims._free_run_claims([(str(tmp_path), "k")])
    assert not path.parent.exists()


def test_command_alive_tells_a_dead_command_and_a_reused_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ticks = claims._start_ticks(child.pid)
    here = claims._pid_space()
    monkeypatch.setenv(claims.INVOCATION_ENV, f"{child.pid}-abc")
    monkeypatch.setenv(claims.STARTED_ENV, f"0.0 {ticks} {here}")
    assert claims.command_alive()
    monkeypatch.setenv(claims.STARTED_ENV, f"0.0 {int(ticks or 0) + 1} {here}")
    assert not claims.command_alive(), "the same pid, started at another time: reused"
    monkeypatch.setenv(claims.STARTED_ENV, f"0.0 {int(ticks or 0) + 1} elsewhere")
    assert claims.command_alive(), "another machine's pid is not looked up here"
    monkeypatch.setenv(claims.STARTED_ENV, f"0.0 {ticks} {here}")
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert not claims.command_alive(), "a zombie is dead all the same"
    child.wait()
    assert not claims.command_alive()
    monkeypatch.setenv(claims.INVOCATION_ENV, f"{os.getpid()}-abc")
    assert claims.command_alive()


FAKE_COMMAND = """
import importlib.util, json, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("claims", sys.argv[1])
claims = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claims)
claims.begin([[sys.argv[2], "k"]])
claims.claim("k")
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps([claims._reaper.pid, worker.pid, os.environ[claims.PLAN_ENV]]), flush=True)
time.sleep(600)
"""


def test_the_reaper_kills_what_a_sigkilled_command_left_and_tidies(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    run = tmp_path / "run"
    (run / claims.RUN_CLAIMS).mkdir(parents=True)
    (run / claims.RUN_CLAIMS / "k").touch()  # a claim its killed job left
    command = subprocess.Popen(
        [sys.executable, "-c", FAKE_COMMAND, claims.__file__, str(run)],
        env=_env(tmp_path, mark),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert command.stdout is not None
    reaper, worker, plan = json.loads(command.stdout.readline())
    assert Path(plan).exists() and set(_marked(mark)) == {command.pid, reaper, worker}
    command.kill()
    command.wait()
    assert reaped(f"ATTNBENCH_TEST_MARK={mark}") == []  # its reaper killed the worker
    assert _leftovers(tmp_path) == [] and not (run / claims.RUN_CLAIMS).exists()
