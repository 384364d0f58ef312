"""Sweeps of thousands of cells: the start-up and the per-cell store work must not
grow with the sweep. Nothing here times anything: the work is counted (Hydra composes, bytes
the store reads), so the tests hold on a loaded machine. The figures are in docs/running.md
("Large sweeps").

* ``expand_jobs`` composes once per distinct choice of config groups, not once per job, and
  gives exactly the configs Hydra's own compose gives job by job (checked here against it,
  errors included, on sweeps that exercise each kind of override).
* ``RunStore.done()`` is an index: a cell reads only the rows appended since the last one,
  whatever the size of the run, and still sees rewrites, edits and half-written lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnbench import store_read
from attnbench.store import CorruptLine, RunStore, read_rows
from attnbench.sweep import config as sweep_config
from attnbench.sweep.compose import compose_each
from attnbench.sweep.config import (
    CONFIG_MODULE,
    expand_jobs,
    prevalidate,
    register_user_options,
)
from attnbench.sweep.hydra_api import split_sweep
from tests.compose_once import each_composed_once, files_read_once

ROW = json.loads(
    (Path(__file__).parents[1] / "results/reference/table3-v100_16gb-cpu/cells.jsonl")
    .read_text()
    .splitlines()[0]
)


# --- the start-up: compose once per choice of groups, the same configs --------------------


@pytest.fixture(scope="module", autouse=True)
def _files_read_once() -> Iterator[None]:
    """Hydra reads each config file once for the module: hundreds of composes below, each of
    which Hydra still builds from the files' contents itself (tests/compose_once.py)."""
    with files_read_once():
        yield


def _both(overrides: list[str], config_dir: Path | None = None) -> tuple[Any, Any]:
    """compose_each's configs and Hydra's, job by job (or the error each raised)."""
    search = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir else []
    register_user_options()
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        jobs = split_sweep(parser.parse_overrides(overrides))

        def outcome(make: Any) -> Any:
            try:
                return [(OmegaConf.to_container(c), OmegaConf.is_struct(c)) for c in make()]
            except Exception as e:
                return f"{type(e).__name__}: {e}"

        fast = outcome(lambda: compose_each(compose, parser, "config", jobs, search))
        slow = outcome(lambda: [compose("config", overrides=[*j, *search]) for j in jobs])
    return fast, slow


@pytest.mark.parametrize(
    "overrides",
    [
        ["+sweep=smoke", "attention=vanilla,linformer,performer", "n=64,128", "k=16"],
        ["+sweep=smoke,table3", "attention=vanilla,linformer", "n=64,4096"],
        ["attention=vanilla,linformer", "n=range(16,24)", "k=8", "model=tiny", "ceiling=1GB"],
        ["model=tiny,base", "model.layers=1,2", "attention=linformer", "attention.params.k=3,4"],
        ["n=1,2", "timing={min_repeats: 3}", "timing.min_repeats=4,5"],  # a dict, then a key
        ["n=1,2", "model={layers: 3}", "ceiling='1GB',null", "run=a,b"],
        ["n=1,2", "k=${n}", "out_dir=${sweep_name}x"],  # interpolations stay unresolved
        ["+sweep=smoke", "hydra/launcher=joblib", "hydra.sweeper.max_batch_size=5", "n=1,2"],
        ["n=1,2", "++foo=3"],  # composed job by job
        ["n=1,2", "+foo=3,4"],
        # Hydra's own errors, from the same job
        ["attention=linformer,vanilla", "attention.params.sharing=kv"],
        ["n=1,2", "~k"],
        ["n=1,2", "nope=3"],
        ["n=1,2", "model=tiny,nope"],
        ["n=1,2", "hydra.launcher.n_jobs=2"],
    ],
)
def test_composing_once_per_choice_of_groups_gives_hydras_configs(overrides: list[str]) -> None:
    fast, slow = _both(overrides)
    assert fast == slow


def _job_by_job(compose: Any, parser: Any, name: str, jobs: list, search: list) -> list:
    return [compose(name, overrides=[*job, *search]) for job in jobs]


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (Path(__file__).parents[1] / "conf/sweep").glob("*.yaml"))
)
def test_every_shipped_sweep_expands_as_hydra_composes_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job of the sweep, with n set on the command line (over the sweep's own n), both
    ways. One n: a second one doubles Hydra's job-by-job composes and changes no kind of
    override; two only where the sweep's own params leave one job (which compose_each
    composes as Hydra does, without its shortcut). The two expansions share what they both
    compose (the command's own config, with Hydra's node)."""

    def plain(jobs: list) -> list:
        return [(OmegaConf.to_container(c), OmegaConf.is_struct(c)) for c in jobs]

    with each_composed_once():
        args = [f"+sweep={name}", "n=512"]
        fast, _ = expand_jobs(args)
        if len(fast) == 1:
            args = [f"+sweep={name}", "n=512,1024"]
            fast, _ = expand_jobs(args)
        monkeypatch.setattr(sweep_config, "compose_each", _job_by_job)
        slow, _ = expand_jobs(args)
    assert len(fast) > 1 and plain(fast) == plain(slow)


def test_a_users_config_dir_groups_and_options(tmp_path: Path) -> None:
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention/mine.yaml").write_text("name: linformer\nparams:\n  sharing: kv\n")
    (tmp_path / "mygroup").mkdir()
    for option in "ab":
        (tmp_path / f"mygroup/{option}.yaml").write_text(f"x: {option}\n")
    for overrides in (
        ["n=1,2", "attention=mine,vanilla"],
        ["n=1,2", "+mygroup=a,b"],
        ["n=1,2", "mygroup=a,b"],  # a group not in the defaults: Hydra's error
    ):
        fast, slow = _both(overrides, tmp_path)
        assert fast == slow, overrides


def test_a_thousand_jobs_compose_a_handful_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = hydra.compose

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("overrides"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hydra, "compose", counted)
    args = ["attention=vanilla,linformer", "n=range(16,516)", "k=8", "model=tiny", "dtype=fp32"]
    jobs, multirun = expand_jobs(args, multirun=True)
    assert multirun and len(jobs) == 1000
    assert [(j.attention.name, j.n) for j in jobs[:2]] == [("vanilla", 16), ("vanilla", 17)]
    assert (jobs[-1].attention.name, jobs[-1].n, jobs[-1].k) == ("linformer", 515, 8)
    assert len(calls) <= 4  # the command, job 0 in full, one per attention (was 1 001)


def test_every_cell_of_a_large_sweep_is_still_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    base = ["-m", "attention=vanilla,linformer", "k=8", "model=tiny", "dtype=fp32", "ceiling=1GB"]
    plan = prevalidate([*base, "n=range(16,216)"])
    assert len(plan) == 400  # every n > k=8: nothing left out, every cell its own key
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 1, got 0$"):
        prevalidate([*base, "n=16,32,0,64"])  # one bad job among many
    assert not any(tmp_path.iterdir())


# --- the store: an index of stored keys, not a re-read per cell ---------------------------


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes every index look-up reads."""
    reads: list[int] = []
    real = store_read._read_from

    def read_from(f: Any, offset: int) -> bytes:
        data = real(f, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(store_read, "_read_from", read_from)
    return reads


def _run_of(path: Path, rows: int) -> RunStore:
    path.mkdir()
    with open(path / "cells.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({**ROW, "key": f"stored-{i:05d}"}) + "\n")
    return RunStore(path)


def _per_cell_bytes(run: Path, counted_reads: list[int], cells: int = 20) -> list[int]:
    """What done() + append() read for each new cell, a fresh RunStore each (as job.py)."""
    RunStore(run).done()  # the sweep's first look-up reads the run once
    per_cell = []
    for i in range(cells):
        counted_reads.clear()
        store = RunStore(run)
        assert f"new-{i}" not in store.done()
        assert store.append({**ROW, "key": f"new-{i}"})
        per_cell.append(sum(counted_reads))
    return per_cell


def test_the_store_reads_the_same_per_cell_at_10_and_5000_rows(
    tmp_path: Path, counted_reads: list[int]
) -> None:
    small = _per_cell_bytes(_run_of(tmp_path / "small", 10).dir, counted_reads)
    large = _per_cell_bytes(_run_of(tmp_path / "large", 5000).dir, counted_reads)
    line = len(json.dumps({**ROW, "key": "new-10"})) + 1
    assert large == small  # flat: nothing depends on the rows already stored
    assert max(large) <= 3 * line + 100  # the previous cell's row, and the last row twice (to
    # know the file is the one indexed): three lines, at any size
    keys = {r["key"] for r in read_rows(tmp_path / "large/cells.jsonl")}
    assert len(keys) == 5020 and RunStore(tmp_path / "large").done() == keys


def test_the_index_sees_rewrites_edits_and_half_lines(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for key in "abc":
        store.append({"key": key})
    assert store.done() == {"a", "b", "c"}
    assert store.append({"key": "b", "v": 2}, replace=True)  # rewritten: a new file
    assert store.done() == {"a", "b", "c"}
    assert [r["key"] for r in read_rows(store.cells)] == ["a", "c", "b"]
    store.cells.write_text('{"key": "x"}\n{"key": "y"}\n{"key": "z"}\n')  # edited in place
    assert store.done() == {"x", "y", "z"}
    with open(store.cells, "a") as f:  # a writer killed mid-line: a whole row, no newline
        f.write('{"key": "w"}')
    assert store.done() == {"x", "y", "z", "w"}  # as read_rows(strict=False) reads it
    with open(store.cells, "a") as f:
        f.write('\n{"key": "half')
    assert store.done() == {"x", "y", "z", "w"}
    store.cells.write_text('{"key": "x"}\n')  # cut short
    assert store.done() == {"x"}
    store.cells.unlink()
    assert store.done() == set()


def test_a_corrupt_line_is_named_by_its_number_however_it_is_read(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.append({"key": "a"})
    store.append({"key": "b"})
    assert store.done() == {"a", "b"}  # lines 1 and 2 indexed
    with open(store.cells, "a") as f:
        f.write('{"key": "c"}\ngarbage\n{"key": "d"}\n')
    for _ in range(2):  # raised again on each look-up, as a full read raises it
        with pytest.raises(CorruptLine, match=r"cells.jsonl:4: not a JSON row"):
            store.done()


def test_an_append_cuts_a_half_line_reading_only_the_end(tmp_path: Path) -> None:
    store = _run_of(tmp_path / "run", 50)
    size = store.cells.stat().st_size
    with open(store.cells, "a") as f:
        f.write('{"key": "killed", "v"')
    assert store.append({"key": "next"})
    rows = read_rows(store.cells)
    assert len(rows) == 51 and rows[-1] == {"key": "next"}
    assert store.cells.stat().st_size == size + len('{"key": "next"}\n')
    only_half = RunStore(tmp_path / "half")
    only_half.dir.mkdir()
    only_half.cells.write_text('{"key": "ki')  # no newline at all: the whole file goes
    assert only_half.append({"key": "a"}) and read_rows(only_half.cells) == [{"key": "a"}]
