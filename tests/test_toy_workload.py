"""A workload with a setting of its own, added by a plugin from its own file
(``tests/toys/toy_workload.py``): its setting is a key checked in one line, a part of the
cell's key only off its default, a row field and a label; its step's two parts are the
forward. In this process, on cells and a tiny encoder; its real run (a fresh process, the
row stored, the report) is tests/test_extensions.py's.

The file is loaded as ``attnbench`` loads it: named in ``$ATTNBENCH_PLUGINS`` and imported by
the first look at the workloads, never imported here; after each test it is unregistered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnbench import workload
from attnbench.cell import Cell, Part, Shape
from attnbench.cell_key import beyond_defaults, key
from attnbench.measure import presets
from attnbench.row import fields as row_fields
from tests.toys import loaded

NAME, TOY = "toy_halves", "tests.toys.toy_workload"
TINY = ("model=tiny", "n=64", "batch=1", "device=cpu", "dtype=fp32", "progress=false")


@pytest.fixture(autouse=True)
def _toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with loaded(monkeypatch, TOY, workload._WORKLOADS, NAME):
        yield


def _cell(**settings: int) -> Cell:
    return Cell(
        "vanilla",
        n=32,
        batch=1,
        device="cpu",
        dtype="fp32",
        workload=Part(NAME, settings),
        model=Shape(layers=3, d_model=32, n_heads=4, d_ff=64),
    )


def test_its_setting_is_a_row_field_and_in_the_key_only_off_its_default() -> None:
    """Asked of the workload and the key alone: a cell's defaults are filled in, and the
    cell validated, by whatever plans it (its real run is tests/test_extensions.py's)."""
    assert workload.names() == [*workload.BUILTINS, NAME]  # the first look loads the plugin
    with pytest.raises(ValueError, match=rf"^mode: must be one of {', '.join(workload.names())}"):
        workload.get("toy")
    assert "split" in row_fields.extra_fields()
    plain, one, two = _cell(), _cell(split=1), _cell(split=2)
    assert beyond_defaults(plain) == beyond_defaults(one) == {"mode": NAME}  # as without it
    assert beyond_defaults(two) == {"mode": NAME, "mode_settings": {"split": 2}}
    cpu = presets.load("cpu")
    assert key(plain, cpu) == key(one, cpu) != key(two, cpu)
    assert workload.get(NAME).label(two) == "halves(split=2)"


@pytest.mark.parametrize(
    ("split", "line"),
    [
        ("0", "split: must be an integer >= 1, got 0"),
        ("2", "split: must be below model.layers=2 (a layer in each part), got 2"),
    ],
)
def test_a_bad_split_is_one_line_naming_the_key_and_exit_2(
    split: str, line: str, tmp_path: Path, cli_in_process
) -> None:
    out = cli_in_process("run", "attention=vanilla", f"mode={NAME}", f"+split={split}", *TINY,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().endswith(line), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.parametrize("split", [1, 2])
def test_its_two_parts_are_the_forward_and_keep_nothing(split: int) -> None:
    cell = _cell(split=split)
    work = workload.get(NAME)
    model = work.build(cell, {}, "cpu", torch.float64)
    x = torch.randn(2, 32, 32, dtype=torch.float64)
    step = work.work(model, cell, x, "cpu", gpu=False)
    with torch.inference_mode():
        want = model(x)
        first, second = step.parts
        first()
        assert step.h is not None and step.h.shape == x.shape
        assert torch.equal(second(), want) and step.h is None
        assert torch.equal(step(), want) and step.h is None
        first()
        step.release()
        assert step.h is None
