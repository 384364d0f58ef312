"""Five extensions, each from a file of its own under tests/toys/, loaded together as plugins
(``$ATTNBENCH_PLUGINS``) the way a user adds them without editing attnbench: a quality task
(``toy_task``), a row field (``toy_field``), a report section with its document
(``toy_section``), a mechanism with a decode form (``toy_decoder``) and a workload with a
setting of its own (``toy_workload``). One real ``attnbench run`` (a decode cell and a cell of
the toy workload: the plugins loaded by a fresh process), then a quality cell and ``attnbench
report`` in this process, the plugins loaded by its first look at its registries as a fresh
process's is; each toy's own behaviour is tested in-process by its own test file."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore

from attnbench import registry, workload
from attnbench.quality import tasks
from attnbench.report import outline
from attnbench.row import fields as row_fields
from attnbench.store import read_rows
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
TOYS = ("toy_task", "toy_field", "toy_section", "toy_decoder", "toy_workload")
PLUGINS = ",".join(f"tests.toys.{t}" for t in TOYS)
TINY = ("n=64", "batch=1", "device=cpu", "dtype=fp32", "model=tiny", "progress=false")


@contextmanager
def registries_kept() -> Iterator[None]:
    """Every registry a plugin adds to, and the Hydra options of its mechanisms and tasks,
    as they were before, afterwards: the rest of the suite sees the built-ins only."""
    from attnbench.report import sections  # noqa: F401  (its built-ins in what is kept)

    saved = [
        (d, dict(d))
        for d in (
            registry._REGISTRY, tasks.REGISTRY, row_fields.EXTRA, row_fields.DERIVE,
            outline._SECTIONS, outline._DOCUMENTS, workload._WORKLOADS,
        )
    ]  # fmt: skip
    repo = ConfigStore.instance().repo
    options = {group: dict(repo.get(group, {})) for group in ("attention", "task")}
    try:
        yield
    finally:
        for d, before in saved:
            d.clear()
            d.update(before)
        for group, before in options.items():
            if group in repo:
                repo[group].clear()
                repo[group].update(before)


@pytest.fixture
def plugins_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``$ATTNBENCH_PLUGINS`` names the toys, not yet loaded in this process; after the
    test every registry they add to is as it was (:func:`registries_kept`)."""
    monkeypatch.setenv(registry.PLUGIN_ENV, PLUGINS)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    for toy in TOYS:
        sys.modules.pop(f"tests.toys.{toy}", None)
    with registries_kept():
        yield
    for toy in TOYS:
        sys.modules.pop(f"tests.toys.{toy}", None)


def test_the_toy_extensions_run_and_report_from_their_own_files(
    tmp_path: Path, plugins_here: None, cli_in_process
) -> None:
    env = {
        "ATTNBENCH_PLUGINS": PLUGINS,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    quick = ("timing.min_seconds=0", "timing.min_repeats=2", "report=false")
    cost = ("-m", "mode=decode,toy_halves", "+split=1", "attention=toy_mean", "decode_tokens=4")
    out = run_cli("run", *cost, *quick, *TINY, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    # the baseline of the workload's ratio tables, in this process
    baseline = ("mode=toy_halves", "+split=1", "attention=vanilla")
    out = cli_in_process("run", *baseline, *quick, *TINY, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    task = ("attention=toy_mean", "task=toy_gain", "+quality.toy_gain.scale=3", "report=false")
    out = cli_in_process("run", *task, *TINY, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "results" / "single" / "cpu-cpu"
    rows = {(r["attention"], r["mode"]): r for r in read_rows(run / "cells.jsonl")}
    served, halves = rows["toy_mean", "decode"], rows["toy_mean", "toy_halves"]
    scored = rows["toy_mean", "inference"]
    # the mechanism decodes: 2 layers × 4 heads × (16 + 1) fp32 sums of state per sequence
    assert (served["attention"], served["mode"], served["status"]) == ("toy_mean", "decode", "ok")
    assert served["params"] == {"causal": True} and served["state_bytes"] == 544
    # the row field, derived from what was measured, and null where nothing was timed
    assert served["toy_seqs_per_s"] == pytest.approx(1 / served["time_per_seq_s"])
    assert scored["toy_seqs_per_s"] is None
    # the workload: its setting a row field (null in other workloads' rows), its two parts
    # timed, adding up to the whole step sample by sample
    assert (halves["mode"], halves["status"], halves["split"]) == ("toy_halves", "ok", 1), halves
    assert served["split"] is None and scored["split"] is None
    first, second = (halves["time_parts"][p]["samples_s"] for p in ("first", "second"))
    for a, b, whole in zip(first, second, halves["time_samples_s"], strict=True):
        assert a + b == pytest.approx(whole)
    assert halves["memory_source"] == "modeled" and halves["peak_bytes"] > 0
    # the task: its setting given on the command line, its figure in the row's quality
    assert scored["task"] == "toy_gain" and scored["status"] == "ok", scored
    assert scored["cell"]["quality"] == [["scale", 3]] and scored["quality"]["gain"] > 0

    out = cli_in_process("report", str(run), "--no-plots", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "toy.md, toy.tex" in out.stdout
    toy = (run / "report" / "toy.md").read_text()
    assert "**Rows per mechanism (toy)**" in toy and "| mechanism | rows | ok | modes |" in toy
    assert "| toy_mean | 3 | 3 | decode, toy_gain, toy_halves |" in toy
    assert "toy_mean" in (run / "report" / "serving.md").read_text()
    # the workload's rows, against vanilla's of the same setting, captioned by its label
    table3 = (run / "report" / "table3.md").read_text()
    assert "halves(split=1) (the paper has no such table)" in table3
    assert list(json.loads((run / "report" / "report.json").read_text()))[-1] == "toy_census"
