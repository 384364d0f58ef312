"""The serving sections of a report (mode=decode rows): the time-per-token and max-batch
ratios by hand, which row is whose baseline (kv_heads rows never, state dtypes never
mixed), the efficiency lengths, and `attnbench report` writing them in every format."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from attnbench.report.ratio import group, is_baseline
from attnbench.report.sections import DOCUMENTS
from attnbench.report.serving import serving_lengths, serving_tables
from attnbench.report.serving_state import state_grids
from attnbench.report.text import grid_markdown, to_latex, to_markdown
from attnbench.row import Row

ALLOCATION_ONLY = "¹ memory modeled (allocated bytes; no caching allocator replayed), not measured"

MODEL = {"layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072}
FIXTURE = Path(__file__).parent / "data" / "cells_fixture.jsonl"


def _row(
    attention: str,
    n: int,
    *,
    batch: int | str = 1,
    t: float | None = None,
    mb: int | None = None,
    kv: int | None = None,
    state: str = "auto",
    params: dict | None = None,
    **kw: object,
) -> Row:
    """A decode row as the workload stores it: the time per token per sequence at a fixed
    batch, or the modeled max batch of a batch=max row."""
    timed = t is not None
    return Row(
        attention=attention,
        n=n,
        dtype="fp16",
        device="v100_16gb",
        params={"causal": True, **(params or {})},
        mode="decode",
        decode_tokens=kw.pop("decode_tokens", 64),
        state_dtype=state,
        prefill_chunk=kw.pop("prefill_chunk", 512),
        batch_asked=batch,
        ceiling_bytes=16944988160,
        model={**MODEL, **({"kv_heads": kv} if kv else {})},
        status=kw.pop("status", "ok"),
        reason=kw.pop("reason", None),
        max_batch=mb,
        memory_source="modeled",
        state_bytes=kw.pop("state_bytes", None),
        time_median_s=t * batch if timed and isinstance(batch, int) else None,
        time_per_seq_s=t,
        time_batch=batch if timed else None,
        time_device="cpu" if timed else None,
        time_dtype="fp32" if timed else None,
        decode=kw.pop("decode", None),
        contention=kw.pop("contention", None),
        env={"device_name": "AMD EPYC", "attnbench": "0.1.0"},
        **kw,
    )


def _tables(rows: list[Row]) -> dict[tuple[str, str], object]:
    return {(t.kind, stem): t for t, stem in serving_tables(rows)}


def _grid_rows() -> list[Row]:
    """Vanilla, vanilla and sdpa with 3 of 12 heads' keys and values, linear: at n = 512
    and 2048, batch 1 timed and batch=max modeled."""
    times = {  # time per token (s) at b=1, by n
        ("vanilla", None): (0.010, 0.020),
        ("vanilla", 3): (0.008, 0.010),
        ("sdpa", 3): (0.005, 0.008),
        ("linear", None): (0.020, 0.004),
    }
    batches = {
        ("vanilla", None): (100, 25),
        ("vanilla", 3): (380, 98),
        ("sdpa", 3): (400, 100),
        ("linear", None): (50, 400),
    }
    rows = []
    for (attention, kv), ts in times.items():
        for n, t, mb in zip((512, 2048), ts, batches[(attention, kv)], strict=True):
            rows.append(_row(attention, n, t=t, kv=kv, state_bytes=n * 1000))
            rows.append(_row(attention, n, batch="max", mb=mb, kv=kv, state_bytes=n * 1000))
    return rows


def test_ratios_against_vanilla_with_its_full_cache() -> None:
    t = _tables(_grid_rows())
    time, memory = t[("time", "serving-b1")], t[("memory", "serving")]
    cols = ("vanilla (kv_heads=3)", "sdpa (kv_heads=3)", "linear")
    assert time.ks == memory.ks == cols  # vanilla's full cache is the baseline, no column
    assert time.ns == (512, 2048)
    # vanilla's time ÷ the configuration's, both at b=1
    assert time.value[(512, "vanilla (kv_heads=3)")] == pytest.approx(0.010 / 0.008)
    assert time.value[(2048, "vanilla (kv_heads=3)")] == pytest.approx(0.020 / 0.010)
    assert time.value[(512, "sdpa (kv_heads=3)")] == pytest.approx(0.010 / 0.005)
    assert time.value[(512, "linear")] == pytest.approx(0.5)
    assert time.value[(2048, "linear")] == pytest.approx(5.0)
    # the configuration's max batch ÷ vanilla's
    assert memory.value[(512, "vanilla (kv_heads=3)")] == pytest.approx(3.8)
    assert memory.value[(2048, "sdpa (kv_heads=3)")] == pytest.approx(4.0)
    assert memory.value[(512, "linear")] == pytest.approx(0.5)
    assert memory.value[(2048, "linear")] == pytest.approx(16.0)
    assert time.text[(512, "linear")] == "0.50x¹"  # timed on the CPU: said
    assert "time measured on cpu in fp32 at b = 1" in time.footnotes[0]
    assert memory.text[(2048, "linear")] == "16.0x¹"
    assert memory.footnotes == (ALLOCATION_ONLY,)
    md = to_markdown(time)
    assert "| n | vanilla (kv_heads=3) | sdpa (kv_heads=3) | linear |" in md
    assert "| 512 | 1.25x¹ | 2.00x¹ | 0.50x¹ |" in md
    assert r"$n$ & vanilla (kv\_heads=3) & sdpa (kv\_heads=3) & linear \\" in to_latex(time)


def test_a_kv_heads_row_is_never_a_baseline() -> None:
    rows = [
        _row("vanilla", 512, t=0.010),
        _row("vanilla", 2048, t=0.040, kv=3),  # no full-cache vanilla at 2048
        _row("sdpa", 512, t=0.002, kv=3),
        _row("sdpa", 2048, t=0.004, kv=3),
    ]
    assert not is_baseline(rows[1], "vanilla") and is_baseline(rows[0], "vanilla")
    assert group(rows[1]) == group(_row("vanilla", 2048, t=1.0))  # matched with the full one
    time = _tables(rows)[("time", "serving-b1")]
    assert time.value[(512, "sdpa (kv_heads=3)")] == pytest.approx(5.0)  # 0.010 / 0.002
    # at 2048 the only vanilla row has kv_heads: no baseline, not a 10x against it
    assert time.value[(2048, "sdpa (kv_heads=3)")] is None
    assert time.text[(2048, "sdpa (kv_heads=3)")] == "n/m²"
    assert time.text[(2048, "vanilla (kv_heads=3)")] == "n/m²"
    assert "² no vanilla baseline row at n=2048" in time.footnotes


def test_a_state_dtype_is_the_configuration_s_the_baseline_keeps_the_cells() -> None:
    """A state kept in another dtype is a configuration of its own, compared against the
    Transformer's cache as served (the cell's dtype); a vanilla row with an fp32 cache is
    one such configuration, never a baseline."""
    rows = [
        _row("vanilla", 512, t=0.010),
        _row("vanilla", 512, t=0.020, state="fp32"),
        _row("vanilla", 2048, t=0.040),
        _row("linear", 512, t=0.005),
        _row("linear", 512, t=0.004, state="fp32"),
        _row("linear", 2048, t=0.004, state="fp32"),
    ]
    assert group(rows[0]) == group(rows[1])
    time = _tables(rows)[("time", "serving-b1")]
    assert time.ks == ("vanilla (state=fp32)", "linear", "linear (state=fp32)")
    assert time.value[(512, "vanilla (state=fp32)")] == pytest.approx(0.5)  # 0.010 / 0.020
    assert time.value[(512, "linear")] == pytest.approx(2.0)  # 0.010 / 0.005
    assert time.value[(512, "linear (state=fp32)")] == pytest.approx(2.5)  # 0.010 / 0.004
    assert time.value[(2048, "linear (state=fp32)")] == pytest.approx(10.0)  # 0.040 / 0.004
    assert time.text[(2048, "linear")] == "-"  # no such row


def test_batch_decode_tokens_and_settings_match_like_with_like() -> None:
    base = _row("vanilla", 512, t=0.010)
    assert group(base) != group(_row("vanilla", 512, t=0.010, batch=8))
    assert group(base) != group(_row("vanilla", 512, t=0.010, decode_tokens=128))
    assert group(base) != group(_row("vanilla", 512, t=0.010, prefill_chunk=64))
    rows = [
        base,
        _row("vanilla", 512, batch=8, t=0.004),
        _row("local", 512, t=0.005, params={"window": 128}),
        _row("local", 512, batch=8, t=0.001, params={"window": 128}),
    ]
    t = _tables(rows)
    assert t[("time", "serving-b1")].value[(512, "local (window=128)")] == pytest.approx(2.0)
    assert t[("time", "serving-b8")].value[(512, "local (window=128)")] == pytest.approx(4.0)
    assert ("memory", "serving") not in t  # no batch=max rows: no max-batch table


def test_undefined_cells_say_why() -> None:
    busy = {"busy": True, "why": "3 of 5 repeats contended"}
    skipped = "time skipped: ~0.2 s per decode step at b=1 on this CPU; its timing (~12 s)"
    rows = [
        _row("vanilla", 512, t=0.010, contention=busy),
        _row("vanilla", 2048, reason=skipped),
        _row("vanilla", 8192, status="oom", reason="modeled: b=1 peaks over the ceiling"),
        *(_row("linear", n, t=0.001) for n in (512, 2048, 8192)),
    ]
    time = _tables(rows)[("time", "serving-b1")]
    assert [time.text[(n, "linear")] for n in (512, 2048, 8192)] == ["busy¹", "n/m²", "OOM³"]
    assert all(time.value[(n, "linear")] is None for n in (512, 2048, 8192))
    assert time.footnotes[1].startswith("² time skipped: ~0.2 s per decode step")
    # at a fixed batch, out of memory is at that batch, not at b = 1
    rows = [_row("vanilla", 8192, batch=8, status="oom"), _row("linear", 8192, batch=8, t=0.01)]
    at8 = _tables(rows)[("time", "serving-b8")]
    assert at8.text[(8192, "linear")] == "OOM¹"
    assert at8.footnotes == ("¹ the baseline does not fit at b = 8 under the ceiling (modeled)",)


def test_efficiency_lengths_by_hand() -> None:
    lengths = serving_lengths(_grid_rows())
    assert len(lengths) == 1 and lengths[0][0] == ""  # one set: no words to tell it apart
    got = {(x.mechanism, x.kind): x for x in lengths[0][1]}
    # linear: time ratio 0.5 at 512, 5.0 at 2048: log-log crossing at 512 · 4^(log 2 /
    # log 10) = 512 · 4^0.30103 ≈ 777
    lin = got[("linear", "time")]
    assert lin.text == "≈ 777" and lin.between == (512, 2048) and lin.baseline == "vanilla"
    # max batch 0.5 then 16: 512 · 4^(log 2 / log 32) = 512 · 4^0.2 ≈ 676, behind at 512
    mem = got[("linear", "memory")]
    assert mem.text == "≈ 676" and mem.behind == (512,)
    assert got[("sdpa (kv_heads=3)", "time")].text == "≤ 512"
    assert got[("vanilla (kv_heads=3)", "memory")].text == "≤ 512"
    assert got[("vanilla (kv_heads=3)", "memory")].behind == ()
    from attnbench.report.serving import lengths_table

    md = grid_markdown(lengths_table(lengths[0][1]))
    assert (
        "| mechanism | faster per token than vanilla (b=1) | more sequences fit than vanilla "
        "(max batch) | fewer fit than vanilla (its state bigger than the cache) at n |"
    ) in md
    assert "| linear | ≈ 777 | ≈ 676 | 512 |" in md
    assert "| vanilla (kv_heads=3) | ≤ 512 | ≤ 512 |  |" in md


def test_state_and_bandwidth_grids() -> None:
    decode = {"bytes_per_s": 13.0e9, "copy_bytes_per_s": 52.0e9}
    rows = [
        _row("vanilla", 512, t=0.03, state_bytes=21_240_576, decode=decode),
        _row("vanilla", 512, batch="max", mb=700, state_bytes=21_240_576),
        _row("linear", 512, t=0.03, state_bytes=590_000, reason="x", decode=None),
    ]
    state, bandwidth = state_grids(rows)
    assert state.head == ["n", "vanilla", "linear"]
    assert state.body == [["512", "21.2", "0.590"]]
    assert bandwidth.head == ["n", "vanilla", "linear", "copy (GB/s)"]
    assert bandwidth.body == [["512", "13.0 (25%)", "n/m", "52.0"]]
    # another process measured another copy bandwidth: its share is of its own, the range shown
    other = {"bytes_per_s": 10.0e9, "copy_bytes_per_s": 20.0e9}
    rows.append(_row("performer", 512, t=0.03, state_bytes=4_790_000, decode=other))
    _, bandwidth = state_grids(rows)
    assert bandwidth.body == [["512", "13.0 (25%)", "n/m", "10.0 (50%)", "20.0–52.0"]]


def test_report_command_writes_the_serving_sections(
    tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """A run dir of Table 3's rows and serving's: `attnbench report` (the CLI, in this
    process: test_report_files.py runs the real one) writes serving.md/.tex, their CSV,
    plots and report.json keys; Table 3's tables hold no decode row."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [r.to_json() for r in _grid_rows()]
    (run / "cells.jsonl").write_text(FIXTURE.read_text() + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    done = cli_in_process("report", str(run), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "time ratio: serving, time per token at b=1" in done.stdout  # the rich tables
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {
        "serving.md",
        "serving.tex",
        "serving-b1-time.csv",
        "serving-memory.csv",
        "plots/serving-time-b1.png",
        "plots/serving-state.svg",
        "plots/serving-max-batch.png",
        "table3.md",
    } <= names
    md = (out / "serving.md").read_text()
    assert "**time ratio: serving, time per token at b=1** (rows n, columns mechanism)" in md
    assert "| 2048 | 2.00x¹ | 2.50x¹ | 5.00x¹ |" in md
    assert (
        "**memory ratio: serving, max batch**" in md and "| 2048 | 3.9x¹ | 4.0x¹ | 16.0x¹ |" in md
    )
    assert "| linear | ≈ 777 | ≈ 676 | 512 |" in md
    assert "Serving: state per sequence (MB)" in md
    assert "serving" not in (out / "table3.md").read_text()  # Table 3's rows only there
    assert (out / "serving-memory.csv").read_text() == (
        "n,vanilla (kv_heads=3),sdpa (kv_heads=3),linear\n512,3.8,4,0.5\n2048,3.92,4,16\n"
    )
    assert r"\toprule" in (out / "serving.tex").read_text()
    report = json.loads((out / "report.json").read_text())
    assert list(report) == [
        "run_dir",
        "baseline",
        "rows",
        # no compiled, packed or named models' rows: none of their keys
        *(
            k
            for d in DOCUMENTS
            for k in d.records
            if k not in ("compiled", "packed_tables", "models")
        ),
    ]
    (time, memory) = report["serving_tables"]
    assert (time["kind"], memory["kind"]) == ("time", "memory")
    assert {"n": 512, "k": "linear", "text": "0.50x¹", "value": 0.5} in time["cells"]
    assert {x["mechanism"] for x in report["serving_efficiency_lengths"]} >= {"linear"}
    assert report["serving_state"] and report["tables"]
    assert "Serving: time per token at b=1 against n" in (out / "index.html").read_text()


@pytest.mark.parametrize("whose", ["linear", "vanilla"])
def test_a_decode_row_without_its_settings_is_named_not_blamed_on_the_baseline(
    whose: str, tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """A decode row without the decode workload's settings cannot be set beside any
    baseline (they are what rows are compared by): it is in no table, and said so by line
    on stderr and in serving.md, where it made a table of "None tokens" of its own whose
    footnote said "no vanilla baseline row" beside a vanilla row that was there."""
    rows = [r.to_dict() for r in _grid_rows()]
    at = next(
        i
        for i, r in enumerate(rows)
        if (r["attention"], r["n"], r["batch_asked"], r["model"].get("kv_heads"))
        == (whose, 2048, 1, None)
    )
    for key in ("decode_tokens", "state_dtype", "prefill_chunk"):
        del rows[at][key]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = cli_in_process("report", "run", "--out", "out", "--quiet", "--no-plots", cwd=tmp_path)
    said = (
        f"run/cells.jsonl:{at + 1}: {whose} n=2048 decode (cost) is in no table: no "
        "decode_tokens, state_dtype, prefill_chunk: a decode row is compared by its "
        "workload's settings"
    )
    assert done.returncode == 0 and done.stderr == f"attnbench report: {said}\n", done.stderr
    assert f"report of {len(rows) - 1} cells" in done.stdout
    md = (tmp_path / "out" / "serving.md").read_text()
    assert said in md and "None tokens" not in md
    time = md.split("**time ratio: serving, time per token at b=1**", 1)[1].split("\n\n")[1]
    if whose == "linear":  # its cell has no row; nothing blames the baseline
        assert "| 2048 | 2.00x¹ | 2.50x¹ | - |" in time and "baseline row" not in md
    else:  # vanilla's row left out, by name: then there is no baseline row at 2048, truly
        assert "| 2048 | n/m² | n/m² | n/m² |" in time
        assert "² no vanilla baseline row at n=2048" in md


def test_rows_are_set_beside_their_baseline_by_the_draw_they_use() -> None:
    """Every prompt n: the draw's settings are unused (a cell's key leaves them out), so a
    row whose unused seed differs is still set beside the baseline; a mix of prompts: two
    seeds are two draws, and an explicit list is compared by the list alone."""
    from attnbench.report.ratio import group

    base = _row("vanilla", 512, t=0.01, contexts="n", length_seed=0)
    assert group(_row("sdpa", 512, t=0.01, contexts="n", length_seed=7)) == group(base)
    drawn = _row("vanilla", 512, t=0.01, contexts="drawn", length_seed=0)
    assert group(_row("sdpa", 512, t=0.01, contexts="drawn", length_seed=7)) != group(drawn)
    listed = _row("vanilla", 512, t=0.01, contexts="drawn", lengths=[3, 9], length_seed=0)
    other = _row("sdpa", 512, t=0.01, contexts="drawn", lengths=[3, 9], length_seed=7)
    assert group(other) == group(listed) != group(drawn)
