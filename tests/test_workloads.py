"""Workloads are one module each: this file alone adds one and runs it through `attnbench run`.

The toy workload is "a forward without autograd at batch 1, timed as two named parts": it
differs from ``inference`` in what it times (two parts, so the row holds ``time_parts``) and in
which mechanisms it refuses, so that the row can only have come from it. The subprocess
loads this very file as a plugin (``$ATTNBENCH_PLUGINS``), the way a user adds a workload
without touching attnbench.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from attnbench import workload
from attnbench.cell import Cell
from attnbench.cell_key import key
from attnbench.measure import presets
from attnbench.plan import label as plan_label
from attnbench.plan import validate
from attnbench.registry import Info
from attnbench.settings import Setting, number
from attnbench.store import read_rows
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


class HalvesWork(workload.Work):
    """The forward, split after ``split_at`` of the layers (the toy's one setting)."""

    def __init__(self, model: Any, x: Any, split_at: float) -> None:
        super().__init__(model, x)
        self.cut = max(1, round(len(model.layers) * split_at))

    @property
    def parts(self) -> Sequence[Callable[[], Any]]:
        return (self.first, self.second)

    def first(self) -> None:
        self.h = self.x
        for layer in self.model.layers[: self.cut]:
            self.h = layer(self.h)

    def second(self) -> None:
        for layer in self.model.layers[self.cut :]:
            self.h = layer(self.h)

    def __call__(self) -> Any:
        with torch.no_grad():
            self.first()
            self.second()
        return self.h


class Halves(workload.Workload):
    name = "toy_halves"
    doc = "a forward without autograd, timed as its two halves (a test's toy workload)"
    what = "two-halves forward"
    parts = ("first", "second")
    # its own setting, declared here alone: a key (+split_at=0.25), a check, the cell's key,
    # a row field
    settings = (Setting("split_at", 0.5, "share of the layers timed first", float, number()),)

    def refuses(self, info: Info) -> str | None:
        return "is not for the toy" if info.name == "performer" else None

    def label(self, cell: Cell) -> str:
        return "halves"

    def work(self, model: Any, cell: Cell, x: Any, device: str, *, gpu: bool) -> workload.Work:
        return HalvesWork(model, x, cell.settings["split_at"])


@pytest.fixture(autouse=True)
def _toy() -> Any:
    """Registered for this file's tests only: the rest of the suite sees the built-ins."""
    workload.register(Halves())
    yield
    workload._WORKLOADS.pop(Halves.name, None)


if __name__ in os.environ.get("ATTNBENCH_PLUGINS", ""):  # loaded as the plugin it tests
    workload.register(Halves())


def test_the_toy_is_a_mode_with_its_own_key_label_and_refusals() -> None:
    cell = Cell("vanilla", n=64, batch=1, device="cpu", dtype="fp32", layers=2, mode="toy_halves")
    validate(cell)
    assert plan_label(cell) == "vanilla n=64 halves"
    plain = Cell("vanilla", n=64, batch=1, device="cpu", dtype="fp32", layers=2)
    assert key(cell, presets.load("cpu")) != key(plain, presets.load("cpu"))
    assert cell.settings == {"split_at": 0.5}  # the declared default, filled in
    other = Cell("vanilla", n=64, batch=1, device="cpu", dtype="fp32", layers=2,
                 mode="toy_halves", mode_settings={"split_at": 0.25})  # fmt: skip
    assert key(other, presets.load("cpu")) != key(cell, presets.load("cpu"))
    with pytest.raises(ValueError, match=r"^split_at: must be a number >= 0, got -1$"):
        validate(dataclasses.replace(other, mode_settings={"split_at": -1}))
    with pytest.raises(ValueError, match=r"^mode: attention=performer is not for the toy$"):
        validate(Cell("performer", n=64, batch=1, device="cpu", mode="toy_halves"))
    modes = "inference, train, decode, packed, packed_train, toy_halves"
    with pytest.raises(ValueError, match=rf"^mode: must be one of {modes}"):
        validate(Cell("vanilla", n=64, mode="toy"))


def test_a_workload_from_a_plugin_runs_end_to_end(tmp_path: Path, cli_in_process) -> None:
    """`attnbench run mode=toy_halves` in a fresh process: the plugin registers the toy,
    the command validates, measures and stores one row of it, and the report is written.
    Its refusal in this process (cli.main, the toy registered here by ``_toy``): a
    refusal's line and exit code are not the process's."""
    env = {
        "ATTNBENCH_PLUGINS": "tests.test_workloads",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = (
        "run", "attention=vanilla", "mode=toy_halves", "n=64", "batch=1", "device=cpu",
        "dtype=fp32", "model.layers=2", "model.d_model=64", "model.n_heads=4",
        "model.d_ff=128", "timing.min_seconds=0", "timing.min_repeats=3", "progress=false",
        "+split_at=0.5",
    )  # fmt: skip
    out = run_cli(*args, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/*/*/cells.jsonl")
    (row,) = read_rows(cells)
    assert row["status"] == "ok" and row["mode"] == "toy_halves", row
    assert row["split_at"] == 0.5  # the workload's setting, a row field from its declaration
    assert set(row["time_parts"]) == {"first", "second"}
    assert row["repeats"] >= 3 and row["time_median_s"] > 0
    # the parts add up to the whole, repeat by repeat
    first, second = (row["time_parts"][p]["samples_s"] for p in ("first", "second"))
    for a, b, whole in zip(first, second, row["time_samples_s"], strict=True):
        assert a + b == pytest.approx(whole)
    assert row["memory_source"] == "modeled" and row["peak_bytes"] > 0
    # refused in one line, exit 2, before anything is written
    (tmp_path / "x").mkdir()
    refused = cli_in_process(*args[:1], "attention=performer", *args[2:], cwd=tmp_path / "x")
    assert refused.returncode == 2
    assert "mode: attention=performer is not for the toy" in refused.stderr
    assert "Traceback" not in refused.stderr and not any((tmp_path / "x").iterdir())


def test_the_architecture_pages_example_registers_a_workload() -> None:
    """docs/architecture.md's "Add a workload" block, run as it stands: it registers a mode
    whose cells validate and label like any other."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("### Add a workload")
    code = re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)
    workload._WORKLOADS.pop(Halves.name, None)  # the page's own definition, not this file's
    exec(compile(code, "docs/architecture.md:add-a-workload", "exec"), {})
    assert workload.get("toy_halves").parts == ("first", "second")
    cell = Cell("vanilla", n=32, batch=1, device="cpu", dtype="fp32", layers=2, mode="toy_halves")
    validate(cell)
    assert plan_label(cell) == "vanilla n=32"
