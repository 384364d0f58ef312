"""The compiled sections of a report (compile=true rows and flex): eager and compiled side
by side, the short-n end, the efficiency lengths against compiled vanilla and sdpa, flex
beside local, the profiled memory and the figure, checked against hand computation; and
that eager and compiled rows never share a group anywhere, while rows from before compile
report as they did."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from attnbench.report import compiled, compiled_memory, compiled_plots, files, plots
from attnbench.report.flex import flex_beside_local
from attnbench.report.ratio import baselines, group, is_baseline, name, ratio
from attnbench.report.serving import serving_tables
from attnbench.report.tables import ratio_tables
from attnbench.report.text import grid_markdown
from attnbench.row import Row

MODEL = {"layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072}
FIXTURE = Path(__file__).parent / "data" / "cells_fixture.jsonl"
BUSY = {"busy": True, "why": "3 of 5 repeats contended"}


def _row(attention: str, n: int, t: float | None, *, comp: bool = False, **kw: object) -> Row:
    """A CPU inference row as the runner stores it: timed at b=1; compiled, with its compile
    time and graphs; flex with its kernel compiled whatever compile says."""
    k = kw.pop("k", None)
    own = attention == "flex"
    return Row(
        attention=attention,
        n=n,
        dtype="fp32",
        device="cpu",
        params=kw.pop("params", {"pattern": "window"} if own else {}),
        k=k,
        budget="window" if k else None,
        mode=kw.pop("mode", "inference"),
        compile=comp,
        compile_mode=kw.pop("mode_", "default") if comp else None,
        batch_asked=kw.pop("batch", 1),
        ceiling_bytes=16944988160,
        model=MODEL,
        status=kw.pop("status", "ok"),
        reason=kw.pop("reason", None),
        max_batch=kw.pop("mb", None),
        memory_source=kw.pop("source", "modeled"),
        time_median_s=t,
        time_per_seq_s=t,
        time_batch=1 if t else None,
        time_device="cpu" if t else None,
        time_dtype="fp32" if t else None,
        compiled="layers" if comp else "kernel" if own else None,
        compile_s=kw.pop("compile_s", 10.0 if comp or own else None),
        compilations=kw.pop("graphs", 1 if comp or own else None),
        mask_build_s=kw.pop("mask", 2.0 if own else None),
        contention=kw.pop("contention", None),
        env={"device_name": "AMD EPYC", "attnbench": "0.1.0"},
        **kw,
    )


# time per sequence (s) eager, compiled at n = 256, 1024, 4096
TIMES = {
    "vanilla": ((0.010, 0.100, 1.00), (0.020, 0.080, 0.60)),
    "linear": ((0.020, 0.050, 0.20), (0.040, 0.030, 0.10)),
    "flex": ((0.050, 0.060, 0.15), (0.060, 0.050, 0.12)),
    "local": ((0.020, 0.050, 0.20), (0.040, 0.030, 0.10)),
}
NS = (256, 1024, 4096)


def _rows(sdpa_compiled: bool = False) -> list[Row]:
    rows = []
    for attention, (eager, comp) in TIMES.items():
        k = 128 if attention in ("flex", "local") else None
        for n, te, tc in zip(NS, eager, comp, strict=True):
            rows.append(_row(attention, n, te, k=k))
            rows.append(_row(attention, n, tc, k=k, comp=True, compile_s=n / 100))
    for n, t in zip(NS, (0.008, 0.050, 0.500), strict=True):
        rows.append(_row("sdpa", n, t))
        if sdpa_compiled:
            rows.append(_row("sdpa", n, t / 2, comp=True))
    return rows


def _at(grid, *first: str) -> list[str]:
    """The row of ``grid`` whose first cells are ``first``."""
    return next(r for r in grid.body if r[: len(first)] == list(first))


def test_eager_and_compiled_rows_never_share_a_group() -> None:
    rows = _rows()
    eager, comp = _row("vanilla", 256, 0.01), _row("vanilla", 256, 0.02, comp=True)
    assert group(eager) != group(comp)
    assert group(comp) != group(_row("vanilla", 256, 0.02, comp=True, mode_="max-autotune"))
    assert is_baseline(comp, "vanilla") and is_baseline(eager, "vanilla")  # each in its own
    assert name(comp) == "vanilla compiled" and name(eager) == "vanilla"
    assert name(_row("a", 1, 1.0, comp=True, mode_="max-autotune")) == "a compiled(max-autotune)"
    # flex in an eager model (its kernel compiled) is an eager row: against eager vanilla
    assert group(_row("flex", 256, 0.05, k=128)) == group(eager)
    base = baselines(rows, "vanilla")
    assert len(base) == 6  # three n, eager and compiled
    for r in rows:
        b = base[group(r)]
        assert b.compile == r.compile  # every row's baseline is compiled as it is


def test_table3_compiled_tables_against_compiled_vanilla() -> None:
    tables = {(t.mechanism, t.kind): t for t in ratio_tables(_rows())}
    assert ("linear compiled", "time") in tables and ("linear", "time") in tables
    eager, comp = tables[("linear", "time")], tables[("linear compiled", "time")]
    assert eager.value[(1024, None)] == pytest.approx(0.100 / 0.050)  # eager vanilla ÷ eager
    assert comp.value[(1024, None)] == pytest.approx(0.080 / 0.030)  # compiled ÷ compiled
    assert comp.value[(256, None)] == pytest.approx(0.020 / 0.040)
    assert comp.compiled == "compiled" and not eager.compiled
    assert comp.context.startswith("compiled (torch.compile, each encoder layer")
    assert "compiled" not in eager.context
    # compiled vanilla is the compiled rows' baseline, never a mechanism against eager vanilla
    assert ("vanilla compiled", "time") not in tables
    flex = tables[("flex (pattern=window) compiled", "time")]
    assert flex.value[(4096, 128)] == pytest.approx(0.60 / 0.12)
    kernel = tables[("flex (pattern=window)", "time")]  # flex's own kernel, eager model
    assert kernel.value[(4096, 128)] == pytest.approx(1.00 / 0.15)
    assert "its kernel compiled (torch.compile) in the eager model" in kernel.context


def test_rows_from_before_compile_report_as_they_did() -> None:
    """A stored row without the compile fields reads as eager: the same group, name and
    tables as before compile existed (the fixture's golden tables are test_report_tables')."""
    stored = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    assert all("compile" not in d for d in stored)
    old = [Row.from_dict(d) for d in stored]
    assert all(r.compile is False and r.compile_mode is None for r in old)
    now = [dataclasses.replace(r, compile=False) for r in old]
    assert [group(r) for r in old] == [group(r) for r in now]
    assert [t.mechanism for t in ratio_tables(old)] == [
        "linformer (sharing=layerwise)",
        "linformer (sharing=layerwise)",
    ]
    assert not any(map(compiled.wanted, old))
    report_rows = [r for r in old if r.status is not None]
    assert compiled.side_by_side(report_rows) == []
    assert compiled_plots.time_vs_n(report_rows) == []


def test_side_by_side_by_hand() -> None:
    rows = _rows()
    rows[0] = _row("vanilla", 256, 0.010, contention=BUSY)  # eager vanilla at 256: busy
    (grid,) = compiled.side_by_side(rows)
    assert grid.head == [
        "mechanism",
        "n",
        "eager (ms)",
        "compiled (ms)",
        "speed-up",
        "compile (s)",
        "kernel compile (s)",
        "mask build (s)",
        "compilations",
    ]
    # eager ÷ compiled: 0.050 / 0.030 at n = 1024; compile_s = n / 100
    assert _at(grid, "linear", "1024") == [
        "linear", "1024", "50.0", "30.0", "1.67x²", "10.2", "-", "-", "1",
    ]  # fmt: skip
    assert _at(grid, "linear", "256")[4] == "0.50x²"
    # a busy time is no figure: the cell says busy, the speed-up too
    assert _at(grid, "vanilla", "256")[2:5] == ["busy", "20.0", "busy¹"]
    assert grid.notes[1].startswith("¹ machine busy: vanilla's time was taken")
    # flex: its kernel compiled in the eager model (10 s), then the layers (40.96 s)
    assert _at(grid, "flex (pattern=window) k=128", "4096") == [
        "flex (pattern=window) k=128", "4096", "150", "120", "1.25x²", "41.0", "10.0", "2.00",
        "1",
    ]  # fmt: skip
    assert "sdpa" not in {r[0] for r in grid.body}  # never compiled: not here
    assert (
        grid.notes[2] == "² time measured on cpu in fp32 at b = 1, not at max batch on the device"
    )


def test_side_by_side_missing_twins_and_failed_rows() -> None:
    rows = [
        _row("linear", 256, 0.02, comp=True),  # no eager twin
        _row("linear", 1024, None, status="oom"),
        _row("linear", 1024, 0.03, comp=True),
        _row("linear", 4096, 0.20),  # eager only
    ]
    (grid,) = compiled.side_by_side(rows)
    assert grid.head[-1] == "compilations" and "mask build (s)" not in grid.head
    assert _at(grid, "linear", "256")[2:5] == ["-", "20.0", "n/m¹"]
    assert "¹ no row of the eager model beside it" in grid.notes
    assert _at(grid, "linear", "1024")[2:5] == ["OOM", "30.0", "OOM²"]
    assert "² the eager model does not fit at b = 1 under the ceiling (modeled)" in grid.notes
    assert _at(grid, "linear", "4096")[2:5] == ["200", "-", "-"]


def test_short_n_end_by_hand() -> None:
    (grid,) = compiled.short_n(_rows())
    # vanilla: speed-up 0.5 at 256, 1.25 at 1024: log-log crossing at
    # 256 · 4^(log 2 / log 2.5) = 256 · 4^0.7565 ≈ 731
    assert _at(grid, "vanilla") == [
        "vanilla", "256", "0.50x", "2.56", "≈ 731", "4096", "1.67x",
    ]  # fmt: skip
    assert _at(grid, "flex (pattern=window) k=128")[4] == "≈ 512"  # 0.83 then 1.2: 256 · 4^0.5
    rows = [r for r in _rows() if r.attention == "linear"]
    rows = [_row("linear", 1024, 0.05, contention=BUSY) if r.n == 1024 and not r.compile else r
            for r in rows]  # fmt: skip
    (grid,) = compiled.short_n(rows)
    # the busy n left out: 0.5 at 256, 2.0 at 4096: 256 · 16^(log 2 / log 4) = 1024
    assert _at(grid, "linear")[4] == "≈ 1024 (1)"
    assert grid.notes[-1] == "(1) linear: n = 1024 left out: machine busy"


def test_compiled_efficiency_lengths_against_compiled_vanilla_and_sdpa() -> None:
    (grid,) = compiled.compiled_lengths(_rows())
    assert grid.head == ["mechanism", "faster than vanilla compiled", "faster than sdpa (eager)"]
    # linear compiled against vanilla compiled: 0.5 at 256, 2.67 at 1024:
    # 256 · 4^(log 2 / log 5.33) ≈ 455; against eager sdpa: 0.2, 1.67: ≈ 733
    assert _at(grid, "linear") == ["linear", "≈ 455", "≈ 733"]
    assert _at(grid, "vanilla") == ["vanilla", "-", "> 4096"]  # itself: no such pair
    (grid,) = compiled.compiled_lengths(_rows(sdpa_compiled=True))
    assert grid.head[-1] == "faster than sdpa compiled"
    # compiled sdpa halves eager's: 0.004, 0.025, 0.25 against 0.04, 0.03, 0.1: ratios 0.1,
    # 0.833, 2.5: 1024 · 4^(log 1.2 / log 3) ≈ 1289
    assert _at(grid, "linear")[2] == "≈ 1289"
    # the report's baseline sdpa: one column, against sdpa compiled
    (grid,) = compiled.compiled_lengths(_rows(sdpa_compiled=True), "sdpa")
    assert grid.head == ["mechanism", "faster than sdpa compiled"]


def test_flex_beside_local_by_hand() -> None:
    rows = _rows()
    rows.append(_row("flex", 1024, 0.2, params={"pattern": "full"}))  # no window: not here
    (grid,) = flex_beside_local(rows)
    assert grid.title.startswith("flex (pattern=window) beside local at the same window")
    assert grid.head[-2:] == ["flex ÷ local", "flex ÷ local, compiled"]
    # flex ÷ local: 0.050 / 0.020 eager; 0.060 / 0.040 compiled
    assert grid.body[0] == ["128", "256", "20.0", "40.0", "50.0", "60.0", "2.50x¹", "1.50x¹"]
    assert _at(grid, "128", "4096")[6:] == ["0.75x¹", "1.20x¹"]
    # no compiled flex: compiled local against flex in the eager model, said so
    rows = [r for r in _rows() if not (r.attention == "flex" and r.compile)]
    (grid,) = flex_beside_local(rows)
    assert _at(grid, "128", "256")[5:] == ["-", "2.50x¹", "1.25x¹,²"]  # 0.050 / 0.040
    assert "² against flex in the eager model (its kernel compiled): no flex compiled row" in (
        grid.notes
    )
    # a busy local time
    rows[rows.index(next(r for r in rows if r.attention == "local"))] = _row(
        "local", 256, 0.02, k=128, contention=BUSY
    )
    (grid,) = flex_beside_local(rows)
    assert _at(grid, "128", "256")[2] == "busy" and _at(grid, "128", "256")[6].startswith("busy")


def test_memory_eager_against_compiled_peak() -> None:
    rows = _rows()
    rows.append(
        _row(
            "performer",
            1024,
            0.03,
            comp=True,
            source="profiled",
            batch=1,
            peak_bytes=200_000_000,
            eager_peak_bytes=300_000_000,
        )
    )
    rows.append(_row("linear", 2048, 0.03, comp=True, source="modeled", peak_bytes=1))
    (grid,) = compiled_memory.memory(rows)
    assert grid.head == ["mechanism", "n", "batch", "eager (MB)", "compiled (MB)",
                         "eager ÷ compiled"]  # fmt: skip
    assert grid.body == [["performer", "1024", "-", "300", "200", "1.50x"]]
    assert compiled_memory.memory(_rows()) == []


def test_compiled_serving_rows_are_a_set_of_their_own() -> None:
    def decode(attention: str, t: float, comp: bool = False) -> Row:
        return _row(attention, 512, t, comp=comp, mode="decode", params={"causal": True},
                    decode_tokens=64, state_dtype="auto", prefill_chunk=0)  # fmt: skip

    rows = [decode("vanilla", 0.01), decode("linear", 0.005), decode("vanilla", 0.004, True),
            decode("linear", 0.001, True)]  # fmt: skip
    (eager, _), (comp, _) = serving_tables(rows)
    assert eager.ks == ("linear",) and comp.ks == ("linear compiled",)
    assert eager.value[(512, "linear")] == pytest.approx(2.0)
    assert comp.value[(512, "linear compiled")] == pytest.approx(4.0)
    assert "compiled" in comp.mechanism and "compiled" not in eager.mechanism


def test_plots_tell_compiled_lines_apart() -> None:
    rows = _rows()
    rows[1] = dataclasses.replace(rows[1], contention=BUSY)  # compiled vanilla at 256
    series = plots._series(
        [r for r in rows if r.attention in ("vanilla", "linear")], "time_per_seq_s"
    )
    assert set(series) == {"vanilla", "vanilla compiled", "linear", "linear compiled"}
    (plot,) = compiled_plots.time_vs_n(rows)
    assert plot.stem == "compiled-time-vs-n"
    ax = plot.figure.axes[0]
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines()}
    assert styles["linear"] == "--" and styles["linear compiled"] == "-"
    assert styles["flex (pattern=window) k=128"] == "--"
    assert "sdpa" not in styles  # never compiled
    assert len(dict(ax.get_lines()[0].get_xydata())) == 3
    assert "1 left out: machine busy" in ax.get_title()


def test_report_writes_the_compiled_document(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = _rows()
    rows.append(
        _row(
            "linear",
            4096,
            0.1,
            comp=True,
            source="profiled",
            peak_bytes=100_000_000,
            eager_peak_bytes=150_000_000,
            mode_="max-autotune",
        )
    )
    (run / "cells.jsonl").write_text("".join(r.to_json() + "\n" for r in rows))
    report = files.build(run)
    assert report.documents() == ["table3", "compiled"]
    out = files.render(report, with_plots=True)
    assert {"compiled.md", "compiled.tex", "plots/compiled-time-vs-n.png"} <= set(out)
    md = out["compiled.md"].decode()
    assert "**Eager and compiled side by side: inference, fp32, preset cpu**" in md
    assert "**Eager and compiled(max-autotune) side by side" in md
    assert "flex (pattern=window) beside local at the same window" in md
    assert "Peak memory, eager and compiled(max-autotune), profiled on a CPU" in md
    assert "| linear | ≈ 455 | ≈ 733 |" in md
    table3 = out["table3.md"].decode()
    assert "**time ratio: linear compiled**" in table3 and "**time ratio: linear**" in table3
    assert "against the baseline compiled the same way" in table3  # the lengths' legend
    assert {"linear-compiled-time.csv", "linear-time.csv"} <= set(out)
    records = json.loads(out["report.json"])["compiled"]
    assert any(r["title"].startswith("The short-n end, compiled") for r in records)
    # eager rows alone: no compiled document, no compiled key
    eager = [r for r in rows if not r.compile and r.attention != "flex"]
    (run / "cells.jsonl").write_text("".join(r.to_json() + "\n" for r in eager))
    report = files.build(run)
    assert report.documents() == ["table3"]
    assert "compiled" not in json.loads(files.render(report, with_plots=False)["report.json"])


def test_grids_print() -> None:
    """Every compiled grid prints in Markdown (the writers' escaping is theirs)."""
    rows = _rows()
    grids = [*compiled.side_by_side(rows), *compiled.short_n(rows), *flex_beside_local(rows)]
    assert all(grid_markdown(g).count("\n|") > 3 for g in grids)
    assert ratio("time", rows[1], rows[0]).value == pytest.approx(0.5)  # the one rule


def test_flex_beside_local_at_their_default_window_when_k_is_unset() -> None:
    """A sweep with k unset (+sweep=compiled) runs both at their default band, 256: they are
    still set side by side, at window 256; flex with a window among its parameters is at
    that window, and flex with the full pattern has no band to compare."""
    rows = [
        _row("local", 512, 0.040),
        _row("flex", 512, 0.050),
        _row("flex", 512, 0.060, params={"pattern": "window", "window": 64}),
        _row("flex", 512, 0.070, params={"pattern": "full"}),
    ]
    grids = flex_beside_local(rows)
    body = [line for grid in grids for line in grid.body]
    assert ["256", "512", "40.0", "-", "50.0", "-", "1.25x¹", "-"] in body
    assert sorted(line[0] for line in body) == ["256", "64"]
