"""`attnbench run` end to end: the CLI in a subprocess on the CPU, real files on disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from attnbench.cell_key import KEY_VERSION
from attnbench.measure.contention import is_busy
from attnbench.store import CorruptLine, RunStore, read_rows
from attnbench.validators import parse_size
from tests.conftest import CLI, run_cli, wait_for

SMOKE = ("+sweep=smoke", "progress=false")


def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("run", *args, cwd=cwd, env=env)


def rows_of(tmp: Path, sweep: str = "smoke") -> list[dict]:
    (cells,) = tmp.glob(f"results/{sweep}/*/cells.jsonl")
    return read_rows(cells)


def cells_of(rows: Iterable[dict]) -> set[tuple]:
    return {(r["attention"], r["n"], r["k"], r["status"], r["max_batch"]) for r in rows}


@pytest.fixture(scope="module")
def smoke_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess]:
    """One ``attnbench run +sweep=smoke`` (a fresh process, the default launcher, the default
    progress=true), shared: the smoke test asserts on its rows and output, the progress
    test on its live display, the launcher tests hold theirs against it. Read only: a test
    that runs again in it copies it first."""
    where = tmp_path_factory.mktemp("smoke")
    return where, run("+sweep=smoke", cwd=where)


def test_smoke_sweep_writes_a_row_per_cell_and_resumes(
    smoke_run: tuple[Path, subprocess.CompletedProcess], tmp_path: Path, cli_in_process
) -> None:
    where, first = smoke_run
    assert first.returncode == 0, first.stderr
    shutil.copytree(where / "results", tmp_path / "results")  # resumed here, not in it
    rows = rows_of(tmp_path)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    assert len({r["key"] for r in rows}) == 6
    assert {r["key_version"] for r in rows} == {KEY_VERSION}  # the rule that made the keys
    run_dir = next(tmp_path.glob("results/smoke/*/cells.jsonl")).parent
    assert (run_dir / "config.yaml").read_text().count("sweep_name: smoke") == 1
    assert json.loads((run_dir / "env.json").read_text())["torch"]
    for r in rows:
        assert r["memory_source"] in ("modeled", "measured") and r["time_per_seq_s"] > 0
    # the sweep ends with its report, the same one `attnbench report RUN_DIR` writes
    where = run_dir.relative_to(tmp_path)
    assert f"attnbench: report in {where}/report/index.html" in first.stdout
    report = json.loads((run_dir / "report/report.json").read_text())
    assert {t["mechanism"].split()[0] for t in report["tables"]} == {"linformer", "performer"}
    # the time plot has a point per cell timed on a quiet CPU (a busy time is no figure: on
    # a loaded machine every cell's can be, and then there is no time plot); the batch plot
    # is there whether or not the machine was busy
    plots = run_dir / "report/plots"
    if any(not is_busy(r.get("contention")) for r in rows):
        assert (plots / "time-vs-n.png").stat().st_size > 1000
    else:
        assert not (plots / "time-vs-n.png").exists()
    assert (plots / "batch-vs-n.png").stat().st_size > 1000
    # run again in this process (cli.main, as the command line calls it): the lines and rows
    # are the property (a real resume: test_interrupts.py's, after an interrupted sweep)
    again = cli_in_process("run", *SMOKE, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("done before") == 6
    assert "attnbench: 0 of 6 cells to measure in results/smoke/" in again.stdout
    assert rows_of(tmp_path) == rows
    forced = cli_in_process("run", *SMOKE, "rerun=true", "n=64", "report=false", cwd=tmp_path)
    assert forced.returncode == 0 and forced.stdout.count("done before") == 0
    assert len(rows_of(tmp_path)) == 6  # measured again, replaced, never duplicated


def test_killed_halfway_then_resumed_has_every_cell_exactly_once(
    tmp_path: Path, cli_in_process
) -> None:
    args = (*SMOKE, "n=64,96,128")  # 9 cells, ~1.5 s each at timing.min_seconds=0.4
    proc = subprocess.Popen(
        [*CLI, "run", *args, "timing.min_seconds=0.4"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cells = tmp_path / "results/smoke"

    def three_rows() -> bool:
        found = list(cells.glob("*/cells.jsonl"))
        return bool(found) and len(found[0].read_text().splitlines()) >= 3

    wait_for(three_rows, "three rows are stored", alive=proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(rows_of(tmp_path))
    assert 3 <= partial < 9, "the kill should land in the middle of the sweep"
    # resumed timing each cell left for its minimum repeats only: timing.min_seconds is not
    # in a cell's key, so the stored cells are the same cells; in this process (cli.main, as
    # the command line calls it: the rows are the property), without the report
    done = cli_in_process("run", *args, "timing.min_seconds=0", "report=false", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = rows_of(tmp_path)
    assert len(rows) == 9 and len({r["key"] for r in rows}) == 9
    assert done.stdout.count("done before") == partial


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_other_launchers_give_the_same_rows(
    smoke_run: tuple[Path, subprocess.CompletedProcess], tmp_path: Path, launcher: str
) -> None:
    basic, first = smoke_run  # the default launcher's rows, measured once for both
    assert first.returncode == 0, first.stderr
    other = tmp_path / launcher
    other.mkdir()
    # two of the smoke sweep's mechanisms, one with a budget and one without, at one of its
    # n: 2 cells (each a fresh process of its own under either launcher), against the same 2
    # of the basic's; untimed and without the report (neither is compared: a cell's max
    # batch is modeled)
    two = ("vanilla", "linformer")
    fast = ("n=64", "timing.min_seconds=0", "report=false")
    out = run(*SMOKE, f"attention={','.join(two)}", f"hydra/launcher={launcher}", *fast, cwd=other)
    assert out.returncode == 0, out.stderr
    theirs = cells_of(rows_of(other))
    assert len(theirs) == 2 and theirs == cells_of(
        r for r in rows_of(basic) if r["attention"] in two and r["n"] == 64
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("attention=foo",), "attention: unknown option 'foo'; allowed: deltanet, flex"),
        (("+sweep=nope",), "sweep: unknown option 'nope'; allowed: approx, batches"),
        (("device=tpu",), "device: unknown option 'tpu'; allowed: a100_40gb"),
        # a choice is an option of its group, named as typed: not a path to another file
        (("device=../../conf/config",), "device: unknown option '../../conf/config'; allowed:"),
        (("model=../config",), "model: unknown option '../config'; allowed: approx, base"),
        (("attention=../model/tiny",), "attention: unknown option '../model/tiny'"),
        (("-m", "attention=vanilla,../config"), "attention: unknown option '../config'"),
        (("+sweep=../config",), "sweep: unknown option '../config'; allowed: approx"),
        (("~device",), "device: cannot be removed; allowed: a100_40gb"),
        # a key the cell needs, removed: one line, never a default of the code's
        (("~decode_tokens", "mode=decode", "causal=true"), "decode_tokens: required"),
        (("~timing.time_budget_s",), "timing.time_budget_s: required"),
        # (in this process, mechanisms other test modules register at import are options too)
        (("attention=null",), "attention: cannot be removed; allowed: "),
        (("attention=linformer", "k=0"), "k: must be an integer >= 1, got 0"),
        # a single cell: k that would change nothing is refused, as for the quality tasks
        (("attention=vanilla", "k=64"), "k: attention=vanilla has no budget: k must be null"),
        (("n=-1",), "n: must be an integer >= 1, got -1"),
        (("attention=linformer", "n=512", "k=1024"), "k: must be at most n=512, got 1024"),
        (("ceiling=lots",), "ceiling: must be a number of bytes or a size like 16GB"),
        (("ceiling=20GB",), "ceiling: 20000000000 bytes is above v100_16gb's"),
        (("dtype=bf16",), "dtype: v100_16gb (Tesla V100-SXM2-16GB) cannot run bf16"),
        (("+sweep=smoke", "n=0"), "n: must be an integer >= 1, got 0"),
        (("+sweep=smoke", "report_baseline=vanila"), "report_baseline: must be a mechanism"),
        (("+sweep=smoke", "report=maybe"), "report: must be true or false, got 'maybe'"),
        (("cell_timeout_s=-1",), "cell_timeout_s: must be a number of seconds >= 0 (0 or null"),
        (("causal=maybe",), "causal: must be true or false, got 'maybe'"),
        (
            ("attention=linformer", "k=64", "causal=true"),
            "causal: attention=linformer has no causal form; causal=true works with vanilla",
        ),
    ],
)
def test_bad_overrides_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path, args: tuple, needle: str, cli_in_process
) -> None:
    # one of them as a user meets it, in a fresh process; the others in this one (the same
    # cli.main, its refusal said before anything is written: seconds of imports each saved)
    if args == ("attention=foo",):
        out = run(*args, cwd=tmp_path)
    else:
        out = cli_in_process("run", *args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("attnbench run: error: ")
    assert needle in out.stderr and out.stderr.count("\n") == 1 and not out.stdout
    assert not any(tmp_path.iterdir()), "nothing may be written"


def test_help_helps(tmp_path: Path) -> None:
    out = run("--help", cwd=tmp_path)
    assert out.returncode == 0
    for word in (
        "+sweep=table3",
        "attention:",
        "sweep: approx, batches, ceilings, compare",
        "device: a100_40gb",
        "cell_timeout_s (seconds; 0 or null: no limit)",  # 0 is no limit: said, not implied
    ):
        assert word in out.stdout
    top = subprocess.run(
        [*CLI, "--help"],
        capture_output=True,
        text=True,
    )
    assert top.returncode == 0 and "run" in top.stdout and "list" in top.stdout


def test_a_python_registered_mechanism_is_an_attention_option(tmp_path: Path) -> None:
    (tmp_path / "my_mech.py").write_text(
        "from dataclasses import dataclass\nimport attnbench\n"
        "from attnbench.attention.base import MultiHeadAttention\n"
        "@dataclass\nclass Cfg:\n    pass\n"
        "@attnbench.register('mine', config=Cfg, causal=False, summary='V only')\n"
        "class Mine(MultiHeadAttention):\n"
        "    def attend(self, x, key_padding_mask):\n        return self.v_proj(x)\n"
    )
    env = {"ATTNBENCH_PLUGINS": "my_mech", "PYTHONPATH": str(tmp_path)}
    out = run(
        "attention=mine",
        "model=tiny",
        "n=32",
        "dtype=fp32",
        "ceiling=1GB",
        "progress=false",
        "timing.min_seconds=0",
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    (row,) = rows_of(tmp_path, "single")
    assert row["attention"] == "mine" and row["status"] == "ok"


def test_sizes() -> None:
    assert parse_size("16GB") == 16 * 10**9 and parse_size("1.5GiB") == 3 * 2**29
    assert parse_size(123) == 123 and parse_size("2048") == 2048 and parse_size(None) is None
    with pytest.raises(ValueError, match="ceiling: must be"):
        parse_size("16 gigs")


def test_store_cuts_a_killed_writers_half_line_and_names_bad_lines(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    assert store.append({"key": "a", "v": 1})
    store.cells.write_text(store.cells.read_text() + '{"key": "b", "v"')  # killed mid-line
    assert [r["key"] for r in read_rows(store.cells, strict=False)] == ["a"]
    with pytest.raises(CorruptLine, match=":2: not a JSON row"):
        read_rows(store.cells)
    assert store.append({"key": "b", "v": 2}) and not store.append({"key": "b", "v": 3})
    assert [r["v"] for r in read_rows(store.cells)] == [1, 2]
    assert read_rows(str(store.cells)) == read_rows(store.cells)  # a path given as text
    store.cells.write_text(store.cells.read_text() + "garbage\n" + '{"key": "c"}\n')
    with pytest.raises(CorruptLine, match=":3: not a JSON row"):
        read_rows(store.cells, strict=False)


# a writer process: attnbench.store alone (no torch, no pytest: a tenth of a second to start),
# appending once every writer is up, so that the four append at the same time
APPEND_MANY = """
import sys, time
from pathlib import Path
from attnbench.store import RunStore
store, worker, go = RunStore(Path(sys.argv[1])), int(sys.argv[2]), Path(sys.argv[3])
(go.parent / f"up-{worker}").touch()
while not go.exists():
    time.sleep(0.001)
for i in range(20):
    store.append({"key": f"shared-{i}", "by": worker})
    store.append({"key": f"own-{worker}-{i}"})
"""


def test_parallel_writers_keep_every_row_exactly_once(tmp_path: Path) -> None:
    run_dir, flags = tmp_path / "run", tmp_path / "flags"
    flags.mkdir()
    go = flags / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", APPEND_MANY, str(run_dir), str(w), str(go)])
        for w in range(4)
    ]
    up = lambda: len(list(flags.glob("up-*"))) == 4  # noqa: E731
    # every writer up (or one dead: its exit fails below), then all at once
    wait_for(lambda: up() or any(p.poll() is not None for p in procs), "the writers are up")
    go.touch()
    assert [p.wait() for p in procs] == [0, 0, 0, 0]
    keys = [r["key"] for r in read_rows(RunStore(run_dir).cells)]
    assert len(keys) == len(set(keys)) == 20 + 4 * 20


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (Path(__file__).parents[1] / "conf/sweep").glob("*.yaml"))
)
def test_every_shipped_sweep_validates(name: str) -> None:
    from attnbench.sweep.config import prevalidate

    plan = prevalidate([f"+sweep={name}"])
    assert plan and len(set(plan)) == len(plan)
    if name == "table3":
        assert len(plan) == 42  # 8 Transformer cells + 34 Linformer cells with k < n


def test_causal_is_a_sweepable_key_and_leaves_out_what_has_no_causal_form(
    tmp_path: Path, cli_in_process
) -> None:
    """``causal=false,true`` over vanilla and Linformer: three cells, the causal Linformer
    left out with the reason; the causal rows carry causal=True among their parameters, so
    their report compares them with the causal vanilla only. In this process (cli.main, as
    the command line calls it): rows, lines and the report are the property."""
    out = cli_in_process(
        "run",
        "-m",
        "attention=vanilla,linformer",
        "causal=false,true",
        "n=64",
        "k=16",
        "model=tiny",
        "device=cpu",
        "dtype=fp32",
        "batch=2",
        "progress=false",
        "timing.min_repeats=1",
        "timing.min_seconds=0",
        "sweep_name=causal",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "1 combinations left out" in out.stderr and "has no causal form" in out.stderr
    rows = rows_of(tmp_path, "causal")
    got = sorted((r["attention"], bool(r["params"].get("causal"))) for r in rows)
    assert got == [("linformer", False), ("vanilla", False), ("vanilla", True)]
    assert all(r["status"] == "ok" for r in rows)
    report = next(tmp_path.glob("results/causal/*/report/table3.md")).read_text()
    assert "vanilla (causal=True)" not in report.split("**time ratio")[1]  # not a mechanism


def test_a_timeout_is_a_row_and_the_sweep_goes_on(tmp_path: Path, cli_in_process) -> None:
    # in this process (cli.main, as the command line calls it): rows are the property. The
    # alarm must not land in an import (it can break the module for the next cell:
    # in-process timeouts are a last resort): a fresh process's first cell imports
    # torch._dynamo (a meta forward does), seconds on a busy machine, which broke this test
    # at cell_timeout_s=5 in a fresh process; imported here first, a cell imports nothing.
    # The timing stops at 1000 repeats whatever min_seconds asks, so the cells are ones whose
    # 1000 repeats take far longer than 2 s (n=1024: about 7 ms a repeat on this CPU; at
    # n=64, 0.4 ms, they ended in 0.5 s and the cells were stored ok)
    import torch._dynamo  # noqa: F401

    out = cli_in_process(
        "run",
        *SMOKE,
        "attention=vanilla",
        "n=1024,2048",
        "cell_timeout_s=2",
        "timing.min_seconds=8",
        "report=false",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    rows = rows_of(tmp_path)
    assert len(rows) == 2 and all(r["status"] == "error" for r in rows)
    assert all(r["reason"] == "timed out after 2 s" for r in rows)
    assert {"max_batch", "time_per_seq_s", "peak_bytes", "memory_source"} <= set(rows[0])


def test_a_single_cell_says_where_it_stored_its_row(tmp_path: Path, cli_in_process) -> None:
    # in this process (cli.main, as the command line calls it): a single cell in a fresh
    # process is the registered mechanism's test above
    args = ("attention=vanilla", "model=tiny", "n=32", "dtype=fp32", "ceiling=1GB")
    # cell_timeout_s=null: no limit, as 0 says
    out = cli_in_process(
        "run", *args, "timing.min_seconds=0", "progress=false", "cell_timeout_s=null", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/single/*/cells.jsonl")
    assert f"attnbench: row stored in {cells.relative_to(tmp_path)}" in out.stdout
    assert len(read_rows(cells)) == 1


def test_command_line_sweep_duplicates_run_once_and_config_is_kept(
    tmp_path: Path, cli_in_process
) -> None:
    """Vanilla ignores k: three jobs, one cell, measured once even with rerun=true. In this
    process (cli.main, as the command line calls it): the lines and rows are the property."""
    args = (
        "run",
        "-m",
        "attention=vanilla",
        "model=tiny",
        "n=32",
        "k=8,16,32",
        "dtype=fp32",
        "ceiling=1GB",
        "timing.min_seconds=0",
        "progress=false",
    )
    first = cli_in_process(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # said once, before it runs; a fresh run has nothing "done before"
    assert first.stderr.count("attnbench run: vanilla ignores k: measured once") == 1
    # the count is of cells; Hydra's of jobs (one per combination) is not shown
    assert "attnbench: 1 cell to measure in results/single/" in first.stdout
    assert "Launching" not in first.stdout + first.stderr
    assert "done before" not in first.stdout
    out = cli_in_process(*args, "rerun=true", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.count("  ok ") == 1
    (cells,) = tmp_path.glob("results/single/*/cells.jsonl")
    assert len(read_rows(cells)) == 1
    assert "attention:" in (cells.parent / "config.yaml").read_text()
    assert len((cells.parent / "commands.jsonl").read_text().splitlines()) == 2


def test_the_progress_display_runs_and_the_report_follows(
    smoke_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """The default (progress=true): the live table's last frame is in the output, and the
    Hydra callback raised nothing (Hydra would only have warned). The shared smoke run's
    (it runs with the default)."""
    _, out = smoke_run
    assert out.returncode == 0, out.stderr
    assert "finished cells (last 8)" in out.stdout
    assert "Error" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert "time ratio: linformer" in out.stdout  # the report's tables, printed


def test_the_eta_counts_every_cell_this_command_finished() -> None:
    """The ETA is the mean time a finished cell took (its finishing times apart) for each
    cell left, less what the running one has had: cells of minutes still give one (a 30 s
    window of recent cells gives none), and a burst of quick cells does not read as the end."""
    from attnbench.sweep.progress import eta_s, eta_text

    assert eta_s(0.0, [], 5, 100.0) is None and eta_text(None) == "after the first cell"
    # two cells of 100 s; 4 left; the one running since 200 has had 50 s of its 100
    assert eta_s(0.0, [100.0, 200.0], 4, 250.0) == 350.0
    assert eta_s(0.0, [100.0, 200.0], 4, 500.0) == 300.0  # it overran: the 3 others count
    # one slow cell, then five quick ones in 5 s: 66 s over 6 cells, not 1 s each
    assert eta_s(0.0, [60.0, 62.0, 63.0, 64.0, 65.0, 66.0], 4, 66.0) == 44.0
    assert eta_s(0.0, [10.0], 0, 20.0) == 0.0 and eta_text(390.4) == "0:06:30"


def test_sweep_files_choose_config_groups_never_set_their_values() -> None:
    """A ``@package _global_`` sweep that sets ``model.*`` (or ``attention``, ``device``)
    values applies them after the command line's group choice, so ``+sweep=X model=listops``
    silently measured the sweep's shape; ``override /group: option`` lets the command line
    win (``+sweep=approx`` had this bug)."""
    import yaml

    conf = Path(__file__).resolve().parent.parent / "conf"
    groups = {p.name for p in conf.iterdir() if p.is_dir() and p.name != "sweep"}
    assert {"attention", "model", "device"} <= groups
    sweeps = sorted((conf / "sweep").glob("*.yaml"))
    assert len(sweeps) >= 10
    for path in sweeps:
        keys = {str(key).split(".")[0] for key in yaml.safe_load(path.read_text()) or {}}
        assert not keys & groups, f"{path.name} sets {sorted(keys & groups)}: use an override"
