"""MQAR over a layer schedule (task=mqar with ``model.schedule``): the refusal lifted for
mqar and kept for the other quality tasks, the recall model's layers the schedule's in order
and trained causally, its context memory its layers' summed (counted by hand), its report
row a configuration of its own beside the pure models, and the task end to end through the
CLI. The pure model's training is tests/test_recall.py's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from attnbench.attention.gated_deltanet import GatedDeltaNet
from attnbench.attention.vanilla import VanillaAttention
from attnbench.cell import Cell
from attnbench.plan import validate
from attnbench.quality import recall
from attnbench.report import quality_plots, recall_setups
from attnbench.report import recall as recall_report
from attnbench.row import Row
from attnbench.schedule import layers_of
from attnbench.store import read_rows
from tests.test_recall import CPU, TINY, TINY_CLI
from tests.test_report_recall import _row, _rows

N, D, H = 32, 16, 2  # TINY's n, d_model, n_heads
MIXER = {"mixer": {"attention": "gated_deltanet"}}
SCHEDULE = {"schedule": "mixer, attention", "kinds": MIXER}
# by hand: Gated DeltaNet's state per head d_h x d_h (h·(d/h)², the model's heads) and its
# short convolution's window over q, k and v, (conv - 1)·3d with conv 4; vanilla's K and V
GDN = H * (D // H) ** 2 + (4 - 1) * 3 * D
VANILLA = 2 * N * D


def _cell(task: str, **shape: object) -> Cell:
    return Cell.of(
        "vanilla", N, task=task, dtype="fp32", device="cpu", batch=1, layers=2, d_model=D,
        n_heads=H, d_ff=32, **shape,
    )  # fmt: skip


def test_mqar_takes_a_schedule_the_other_tasks_refuse_it_and_head_dim_stays_refused() -> None:
    res = validate(_cell("mqar", **SCHEDULE))
    assert [k.attention for k in layers_of(res.cell, res.params)] == ["gated_deltanet", "vanilla"]
    for task in ("approx", "spectrum", "listops"):
        says = rf"^model\.schedule: task={task} trains a model of one mechanism; .*task=mqar"
        with pytest.raises(ValueError, match=says):
            validate(_cell(task, **SCHEDULE))
    with pytest.raises(ValueError, match=r"^model\.head_dim: task=mqar trains heads of d_model"):
        validate(_cell("mqar", head_dim=4))


def test_the_recall_model_is_the_schedule_in_order_trained_causally() -> None:
    res = validate(_cell("mqar", **SCHEDULE))
    schedule = layers_of(res.cell, res.params)
    assert "causal" not in dict(schedule[0].params)  # the cell sets none for a kind to inherit
    r = recall.train("vanilla", res.params, schedule=schedule, **{**TINY, "lrs": [1e-3]})
    attns = [layer.attn for layer in r["model"].encoder.layers]
    assert [type(a) for a in attns] == [GatedDeltaNet, VanillaAttention]
    assert all(a.cfg.causal for a in attns) and r["causal"] is True
    assert len(r["model"].short_convs) == 2  # the task's convolution before each layer
    with pytest.raises(ValueError, match=r"^schedule: must be one layer per model layer"):
        recall.train("vanilla", {}, schedule=schedule[:1], **TINY)


def test_a_schedules_context_memory_is_its_layers_summed_by_hand() -> None:
    res = validate(_cell("mqar", **SCHEDULE))
    r = recall.train("vanilla", res.params, schedule=layers_of(res.cell, res.params),
                     **{**TINY, "lrs": [1e-3]})  # fmt: skip
    encoder = r["model"].encoder
    assert encoder.layer_context_elements(N) == [GDN, VANILLA]
    assert encoder.context_elements(N) == GDN + VANILLA
    # per layer, as every row's: the sum over the two layers
    assert r["context_elements"] == (GDN + VANILLA) // 2 and (GDN + VANILLA) % 2 == 0
    assert r["context_bytes"] == 4 * r["context_elements"]


def test_the_task_over_a_schedule_end_to_end(tmp_path: Path, cli_in_process) -> None:
    out = cli_in_process(
        "run", "task=mqar", "attention=vanilla", "model.schedule='mixer, attention'",
        "+model.kinds.mixer.attention=gated_deltanet", "model.n_heads=2", "sweep_name=rc",
        "report=false", *TINY_CLI, *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/rc/*/cells.jsonl")
    (row,) = [Row.from_dict(d) for d in read_rows(cells)]
    assert row.status == "ok" and row.task == "mqar", row.error
    assert row.model["schedule"] == "mixer, attention; mixer=gated_deltanet()"
    assert row.quality["causal"] is True
    assert row.quality["context_elements"] == (GDN + VANILLA) // 2
    assert recall_setups.mechanism(row) == "gated_deltanet+vanilla"  # the report's name


def _hybrid(pairs: int, acc: float) -> Row:
    """A task=mqar row of the hybrid as stored: its model the setup's with the canonical
    schedule, its cell with the pattern and the kinds."""
    r = _row("vanilla", pairs, acc, ctx=5000)
    model = {**r.model, "schedule": "mixer, attention; mixer=gated_deltanet(conv=4)"}
    kinds = {"mixer": {"attention": "gated_deltanet", "params": {"conv": 4}}}
    cell = {**r.cell, "layers": 2, "schedule": "mixer, attention", "kinds": kinds}
    return dataclasses.replace(r, model=model, cell=cell)


LABEL = "gated_deltanet (conv=4)+vanilla"  # its layers in order, each with its parameters


def test_the_hybrid_is_a_configuration_beside_the_pure_models() -> None:
    rows = [*_rows(), _hybrid(4, 0.5), _hybrid(16, 0.25)]
    (setup,) = recall_setups.setups(rows)
    assert LABEL in setup.configs and "vanilla" in setup.configs
    (grid,) = [g for g in recall_report.accuracy_tables(rows)]
    body = {line[0]: line[1:] for line in grid.body}
    assert body[LABEL] == ["causal", "50.0 %", "-", "25.0 %"]
    assert "schedule" not in grid.notes[0]  # the setup's model, not the hybrid's
    (cost,) = recall_report.cost_tables(rows)
    assert {line[0]: line[-1] for line in cost.body}[LABEL] == "5,000"
    assert any("sum of its layers' context memory" in note for note in cost.notes)
    main, _ = quality_plots.mqar_pareto(rows)
    ax = main.figure.axes[0]
    lines = {c.get_label(): c.lines[0] for c in ax.containers}
    lines.update((line.get_label(), line) for line in ax.get_lines())
    assert lines[LABEL].get_xydata().tolist() == [[4 * 5000, 25.0]]
    assert lines[LABEL].get_marker() == "D" and lines["vanilla"].get_marker() == "o"
