"""What a newcomer sees (issue 47, item 8), each on injected data: the progress display names
the cell it is measuring; a report's marks are told apart and explained in every format, its
footer says how the times were taken and its title what the report is; ``run --help`` lists
every registered workload and each choice as its owner declares it; a busy machine still
times what fits the budget on a quiet CPU, and says which cells the load, not their cost,
left untimed. No test here reads a clock: rates, rows and claims are injected.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from attnbench import workload
from attnbench.cell import Cell, Shape, TimingSpec
from attnbench.measure import contention, gemm
from attnbench.measure.contention import SKIPPED_FOR_LOAD, TIMED_UNDER_LOAD
from attnbench.measure.timing import Timing
from attnbench.report import files, marks, text
from attnbench.report.ratio import ratio
from attnbench.report.tables import about, context, ratio_tables, timed
from attnbench.row import Row
from attnbench.runner import run_cell
from attnbench.runner.timed import LOAD_STRETCH, budget_verdict
from attnbench.store import read_rows
from attnbench.sweep import claims
from attnbench.sweep.finish import busy_line
from attnbench.sweep.help import keys_text
from attnbench.sweep.progress import Display

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "cells_fixture.jsonl"  # GPU rows, timed at max batch
TABLE3 = ROOT / "results" / "reference" / "table3-v100_16gb-cpu"  # CPU rows, fp32 at b = 1
LABEL = "linformer (sharing=layerwise) n=512 k=128"

# -- the progress display names the running cell ------------------------------------------


def _shown(renderable: object) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


FINISHED = {"attention": "vanilla", "n": 512, "status": "ok", "finished_at": 120.0}


@pytest.mark.parametrize(
    ("rows", "running", "seen", "unseen"),
    [
        # the first cell of a sweep, a minute in: its label, how long, and what the ETA awaits
        ([], [(LABEL, 100.0)], [f"running 0:00:52: {LABEL}", "0/3", "after the first cell"],
         ["finished cells"]),
        # under a parallel launcher, each cell being measured, the oldest first
        ([FINISHED], [(LABEL, 130.0), ("vanilla n=1024", 150.0)],
         [f"running 0:00:22: {LABEL}", "running 0:00:02: vanilla n=1024", "1/3",
          "finished cells (last 8)"], ["after the first cell"]),
        # a label holding a newline (a parameter's value) stays on its one line
        ([], [("a\nb n=4", 148.0)], ["running 0:00:04: a\\nb n=4"], []),
        # between cells: nothing said to be running
        ([FINISHED], [], ["1/3", "finished cells (last 8)"], ["running"]),
    ],
)  # fmt: skip
def test_the_progress_display_names_the_running_cell(
    rows: list[dict], running: list[tuple[str, float]], seen: list[str], unseen: list[str]
) -> None:
    shown = _shown(Display(3, started=100.0, before=0).frame(rows, running, now=152.0))
    for words in seen:
        assert words in shown, shown
    for words in unseen:
        assert words not in shown, shown


def test_the_running_cell_is_read_from_the_claim_its_job_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's claim (:func:`claims.hold`) holds its cell's label while it is measured, so
    the command's display reads it under any launcher; another command's claim is not
    this command's running cell, and a released claim is none."""
    monkeypatch.setenv(claims.INVOCATION_ENV, "123-abc")
    plan = [(str(tmp_path), "k1"), (str(tmp_path), "k2")]
    assert claims.running(plan) == []
    with claims.hold(tmp_path, "k1", print, LABEL):
        assert [label for label, _ in claims.running(plan)] == [LABEL]
        assert claims.running([(str(tmp_path), "k2")]) == []  # not in this plan
        monkeypatch.setenv(claims.INVOCATION_ENV, "456-def")
        assert claims.running(plan) == []  # another command's cell
        monkeypatch.setenv(claims.INVOCATION_ENV, "123-abc")
    assert claims.running(plan) == []


# -- run --help lists every registered workload and every declared choice -------------------


def test_help_lists_every_registered_workload_and_declared_choice(
    cli_in_process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys are made from their owners when the help asks: a workload registered (a
    plugin's too) is a ``mode`` choice, and each setting's choices are its check's."""
    mine = type("Mine", (type(workload.get("inference")),), {"name": "mine_workload"})()
    monkeypatch.setitem(workload._WORKLOADS, "mine_workload", mine)
    out = cli_in_process("run", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    keys = " ".join(out.stdout.split())  # as one line: the help wraps between keys
    assert f"mode ({'|'.join(workload.names())})" in keys
    assert "mine_workload" in keys and {"packed", "packed_train"} <= set(workload.names())
    for wanted in (
        "optimizer (adamw|sgd|none)",
        "state_dtype (auto|fp32|fp16|bf16)",
        "contexts (n|drawn)",
        "distribution (uniform|lognormal|long_tail)",
        "layout (padded|packed|bucketed)",
        "lengths ([N, ...] or null)",
        "compile_mode (default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs)",
        "cell_timeout_s (seconds; 0 or null: no limit)",
    ):
        assert wanted in keys, wanted
    assert keys_text() in out.stdout  # the resolver's text, as it is
    assert not any(tmp_path.iterdir())


# -- a busy machine still times what it can -------------------------------------------------


@pytest.mark.parametrize(
    ("timing_s", "slowdown", "verdict"),
    [
        (25.0, 1.0, None),  # quiet, in budget: timed
        (31.0, 1.0, "cost"),  # quiet, over budget: its cost
        (31.0, 8.0, "cost"),  # over budget on a quiet CPU too: its cost, not the load
        (4.0, 8.0, None),  # a contended reading 8x slower: 32 s, timed (it skipped before)
        (10.0, LOAD_STRETCH * 3, None),  # at the stretch allowed, not over it
        (25.0, 3.0, "load"),  # fits on a quiet CPU; ~75 s under this load: the load's
    ],
)
def test_the_budget_is_decided_on_the_quiet_rate(
    timing_s: float, slowdown: float, verdict: str | None
) -> None:
    assert budget_verdict(timing_s, slowdown, 30.0) == verdict


def _timing(samples: tuple[float, ...], busy: bool) -> Timing:
    share = contention.Share(0.5 if busy else 0.0, 1.0, 3 if busy else 0, None, busy, "x")
    return Timing(samples, "perf_counter", 1, share)


@pytest.mark.parametrize(
    ("samples", "busy", "quiet", "now", "kept"),
    [
        ((0.01, 0.01, 0.012), False, 0.01, 0.01, True),  # quiet: its median, kept
        ((0.01, 0.08, 0.2), True, 0.01, 0.08, False),  # busy: the fastest, read again later
    ],
)
def test_a_contended_reading_gives_the_cpus_own_rate_from_its_fastest_sample(
    monkeypatch: pytest.MonkeyPatch,
    samples: tuple[float, ...],
    busy: bool,
    quiet: float,
    now: float,
    kept: bool,
) -> None:
    monkeypatch.setattr(gemm, "_RATES", {})
    monkeypatch.setattr(gemm, "time_forward", lambda *a, **k: _timing(samples, busy))
    rate = gemm.cpu_matmul_rate()
    assert rate == gemm.Rate(gemm.FLOPS / quiet, gemm.FLOPS / now, busy)
    assert rate.slowdown == pytest.approx(now / quiet) and bool(gemm._RATES) == kept


TINY = Cell(
    "vanilla",
    16,
    dtype="fp32",
    device="cpu",
    model=Shape(layers=1, d_model=16, n_heads=2, d_ff=32),
    timing=TimingSpec(min_repeats=2, min_seconds=0.0),
    batch=1,
)


@pytest.mark.parametrize(
    ("rate", "reason", "timed_", "busy"),
    [
        # a cell timed: its own samples say whether it is busy (this machine's load), not us
        (gemm.Rate(1e12, 1e12, False), None, True, None),
        (gemm.Rate(1e12, 5e11, True), TIMED_UNDER_LOAD, True, None),
        (gemm.Rate(1e12, 1e2, True), SKIPPED_FOR_LOAD, False, True),
        (gemm.Rate(1e-3, 1e-3, False), "time skipped: ", False, False),  # its cost
        (gemm.Rate(1e-3, 1e-4, True), "time skipped: ", False, False),  # its cost, busy or not
    ],
)
def test_a_cell_says_whether_its_cost_or_the_load_left_it_untimed(
    monkeypatch: pytest.MonkeyPatch,
    rate: gemm.Rate,
    reason: str | None,
    timed_: bool,
    busy: bool | None,
) -> None:
    monkeypatch.setattr(gemm, "cpu_matmul_rate", lambda: rate)
    row = run_cell(TINY)
    assert row.status == "ok"
    assert (row.reason or None) == reason or (row.reason or "").startswith(reason), row.reason
    assert bool(row.time_per_seq_s) == timed_
    if busy is not None:
        assert row.busy == busy
    if not timed_ and busy:  # the sweep's last line counts it as the load's
        assert "1 not taken (skipped for the load, not for their cost)" in busy_line(
            [row.to_dict()]
        )


# -- a report's marks, footer and title -----------------------------------------------------


def test_the_marks_are_told_apart() -> None:
    dashes = set("-‐‑‒–—―−")
    assert marks.SKIPPED != marks.MISSING and not set(marks.SKIPPED) & dashes
    for mark in (marks.SKIPPED, marks.MISSING, marks.OOM, marks.BUSY):
        assert f"{mark}: " in marks.LEGEND


def _fixture_rows(**changed: object) -> list[dict]:
    """The fixture, its linformer n=512 k=128 row changed."""
    rows = read_rows(FIXTURE)
    for r in rows:
        if r["attention"] == "linformer" and r["n"] == 512 and r["k"] == 128:
            r.update(changed)
    return rows


@pytest.mark.parametrize(
    ("changed", "shown", "note"),
    [
        ({"reason": f"{TIMED_UNDER_LOAD}: x"}, "1.25x", f"{TIMED_UNDER_LOAD}: linformer's time"),
        ({"reason": f"{SKIPPED_FOR_LOAD}: x", "time_per_seq_s": None}, marks.SKIPPED,
         "skipped for the load, not for its cost"),
        ({"reason": "time skipped: ~9 s; would exceed time_budget_s=1", "time_per_seq_s": None},
         marks.SKIPPED, "estimated over timing.time_budget_s"),
    ],
)  # fmt: skip
def test_a_time_taken_or_skipped_under_load_is_footnoted(
    changed: dict, shown: str, note: str
) -> None:
    rows = [Row.from_dict(r) for r in _fixture_rows(**changed)]
    mine = next(r for r in rows if r.attention == "linformer" and r.n == 512 and r.k == 128)
    base = next(r for r in rows if r.attention == "vanilla" and r.n == 512)
    got = ratio("time", mine, base)
    assert got.text == shown and any(note in n for n in got.notes), got.notes


def _report(tmp_path: Path, rows: list[dict]) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    made = files.render(files.build(run), with_plots=False)
    return {name: data.decode() for name, data in made.items()}


def test_every_format_says_what_its_marks_mean(tmp_path: Path) -> None:
    """Markdown, LaTeX and the page each say the legend under their title; a CSV is data:
    an empty cell where there is no number, never a mark."""
    got = _report(tmp_path, _fixture_rows(time_per_seq_s=None))
    assert text.markdown(marks.LEGEND) in got["table3.md"]
    assert text.comment(marks.LEGEND) in got["table3.tex"]
    assert html.escape(marks.LEGEND) in got["index.html"]
    assert f"| {marks.SKIPPED}¹ |" in got["table3.md"]  # the time not measured
    assert "| - |" in got["table3.md"]  # no such cell: k >= n
    for name, data in got.items():
        if name.endswith(".csv"):
            assert "n/m" not in data and "-" not in data.split("\n", 1)[1], name
        assert "–¹" not in data and "| – |" not in data, name


def test_the_footer_says_how_the_times_were_taken_from_the_rows() -> None:
    """A CPU standing in for a V100 times in fp32 at b = 1: the footer says so beside the
    preset's fp16, never "fp16" as if the times were; GPU rows at each max batch."""
    cpu = [Row.from_dict(r) for r in read_rows(TABLE3 / "cells.jsonl")]
    gpu = [Row.from_dict(r) for r in read_rows(FIXTURE)]
    assert timed(cpu) == "timed on cpu in fp32 at b = 1"
    assert timed(gpu) == "timed on cuda in fp16 at b = 20 to 170"
    assert timed([r for r in cpu if not r.time_per_seq_s]) == "no time measured"
    assert timed(cpu + gpu) == "timed on cpu in fp32 at b = 1 and cuda in fp16 at b = 20 to 170"
    line = context(cpu)
    assert "preset v100_16gb (fp16, ceiling 16944988160 bytes)" in line
    assert "timed on cpu in fp32 at b = 1, run on" in line
    (time, _), *_ = [ratio_tables(cpu)]
    assert "timed on cpu in fp32 at b = 1" in time.context


@pytest.mark.parametrize(
    ("rows", "title"),
    [
        ([r for r in read_rows(TABLE3 / "cells.jsonl")],
         "sweep table3, preset v100_16gb (ceiling 15.8 GiB), timed on cpu"),
        ([r for r in read_rows(TABLE3 / "cells.jsonl") if not r.get("time_per_seq_s")],
         "sweep table3, preset v100_16gb (ceiling 15.8 GiB)"),
        ([*read_rows(FIXTURE), *({**r, "ceiling_bytes": 2**33} for r in read_rows(FIXTURE))],
         "preset v100_16gb, timed on cuda"),
        ([{**r, "sweep": f"s{i}"} for i, r in enumerate(read_rows(FIXTURE))],
         "sweep s0, s1, s2 and 5 more, preset v100_16gb (ceiling 15.8 GiB), timed on cuda"),
    ],
)  # fmt: skip
def test_the_title_says_what_the_report_is(rows: list[dict], title: str) -> None:
    assert about(Row.from_dict(r) for r in rows) == title


def test_each_document_is_titled_by_what_it_is(tmp_path: Path) -> None:
    got = _report(tmp_path, read_rows(TABLE3 / "cells.jsonl"))
    first = "Table 3 — sweep table3, preset v100_16gb (ceiling 15.8 GiB), timed on cpu"
    assert got["table3.md"].startswith(f"# {first}\n")
    assert got["table3.tex"].startswith(f"% {first}\n")
    assert "<h1>attnbench report — sweep table3, preset v100_16gb" in got["index.html"]
    assert "run/cells.jsonl" in got["table3.md"].splitlines()[2]  # where the rows are, next
