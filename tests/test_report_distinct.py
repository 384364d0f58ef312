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
