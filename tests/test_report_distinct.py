"""Two rows of one cell in what a report reads (docs/reports.md, "Two rows of one cell"):
the later counts, an exact copy counts once, a run dir named twice is read once, and each
row left out is said with its place. The rule on rows in memory; one ``attnbench report``
in-process for the lines a user sees (tests/test_report_files.py runs it as a process)."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.report.distinct import distinct
from attnbench.row import Row

REFERENCE = Path(__file__).parent.parent / "results/reference/table3-v100_16gb-cpu/cells.jsonl"


def reference_rows() -> list[dict]:
    return [json.loads(line) for line in REFERENCE.read_text().splitlines()]


def test_the_later_row_of_a_cell_counts_and_every_row_left_out_is_said(tmp_path: Path) -> None:
    a, b, c = (Row.from_dict(d) for d in reference_rows()[:3])
    slower = Row.from_dict({**a.to_dict(), "time_per_seq_s": 2 * a.time_per_seq_s})
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    rows, said = distinct([(one, [(1, a), (2, b), (3, b)]), (two, [(1, slower), (2, c)])])
    assert rows == [b, slower, c]  # a replaced by the later slower, b once
    assert said == [
        f"{one}:3 repeats {one}:2 exactly: counted once",
        f"{two}:1 and {one}:1 are the same cell ({a.attention} n={a.n} {a.mode}) with "
        f"different figures: {two}:1 counts, the later (docs/reports.md, 'Two rows of one "
        "cell')",
    ]
    again, said = distinct([(one, [(1, a)]), (tmp_path / "." / "one.jsonl", [(1, a)])])
    assert again == [a] and said == [f"{tmp_path}/one.jsonl is named more than once: read once"]


def test_the_report_says_which_row_counts_and_counts_each_cell_once(
    tmp_path: Path, cli_in_process
) -> None:
    rows = reference_rows()
    first = next(r for r in rows if r["time_per_seq_s"])
    run = tmp_path / "run"
    run.mkdir()
    doubled = [*rows, {**first, "time_per_seq_s": 2 * first["time_per_seq_s"]}, rows[0]]
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in doubled))
    out = cli_in_process("report", "run", "--also", "run", "--quiet", "--no-plots", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"report of {len(rows)} cells" in out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 3, out.stderr
    at = rows.index(first) + 1
    assert f"run/cells.jsonl:{len(rows) + 1} and run/cells.jsonl:{at} are the same cell" in lines[0]
    assert lines[2] == "attnbench report: run/cells.jsonl is named more than once: read once"


def test_a_row_no_table_can_use_is_left_out_by_name(tmp_path: Path) -> None:
    """The rule on rows in memory: a failed cost row counts (its cell says why), a failed
    quality row, a row with no status, a decode row without its settings and a task no
    table reads do not, each said with its place and why."""
    base = reference_rows()[0]
    quality = json.loads(
        (REFERENCE.parent.parent / "approx-cpu-cpu/cells.jsonl").read_text().splitlines()[0]
    )
    rows = [
        {**base, "status": "error", "reason": "x"},  # a cost row's error is a cell
        {**base, "n": 1, "status": None},
        {**quality, "status": "error", "reason": "out of memory", "quality": None},
        {**quality, "n": 1, "quality": None},
        {**base, "n": 2, "mode": "decode", "params": {"causal": True}},
        {**quality, "n": 2, "task": "nosuch"},
    ]
    one = tmp_path / "one.jsonl"
    numbered = [(i, Row.from_dict({**r, "key": None})) for i, r in enumerate(rows, 1)]
    kept, said = distinct([(one, numbered)])
    assert [r.status for r in kept] == ["error"]
    where = [f"{one}:{i}: vanilla n={n} " for i, n in ((2, 1), (3, 512), (4, 1), (5, 2), (6, 2))]
    assert said == [
        f"{where[0]}inference (cost) is in no table: no status: nothing was measured",
        f"{where[1]}inference (approx) is in no table: error: out of memory",
        f"{where[2]}inference (approx) is in no table: no quality figures",
        f"{where[3]}decode (cost) is in no table: no decode_tokens, state_dtype, "
        "prefill_chunk: a decode row is compared by its workload's settings",
        f"{where[4]}inference (nosuch) is in no table: no table reads task=nosuch rows (a "
        "plugin's, not loaded here?)",
    ]
