"""Interrupts, tidily: Ctrl-C and SIGTERM end `attnbench run` with one line and no temp
files, stale files of SIGKILLed commands are swept, and every process that times a cell runs
with glibc's malloc thresholds fixed. The CLI in a subprocess, real files, its own TMPDIR."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from hydra._internal.utils import run_and_report

from attnbench.sweep import claims, command, config, job, slurm
from tests.conftest import CLI as ATTNBENCH
from tests.conftest import HANG_S, processes_with, reaped, wait_for

CLI = (*ATTNBENCH, "run")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return {**env, "TMPDIR": str(tmp / "tmp"), **extra}


def _temp_dir(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """This process's temp dir is ``tmp`` (for a command run in it), as ``TMPDIR`` makes it
    for a fresh one."""
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))


def _as_in_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a shell that starts a job in the background
    (``cmd &``, nohup, some CI runners) makes it ignore SIGINT, and a Python that starts
    with SIGINT ignored never raises KeyboardInterrupt — these tests then saw no interrupt
    at all (exit 0, or a timeout). Run in the child before it starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ours(tmp: Path) -> list[str]:
    """What attnbench left in the temp dir, and any cell claims left in run directories."""
    left = [p.name for p in (tmp / "tmp").iterdir() if p.name.startswith("attnbench-")]
    return sorted(left + [str(p) for p in tmp.glob("results/**/.claims")])


def _gone(needle: str) -> bool:
    """Whether every process carrying ``needle`` is gone once the command's reaper has ended
    (:func:`tests.conftest.reaped`: its end, not a time, says when to look)."""
    return reaped(needle) == []


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_says_what_is_stored_and_leaves_no_temp_files(
    tmp_path: Path, sig: int, code: int
) -> None:
    # 2 mechanisms × 4 n: far more cells than the 2 it waits for (6 left, timed 0.4 s each
    # at least), so that the sweep cannot finish between the second row and the signal,
    # however fast the machine
    args = ("+sweep=smoke", "progress=false", "attention=vanilla,linformer", "n=64,96,128,160")
    mark = f"ATTNBENCH_TEST_MARK={tmp_path.name}"
    proc = subprocess.Popen(
        [*CLI, *args, "timing.min_seconds=0.4"],
        cwd=tmp_path,
        env=_env(tmp_path, ATTNBENCH_TEST_MARK=tmp_path.name),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )

    def two_rows() -> bool:
        found = list((tmp_path / "results/smoke").glob("*/cells.jsonl"))
        return bool(found) and len(found[0].read_text().splitlines()) >= 2

    wait_for(two_rows, "two rows are stored", alive=proc)
    assert _ours(tmp_path), "a running sweep has its plan and claims in the temp dir"
    os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole foreground group
    _, err = proc.communicate()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("attnbench run: interrupted")]
    assert "of 8 cells are stored in results/smoke/" in line
    assert "run the same command again to resume" in line
    assert _ours(tmp_path) == []
    assert _gone(mark), "the command's reaper goes with it, its work done"
    # resumed untimed: timing.min_seconds is how long a cell is timed, not which cell it is
    # (not in its key), so the stored cells are still found; the 6 cells left are timed
    # for their minimum repeats only, not for 0.4 s each, and no report is written (nor is
    # one in its key)
    resumed = subprocess.run(
        [*CLI, *args, "timing.min_seconds=0", "report=false"],
        cwd=tmp_path,
        env=_env(tmp_path, ATTNBENCH_TEST_MARK=tmp_path.name),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0 and "done before" in resumed.stdout, resumed.stderr
    assert _ours(tmp_path) == [] and _gone(mark)  # a normal end leaves nothing either


def test_an_interrupt_a_library_turns_into_its_own_error_ends_with_our_line_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI saw it: Ctrl-C landed inside Hydra's config reader, whose ``finally`` then closed a
    # file it never opened; Hydra printed that UnboundLocalError's traceback and exited 1.
    # The same path, in process: Hydra's real reporter, the command's real handler, the
    # rest of the command (plan, claims, SLURM) stood in for
    monkeypatch.setattr(config, "prevalidate", lambda args: [("results/smoke/x", "key")])
    for name in ("begin", "end", "stop_processes"):
        monkeypatch.setattr(claims, name, lambda *a: None)
    monkeypatch.setattr(claims, "rows_of", lambda plan: [])
    monkeypatch.setattr(slurm, "cancel", lambda: "")

    def read_config() -> None:  # as Hydra's ImportlibResourcesConfigSource._read_config
        try:
            command._interrupt(signal.SIGINT, None)  # Ctrl-C lands before the file opens
            f = open(os.devnull)
        finally:
            f.close()  # UnboundLocalError, raised while the KeyboardInterrupt unwinds

    monkeypatch.setattr(job, "hydra_main", lambda: run_and_report(read_config))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:  # main() sets its own handlers: put pytest's back after
        code = command.main(["+sweep=smoke"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    err = capsys.readouterr().err
    assert code == 130, err
    assert err.strip().splitlines() == [
        "attnbench run: interrupted; 0 of 1 cells are stored in results/smoke/x; run the "
        "same command again to resume (stored cells are not measured again)"
    ]


STUCK = """
import ctypes, os, pathlib
from dataclasses import dataclass
import attnbench
from attnbench.attention.base import MultiHeadAttention

@dataclass
class Cfg:
    causal: bool = False

@attnbench.register("stuck", config=Cfg, causal=False, summary="V, after a native call")
class Stuck(MultiHeadAttention):
    def attend(self, x, key_padding_mask):
        if x.device.type != "meta":  # a training step, not the memory model's trace
            pathlib.Path(os.environ["STUCK_MARK"]).touch()
            # one native call that outlasts any signal: libc's system() waits for its child
            # again when a signal interrupts the wait, so Python's handler cannot run, as
            # in one huge convolution; a day long, so that only the watcher ends the command
            ctypes.CDLL(None).system(b"exec sleep 86400")
        return self.v_proj(x)
"""


def test_sigterm_ends_a_training_step_stuck_in_one_native_call(tmp_path: Path) -> None:
    """SIGTERM to a command whose training step is one native call of a day (its handler
    cannot run until the call returns): the same line and exit 143 (the watcher's grace, then
    its own end; without it, not before the call returns), no row stored, the call's process
    gone with it and, once the reaper has tidied, no claim or temp file left."""
    (tmp_path / "stuck_mech.py").write_text(STUCK)
    mark = tmp_path / "training"
    env = _env(tmp_path, ATTNBENCH_PLUGINS="stuck_mech", PYTHONPATH=str(tmp_path),
               STUCK_MARK=str(mark), ATTNBENCH_TEST_MARK=tmp_path.name)  # fmt: skip
    small = ("train_examples=64", "test_examples=16", "steps=2", "eval_every=1")
    proc = subprocess.Popen(
        [*CLI, "task=mqar", "attention=stuck", "progress=false",
         *(f"quality.mqar.{s}" for s in small)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(mark.exists, "training: inside its first step's call", alive=proc)
        proc.send_signal(signal.SIGTERM)  # the command alone, as `kill PID` sends it
        # its end is the property (the call never returns by itself): a guard, not a bound
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("attnbench run: interrupted")]
    assert "0 of 1 cells are stored in results/single/cpu-cpu" in line
    assert not list(tmp_path.glob("results/**/cells.jsonl")), "no row, not even a half one"
    assert _gone(tmp_path.name), "the command's processes (the call's child too) go with it"
    assert _ours(tmp_path) == []


def test_stale_files_of_a_killed_command_are_swept_on_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process
) -> None:
    """The next command (in this process: cli.main, as the command line calls it; the
    killed command is simulated, a pid that cannot be alive) sweeps what a dead one left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    _temp_dir(monkeypatch, tmp)
    dead = 2**22 + 12345  # above the default pid_max of 4194304: no such process
    stale_plan = tmp / f"attnbench-plan-{dead}-x.json"
    stale_claims = tmp / f"attnbench-{dead}-abc"
    live_plan = tmp / f"attnbench-plan-{os.getpid()}-y.json"  # this process is alive
    young = tmp / f"attnbench-plan-{dead + 1}-z.json"  # too new to judge
    elsewhere = tmp_path / "elsewhere"  # a run directory of the dead command, not this one's
    (elsewhere / claims.RUN_CLAIMS).mkdir(parents=True)
    (elsewhere / claims.RUN_CLAIMS / "k").touch()  # the claim its killed job left
    stale_plan.write_text(f'[["{elsewhere}", "k"]]')
    stale_claims.mkdir()
    (stale_claims / "key").touch()
    live_plan.write_text("[]")
    young.write_text("[]")
    worktree = tmp / "attnbench-check-xyz"  # the gate's, not a run's: never touched
    worktree.mkdir()
    old = time.time() - 3600
    for p in (stale_plan, stale_claims, live_plan, worktree):
        os.utime(p, (old, old))
    args = ("model=tiny", "n=32", "dtype=fp32", "ceiling=1GB", "progress=false")
    done = cli_in_process("run", *args, "timing.min_seconds=0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not stale_plan.exists() and not stale_claims.exists()
    assert not (elsewhere / claims.RUN_CLAIMS).exists(), "a dead plan's unheld claims go too"
    assert live_plan.exists() and young.exists() and worktree.exists()
    assert _ours(tmp_path) == sorted(p.name for p in (live_plan, young, worktree))


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_a_claim_left_by_a_command_killed_with_its_reaper_goes_with_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process
) -> None:
    """``kill -9`` to the whole process group mid-cell: the command, its job and its reaper
    die at once, and the cell's claim file stays (unlocked) in the run directory. The next
    command on that run directory, measuring another cell, removes it: nobody holds it
    (the next command in this process: cli.main, as the command line calls it)."""
    mark = tmp_path.name
    env = _env(tmp_path, ATTNBENCH_TEST_MARK=mark)
    base = ("model=tiny", "dtype=fp32", "ceiling=1GB", "progress=false", "device=cpu")
    proc = subprocess.Popen(
        [*CLI, *base, "n=64", "timing.min_seconds=60"],  # a cell that times for a minute
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        claimed = lambda: list(tmp_path.glob("results/single/*/.claims/*"))  # noqa: E731
        wait_for(claimed, "the cell is claimed", alive=proc)
        (claim,) = claimed()  # held: the cell is measured
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the command, its job and its reaper
        proc.wait()
    # no reaper to wait for (killed with them): SIGKILLed processes go, however slowly
    wait_for(lambda: not processes_with(mark), "nothing of the killed command is left to tidy")
    assert claim.exists(), "the premise: a SIGKILLed holder leaves its claim file"
    _temp_dir(monkeypatch, tmp_path / "tmp")
    done = cli_in_process("run", *base, "n=32", "timing.min_seconds=0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("results/**/.claims")), "an unheld claim outlived the next"


PLUGIN = """
import os, pathlib
from dataclasses import dataclass
import attnbench
from attnbench.attention.base import MultiHeadAttention

out = pathlib.Path(os.environ["SEEN_DIR"])
(out / str(os.getpid())).write_text(
    os.environ.get("MALLOC_MMAP_THRESHOLD_", "unset") + " "
    + os.environ.get("MALLOC_TRIM_THRESHOLD_", "unset"))

@dataclass
class Cfg:
    pass

@attnbench.register("seen", config=Cfg, causal=False, summary="V only")
class Seen(MultiHeadAttention):
    def attend(self, x, key_padding_mask):
        return self.v_proj(x)
"""


def test_every_process_that_times_starts_with_malloc_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "seen_mech.py").write_text(PLUGIN)
    seen = tmp_path / "seen"
    seen.mkdir()
    env = _env(
        tmp_path, ATTNBENCH_PLUGINS="seen_mech", PYTHONPATH=str(tmp_path), SEEN_DIR=str(seen)
    )
    done = subprocess.run(
        [
            *CLI,
            "-m",
            "attention=seen",
            "model=tiny",
            "n=32",  # one cell: the command, a joblib worker and the cell's own process
            "dtype=fp32",
            "ceiling=1GB",
            "progress=false",
            "report=false",
            "timing.min_seconds=0",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",  # a worker process whatever the CPUs (1: cells inline)
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    values = {p.name: p.read_text() for p in seen.iterdir()}
    # the command itself (where the plugin loads first), joblib's workers, each cell's process
    assert len(values) >= 3, values
    assert set(values.values()) == {"33554432 4294967296"}, values
    # its switch off: nothing fixed, nor set for the processes it starts (in this process:
    # the switch and the variables are read from the environment when it is called)
    from attnbench.env import fix_malloc

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.setenv(name, "1")  # put back after the test, whatever fix_malloc does
        monkeypatch.delenv(name)
    monkeypatch.setenv("ATTNBENCH_MALLOC_FIX", "0")
    assert fix_malloc() is False
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") is None


def test_claims_sweep_leaves_processes_it_cannot_judge_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = tmp_path / f"attnbench-plan-{os.getpid()}-a.json"
    mine.write_text("[]")
    os.utime(mine, (0, 0))
    assert claims.sweep_stale() == [] and mine.exists()


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """``attnbench demo`` runs long enough at n=2048 × 500 repeats to be interrupted for sure
    (and each op is short: Python handles a signal between ops); every
    command but run and check goes through the same handler in cli.main."""
    proc = subprocess.Popen(
        [*ATTNBENCH, "demo", "--n", "2048", "--repeats", "500"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("One Table 3 cell")  # it is timing now
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip() == "attnbench demo: interrupted; nothing was changed", err
