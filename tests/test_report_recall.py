"""MQAR's report sections (task=mqar rows, issue #24): the accuracy table, the cost beside it
and the seed spread checked against hand computation; the recall–memory Pareto plot drawn
with the points the rows hold; no MQAR section without MQAR rows."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from attnbench.report import files, quality_plots, recall, recall_setups
from attnbench.report.sections import SECTIONS
from attnbench.report.text import grid_markdown
from attnbench.row import Row

N, V, D = 64, 256, 64
MODEL = {"layers": 2, "d_model": D, "n_heads": 1, "d_ff": 128}
SETTINGS = {
    "power_a": 0.01, "train_examples": 2000, "test_examples": 300, "steps": 100,
    "batch": 32, "lrs": [0.001, 0.003], "warmup": 10, "weight_decay": 0.01, "eval_every": 50,
}  # fmt: skip
LISTOPS = Path(__file__).parent.parent / "results/reference/listops-cpu-cpu/cells.jsonl"


def _row(
    attention: str,
    pairs: int,
    acc: float,
    *,
    seed: int = 0,
    k: int | None = None,
    budget: str | None = None,
    params: dict | None = None,
    ctx: int = 2 * N * D,
    rate: float = 10.0,
    peak: int = 100 * 2**20,
    short_conv: int = 3,
    **settings: object,
) -> Row:
    """A task=mqar row as the runner stores it: the cell's settings in ``cell.quality`` (as
    sorted pairs), the figures in ``quality``; ``ctx``: context elements per layer."""
    causal = attention not in ("linformer", "nystromformer")
    cell = {**SETTINGS, "num_kv_pairs": pairs, "vocab_size": V, "seed": seed}
    cell.update(short_conv=short_conv, **settings)
    figures = {
        "test_accuracy": acc, "chance": 1 / pairs, "lr": 0.003,
        "lr_accuracy": [[0.001, acc / 2], [0.003, acc]], "curve": [[50, acc / 2], [100, acc]],
        "steps_per_s": rate, "peak_bytes": peak, "causal": causal,
        "short_conv": short_conv, "context_elements": ctx, "context_bytes": 4 * ctx,
        "train_examples": 2000, "test_examples": 300, "seconds": 12.5,
    }  # fmt: skip
    return Row(
        attention=attention,
        n=N,
        dtype="fp32",
        device="cpu",
        params=params or {},
        k=k,
        budget=budget if k else None,
        task="mqar",
        batch_asked=1,
        model=MODEL,
        status="ok",
        quality=figures,
        env={"device_name": "AMD EPYC", "attnbench": "0.1.0"},
        cell={"attention": attention, "task": "mqar", "quality": sorted(cell.items())},
    )


LIN = {"kernel": "eager"}


def _rows() -> list[Row]:
    """Vanilla (three seeds at 16 pairs), Linformer k=16 and k=32 (two seeds at 16 pairs),
    local window=8, and vanilla without its short convolution, at 4, 8 and 16 pairs."""
    rows = []
    for p, acc in ((4, 1.0), (8, 0.99)):
        rows.append(_row("vanilla", p, acc))
    for seed, acc, rate, mib in ((0, 0.90, 10.0, 100), (1, 0.95, 20.0, 200), (2, 1.00, 40.0, 300)):
        rows.append(_row("vanilla", 16, acc, seed=seed, rate=rate, peak=mib * 2**20))
    for k in (16, 32):
        for p, acc in ((4, 0.8), (8, 0.6)):
            rows.append(_row("linformer", p, acc + k / 1000, k=k, budget="k", params=LIN,
                             ctx=2 * k * D))  # fmt: skip
    rows.append(_row("linformer", 16, 0.30, k=16, budget="k", params=LIN, ctx=2 * 16 * D))
    for seed, acc in ((0, 0.50), (1, 0.60)):
        rows.append(_row("linformer", 16, acc, seed=seed, k=32, budget="k", params=LIN,
                         ctx=2 * 32 * D, rate=25.0))  # fmt: skip
    for p, acc in ((4, 0.7), (8, 0.4), (16, 0.2)):
        rows.append(_row("local", p, acc, k=8, budget="window", ctx=2 * 8 * D))
    rows.append(_row("vanilla", 16, 0.10, short_conv=0))
    return rows


def _cells(grid) -> dict[str, list[str]]:
    return {line[0]: line[1:] for line in grid.body}


def test_accuracy_table_by_hand() -> None:
    rows = _rows()
    (grid,) = recall.accuracy_tables([*rows, rows[0]])  # vanilla at 4 pairs stored twice
    assert grid.title == f"MQAR test accuracy, n={N}, V={V}"
    assert grid.head == ["configuration", "trained", "4 pairs", "8 pairs", "16 pairs"]
    cells = _cells(grid)
    assert list(cells) == [
        "vanilla", "vanilla short_conv=0", "linformer (kernel=eager) k=16",
        "linformer (kernel=eager) k=32", "local window=8", "chance (1/pairs)",
    ]  # fmt: skip
    # 90, 95, 100: mean 95, sd sqrt(((-5)² + 0 + 5²) / 2) = 5
    assert cells["vanilla"] == ["causal", "100.0 %", "99.0 %", "95.0 ± 5.0 % (3 seeds)"]
    assert cells["vanilla short_conv=0"] == ["causal", "-", "-", "10.0 %"]
    # 50, 60: mean 55, sd sqrt(2 · 5² / 1) = 7.07
    assert cells["linformer (kernel=eager) k=32"] == [
        "bidirectional", "83.2 %", "63.2 %", "55.0 ± 7.1 % (2 seeds)"
    ]  # fmt: skip
    assert cells["linformer (kernel=eager) k=16"] == ["bidirectional", "81.6 %", "61.6 %", "30.0 %"]
    assert cells["local window=8"] == ["causal", "70.0 %", "40.0 %", "20.0 %"]
    assert cells["chance (1/pairs)"] == ["", "25.0 %", "12.5 %", "6.2 %"]
    notes = " ".join(grid.notes)
    assert "short convolution of kernel 3, unless the label says" in notes
    assert "1 repeated row(s)" in notes and "Zoology" in notes
    assert "| vanilla | causal | 100.0 % |" in grid_markdown(grid)


def test_cost_table_by_hand() -> None:
    (grid,) = recall.cost_tables(_rows())
    cells = _cells(grid)
    # vanilla at 16 pairs: 1000/10, 1000/20, 1000/40 ms = 100, 50, 25: mean 58.3; peaks 200 MiB
    assert cells["vanilla"] == ["58.3", "200.0 MiB", f"{4 * 2 * N * D:,} B", f"{2 * N * D:,}"]
    assert cells["linformer (kernel=eager) k=32"] == ["40.0", "100.0 MiB", "16,384 B", "4,096"]
    assert cells["local window=8"][2:] == ["4,096 B", "1,024"]
    assert "largest number of pairs (16)" in grid.notes[0]
    # a configuration that never ran the largest number of pairs says where it was measured
    short = [
        r for r in _rows() if not (r.attention == "local" and recall_setups.num_pairs(r) == 16)
    ]
    (grid,) = recall.cost_tables(short)
    assert _cells(grid)["local window=8"][:2] == ["100.0 (at 8 pairs)", "100.0 MiB (at 8 pairs)"]


def test_seed_spread_by_hand() -> None:
    (grid,) = recall.seed_tables(_rows())
    assert grid.head == ["configuration", "pairs", "seeds", "test accuracy per seed", "mean", "sd"]
    sd = statistics.stdev([50.0, 60.0])
    assert grid.body == [
        ["vanilla", "16", "0, 1, 2", "90.00, 95.00, 100.00 %", "95.00 %", "5.00"],
        ["linformer (kernel=eager) k=32", "16", "0, 1", "50.00, 60.00 %", "55.00 %", f"{sd:.2f}"],
    ]
    assert recall.seed_tables([r for r in _rows() if recall_setups.seed(r) == 0]) == []


def test_setups_apart_and_titled_by_what_differs() -> None:
    rows = _rows()
    longer = [dataclasses.replace(r, cell=_row("vanilla", 4, 1, steps=400).cell) for r in rows[:1]]
    grids = recall.accuracy_tables([*rows, *longer])
    assert [g.title for g in grids] == [
        f"MQAR test accuracy, n={N}, V={V} (steps=100)",
        f"MQAR test accuracy, n={N}, V={V} (steps=400)",
    ]
    # a budget set among the parameters (attention=linformer_k256) is in the label once
    own = dataclasses.replace(rows[5], k=None, params={"k": 256})
    assert recall_setups.budget(own) == ("", 256) and recall_setups.budget(rows[5]) == ("k=16", 16)
    assert recall_setups.setups([own])[0].configs == ["linformer (k=256)"]
    # a row whose cell is not stored: its pairs from its chance
    bare = dataclasses.replace(rows[0], cell=None)
    assert recall_setups.num_pairs(bare) == 4 and recall_setups.seed(bare) == 0


def test_pareto_plot_points() -> None:
    main, pairs = quality_plots.mqar_pareto(_rows())
    assert (main.stem, pairs.stem) == ("mqar-pareto", "mqar-pareto-pairs")
    ax = main.figure.axes[0]
    assert ax.get_xscale() == "log"
    assert ax.get_title() == f"MQAR recall against context memory: n={N}, V={V}, 16 pairs"
    lines = {c.get_label(): c.lines[0] for c in ax.containers}  # errorbar: line, bars
    lines.update((line.get_label(), line) for line in ax.get_lines())
    # Linformer's k joined in k order: (bytes, accuracy %) at 16 pairs, seeds averaged
    linformer = lines["linformer (kernel=eager)"].get_xydata().tolist()
    assert linformer == [[4 * 2 * 16 * D, 30.0], [4 * 2 * 32 * D, pytest.approx(55.0)]]
    assert lines["vanilla"].get_xydata().tolist() == [[4 * 2 * N * D, pytest.approx(95.0)]]
    assert lines["chance"].get_ydata()[0] == pytest.approx(100 / 16)
    assert lines["chance"].get_linestyle() == "--"
    assert "vanilla (short_conv=0)" in lines
    assert {t.get_text() for t in ax.texts} == {"k=16", "k=32"}
    assert len([a for a in pairs.figure.axes if a.get_visible()]) == 3  # a panel per pairs


def test_report_writes_the_sections_and_the_plot(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("".join(r.to_json() + "\n" for r in _rows()))
    report = files.build(run)
    assert report.documents() == ["quality"]
    out = files.render(report, with_plots=True)
    md = out["quality.md"].decode()
    for title in ("MQAR test accuracy", "MQAR cost beside recall", "MQAR accuracy over seeds"):
        assert f"**{title}, n={N}, V={V}**" in md
    assert "| vanilla | causal | 100.0 % | 99.0 % | 95.0 ± 5.0 % (3 seeds) |" in md
    for stem in ("mqar-pareto", "mqar-pareto-pairs"):
        assert len(out[f"plots/{stem}.png"]) > 1000 and out[f"plots/{stem}.svg"]
    titles = [g["title"] for g in json.loads(out["report.json"])["quality"]]
    assert titles[0] == f"MQAR test accuracy, n={N}, V={V}" and len(titles) == 3


def test_no_mqar_section_without_mqar_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text("\n".join(LISTOPS.read_text().splitlines()[:2]) + "\n")
    out = files.render(files.build(run), with_plots=False)
    assert "ListOps accuracy" in out["quality.md"].decode()
    assert "MQAR" not in out["quality.md"].decode() and "MQAR" not in out["index.html"].decode()
    mqar = [s for s in SECTIONS if s.name.startswith("mqar")]
    assert len(mqar) == 4 and not any(s.used(files.build(run).rows) for s in mqar)
    assert quality_plots.mqar_pareto(files.build(run).rows) == []
