"""`attnbench run` on a real SLURM cluster (issue #25): a sweep through hydra-submitit-launcher's
``submitit_slurm``, a task cancelled while it runs and while it waits, SIGTERM to the command.
Real slurmctld, slurmd and munge (``scripts/slurm_cluster.sh up`` brings up a single-node
cluster; ``.ci/run`` does), the CLI in a subprocess, real files. Where no cluster answers
these skip with the reason, except under ATTNBENCH_REQUIRE_SLURM=1 (CI), where they fail.

Each cell is tiny; the cells that must still be running when something happens to them are
made to last with ``timing.min_seconds`` (the cell's key does not depend on it)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnbench.store_read import flat
from tests.conftest import CLI as ATTNBENCH
from tests.conftest import processes_with, wait_for

CLI = (*ATTNBENCH, "run")
REQUIRED = os.environ.get("ATTNBENCH_REQUIRE_SLURM") == "1"


def _cluster() -> tuple[str | None, str]:
    """(why no SLURM cluster can be used here or None, its default partition)."""
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        return "needs hydra-submitit-launcher (pip install -e '.[slurm]')", ""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "needs SLURM's clients (apt-get install slurm-wlm munge)", ""
    info = subprocess.run(["sinfo", "--noheader", "--format=%P %T"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"no SLURM cluster here ({(info.stderr.strip().splitlines() or [''])[-1]})", ""
    ready = [
        p
        for p, state in (line.split() for line in info.stdout.splitlines())
        if state in ("idle", "mixed")
    ]
    if not ready:
        return "no idle SLURM node", ""
    default = [p for p in ready if p.endswith("*")]
    return None, (default or ready)[0].rstrip("*")


WHY, PARTITION = _cluster()
needs_cluster = pytest.mark.skipif(
    WHY is not None and not REQUIRED,
    reason=f"{WHY}; scripts/slurm_cluster.sh up brings up a test cluster (CI does)",
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[None]:
    """A SLURM cluster, or a failure under ATTNBENCH_REQUIRE_SLURM=1; after the test (a failed
    one too), no command it started runs and no job of it stays in the queue."""
    assert WHY is None, f"ATTNBENCH_REQUIRE_SLURM=1 but {WHY}"
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    jobs = _jobs(tmp_path)
    if jobs and any(_queue(job, "") for job in jobs):
        subprocess.run(["scancel", *jobs], check=False)


def _env(tmp: Path) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return {**env, "TMPDIR": str(tmp / "tmp"), "ATTNBENCH_TEST_MARK": tmp.name}


_started: list[subprocess.Popen] = []  # commands this test started, killed if it failed


def _start(tmp: Path, args: list[str]) -> subprocess.Popen:
    """``attnbench run ARGS`` in ``tmp``, running."""
    proc = subprocess.Popen(
        [*CLI, *args],
        cwd=tmp,
        env=_env(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _started.append(proc)
    return proc


def _args(sweep: str, *cells: str, seconds: float = 0.05, **launcher: object) -> list[str]:
    """A sweep of tiny cells through submitit_slurm, one CPU and 1 GB per task."""
    keys = {"partition": PARTITION, "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 10}
    return [
        "-m",
        *cells,
        "model=tiny",
        "dtype=fp32",
        "ceiling=1GB",
        "progress=false",
        f"sweep_name={sweep}",
        "timing.min_repeats=2",
        f"timing.min_seconds={seconds}",
        "hydra/launcher=submitit_slurm",
        *(f"hydra.launcher.{k}={v}" for k, v in {**keys, **launcher}.items()),
    ]


def _run_dir(tmp: Path, sweep: str) -> Path:
    return tmp / "results" / sweep / "v100_16gb-cpu"


def _rows(tmp: Path, sweep: str) -> list[dict]:
    path = _run_dir(tmp, sweep) / "cells.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [flat(json.loads(line)) for line in lines if line.strip()]  # the spec's fields too


def _jobs(tmp: Path, sweep: str = "*") -> list[str]:
    """The SLURM job ids submitted under ``tmp``, from submitit's folders (``ID_TASK``)."""
    tasks = tmp.glob(f"results/{sweep}/.hydra/*/.submitit/*_*")
    return sorted({p.name.split("_")[0] for p in tasks if p.name.split("_")[0].isdigit()})


def _job(tmp: Path, sweep: str, proc: subprocess.Popen) -> str:
    """The SLURM job id of the sweep's array, once ``proc`` (its command) has submitted it."""
    wait_for(lambda: _jobs(tmp, sweep), "the sweep is submitted", alive=proc)
    (job,) = _jobs(tmp, sweep)
    return job


def _queue(job: str, states: str = "all") -> dict[str, str]:
    """squeue's state of each task of ``job`` ("" for squeue's default states: pending,
    running, completing), by task id."""
    command = ["squeue", "--noheader", "--array", "--format=%i|%T", f"--jobs={job}"]
    done = subprocess.run(
        [*command, f"--states={states}"] if states else command,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and "Invalid job id" in done.stderr:
        return {}
    assert done.returncode == 0, done.stderr
    return dict(line.split("|", 1) for line in done.stdout.split())


def _last_line(err: str) -> str:
    """The command's last line: no traceback, one line of its own (before it, the plan's
    notes, e.g. ``vanilla ignores k: measured once``)."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("attnbench run:"), err
    return lines[-1]


@needs_cluster
def test_a_sweep_stores_every_cell_once_and_its_report(tmp_path: Path, cluster: None) -> None:
    args = _args("a", "attention=vanilla,linformer", "n=64,128", "k=16")
    done = subprocess.run(
        [*CLI, *args], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    rows = _rows(tmp_path, "a")
    assert sorted((r["attention"], r["n"]) for r in rows) == [
        ("linformer", 64),
        ("linformer", 128),
        ("vanilla", 64),
        ("vanilla", 128),
    ]
    assert len({r["key"] for r in rows}) == 4 and {r["status"] for r in rows} == {"ok"}
    (command,) = [
        json.loads(line)
        for line in (_run_dir(tmp_path, "a") / "commands.jsonl").read_text().splitlines()
    ]
    assert {r["invocation"] for r in rows} == {command["invocation"]}  # this command's tasks
    assert len(list(tmp_path.glob("results/a/.hydra/*/.submitit/*_*/*_result.pkl"))) == 4
    assert (_run_dir(tmp_path, "a") / "report" / "index.html").is_file()
    assert "sacct" not in done.stderr  # states came from squeue: no accounting here
    for row in rows:
        assert row["env"]["threads"] == 1  # one CPU per task: one thread


@needs_cluster
def test_a_task_cancelled_while_it_runs_ends_the_command_and_the_next_measures_the_rest(
    tmp_path: Path, cluster: None
) -> None:
    """Two cells run at once (array_parallelism, whatever the node's CPUs); the third, cancelled
    once they are stored, runs. Its task ignores SLURM's SIGTERM (submitit keeps it for
    preemption) and is killed KillWait later, without its result: the command sees it leave
    and ends, naming it; the same command again measures only that cell."""
    # the third cell at n=1024 (~7 ms a repeat): its 8 s are not cut short by the timing's
    # 1000-repeat cap, as n=128's were on a quiet CPU (the cell was stored before scancel)
    args = _args("b", "attention=vanilla", "n=64,96,1024", seconds=8, array_parallelism=2)
    env = _env(tmp_path)
    proc = _start(tmp_path, args)
    job = _job(tmp_path, "b", proc)
    wait_for(lambda: len(_rows(tmp_path, "b")) == 2, "the first two cells are stored", proc)
    wait_for(lambda: _queue(job).get(f"{job}_2") == "RUNNING", "the third task runs", proc)
    subprocess.run(["scancel", f"{job}_2"], check=True)
    _, err = proc.communicate()
    assert proc.returncode == 1, err
    line = _last_line(err)
    assert line.startswith(
        f"attnbench run: error: SLURM job {job}_2 (n=1024) was cancelled while it ran;"
    ), line
    assert "2 of 3 cells are stored in results/b/v100_16gb-cpu" in line, line
    assert _queue(job, "") == {}
    before = _rows(tmp_path, "b")
    assert sorted(r["n"] for r in before) == [64, 96]

    again = subprocess.run([*CLI, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    logs = tmp_path.glob("results/b/.hydra/*/.submitit/*_*/*_log.out")  # the tasks' stdout
    assert sum(log.read_text().count("done before") for log in logs) == 2
    after = _rows(tmp_path, "b")
    assert after[:2] == before and sorted(r["n"] for r in after) == [64, 96, 1024]


@needs_cluster
def test_sigterm_cancels_the_queued_and_running_tasks_and_no_row_comes_after(
    tmp_path: Path, cluster: None
) -> None:
    """Its tasks play "another node": their setup hides them from the command's reaper (no
    ATTNBENCH_INVOCATION of the command) and from its liveness check (another pid space),
    so only SLURM can stop them. SIGTERM while two run and two wait (array_parallelism, whatever
    the node's CPUs): exit 143, one line, none of them left in the queue nor running, not all of
    them run to their end (the command did not wait for its tasks: said by what happened, not
    by how long it took), and no row stored after that line."""
    elsewhere = tmp_path / "elsewhere.sh"
    elsewhere.write_text(
        'export ATTNBENCH_INVOCATION="$ATTNBENCH_INVOCATION-elsewhere"\n'
        'export ATTNBENCH_STARTED="$(echo "$ATTNBENCH_STARTED" | cut -d" " -f1,2) elsewhere"\n'
        f"export ATTNBENCH_TEST_MARK={tmp_path.name}-elsewhere\n"
    )
    args = _args(
        "c", "attention=vanilla,linformer", "n=64,128", "k=16", seconds=8, array_parallelism=2
    )
    args.append(f'hydra.launcher.setup=["source {elsewhere}"]')
    proc = _start(tmp_path, args)
    job = _job(tmp_path, "c", proc)
    two_of_each = ["PENDING", "PENDING", "RUNNING", "RUNNING"]
    wait_for(lambda: sorted(_queue(job, "").values()) == two_of_each, "two run, two wait", proc)
    elsewhere_mark = f"ATTNBENCH_TEST_MARK={tmp_path.name}-elsewhere"
    wait_for(lambda: len(processes_with(elsewhere_mark)) >= 2, "the tasks' processes run", proc)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate()
    rows = _rows(tmp_path, "c")
    assert proc.returncode == 143, err
    line = _last_line(err)
    assert line.startswith(f"attnbench run: interrupted; {len(rows)} of 4 cells are stored"), line
    assert len(rows) < 4, "the command waited for the tasks it was to cancel"
    assert _queue(job, "") == {}, "every task of the array left the queue before the line"
    # no process of a task left, so none that could store a row: the rows are final now
    assert processes_with(elsewhere_mark) == []
    assert _rows(tmp_path, "c") == rows, "a row was stored after the command's last line"


@needs_cluster
def test_a_task_cancelled_while_pending_ends_the_command_in_one_line(
    tmp_path: Path, cluster: None
) -> None:
    """One task at a time (array_parallelism=1): the third is cancelled while it waits. It
    never writes a result and, without accounting, sacct cannot say what became of it;
    squeue no longer lists it, so the command ends, naming the cell and the job, before the
    first cell is stored (at n=1024, its timing lasts seconds on any CPU), and cancels the
    rest."""
    args = _args("d", "attention=vanilla", "n=1024,96,128", seconds=8, array_parallelism=1)
    proc = _start(tmp_path, args)
    job = _job(tmp_path, "d", proc)
    wait_for(lambda: _queue(job).get(f"{job}_0") == "RUNNING", "the first task runs", proc)
    assert _queue(job).get(f"{job}_2") == "PENDING"
    subprocess.run(["scancel", f"{job}_2"], check=True)
    _, err = proc.communicate()
    assert proc.returncode == 1, err
    line = _last_line(err)
    assert line.startswith(
        f"attnbench run: error: SLURM job {job}_2 (n=128) was cancelled before it ran;"
    ), line
    assert "0 of 3 cells are stored" in line, line  # it did not wait for the first task
    assert _queue(job, "") == {}


@needs_cluster
def test_a_sweep_sbatch_refuses_is_one_line_and_exit_2(tmp_path: Path, cluster: None) -> None:
    """More memory per task than any node has: sbatch refuses the array, the command says
    sbatch's reason in one line, and nothing is queued."""
    args = _args("e", "attention=vanilla", "n=64,128", mem_gb=10**6)
    done = subprocess.run(
        [*CLI, *args], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    line = _last_line(done.stderr)
    assert line.startswith("attnbench run: error: sbatch refused the sweep: sbatch: error:"), line
    assert [ln for ln in done.stderr.splitlines() if "sbatch" in ln] == [line]
    assert _rows(tmp_path, "e") == [] and _jobs(tmp_path) == []


class _Job:
    """What the watcher reads of a submitit job: where its result and logs would be."""

    def __init__(self, folder: Path, job_id: str) -> None:
        self.paths = type("Paths", (), {})()
        self.paths.result_pickle = folder / f"{job_id}_0_result.pkl"
        self.paths.stdout = folder / f"{job_id}_0_log.out"
        self.paths.stderr = folder / f"{job_id}_0_log.err"


def test_tasks_the_queue_forgot_are_judged_by_sacct_where_there_is_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The accounting path, which the single-node cluster (no slurmdbd) cannot take, with
    SLURM's answers as such a cluster gives them replayed to the watcher (no cluster needed).
    squeue has forgotten array 7 (its tasks ended over MinJobAge ago); sacct says task 0
    completed, task 1 was cancelled: task 0, its result file not there yet, is left to
    submitit (which waits for a slow file system), task 1 ends the command. Without
    accounting the same tasks have left the queue: one without its result ends the command.
    A controller that does not answer is no verdict."""
    pytest.importorskip("submitit")
    from attnbench.sweep import slurm_watch

    def done(code: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], code, out, err)

    answers = {
        "squeue": done(1, err="slurm_load_jobs error: Invalid job id specified\n"),
        "sacct": done(0, "JobID|State\n7_0|COMPLETED\n7_0.batch|COMPLETED\n7_1|CANCELLED by 0\n"),
    }
    monkeypatch.setattr(slurm_watch, "call", lambda command: answers[command[0]])

    def tasks() -> dict[str, slurm_watch.Task]:
        return {
            f"7_{i}": slurm_watch.Task(_Job(tmp_path, f"7_{i}"), f"n={64 * (i + 1)}")
            for i in (0, 1)
        }

    monkeypatch.setattr(slurm_watch, "tasks", tasks())
    watcher = slurm_watch.Watcher()
    with pytest.raises(slurm_watch.Failed) as e:
        watcher.update(force=True)
    assert (str(e.value), e.value.code) == ("SLURM job 7_1 (n=128) was cancelled before it ran", 1)
    assert watcher.get_state("7_0", "cache") == "COMPLETED" and watcher.is_done("7_0", "cache")

    answers["sacct"] = done(1, err="Slurm accounting storage is disabled\n")
    monkeypatch.setattr(slurm_watch, "tasks", tasks())
    (tmp_path / "7_0_0_result.pkl").touch()  # task 0 gave its result
    (tmp_path / "7_1_0_log.out").touch()  # task 1 started
    watcher = slurm_watch.Watcher()
    with pytest.raises(slurm_watch.Failed) as e:
        watcher.update(force=True)
    assert str(e.value).startswith("SLURM job 7_1 (n=128) left SLURM's queue without its result")
    assert watcher.get_state("7_0", "cache") == slurm_watch.LEFT  # done: its result is there

    answers["squeue"] = done(1, err="slurm_load_jobs error: Unable to contact slurm controller\n")
    monkeypatch.setattr(slurm_watch, "tasks", tasks())
    slurm_watch.Watcher().update(force=True)
    assert {t.state for t in slurm_watch.tasks.values()} == {"UNKNOWN"}
