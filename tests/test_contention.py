"""Timings say when the machine was busy, and threads follow the CPUs a process was given.

The contention flag is proven against a real busy loop sharing the timed thread's CPU (and
the same timing without it), and the whole path once in a real ``attnbench run`` pinned
beside one; the thread count against a real CPU affinity (that run's) and
``SLURM_CPUS_PER_TASK``. Reports, the end-of-sweep line and the gate are held to what a busy
figure means: no figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench import env as cpus
from attnbench.cell import Shape, TimingSpec
from attnbench.check import verdicts
from attnbench.measure import contention
from attnbench.report.efficiency import efficiency_lengths
from attnbench.report.ratio import ratio
from attnbench.row import Row
from attnbench.store import read_rows
from attnbench.sweep.finish import busy_line
from tests.conftest import run_cli

LINUX = pytest.mark.skipif(
    contention.Sched().read() is None or not hasattr(os, "sched_setaffinity"),
    reason="needs Linux's per-thread schedstat and CPU affinity",
)
CPU = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0


# This thread pinned to CPU timing a chain of SIZE x SIZE matmuls on one torch thread,
# re-sampling for at most 1.5 s: at 640, ~10 ms a sample (longer than a scheduler time slice,
# so a busy loop on the same CPU takes part of every sample); at 330, ~1 ms, and at 150,
# ~0.1 ms, shorter than a slice: most samples run between the loop's turns, and only the
# repeats together show the CPU shared.
def _timed(size: int, hog: bool) -> dict:
    import torch

    from attnbench.measure.timing import time_forward

    busy_loop = None
    if hog:  # running (it said so) before the first sample
        busy_loop = subprocess.Popen(
            [sys.executable, "-c", "print('on', flush=True)\nwhile True: pass"],
            preexec_fn=lambda: os.sched_setaffinity(0, {CPU}),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert busy_loop.stdout is not None and busy_loop.stdout.readline() == "on\n"
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {CPU})  # this thread alone (Linux: pid 0 is the caller)
        torch.set_num_threads(1)
        a = torch.randn(size, size)
        t = time_forward(
            lambda: a @ a @ a @ a,
            torch.device("cpu"),
            min_repeats=3,
            min_seconds=0.1,
            patience_s=1.5,
        )
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
        if busy_loop is not None:
            busy_loop.kill()
            busy_loop.wait()
    return {**t.contention.as_dict(), "repeats": t.repeats}


@LINUX
@pytest.mark.parametrize("size", [640, 330, 150], ids=["10ms", "1ms", "0.1ms"])
def test_a_timing_beside_a_busy_loop_on_its_cpu_is_busy_at_every_sample_length(
    size: int,
) -> None:
    beside = _timed(size, hog=True)
    # the busy loop had its share of the CPU for the whole timing: never a figure, whether
    # the samples are read contended one by one (~10 ms: each waited about half of it) or
    # only together (shorter than a time slice)
    assert beside["busy"] and "of their time for a CPU" in beside["why"], beside
    if size == 640:
        assert "waited over 10%" in beside["why"] and beside["delay"] > 0.3, beside


def test_the_repeats_together_judge_what_samples_alone_cannot() -> None:
    """On injected scheduler readings: samples shorter than the scheduler's accounting read
    one by one as uncontended (nothing credited, or the waits in a few lumps) are busy when
    the repeats together waited over 10% of their time; the same samples with the waits
    dropped out of the figure by re-sampling, on a CPU otherwise its own, are not."""

    def reading(ran: int, waited: int) -> contention.Reading:
        delay = waited / (ran + waited) if ran + waited else None
        return contention.Reading(1e-3, 1e-3, delay, ran, waited)

    # a busy loop for the whole timing: 1 ms samples, the loop's 3 ms turns credited as
    # lumps to one window in four; the other three read ran = waited = 0 or clean
    lumpy = [reading(4_000_000, 3_000_000)] + [reading(0, 0)] * 2 + [reading(1_000_000, 0)]
    readings = lumpy * 25
    kept = [i for i, r in enumerate(readings) if not r.contended]
    share = contention.judge(readings, kept, [1e-3] * 100, threads=1, wanted=5)
    assert len(kept) == 75 and share.contended == 25 and share.busy
    assert share.why == "its 100 samples together waited 38% of their time for a CPU"
    # a single contended sample among many clean ones, taken again: a figure
    clean = [reading(1_000_000, 0)] * 99 + [reading(1_000_000, 5_000_000)]
    share = contention.judge(clean, range(99), [1e-3] * 100, threads=1, wanted=5)
    assert not share.busy and share.contended == 1
    # no scheduler counts (not Linux): the rule says nothing, the spread still does
    assert contention.aggregate_delay([contention.Reading(1e-3, 1e-3, None)] * 3) is None


@LINUX
def test_a_timing_alone_is_busy_only_by_what_its_scheduler_said() -> None:
    # no false alarm: alone on its CPU, the figure stands unless the scheduler said the
    # repeats waited (another job on a loaded CI); then the why cites that waiting
    alone = _timed(150, hog=False)
    assert not alone["busy"] or "of their time for a CPU" in alone["why"], alone


def test_samples_an_order_of_magnitude_apart_are_busy_without_a_scheduler_reading() -> None:
    quiet = [contention.Reading(0.01, 0.01, None)] * 3  # no schedstat: delay unknown
    share = contention.judge(quiet, [0, 1, 2], [1.116, 0.609, 0.00052], threads=1, wanted=3)
    assert share.busy and share.delay is None and "1171x the fastest" in share.why
    share = contention.judge(quiet, [0, 1, 2], [1.0, 1.2, 0.9], threads=1, wanted=3)
    assert not share.busy and share.cpu_share == pytest.approx(1.0)
    # one slow outlier among many is not a busy machine; the median is what is compared
    many = [contention.Reading(0.01, 0.01, 0.0)] * 100
    times = [1e-4] * 99 + [5e-3]
    assert not contention.judge(many, range(100), times, threads=1, wanted=5).busy
    # contended repeats not kept are kept here: every sample is in the row
    mixed = [contention.Reading(0.01, 0.01, 0.5), *many[:3]]
    share = contention.judge(mixed, [1, 2, 3], [9.0, 1.0, 1.1, 1.0], threads=1, wanted=3)
    assert not share.busy and share.contended == 1 and share.dropped_s == (9.0,)


def _row(attention: str, n: int, t: float, busy: bool = False) -> Row:
    return Row(
        attention=attention,
        n=n,
        dtype="fp16",
        device="v100_16gb",
        time_per_seq_s=t,
        max_batch=10,
        model={"layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072},
        contention={"busy": busy, "why": "3 of 3 samples waited"} if busy else None,
    )


def test_a_busy_time_is_shown_as_busy_never_as_a_ratio() -> None:
    base, fast = _row("vanilla", 512, 1.0), _row("linear", 512, 0.5)
    busy = _row("linear", 512, 1e-3, busy=True)
    assert ratio("time", fast, base).text == "2.00x"
    got = ratio("time", busy, base)
    assert got.value is None and got.text == "busy" and "machine busy: linear" in got.notes[0]
    assert ratio("time", base, _row("vanilla", 512, 1e-3, busy=True)).text == "busy"  # its baseline
    assert ratio("memory", busy, base).value == 1.0  # memory was not timed: it stands
    # a 1000x speed-up at n = 512 taken on a busy CPU does not make 512 the efficiency length
    rows = [_row("vanilla", 512, 1.0), busy, _row("vanilla", 1024, 1.0), _row("linear", 1024, 0.5)]
    (time,) = [x for x in efficiency_lengths(rows) if x.kind == "time"]
    assert time.compared == (1024,) and time.note == "n = 512 left out: machine busy"


def test_the_end_of_a_busy_sweep_says_so() -> None:
    quiet = {"contention": {"busy": False}, "time_per_seq_s": 1.0}
    assert busy_line([quiet]) is None
    timed = {"contention": {"busy": True}, "time_per_seq_s": 1e-3}
    skipped = {"contention": {"busy": True}, "time_per_seq_s": None}  # rate read while busy
    line = busy_line([quiet, timed, skipped])
    assert line.startswith("attnbench: machine busy: 1 timings taken on a contended CPU")
    assert "1 not taken" in line and "rerun=true" in line


def test_the_gate_gives_no_verdict_on_contended_samples(tmp_path: Path) -> None:
    from attnbench.check import run as gate
    from attnbench.check.sampling import Samples
    from attnbench.check.suite import Suite, SuiteCell

    a = [1.0 + 0.01 * i for i in range(10)]
    b = [2.0 + 0.01 * i for i in range(10)]  # twice as slow: a regression, if it were true
    xs, ys, why = verdicts._uncontended(a, b, [], [0, 1, 2], least=6)  # 3 of B's 10
    assert why.startswith("machine busy: 0 of A's 10 and 3 of B's 10 samples")
    xs, ys, why = verdicts._uncontended(a, b, [], [4], least=6)  # one: judged without it
    assert why == "" and len(xs) == 10 and len(ys) == 9 and 2.04 not in ys
    # a suite whose every cell ran contended: exit 3 (no verdict), not 2 (misuse), not 1
    cell = SuiteCell("vanilla", {}, n=64, batch=1, d_model=64, n_heads=2, threshold=0.1)
    suite = Suite(cells=[cell], skipped=[], settings={"alpha": 0.002, "threshold": 0.1})
    got = Samples(versions={"A": {cell.name: a}, "B": {cell.name: b}})
    got.contended = {"B": {cell.name: list(range(10))}}
    results = gate._judge(suite, got.versions["A"], got)
    assert [r.verdict for r in results] == ["busy"]
    json_path = tmp_path / "r.json"
    assert gate._conclude(results, {"wall_s": 1.0}, got.versions, got.contended, json_path) == 3
    # a suite at alpha 0.05 needs 4 rounds, not 6: 4 uncontended are judged, not busy
    few = Suite(cells=[cell], skipped=[], settings={"alpha": 0.05, "threshold": 0.1})
    got = Samples(versions={"A": {cell.name: a[:4]}, "B": {cell.name: b[:4]}})
    assert [r.verdict for r in gate._judge(few, got.versions["A"], got)] == ["regressed"]


@LINUX
def test_another_process_is_read_by_its_pid_as_the_gate_reads_its_workers() -> None:
    """Two busy loops on one CPU: each runs half the time and waits the other half."""
    pin = lambda: os.sched_setaffinity(0, {CPU})  # noqa: E731
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
        for _ in range(2)
    ]
    try:
        with contention.Sched(loops[0].pid) as sched:
            window = contention.Window(sched)
            time.sleep(1.0)
            got = window.close()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert got.contended and got.delay > 0.3, got  # more if CI loads that CPU too
    assert got.cpu_s < 0.8 * got.wall_s, got


def test_threads_follow_the_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    given = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv(cpus.SLURM_CPUS, raising=False)
    assert cpus.allocated()[0] == given and cpus.resolve_threads(None) == given
    monkeypatch.setenv(cpus.SLURM_CPUS, "1")
    assert cpus.allocated()[0] == 1 and cpus.resolve_threads(None) == 1
    if given > 1:  # SLURM says less than the affinity: it is the source
        assert cpus.allocated()[1] == cpus.SLURM_CPUS
    with pytest.raises(
        ValueError,
        match=r"^timing.threads: 2 threads asked, but this process"
        r" may run on 1 CPUs \(.*\); allowed: 1 to 1",
    ):
        cpus.resolve_threads(2)
    with pytest.raises(ValueError, match=r"^timing.threads: must be an integer >= 1, got 0"):
        cpus.resolve_threads(0)


CELL = (
    "attention=vanilla",
    "n=64",
    "model=tiny",
    "dtype=fp32",
    "device=cpu",
    "batch=2",
    "timing.min_seconds=0.05",
    "timing.min_repeats=3",
    "progress=false",
)


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The whole path, for real: ``attnbench run`` of two cells in a process pinned to one
    CPU beside a busy loop pinned to it (n = 128 on the base model's width: forwards of tens
    of ms, far longer than a scheduler's time slice, so the loop takes part of every one);
    its directory and the finished command."""
    tmp = tmp_path_factory.mktemp("busy")
    pin = lambda: os.sched_setaffinity(0, {CPU})  # noqa: E731
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
    try:
        done = run_cli(
            "run", "-m", "attention=vanilla,linear", "n=128", "model.layers=2", "dtype=fp32",
            "device=cpu", "batch=1", "timing.min_seconds=0.05", "timing.min_repeats=3",
            "progress=false", "sweep_name=busy", cwd=tmp, preexec_fn=pin,
        )  # fmt: skip
    finally:
        loop.kill()
        loop.wait()
    return tmp, done


@LINUX
def test_a_cell_times_on_the_cpus_it_was_given_and_says_so(
    busy_run: tuple[Path, subprocess.CompletedProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_in_process,
) -> None:
    """The process's CPU affinity, as it started (the pinned run's rows), then
    ``SLURM_CPUS_PER_TASK`` as the command reads it (in this process)."""
    where, one = busy_run
    assert one.returncode == 0, one.stderr
    for row in read_rows(next(where.glob("results/busy/*/cells.jsonl"))):
        assert row["env"]["threads"] == 1 and row["env"]["cpus"] == 1
        assert set(row["contention"]) >= {"delay", "cpu_share", "contended", "busy"}
    monkeypatch.setenv(cpus.SLURM_CPUS, "1")
    slurm = cli_in_process("run", *CELL, "report=false", cwd=tmp_path)  # rows only
    assert slurm.returncode == 0, slurm.stderr
    (row,) = read_rows(next(tmp_path.glob("results/single/*/cells.jsonl")))
    assert row["env"]["threads"] == 1


def test_threads_are_checked_where_the_jobs_run() -> None:
    """Under SLURM the jobs' CPUs are the compute node's: the command does not refuse a
    thread count its own machine lacks (each job checks it, as an error row)."""
    from attnbench.sweep.config import prevalidate

    many = f"timing.threads={cpus.allocated()[0] + 1}"
    with pytest.raises(ValueError, match=r"^timing\.threads: "):
        prevalidate([*CELL, many])
    assert len(prevalidate([*CELL, many, "hydra/launcher=submitit_slurm"])) == 1


def test_more_threads_than_cpus_are_refused_before_anything_runs(
    tmp_path: Path, cli_in_process
) -> None:
    """A refusal's line and exit code, in this process (a real refusal of ``attnbench run``:
    tests/test_run_cli.py)."""
    too_many = cpus.allocated()[0] + 1
    done = cli_in_process("run", *CELL, f"timing.threads={too_many}", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "results").exists()
    assert done.stderr.strip().splitlines() == [
        f"attnbench run: error: timing.threads: {too_many} threads asked, but this process may "
        f"run on {too_many - 1} CPUs ({cpus.allocated()[1]}); allowed: 1 to {too_many - 1}, or "
        "null to use them all"
    ]


@LINUX
def test_a_cell_timed_beside_a_busy_loop_is_stored_busy_and_said_last(
    busy_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """The whole path (:func:`busy_run`): the rows are busy, the report shows ``busy`` for
    their time ratio, and the command's last line says the machine was busy."""
    tmp_path, done = busy_run
    assert done.returncode == 0, done.stderr
    rows = read_rows(next(tmp_path.glob("results/busy/*/cells.jsonl")))
    assert [r["contention"]["busy"] for r in rows] == [True, True], rows
    assert rows[0]["time_per_seq_s"] > 0 and rows[0]["env"]["threads"] == 1
    assert done.stdout.splitlines()[-1].startswith(
        "attnbench: machine busy: 2 timings taken on a contended CPU"
    )
    table = next(tmp_path.glob("results/busy/*/report/table3.md")).read_text()
    assert "busy" in table and "machine busy: " in table


def test_a_cell_leaves_the_callers_thread_count_as_it_was() -> None:
    import torch

    from attnbench.cell import Cell
    from attnbench.runner import run_cell

    cell = Cell(
        "vanilla",
        64,
        model=Shape(layers=1, d_model=64, n_heads=2, d_ff=128),
        timing=TimingSpec(min_repeats=2, min_seconds=0.01),
        dtype="fp32",
        device="cpu",
        batch=2,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        row = run_cell(cell)
        assert row.status == "ok" and row.env["threads"] == cpus.allocated()[0]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
