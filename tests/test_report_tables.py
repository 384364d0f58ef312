"""Table 3 ratio tables: hand-computed ratios and golden Markdown, CSV and LaTeX text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from attnbench.report.efficiency import efficiency_lengths
from attnbench.report.paper import load_paper, paper_table, quotient
from attnbench.report.ratio import ratio
from attnbench.report.tables import marked, ratio_tables, split_marks
from attnbench.report.text import to_csv, to_latex, to_markdown
from attnbench.row import Row
from attnbench.store import CorruptLine, read_rows

ALLOCATION_ONLY = "¹ memory modeled (allocated bytes; no caching allocator replayed), not measured"

FIXTURE = Path(__file__).parent / "data" / "cells_fixture.jsonl"
CONTEXT = (  # the preset's dtype beside its ceiling; the times as the rows took them
    "preset v100_16gb (fp16, ceiling 16944988160 bytes), model layers 12, d_model 768, "
    "n_heads 12, d_ff 3072; timed on cuda in fp16 at b = 20 to 170, run on "
    "Tesla V100-SXM2-16GB; attnbench 0.1.0, 2026-11-21"
)


@pytest.fixture
def tables() -> dict[str, object]:
    return {t.kind: t for t in ratio_tables(read_rows(FIXTURE))}


def test_ratios_are_the_papers_definitions(tables) -> None:
    time, memory = tables["time"], tables["memory"]
    assert time.mechanism == memory.mechanism == "linformer (sharing=layerwise)"
    assert time.value[(512, 128)] == pytest.approx(0.010 / 0.008)  # baseline time / ours
    assert time.value[(1024, 128)] == pytest.approx(0.040 / 0.016)
    assert memory.value[(512, 128)] == pytest.approx(170 / 100)  # our max b / baseline's
    assert memory.value[(512, 256)] == pytest.approx(150 / 100)
    assert memory.value[(1024, 128)] == pytest.approx(60 / 20)


def test_honest_cells(tables) -> None:
    time, memory = tables["time"], tables["memory"]
    assert time.text[(512, 256)] == "n/m¹" and time.value[(512, 256)] is None  # time skipped
    assert time.text[(1024, 256)] == "OOM²" and memory.text[(1024, 256)] == "OOM¹"  # ours OOMs
    assert time.text[(2048, 128)] == "OOM³"  # the baseline OOMs at b = 1: no number
    assert time.text[(2048, 256)] == "-"  # no such cell
    assert "the baseline does not fit at b = 1" in time.footnotes[2]


def test_golden_markdown(tables) -> None:
    assert to_markdown(tables["time"]) == (
        "**time ratio: linformer (sharing=layerwise)** (rows n, columns k)\n\n"
        "| n | 128 | 256 |\n|---:|---:|---:|\n"
        "| 512 | 1.25x | n/m¹ |\n| 1024 | 2.50x | OOM² |\n| 2048 | OOM³ | - |\n\n"
        "¹ time not measured: a CPU run was estimated over timing.time_budget_s  \n"
        "² this mechanism does not fit at b = 1 under the ceiling  \n"
        "³ the baseline does not fit at b = 1 under the ceiling (modeled)  \n"
        f"{CONTEXT}\n"
    )


def test_golden_csv(tables) -> None:
    assert to_csv(tables["time"]) == "n,k=128,k=256\n512,1.25,\n1024,2.5,\n2048,,\n"
    assert to_csv(tables["memory"]) == "n,k=128,k=256\n512,1.7,1.5\n1024,3,\n2048,,\n"


def test_golden_latex(tables) -> None:
    assert to_latex(tables["memory"]) == (
        "\\begin{tabular}{rrr}\n\\toprule\n$n$ & $k=128$ & $k=256$ \\\\\n\\midrule\n"
        "512 & 1.7$\\times$ & 1.5$\\times$ \\\\\n"
        "1024 & 3.0$\\times$ & OOM$^{1}$ \\\\\n"
        "2048 & OOM$^{2}$ & - \\\\\n\\bottomrule\n\\end{tabular}\n"
        "% ¹ this mechanism does not fit at b = 1 under the ceiling\n"
        "% ² the baseline does not fit at b = 1 under the ceiling (modeled)\n"
        f"% linformer (sharing=layerwise), memory ratio; {CONTEXT}\n"
    )


def test_modeled_memory_and_cpu_time_are_marked(tmp_path: Path) -> None:
    rows = read_rows(FIXTURE)
    for r in rows:
        r.update(memory_source="modeled", time_device="cpu", time_dtype="fp32", time_batch=1)
    tables = {t.kind: t for t in ratio_tables(rows)}
    assert tables["memory"].text[(512, 128)] == "1.7x¹"
    assert tables["memory"].footnotes[0] == ALLOCATION_ONLY
    assert tables["time"].text[(512, 128)] == "1.25x¹"
    assert "time measured on cpu in fp32 at b = 1" in tables["time"].footnotes[0]


def test_a_memory_figure_says_whether_it_is_replayed_allocated_or_measured() -> None:
    """Each memory ratio's note names its figures' kind: the caching allocator replayed over
    the modeled allocations (and under which setting), modeled allocated bytes alone, or
    measured on the card, where under an allocator setting of its own."""

    def notes(**fields: Any) -> tuple[str, ...]:
        rows = read_rows(FIXTURE)
        for r in rows:
            r.update(fields)
        return {t.kind: t for t in ratio_tables(rows)}["memory"].footnotes

    replayed = notes(memory_source="modeled", allocator="expandable", fragmentation=0.01)
    assert replayed[0] == (
        "¹ memory modeled (the caching allocator replayed, allocator=expandable, over the "
        "modeled allocations), not measured"
    )
    assert "allocated bytes; no caching allocator replayed" in notes(memory_source="modeled")[0]
    measured = notes(memory_source="measured", allocator="default")
    assert not [n for n in measured if "allocat" in n or "modeled" in n]
    assert notes(memory_source="measured", allocator="expandable")[0] == (
        "¹ max batch measured with allocator=expandable"
    )


def test_a_corrupt_line_is_reported_with_its_number(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    lines[3] = lines[3][:40]
    bad = tmp_path / "cells.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptLine, match=r"cells.jsonl:4: not a JSON row"):
        read_rows(bad)


def test_unknown_baseline_says_which_mechanisms_there_are() -> None:
    with pytest.raises(ValueError, match="baseline: no rows of 'sdpa'; the rows have linformer"):
        ratio_tables(read_rows(FIXTURE), baseline="sdpa")


def test_the_papers_table_ships_with_the_package() -> None:
    paper = {(r["n"], r["k"]): r for r in load_paper()}
    assert len(paper) == 34  # 8 rows of n, k < n only, as printed in the paper
    assert paper[(4096, 128)] == {"n": 4096, "k": 128, "time_ratio": 3.4, "memory_ratio": 14.0}
    assert paper[(65536, 2048)]["time_ratio"] == 7.9 and (512, 512) not in paper


def test_measured_over_paper_cell_by_cell(tables) -> None:
    paper = load_paper()
    time_paper = paper_table(tables["time"], paper)
    assert time_paper.text[(512, 128)] == "1.5x" and time_paper.value[(2048, 256)] == 2.4
    q = quotient(tables["time"], time_paper)
    assert q.value[(512, 128)] == pytest.approx(1.25 / 1.5)  # measured 1.25x, paper 1.5x
    assert q.value[(1024, 128)] == pytest.approx(2.5 / 1.7)
    assert q.text[(512, 128)] == "0.83" and q.text[(1024, 128)] == "1.47"
    assert q.text[(512, 256)] == "-" and q.value[(1024, 256)] is None  # no measured number
    assert q.footnotes == ()  # its numbers are unmarked: none of the table's notes is on them
    memory = dict(tables)["memory"]
    rows = read_rows(FIXTURE)
    for r in rows:
        r["memory_source"] = "modeled"
    modeled = {t.kind: t for t in ratio_tables(rows)}["memory"]
    q = quotient(modeled, paper_table(modeled, paper))
    assert q.text[(512, 128)] == "1.00¹"  # 1.7x measured (modeled, footnote ¹), paper 1.7x
    assert q.footnotes == (ALLOCATION_ONLY,)  # the OOM's ² marks no quotient
    assert memory.text[(512, 128)] == "1.7x"
    assert (memory.source, modeled.source, tables["time"].source) == (
        "measured",
        "modeled",
        "measured",
    )


def test_two_footnote_marks_on_one_cell_read_as_two() -> None:
    """A cell with two notes reads ``¹,²`` (footnotes one and two), never ``¹²`` (twelve):
    in the table, its LaTeX, and on the quotient beside the paper."""
    rows = read_rows(FIXTURE)
    for r in rows:
        r.update(time_device="cpu", time_dtype="fp32", time_batch=1)
    rows[3].update(time_median_s=0.008, time_iqr_s=0.004)  # linformer n=512 k=128: noisy
    time = ratio_tables(rows)[0]
    assert time.text[(512, 128)] == "1.25x¹,²" and time.text[(1024, 128)] == "2.50x¹"
    assert "noisy: linformer's time" in time.footnotes[1]
    assert "512 & 1.25$\\times$$^{1,2}$ &" in to_latex(time)
    assert quotient(time, paper_table(time, load_paper())).text[(512, 128)] == "0.83¹,²"
    assert split_marks("1.14x¹²") == ("1.14x", ["¹²"])  # footnote twelve stays one mark
    assert marked("OOM¹²", "³") == "OOM¹²,³" and marked("n/m") == "n/m"


def test_columns_are_named_after_the_mechanisms_budget() -> None:
    rows = read_rows(FIXTURE)
    for r in rows:
        if r["attention"] == "linformer":
            r["attention"] = "performer"
    (time, _) = ratio_tables(rows)
    assert time.column == "nb_features" and time.attention == "performer"
    assert to_csv(time).startswith("n,nb_features=128,nb_features=256\n")
    assert "(rows n, columns nb_features)" in to_markdown(time)
    assert r"$\text{nb\_features}=128$" in to_latex(time)


def test_two_settings_of_one_mechanism_are_two_tables_never_one() -> None:
    rows = read_rows(FIXTURE)
    fp32 = [
        dict(r, dtype="fp32", time_per_seq_s=(r["time_per_seq_s"] or 0) * 2 or None) for r in rows
    ]
    tables = ratio_tables(rows + fp32)
    assert len(tables) == 4
    dtypes = [t.context.split("(")[1].split(",")[0] for t in tables]  # the preset's (dtype, ..)
    assert sorted(dtypes) == ["fp16"] * 2 + ["fp32"] * 2
    for t in tables:  # both halves of the fixture give the same ratios (times doubled)
        assert t.value[(512, 128)] == pytest.approx(1.25 if t.kind == "time" else 1.7)


def test_a_mechanism_without_a_budget_gets_one_ratio_column() -> None:
    rows = [
        dict(r, attention="sdpa", k=None)
        for r in read_rows(FIXTURE)
        if r["attention"] == "linformer" and r["k"] == 128
    ]
    (time, memory) = ratio_tables(read_rows(FIXTURE)[:3] + rows)
    assert time.ks == (None,) and time.text[(512, None)] == "1.25x"
    assert to_csv(memory).splitlines()[:2] == ["n,ratio", "512,1.7"]
    assert "| n | ratio |" in to_markdown(time) and "& ratio" in to_latex(time)


def test_fixed_batch_rows_pair_with_the_same_batch_and_have_no_memory_ratio() -> None:
    rows = []
    for b, scale in ((1, 1.0), (8, 0.5)):  # per-sequence times halve at b = 8
        for r in read_rows(FIXTURE):
            t = r["time_per_seq_s"]
            rows.append(
                dict(
                    r,
                    cell={"batch": b},
                    max_batch=None,
                    time_per_seq_s=t
                    * scale
                    * (2 if r["attention"] == "linformer" and b == 8 else 1)
                    if t
                    else None,
                )
            )
    tables = ratio_tables(rows)
    assert len(tables) == 4  # linformer at b = 1 and at b = 8: never against each other
    by = {(t.kind, t.context.split("fixed batch ")[1].split(")")[0]): t for t in tables}
    assert by[("time", "1")].value[(512, 128)] == pytest.approx(1.25)
    assert by[("time", "8")].value[(512, 128)] == pytest.approx(1.25 / 2)
    assert by[("memory", "8")].text[(512, 128)] == "n/m¹"
    assert by[("memory", "8")].footnotes[0] == "¹ fixed batch: no max batch was searched"


def _oom_baseline_rows() -> list[Row]:
    """vanilla fits at n = 1024 and not at 2048; linformer fits at both."""
    shape = {"layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072}
    at = {"dtype": "fp16", "device": "v100_16gb", "model": shape, "time_device": "cuda"}
    return [
        Row(attention="vanilla", n=1024, time_per_seq_s=0.04, max_batch=20, **at),
        Row(attention="vanilla", n=2048, status="oom", memory_source="measured", **at),
        Row(attention="linformer", n=1024, k=128, time_per_seq_s=0.016, max_batch=60, **at),
        Row(attention="linformer", n=2048, k=128, time_per_seq_s=0.03, max_batch=30, **at),
    ]


def test_an_oom_baseline_has_no_ratio_but_its_status() -> None:
    """The one rule: where the baseline does not fit one sequence the ratio is undefined,
    shown as the baseline's status with its footnote, never a number or an infinity."""
    vanilla, oom, _, linformer = _oom_baseline_rows()
    for kind in ("time", "memory"):
        got = ratio(kind, linformer, oom)
        assert (got.value, got.text, got.outgrown) == (None, "OOM", True)
        assert got.notes == ("the baseline does not fit at b = 1 under the ceiling (measured)",)
    # the mechanism out of memory too: still undefined, and not "outgrown"
    assert not ratio("memory", dataclasses.replace(linformer, status="oom"), oom).outgrown
    assert ratio("memory", linformer, vanilla).value == pytest.approx(30 / 20)
    # in a ratio table: the status and its footnote, no value, nothing for a CSV
    time, memory = ratio_tables(_oom_baseline_rows())
    for t in (time, memory):
        assert t.text[(2048, 128)] == "OOM¹" and t.value[(2048, 128)] is None
        assert t.footnotes == ("¹ the baseline does not fit at b = 1 under the ceiling (measured)",)
    assert memory.text[(1024, 128)] == "3.0x" and to_csv(memory).endswith("2048,\n")


def test_an_oom_baseline_in_an_efficiency_length_is_read_from_the_same_rule() -> None:
    """The lengths take each n's ratio from the tables' rule: the memory length crosses where
    the baseline stops fitting (no ratio to interpolate), the time length has no point
    there, and no length claims a figure the table does not show."""
    rows = _oom_baseline_rows()
    rows[2].max_batch = 10  # behind at 1024 (10 < 20), so the crossing is the OOM
    got = {x.kind: x for x in efficiency_lengths(rows, ("vanilla",))}
    memory, time = got["memory"], got["time"]
    assert (memory.n, memory.text, memory.between) == (None, "1024–2048", (1024, 2048))
    assert memory.compared == (1024, 2048)
    assert (time.text, time.compared) == ("≤ 1024", (1024,))
