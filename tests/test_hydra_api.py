"""Hydra's private API, pinned: attnbench expands a sweep before Hydra launches it, through
one call into Hydra's BasicSweeper (attnbench/sweep/hydra_api.py). If a Hydra upgrade moves or
changes it, these fail here, loudly, instead of sweeps silently expanding another way."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser

from attnbench.sweep.config import expand_jobs
from attnbench.sweep.hydra_api import split_sweep


def test_split_sweep_is_the_cartesian_product_in_hydras_order() -> None:
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y", "c=3"])
    assert split_sweep(parsed) == [
        ["a=1", "b=x", "c=3"],
        ["a=1", "b=y", "c=3"],
        ["a=2", "b=x", "c=3"],
        ["a=2", "b=y", "c=3"],
    ]


def test_split_sweep_expands_ranges_and_keeps_single_values() -> None:
    parsed = OverridesParser.create().parse_overrides(["n=range(1,4)", "k=5"])
    assert split_sweep(parsed) == [["n=1", "k=5"], ["n=2", "k=5"], ["n=3", "k=5"]]


def test_a_sweep_file_expands_as_hydra_runs_it_with_the_command_line_winning() -> None:
    jobs, multirun = expand_jobs(["+sweep=smoke", "n=64"])
    assert multirun and len(jobs) == 3  # the command line's n=64 replaces the file's 64,128
    assert [j.attention.name for j in jobs] == ["vanilla", "linformer", "performer"]
    assert {j.n for j in jobs} == {64}


def test_a_cell_from_python_and_from_the_default_command_line_are_the_same_cell() -> None:
    """Every default is written once: Cell's own and conf/config.yaml's are held equal here
    (Cell.time_budget_s said 60 s where the config said 30), through the one table
    cell_from_cfg reads the config by."""
    from attnbench.cell import OPTIONAL_SHAPE, SCHEDULE_FIELDS, STORED, Cell
    from attnbench.sweep.cells import CELL_KEYS, cell_from_cfg

    (job,), _ = expand_jobs([])
    assert cell_from_cfg(job) == Cell("vanilla", n=512)
    fields = set(STORED) - {"attention", "k", "device"}  # every part's, one level
    handled = {"ceiling_bytes", "params", "quality", "model_only", "mode_settings"}
    handled |= {*OPTIONAL_SHAPE, *SCHEDULE_FIELDS}  # a model group may omit them
    assert fields - handled == set(CELL_KEYS)  # a new Cell field is read from the config too
