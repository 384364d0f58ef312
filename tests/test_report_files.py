"""`attnbench report` on disk: the files, the plots, the HTML page in a real browser, and
the errors a user sees. The table arithmetic itself is in test_report_tables.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from attnbench.report import files, plots
from attnbench.report.sections import DOCUMENTS, SECTIONS
from attnbench.report.tables import ratio_tables
from attnbench.store import read_rows
from tests.conftest import run_cli

FIXTURE = Path(__file__).parent / "data" / "cells_fixture.jsonl"
# runs without Table 3's rows: a baseline named that no row has is refused there too
RUNS = {
    name: Path(__file__).parent.parent / f"results/reference/{name}-{where}/cells.jsonl"
    for name, where in (("serving", "v100_16gb-cpu"), ("approx", "cpu-cpu"))
}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# .ci/run installs Chromium and sets this, so that in CI the browser test cannot skip
NEED_CHROMIUM = os.environ.get("ATTNBENCH_REQUIRE_CHROMIUM") == "1"


def _run_dir(d: Path) -> Path:
    """The fixture's rows as a run directory, with a modeled prediction beside each measured
    max batch (as a GPU run has), so that every plot has something to draw."""
    d.mkdir()
    rows = read_rows(FIXTURE)
    for r in rows:
        if r["memory_source"] == "measured" and r["max_batch"]:
            r["predicted_max_batch"] = round(r["max_batch"] * 1.1)
    (d / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return _run_dir(tmp_path / "run")


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real ``attnbench report`` of :func:`_run_dir`'s rows, plots and all: its output
    directory and the finished process, read (never changed) by the tests of what a report
    writes, of its plots, and of its page in a browser."""
    tmp = tmp_path_factory.mktemp("reported")
    run = _run_dir(tmp / "run")
    out = tmp / "reports" / "fixture"
    return out, run_cli("report", str(run), "--out", str(out), cwd=tmp)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_command_writes_every_format(
    reported: tuple[Path, subprocess.CompletedProcess],
) -> None:
    out, done = reported
    assert done.returncode == 0, done.stderr
    assert "time ratio: linformer (sharing=layerwise)" in done.stdout  # the rich tables
    assert "1.25x" in done.stdout and "OOM³" in done.stdout
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {
        "index.html",
        "table3.md",
        "table3.tex",
        "report.json",
        "linformer-sharing-layerwise-time.csv",
        "linformer-sharing-layerwise-memory.csv",
    } <= names
    md = (out / "table3.md").read_text()
    assert "| 512 | 1.25x | n/m¹ |" in md  # measured
    assert "| 512 | 1.5x | 1.3x |" in md  # the paper's Table 3 beside it
    assert "| 512 | 0.83 | - |" in md  # and the quotient
    assert (
        (out / "linformer-sharing-layerwise-memory.csv")
        .read_text()
        .startswith("n,k=128,k=256\n512,1.7,1.5\n")
    )
    assert r"\toprule" in (out / "table3.tex").read_text()
    for stem in (
        "time-vs-n",
        "batch-vs-n",
        "memory-modeled-vs-measured",
        "speedup-linformer-sharing-layerwise",
    ):
        assert f"plots/{stem}.png" in names and f"plots/{stem}.svg" in names


def test_plots_are_real_images_of_the_stated_size(
    reported: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """The plots the report command wrote (files.render's bytes, as written)."""
    from matplotlib.image import imread

    out, done = reported
    assert done.returncode == 0, done.stderr
    pngs = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.png")}
    assert len(pngs) == 4
    for name, data in pngs.items():
        assert png_size(data) == plots.PNG_PIXELS, name
        pixels = imread(__import__("io").BytesIO(data))
        assert pixels.std() > 0.05, f"{name} is a blank image"  # lines, text, colour
        assert b"<svg" in (out / name.replace(".png", ".svg")).read_bytes()


def test_no_plot_is_drawn_for_rows_that_hold_nothing_to_draw(run_dir: Path) -> None:
    rows = read_rows(FIXTURE)  # no row has both a modeled and a measured max batch
    assert plots.modeled_vs_measured(rows) is None
    assert plots.time_vs_n([dict(r, time_per_seq_s=None) for r in rows]) is None
    page = files.render(files.build(run_dir), with_plots=False)["index.html"].decode()
    assert "no plots: plots not asked for" in page


def test_few_timed_cells_still_read_as_figures() -> None:
    """A CPU run times few cells: a mechanism timed at one n is a ring its legend says is
    one n, the title counts the cells without a time, and the heat map's colours centre on
    1 (as fast as the baseline), at least 1/2 to 2, so two speed-ups of 1.4 and 1.65 are
    both faster (blue), not the two ends of the scale."""
    assert plots.speedup_limits([1.40, 1.65]) == pytest.approx((0.5, 2.0))
    assert plots.speedup_limits([0.25, 3.0]) == pytest.approx((0.25, 4.0))
    rows = read_rows(FIXTURE)
    rows[1]["time_per_seq_s"] = None  # vanilla timed at n = 512 only
    fig = plots.time_vs_n(rows)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "vanilla (n = 512 only)" in labels and "linformer (sharing=layerwise) k=128" in labels
    assert "\nno figure at 4 of 8 cells: the tables say why" in fig.axes[0].get_title()
    time = next(t for t in ratio_tables(read_rows(FIXTURE)) if t.kind == "time")
    (ax, _) = plots.speedup_heatmap(time).axes  # 1.25x and 2.50x, and the colour bar
    assert (ax.images[0].norm.vmin, ax.images[0].norm.vmax) == pytest.approx((0.4, 2.5))
    assert "\n2 of 5 cells timed; grey: no figure" in ax.get_title()


def test_the_page_says_each_heading_once_and_calls_modeled_memory_modeled(run_dir: Path) -> None:
    """No caption repeats the heading right above it; the tables set beside the paper are
    headed by how their figures were had: modeled memory (a CPU run's) is never measured."""
    heading = r"<h2>([^<]*)</h2>\n(?:<div[^>]*>)+<table>(?:<caption>([^<]*)</caption>)?"
    page = files.render(files.build(run_dir), with_plots=False)["index.html"].decode()
    found = re.findall(heading, page)
    assert len(found) == page.count("<h2>") - 1 == 5  # every section but the plots
    assert all(caption != h for h, caption in found), found
    assert page.count("<caption>measured ÷ paper</caption>") == 2  # time and memory
    modeled = [dict(r, memory_source="modeled") for r in read_rows(FIXTURE)]
    (run_dir / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in modeled))
    page = files.render(files.build(run_dir), with_plots=False)["index.html"].decode()
    assert page.count("<caption>measured ÷ paper</caption>") == 1  # time
    assert "<caption>modeled</caption>" in page and "<caption>modeled ÷ paper</caption>" in page


def test_a_report_replaces_the_old_one_whole_or_not_at_all(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "rep"
    rendered = files.render(files.build(run_dir), with_plots=False)
    files.write(rendered, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = Path.write_bytes
    calls = []

    def failing(self: Path, data: bytes) -> int:
        calls.append(self)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        files.write({**rendered, "table3.md": b"new"}, out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rep")] == []
    files.write({"only.md": b"x"}, out)  # a new report leaves nothing of the old behind
    assert [p.name for p in out.iterdir()] == ["only.md"]


def test_out_never_deletes_what_is_not_a_report(
    run_dir: Path, tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """In this process (a real refusal of `attnbench report`: test_report_writers.py's
    test_out_under_a_file_through_a_real_process, test_hostile.py's refused row)."""
    attnbench = cli_in_process
    for out in (run_dir, tmp_path):  # the run dir itself, or a directory holding it
        done = attnbench("report", str(run_dir), "--out", str(out), cwd=tmp_path)
        assert done.returncode == 2 and "is not an attnbench report" in done.stderr
        assert (run_dir / "cells.jsonl").is_file()
    assert (
        attnbench("report", str(run_dir), "--out", "rep", "--no-plots", cwd=tmp_path).returncode
        == 0
    )
    assert (
        attnbench("report", str(run_dir), "--out", "rep", "--no-plots", cwd=tmp_path).returncode
        == 0
    )  # an earlier report is replaced


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("none", ("report", "missing"), "run dir: no cells.jsonl in missing"),
        ("corrupt", ("report", "run"), "cells.jsonl:4: not a JSON row"),
        ("ok", ("report", "run", "--baseline", "sdpa"), "baseline: no rows of 'sdpa'"),
        (
            "serving",
            ("report", "run", "--baseline", "linformer"),
            "baseline: no rows of 'linformer'; the rows have linear, local, performer, sdpa,",
        ),
        ("approx", ("report", "run", "--baseline", "sdpa"), "baseline: no rows of 'sdpa'"),
        ("empty", ("report", "run"), "holds no rows yet"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path,
    setup: str,
    args: tuple,
    message: str,
    cli_in_process: Callable[..., subprocess.CompletedProcess],
) -> None:
    """In this process, as test_out_never_deletes_what_is_not_a_report."""
    attnbench = cli_in_process
    run = tmp_path / "run"
    if setup != "none":
        run.mkdir()
        lines = RUNS.get(setup, FIXTURE).read_text().splitlines()
        if setup == "corrupt":
            lines[3] = lines[3][:40]
        (run / "cells.jsonl").write_text("" if setup == "empty" else "\n".join(lines) + "\n")
    done = attnbench(*args, "--out", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.skipif(
    CHROMIUM is None and not NEED_CHROMIUM,
    reason="needs Debian's chromium (apt-get install chromium); CI installs it",
)
def test_the_html_page_shows_tables_and_plots_in_headless_chromium(
    reported: tuple[Path, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    """Chromium opens the page from disk with the network off: the tables are in its DOM,
    every embedded image decoded (counted by the page itself after load), and the
    screenshot holds the plots' colour, which tables alone do not have."""
    from matplotlib.image import imread

    assert CHROMIUM, "ATTNBENCH_REQUIRE_CHROMIUM=1 but chromium is not on PATH"
    out, done = reported  # the page `attnbench report` wrote
    assert done.returncode == 0, done.stderr
    page = (out / "index.html").as_uri()
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True).stdout
    n_images = (out / "index.html").read_text().count("<img ")
    assert n_images == 4
    assert f'data-images-decoded="{n_images}"' in dom
    # time and memory, each measured, paper and quotient; and the efficiency lengths
    assert dom.count("<table>") == 9 and "Efficiency length" in dom
    assert "measured ÷ paper" in dom and "OOM³" in dom
    shot = tmp_path / "page.png"
    subprocess.run(
        [*flags, "--window-size=1400,3800", f"--screenshot={shot}", page],
        capture_output=True,
        check=True,
    )
    assert png_size(shot.read_bytes()) == (1400, 3800)
    rgb = imread(shot)[..., :3]
    colourful = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.3  # saturated: plot lines, heat map
    assert colourful.sum() > 5000, "no plot visible in the screenshot"
    dark = rgb.max(axis=-1) < 0.3
    assert dark[:1500].sum() > 5000, "no table text in the top of the page"


def test_committed_reports_are_those_of_the_committed_reference_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """reports/ is regenerated by scripts/make_reports.sh; a stale one fails here."""
    root = Path(__file__).parent.parent
    monkeypatch.chdir(root)
    runs = sorted(p.name for p in (root / "results/reference").iterdir() if p.is_dir())
    assert runs and sorted(p.name for p in (root / "reports").iterdir() if p.is_dir()) == runs
    for name in runs:
        # as scripts/make_reports.sh makes them: a training run with its inference run
        also = []
        if name.startswith("table3_train-"):
            also = [Path("results/reference") / f"table3-{name.removeprefix('table3_train-')}"]
        fresh = files.render(
            files.build(Path("results/reference") / name, also=also), with_plots=False
        )
        for rel, data in fresh.items():
            if rel != "index.html":  # the committed page also holds the plots
                assert (root / "reports" / name / rel).read_bytes() == data, (name, rel)


def _quality_rows(n: int = 3) -> list[str]:
    """The first approx rows of the committed reference run, as stored."""
    path = Path(__file__).parent.parent / "results/reference/approx-cpu-cpu/cells.jsonl"
    return path.read_text().splitlines()[:n]


def test_documents_are_named_after_what_they_hold(tmp_path: Path) -> None:
    """``table3.*`` only where the rows have Table 3's ratios, ``quality.*`` for the quality
    tables; a report of both writes both, each holding only its own tables."""
    quality_only, both = tmp_path / "q", tmp_path / "both"
    for d, lines in (
        (quality_only, _quality_rows()),
        (both, FIXTURE.read_text().splitlines() + _quality_rows()),
    ):
        d.mkdir()
        (d / "cells.jsonl").write_text("\n".join(lines) + "\n")
    q = files.render(files.build(quality_only), with_plots=False)
    assert {"quality.md", "quality.tex"} <= set(q) and not any(f.startswith("table3") for f in q)
    assert "Approximation error on the same weights" in q["quality.md"].decode()
    assert "Quality rows: no time or memory ratios." in q["quality.md"].decode()
    assert files.summary(q) == "index.html, quality.md, quality.tex, 0 CSV, 0 plots"
    b = files.render(files.build(both), with_plots=False)
    table3, quality = b["table3.md"].decode(), b["quality.md"].decode()
    assert "**time ratio: linformer" in table3 and "Approximation error" not in table3
    assert "Approximation error" in quality and "time ratio" not in quality
    assert "Time ratio = vanilla time per sequence" in table3
    assert files.summary(b).startswith("index.html, quality.md, quality.tex, table3.md")


def test_report_json_is_what_the_sections_record(run_dir: Path) -> None:
    """Every ratio table (not the paper's, nor the quotient) and every efficiency length,
    as the sections made them, under the keys report.json has always had."""
    report = files.build(run_dir)
    data = json.loads(files.render(report, with_plots=False)["report.json"])
    assert list(data) == ["run_dir", "baseline", "rows", "tables", "efficiency_lengths", "quality"]
    assert [(t["mechanism"], t["kind"]) for t in data["tables"]] == [
        (t.mechanism, t.kind) for t in report.tables
    ]
    time = data["tables"][0]
    assert {"n": 2048, "k": 128, "text": "OOM³", "value": None} in time["cells"]
    assert data["efficiency_lengths"] and data["quality"] == []
    assert {s.record for s in SECTIONS} - {None} == {k for d in DOCUMENTS for k in d.records}
    assert len({s.name for s in SECTIONS}) == len(SECTIONS)
