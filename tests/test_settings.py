"""Each setting is declared once (attnbench/settings.py, the workloads, the quality tasks):
conf/config.yaml's settings, docs/running.md's table, a cell's defaults, its checks and a
workload's row fields all come from the declarations (tests/test_mirrors.py holds the
generated files to them)."""

from __future__ import annotations

import copy
import functools
import re

import pytest
from omegaconf import DictConfig, OmegaConf

from attnbench import workload
from attnbench.cell import Cell, Part
from attnbench.cell_key import cell_of, key
from attnbench.cell_rules import complete
from attnbench.measure import presets
from attnbench.plan import validate
from attnbench.quality import tasks
from attnbench.row.fields import BY_NAME
from attnbench.settings import Setting, yaml_block
from attnbench.sweep import declared
from attnbench.sweep.cells import cell_from_cfg
from attnbench.sweep.config import expand_jobs


@functools.cache
def _job(*overrides: str) -> DictConfig:
    (job,), _ = expand_jobs(list(overrides))
    return job


def _cell(*overrides: str, **values: object) -> Cell:
    """The cell of a composed command line, with ``values`` set as keys (composed once)."""
    job = copy.deepcopy(_job(*overrides))
    for name, value in values.items():
        OmegaConf.update(job, name, value, force_add=True)
    return cell_from_cfg(job)


@pytest.mark.parametrize("mode", workload.BUILTINS)
def test_a_cell_of_each_workload_from_python_and_from_the_command_line_is_one_cell(mode) -> None:
    """The defaults a workload declares are the config's: Python's cell, naming none, and
    the command line's, which reads every key, have one key and are one cell once planned
    (a cell is a spec as asked; the plan completes its workload's part)."""
    params = (("causal", True),) if mode == "decode" else ()
    made = Cell("vanilla", n=512, workload=Part(mode), params=params)
    composed = _cell(f"mode={mode}")
    assert composed == complete(made) and made.settings == {}
    assert composed.settings == {s.name: s.default for s in workload.get(mode).settings}
    preset = presets.load("v100_16gb")
    assert key(composed, preset) == key(made, preset)


@pytest.mark.parametrize("task", tasks.REGISTRY)
def test_a_cell_of_each_quality_task_from_python_and_from_the_command_line_is_one_cell(
    task,
) -> None:
    """The task's settings are the registry's. Its model, dtype, batch and n are its own
    (conf/task/), unless the command line names them: here the config's, as Python's cell."""
    cost = ("model=base", "device=v100_16gb", "n=512", "dtype=fp16", "batch=max")
    made = complete(
        Cell(
            "vanilla",
            n=512,
            task=Part(task),
        )
    )
    assert _cell("attention=vanilla", f"task={task}", *cost) == made


def test_a_workload_setting_is_a_row_field_from_its_declaration() -> None:
    for name in workload.BUILTINS:
        for s in workload.get(name).settings:
            field = BY_NAME[s.name]
            owners, doc = field.doc.split(" rows: ", 1)  # a shared setting names each owner
            assert field.check is s.check and name in owners.split(", ") and doc == s.doc
            with pytest.raises(ValueError, match=rf"^{s.name}: must be"):
                field.read_check(s.name, "bogus" if s.type is not str else 3)


def _bad(s: Setting) -> object:
    """A value the setting's check (or its owner's rules) refuses."""
    if s.name == "name":  # any word names a model
        return "[1]"
    return "[1]" if s.type is str and s.name != "inputs" else "bogus"


EVERY = [s for s in declared.all_settings() if not s.carried]


@pytest.mark.parametrize("s", EVERY, ids=[s.key for s in EVERY])
def test_every_declared_setting_is_checked_in_one_line_naming_its_key(s: Setting) -> None:
    """Whatever the mode or the task, a bad value of any declared key is one ValueError line
    starting with that key, before anything runs (a typo never passes silently)."""
    owner = {"mode=decode": ("mode=decode", "causal=true"), "mode=train": ("mode=train",)}
    extra = owner.get(s.owner, ())
    if s.owner.startswith("task="):
        extra = ("attention=vanilla", f"task={s.owner.removeprefix('task=')}")
    value = _bad(s)
    with pytest.raises(ValueError) as caught:
        validate(_cell(*extra, **{s.key: value}))
    message = str(caught.value)
    assert message.startswith(f"{s.key}: ") and "\n" not in message, message


def test_another_workloads_setting_is_checked_whatever_the_mode() -> None:
    with pytest.raises(ValueError, match=r"^optimizer: must be one of adamw, sgd, none"):
        _cell("mode=inference", "optimizer=adam")


def test_a_setting_the_workload_does_not_declare_is_refused_in_one_line() -> None:
    cell = Cell(
        "vanilla",
        n=64,
        workload=Part("train", {"optimiser": "sgd"}),
    )
    with pytest.raises(ValueError, match=r"^optimiser: not a setting of mode=train \(its set"):
        validate(cell)


def test_a_stored_spec_from_before_reads_as_the_same_cell() -> None:
    """Specs stored with a row kept the workload's settings as fields of the cell."""
    cell = Cell(
        "vanilla",
        n=64,
        workload=Part("train", {"checkpoint": True}),
    )
    old = {k: v for k, v in cell.to_dict().items() if k != "mode_settings"}
    old.update(optimizer="adamw", checkpoint=True, decode_tokens=128, state_dtype="auto")
    assert cell_of(old) == complete(cell)


def test_the_yaml_block_nests_keys_and_comments_blocks() -> None:
    settings = [
        Setting("a", 1, "first").owned("mode=x"),
        Setting("b", 1e-5, "small", float).owned("t", "t.x."),
        Setting("c", [1, 2], "list").owned("t", "t.x."),
        Setting("d", None, "none").owned("t", "t.y."),
    ]
    text = yaml_block(settings, {"t.x": "the x block"})
    assert text == (
        "a: 1  # mode=x: first\nt:\n  x:  # the x block\n    b: 1.0e-05  # small\n"
        "    c: [1, 2]  # list\n  y:\n    d: null  # none\n"
    )
    import yaml

    assert yaml.safe_load(text)["t"]["x"]["b"] == 1e-5  # YAML 1.1 would read 1e-05 as text
    assert re.search(r"\| `timing.min_seconds` \| timing \| float \| `1.0` \| s \| no \|",
                     declared.docs_table())  # fmt: skip
