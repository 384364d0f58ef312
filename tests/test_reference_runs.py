"""The committed reference runs agree with the code that makes them.

A sample of each run's modeled figures — the max batch, the modeled peak, a decoder's state,
the FLOPs; MQAR's context memory — is made again from the row's own stored cell, on meta
tensors and without timing (``model_only``), and compared with the stored row. A change to
the memory model, a mechanism or the encoder that moves a modeled figure fails here, naming
the run and the cell, until the run is made again and its report with it
(``bash scripts/make_reports.sh``); ``test_docs.py`` and ``test_doc_figures.py`` then hold
the docs to the reports. Timings are measurements, not functions of the code, and are not
made again; nor are the trained quality figures, or a compiled cell's profiled peak.

``python -m tests.test_reference_runs`` lists every row that moved, in every run (minutes).
``python -m tests.test_reference_runs --write RUN ...`` rewrites those rows' modeled memory
figures in place and keeps every measured field, for cells that cannot be timed again on a
quiet machine (:func:`rewrite`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnbench.cell import Cell
from attnbench.cell_key import cell_of, key, stored_cell, stored_key
from attnbench.row import Row, read
from attnbench.store import CELLS
from tests.test_docs import ROOT

REFERENCE = ROOT / "results" / "reference"
RUNS = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
# a row's figures that are functions of its cell and the code (no clock, no training)
MODELED = ("max_batch", "predicted_max_batch", "batch", "peak_bytes", "state_bytes",
           "allocated_max_batch", "peak_reserved_bytes", "fragmentation", "allocator")  # fmt: skip
COUNTED = ("flops", "flops_backward", "flops_dense")
# the runs whose rows are trained: no modeled figure but MQAR's context memory
TRAINED = {"approx-cpu-cpu", "listops-cpu-cpu", "listops_seeds-cpu-cpu", "spectrum-cpu-cpu"}


def rows(run: str) -> list[Row]:
    return read(REFERENCE / run / "cells.jsonl")


def modeled(row: Row) -> bool:
    """A cost row whose memory the model gave (a compiled cell's is the profiler's)."""
    return row.task in (None, "cost") and row.memory_source == "modeled"


def figures(row: Row, *, full: bool = False) -> dict[str, Any]:
    """What a row says that the code alone decides: its key (the one a resume finds it by,
    :func:`attnbench.cell_key.stored_key`), status and modeled figures. A row stored before
    the allocator's replay (``allocator`` null) reads as what it was, allocation-only: its
    max batch is held to the allocation-only one made now, and its state's bytes (``full``:
    every figure, as :func:`rewrite` makes them anew)."""
    names = ("status", *COUNTED, *(MODELED if modeled(row) else ()))
    if modeled(row) and row.allocator is None and not full:
        names = ("status", *COUNTED, "state_bytes")
    out = {"key": stored_key(row.to_dict())}
    out |= {name: getattr(row, name, None) for name in names}
    if modeled(row) and row.allocator is None and not full:
        out["allocated_max_batch"] = row.max_batch
    if row.task == "mqar":
        out |= {f: row.quality[f] for f in ("context_elements", "context_bytes")}
    return out


def remade(row: Row, *, full: bool = False) -> dict[str, Any]:
    """:func:`figures` of the row the code makes now of the stored row's cell (its key
    too: the cell read back is the cell that was run)."""
    from attnbench.runner import run_cell

    cell = cell_of(row.cell)  # as run, its ceiling resolved; as a sweep makes it now:
    made = {"key": key(*stored_cell(row.to_dict(), row.key_version or 1))}
    if row.task == "mqar":
        return {**figures(row), **made, **_context(cell)}
    again = run_cell(dataclasses.replace(cell, model_only=True))
    return {**{name: getattr(again, name, None) for name in figures(row, full=full)}, **made}


def _context(cell: Cell) -> dict[str, int]:
    """MQAR's context memory, from the model the task trains (its weights are not used)."""
    from attnbench.quality import recall

    s = dict(cell.task.settings)
    shape = {f: getattr(cell.model, f) for f in ("layers", "d_model", "n_heads", "d_ff")}
    params = {**cell.mechanism_params(), "causal": recall.causal(cell.attention)}
    net = recall._model(cell.attention, s["vocab_size"], cell.n, s["short_conv"], shape, params)()
    elements, nbytes = recall.context_memory(net, cell.n)
    return {"context_elements": elements, "context_bytes": nbytes}


def moved(
    of: list[Row], *, full: bool = False
) -> Iterator[tuple[Row, dict[str, Any], dict[str, Any]]]:
    """(row, stored, made now) for each measured row of ``of`` whose figures moved."""
    for r in of:
        was = figures(r, full=full)
        if r.status in ("ok", "oom") and (again := remade(r, full=full)) != was:
            yield r, was, again


def sample(run: str) -> list[Row]:
    """Two rows of ``run`` (one of a run of training steps, each about three forwards), each
    of another mechanism, the cheapest to make again first (fewer layers, a fixed batch
    before a searched one, shorter n): a few seconds in all. Any row sees a change to the
    encoder, the workload or the memory model; a mechanism's own memory is held to the
    profiler in ``test_memory_model.py``."""
    measured = [r for r in rows(run) if r.status in ("ok", "oom")]
    size = 1 if all(r.mode == "train" for r in measured) else 2
    order = {a: i for i, a in reversed(list(enumerate(r.attention for r in measured)))}

    def cost(r: Row) -> tuple:
        return (r.model["layers"], r.batch_asked == "max", r.n, r.k or 0, order[r.attention])

    picked: dict[str, Row] = {}
    for r in sorted(measured, key=cost):
        if len(picked) < size:
            picked.setdefault(r.attention, r)
    return list(picked.values())


def test_every_reference_run_is_sampled_or_trained() -> None:
    """A new reference run with modeled figures is sampled here, not left out in silence."""
    for run in RUNS:
        if run in TRAINED:
            assert not any(modeled(r) or r.task == "mqar" for r in rows(run)), run
        else:
            assert sample(run), run


@pytest.mark.parametrize("run", sorted(set(RUNS) - TRAINED))
def test_modeled_figures_are_the_codes(run: str) -> None:
    stale = [(f"{r.attention} {r.params} n={r.n} k={r.k} {r.mode}", was, now)
             for r, was, now in moved(sample(run))]  # fmt: skip
    assert not stale, f"{run}: stored ≠ made now (make the run again): {stale}"


# the runs a real resume is tried on: the paper's grid (keys the same under every rule), and
# those whose keys moved with KEY_VERSION 2 (a workload's settings at their default, a
# compile mode, a quality task's settings, the cpu preset's ceiling); serving's own is left to
# its smaller twins (serving_mix, serving_mixers), its 362 cells take a minute to plan
RESUMED = ("table3-v100_16gb-cpu", "table3_train-v100_16gb-cpu", "packed-v100_16gb-cpu",
           "serving_mixers-v100_16gb-cpu", "compiled-v100_16gb-cpu", "recall-cpu-cpu")  # fmt: skip


@pytest.mark.parametrize("run", RESUMED)
def test_a_committed_run_resumes_under_todays_keys(run: str, tmp_path: Path) -> None:
    """Every row of a committed run is found by a cell that the commands which stored it
    plan today (``prevalidate``, as ``attnbench run`` composes and keys its jobs): a resume
    measures none of them again, whatever rule keyed them when they were stored. The keys
    that moved since must be among them, or this would not test the migration."""
    from attnbench.store import RunStore
    from attnbench.sweep.config import prevalidate

    stored = RunStore(REFERENCE / run, rekey=stored_key).rows()
    planned: set[str] = set()
    for line in (REFERENCE / run / "commands.jsonl").read_text().splitlines():
        argv = json.loads(line)["argv"]
        if argv[:1] == ["python"]:  # a rewrite of modeled figures: it planned no cell
            continue
        argv = [a for a in argv if not a.startswith(("out_dir=", "rerun="))]
        planned |= {k for _, k in prevalidate([*argv, f"out_dir={tmp_path}"])}
    lost = [(r["attention"], r["mode"], r["n"]) for r in stored if r["key"] not in planned]
    assert not lost, f"{run}: stored rows no cell plans today (a resume measures again): {lost}"
    if run != "table3-v100_16gb-cpu":
        raw = {
            json.loads(line)["key"] for line in (REFERENCE / run / CELLS).read_text().splitlines()
        }
        assert raw - planned, f"{run}: no stored key moved; pick a run that tests the migration"


def rewrite(run: str) -> int:
    """Rewrite in place the modeled memory figures (:data:`MODELED`) of every row of ``run``
    that the code now models otherwise, keeping every measured field: a CPU times a cell at
    its own batch (``time_batch``), whatever the modeled one, so its time stands. The
    command is recorded in the run's ``commands.jsonl`` with the revision. A row whose key,
    status or FLOPs moved is refused (its time or its derived rates would be wrong): make
    that cell again with ``rerun=true``. Returns the rows rewritten."""
    from attnbench.env import git_revision

    path = REFERENCE / run / "cells.jsonl"
    lines = path.read_text().splitlines()
    changes = {}
    for r, was, now in moved(rows(run), full=True):
        if any(was[f] != now[f] for f in ("key", "status", *COUNTED)):
            raise SystemExit(f"{run}: {r.key}: key, status or FLOPs moved; make it again")
        changes[r.key] = {f: now[f] for f in MODELED if f in was and was[f] != now[f]}
    out = []
    for line in lines:
        data = json.loads(line)
        out.append(json.dumps({**data, **changes.get(data["key"], {})}, default=str))
    path.write_text("\n".join(out) + "\n")
    argv = ["python", "-m", "tests.test_reference_runs", "--write", run]
    note = {"invocation": f"{os.getpid()}-{uuid.uuid4().hex}", "time": time.time(), "argv": argv}
    note |= {"rewrote": len(changes), "git_revision": git_revision()}
    with open(REFERENCE / run / "commands.jsonl", "a") as f:
        f.write(json.dumps(note) + "\n")
    return len(changes)


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    for run in sys.argv[2:]:
        print(run, "rows rewritten:", rewrite(run))
elif __name__ == "__main__":
    for run in sorted(set(RUNS) - TRAINED):
        for r, was, now in moved(rows(run)):
            print(run, r.key, r.attention, r.n, r.k, r.params, r.mode, r.batch_asked)
            print("  stored", {k: v for k, v in was.items() if now.get(k) != v})
            print("  now   ", {k: v for k, v in now.items() if was.get(k) != v})
        print(run, "compared", file=sys.stderr)
