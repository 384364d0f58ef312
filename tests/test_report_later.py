"""A sweep whose own report could not be made says how to make it later: the command it
prints must then work (a run without ``vanilla`` rows printed ``attnbench report DIR``,
which failed the same way)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from attnbench.sweep.finish import write_report

REFERENCE = Path(__file__).parent.parent / "results/reference/table3-v100_16gb-cpu/cells.jsonl"


def test_the_command_a_failed_report_suggests_makes_the_report(
    tmp_path: Path, cli_in_process, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [json.loads(line) for line in REFERENCE.read_text().splitlines()]
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if r["attention"] != "vanilla")
    )
    write_report(run, "vanilla", show=False)
    said = capsys.readouterr().out
    assert "baseline: no rows of 'vanilla'" in said, said
    later = said.split("(make it later: ", 1)[1].rsplit(")", 1)[0]
    assert later == f"attnbench report {run} --baseline linformer"
    argv = shlex.split(later)
    assert argv[0] == "attnbench"
    out = cli_in_process(*argv[1:], "--quiet", "--no-plots", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
