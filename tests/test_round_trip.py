"""What ``attnbench run`` writes, ``report`` and ``load`` read: every declared setting, given
a value other than its default on the command line, comes back from the stored row as it
was typed (a list as a list), through the row's own fields, its stored spec and a
launcher's payload. Composed by Hydra in this process; one real run under joblib.

A config list once reached a row as its ``str`` (``"[10, 20, 30]"``), which every reader
then refused: the run's own report failed, and under joblib the cell did not run at all.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import attnbench
import attnbench.plan
from attnbench import workload
from attnbench.cell import Cell
from attnbench.env import environment
from attnbench.measure import presets
from attnbench.row import Row
from attnbench.settings import CELL_FIELDS
from attnbench.store import RunStore
from attnbench.sweep.cells import cell_from_cfg
from attnbench.sweep.config import expand_jobs
from tests.conftest import run_cli

# a value other than its default for every declared setting, as typed and as read back; a
# setting declared later without one here fails the first test, naming it
TYPED: dict[str, tuple[str, Any]] = {
    "optimizer": ("sgd", "sgd"),
    "checkpoint": ("true", True),
    "decode_tokens": ("7", 7),
    "state_dtype": ("fp32", "fp32"),
    "prefill_chunk": ("64", 64),
    "contexts": ("drawn", "drawn"),
    "lengths": ("[10,20,30]", [10, 20, 30]),
    "distribution": ("uniform", "uniform"),
    "total_tokens": ("999", 999),
    "length_mean": ("77", 77),
    "length_min": ("3", 3),
    "length_seed": ("5", 5),
    "layout": ("bucketed", "bucketed"),
    "bucket_tokens": ("2048", 2048),
    "layers": ("2", 2),
    "d_model": ("64", 64),
    "n_heads": ("2", 2),
    "d_ff": ("128", 128),
    "kv_heads": ("1", 1),
    "head_dim": ("16", 16),  # d_model 64 over 2 heads: 32 by default
    "schedule": ("'attention, lin'", "attention, lin"),  # lin: BASE's kind
    "name": ("mine", "mine"),
    "min_repeats": ("3", 3),
    "min_seconds": ("0.5", 0.5),
    "cpu_batch": ("2", 2),
    "time_budget_s": ("12.5", 12.5),
    "flush_l2": ("true", True),
    "threads": ("1", 1),
    "compile": ("true", True),
    "compile_mode": ("max-autotune", "max-autotune"),
    "allocator": ("expandable", "expandable"),
}
BASE = ("attention=vanilla", "causal=true", "device=cpu", "dtype=fp32", "n=64", "batch=1",
        "+model.kinds.lin.attention=linear")  # fmt: skip


def _declared() -> dict[str, str]:
    """Every setting a workload or the cell declares: its name -> its key."""
    found = {s.name: s.key for s in CELL_FIELDS}
    for name in workload.names():
        found.update({s.name: s.key for s in workload.get(name).settings})
    return found


def test_every_declared_setting_has_a_value_here() -> None:
    assert set(_declared()) - set(TYPED) == set(), "add a non-default value to TYPED"


def _stored(tmp_path: Path, cell: Cell) -> dict[str, Any]:
    """``cell``'s row as the store writes it and a reader reads it back (a failed cell's
    row: every setting is the cell's, and no measurement is needed for that)."""
    preset = presets.load("cpu")
    row = Row.new(cell, preset.total_bytes, 0, environment(), status="error", reason="x")
    spec = attnbench.plan.spec(cell, preset)
    RunStore(tmp_path).append(row.replaced(key="k", sweep="s", cell=spec))
    (line,) = (tmp_path / "cells.jsonl").read_text().splitlines()
    return json.loads(line)


@pytest.mark.parametrize("mode", workload.BUILTINS)
def test_each_setting_typed_comes_back_from_the_row(mode: str, tmp_path: Path) -> None:
    declared = _declared()
    own = {s.name for s in workload.get(mode).settings} | {s.name for s in CELL_FIELDS}
    typed = [f"{declared[name]}={TYPED[name][0]}" for name in sorted(own)]
    (job,), _ = expand_jobs([*BASE, f"mode={mode}", *typed])
    cell = cell_from_cfg(copy.deepcopy(job))
    stored = _stored(tmp_path, cell)
    row = Row.from_dict(stored)  # what report and load check every row with
    for name in own:
        want = TYPED[name][1]
        kept = json.loads(json.dumps(want))  # JSON's form: tuples are lists
        if name in {s.name for s in workload.get(mode).settings}:  # stored once, in the spec
            assert dict(stored["cell"]["mode_settings"])[name] == kept and name not in stored
            assert getattr(row, name) in (want, tuple(want) if isinstance(want, list) else want)
    again = Cell.from_dict(stored["cell"])  # the stored spec: the same cell, every field
    assert again == dataclasses.replace(cell, ceiling_bytes=stored["cell"]["ceiling_bytes"])
    # a launcher's payload (joblib's subprocess: JSON), and the frame load() gives
    assert Cell.from_dict(json.loads(json.dumps(cell.to_dict()))) == cell
    frame = attnbench.load(tmp_path)
    for name in own & {s.name for s in workload.get(mode).settings}:
        value = frame.loc[0, name]
        assert (list(value) if isinstance(value, (list, tuple)) else value) == TYPED[name][1]


def test_lengths_round_trip_through_a_run_under_joblib_and_its_report(
    tmp_path: Path, cli_in_process
) -> None:
    """A real sweep under joblib (each cell a fresh process, its cell crossing as JSON) with
    explicit lengths: stored as a list, reported, and resumed as done."""
    args = (
        "run", "attention=sdpa", "mode=packed", "lengths=[10,20,30]", "model=tiny", "n=64",
        "device=cpu", "dtype=fp32", "timing.min_seconds=0", "progress=false",
        "hydra/launcher=joblib", "report_baseline=sdpa", "-m",
    )  # fmt: skip
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/single/*/cells.jsonl")
    (row,) = [json.loads(line) for line in cells.read_text().splitlines()]
    assert row["status"] == "ok", row.get("reason")
    assert dict(row["cell"]["mode_settings"])["lengths"] == [10, 20, 30]  # stored once, there
    assert (cells.parent / "report" / "index.html").exists(), out.stdout
    again = cli_in_process(*args[:-2], "report=false", cwd=tmp_path)  # the default launcher
    assert again.returncode == 0 and "done before" in again.stdout, again.stderr


@pytest.mark.parametrize(
    "override",
    [
        "hydra.run.dir=/tmp/elsewhere",
        "hydra.sweep.dir=elsewhere",
        "hydra.run.dir=${out_dir}/../x",
        "hydra.sweep.subdir=../../x",
        "hydra.sweep.subdir=/abs",
    ],
)
def test_hydra_output_directories_outside_out_dir_are_refused(
    override: str, tmp_path: Path, cli_in_process
) -> None:
    """Hydra's own files stay under out_dir, where the pre-checks test them: elsewhere is one
    line naming the key, exit 2, and nothing written anywhere."""
    out = cli_in_process(
        "run", "model=tiny", "n=32", f"out_dir={tmp_path}/out", override, cwd=tmp_path
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{override.split('=')[0]}: Hydra's files stay under out_dir" in out.stderr
    assert not any(tmp_path.iterdir()) and not Path("/tmp/elsewhere").exists()
