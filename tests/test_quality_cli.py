"""Quality tasks through ``attnbench run`` end to end: rows in the store, the report's tables
and figures, and bad input refused in one line with nothing written (issue #13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnbench.quality import tasks
from attnbench.report.quality import _front, pareto_points
from attnbench.row import Row
from attnbench.store import read_rows
from tests.conftest import run_cli

CONFIG = Path(__file__).parent.parent / "conf/config.yaml"

CPU = ("device=cpu", "dtype=fp32", "batch=1", "progress=false")
TINY_LISTOPS = (
    "model=listops",
    "model.d_model=32",
    "model.d_ff=64",
    "quality.listops.steps=6",
    "quality.listops.batch=8",
    "quality.listops.train_examples=64",
    "quality.listops.test_examples=32",
    "quality.listops.eval_every=3",
    "quality.listops.max_depth=4",
    "quality.listops.warmup=2",
)


def _rows(tmp: Path, sweep: str) -> list[Row]:
    (cells,) = tmp.glob(f"results/{sweep}/*/cells.jsonl")
    return [Row.from_dict(r) for r in read_rows(cells)]


def test_approx_sweep_rows_and_report(tmp_path: Path) -> None:
    out = run_cli(
        "run", "-m", "task=approx", "attention=vanilla,performer,linear", "n=64", "k=8,32",
        "model=tiny", "sweep_name=ap", "quality.approx.seeds=1", *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = _rows(tmp_path, "ap")
    # vanilla and linear have no budget: one cell each, not one per k
    got = sorted((r.attention, r.k) for r in rows)
    assert got == [("linear", None), ("performer", 8), ("performer", 32), ("vanilla", None)]
    q = {(r.attention, r.k): r.quality for r in rows}
    assert all(r.task == "approx" and r.status == "ok" for r in rows)
    assert q[("vanilla", None)]["rel_frobenius"] < 1e-5  # exact: no error
    assert q[("performer", 32)]["rel_frobenius"] < q[("performer", 8)]["rel_frobenius"]
    assert 0 < q[("linear", None)]["rel_frobenius"] < 2
    report = next(tmp_path.glob("results/ap/*/report/quality.md")).read_text()
    assert "Approximation error on the same weights, n=64, random inputs" in report
    assert "random projection" in report  # the footnote says what Linformer's figure is
    assert "| uniform attention (baseline) |" in report  # what every error is read beside
    assert 0 < q[("performer", 8)]["uniform_rel_frobenius"] < 1
    assert "time ratio" not in report  # no cost rows, no cost tables
    assert (next(tmp_path.glob("results/ap/*/report/plots")) / "approx-random-n64.png").is_file()


def test_listops_and_spectrum_cells(tmp_path: Path, cli_in_process) -> None:
    """The three runs in this process (cli.main, as the command line calls it): a quality
    task's real process is test_approx_sweep_rows_and_report's. The spectrum's and the
    approximation's runs train the vanilla model again (deterministic on the CPU), once for
    both: trained once per process, as in a sweep."""
    out = cli_in_process(
        "run", "-m", "task=listops", "attention=vanilla,local", "n=32", "k=8",
        "sweep_name=lo", *TINY_LISTOPS, *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = _rows(tmp_path, "lo")
    assert sorted(r.attention for r in rows) == ["local", "vanilla"]
    for r in rows:
        q = r.quality
        assert r.status == "ok" and 0 <= q["test_accuracy"] <= 1 and 0 < q["majority_accuracy"]
        assert q["steps_per_s"] > 0 and q["peak_bytes"] > 0
        assert [s for s, _ in q["curve"]] == [3, 6]
    report = next(tmp_path.glob("results/lo/*/report/quality.md")).read_text()
    assert "ListOps accuracy" in report and "36.37 % (Transformer)" in report
    assert "15.82 % (Local Attention)" in report
    plots = next(tmp_path.glob("results/lo/*/report/plots"))
    assert (plots / "pareto-listops.png").is_file()

    # the spectrum, on the trained model's hidden states (trained again here: deterministic)
    out = cli_in_process(
        "run", "-m", "task=spectrum", "n=32", "sweep_name=sp", "quality.spectrum.inputs=listops",
        "quality.spectrum.index=8", *TINY_LISTOPS, *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (row,) = _rows(tmp_path, "sp")
    q = row.quality
    assert q["inputs"] == "listops" and len(q["cumulative"]) == 2 and len(q["at_index"][0]) == 4
    assert all(abs(curve[-1] - 1) < 1e-9 for curve in q["cumulative"])
    # the very model task=listops trained (deterministic on the CPU): the same test accuracy
    trained = {r.attention: r.quality["test_accuracy"] for r in rows}["vanilla"]
    assert q["model_accuracy"] == trained
    report = next(tmp_path.glob("results/sp/*/report/quality.md")).read_text()
    assert "Spectrum of P, n=32, listops model" in report
    at_8 = [line.split("|")[2].strip() for line in report.splitlines() if line.startswith("| 2 |")]
    assert at_8 == [f"{q['cumulative'][1][7]:.3f}"]  # layer 2's curve at the index
    assert f"test accuracy: {100 * trained:.2f} %" in report

    # the approximation error on the same trained model's hidden states, layer by layer
    out = cli_in_process(
        "run", "-m", "task=approx", "attention=vanilla,performer", "n=32", "k=8",
        "sweep_name=at", "quality.approx.inputs=listops", *TINY_LISTOPS, *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    q = {r.attention: r.quality for r in _rows(tmp_path, "at")}
    assert q["vanilla"]["inputs"] == "listops" and len(q["vanilla"]["layers"]) == 2
    assert q["vanilla"]["rel_frobenius"] < 1e-5 < q["performer"]["rel_frobenius"]
    report = next(tmp_path.glob("results/at/*/report/quality.md")).read_text()
    assert "n=32, listops inputs" in report and "trained by task=listops" in report
    assert f"test accuracy: {100 * trained:.2f} %" in report


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("task=aprox",), "task: unknown option 'aprox'; allowed: approx, cost, "),
        (("task=approx", "attention=linear", "k=16"), "k: attention=linear has no budget"),
        (("task=approx", "attention=reformer"), "attention: reformer has no exact counterpart"),
        (("task=listops", "n=8"), "n: must be at least 16 for listops"),
        (("task=spectrum", "attention=performer"), "task=spectrum reads softmax's own P"),
        (("task=spectrum", "n=64"), "quality.spectrum.index: must be at most n=64, got 128"),
        (("task=approx", "quality.approx.inputs=real"), "quality.approx.inputs: must be one of"),
        (("task=approx", "mode=train"), "mode: task=approx measures a quality"),
        # the training settings are checked before anything runs, not stored as error rows
        (("task=listops", "quality.listops.steps=0"), "quality.listops.steps: must be an"),
        (("task=listops", "quality.listops.lr=0"), "quality.listops.lr: must be a number > 0"),
        (
            ("task=listops", "quality.listops.max_depth=2"),
            "quality.listops.max_depth: must be at least 3 at max_args=10",
        ),
        (
            ("task=approx", "quality.approx.inputs=listops", "quality.listops.warmup=-1"),
            "quality.listops.warmup: must be an integer >= 0, got -1",
        ),
        (
            ("task=spectrum", "quality.spectrum.inputs=listops", "+quality.listops.step=9"),
            "quality.listops.step: unknown key; did you mean quality.listops.steps?",
        ),
        # MQAR's data (Zoology's constraints, at the cell's n) and training, issue #24
        (("task=mqar", "n=63"), "n: must be even (Zoology's constraint), got 63"),
        (("task=mqar", "n=64", "quality.mqar.num_kv_pairs=17"), "num_kv_pairs: must be at most"),
        (("task=mqar", "n=64", "quality.mqar.vocab_size=64"), "quality.mqar.vocab_size: must"),
        (("task=mqar", "n=64", "quality.mqar.power_a=0"), "quality.mqar.power_a: must be a"),
        (("task=mqar", "n=64", "quality.mqar.short_conv=-1"), "quality.mqar.short_conv: must"),
        # what the run could not do in time or memory, refused before anything runs
        (
            ("task=mqar", "n=64", "quality.mqar.short_conv=1000000"),
            "quality.mqar.short_conv: must be at most n=64",
        ),
        (
            ("task=mqar", "n=64", "quality.mqar.vocab_size=1000000000000"),
            "quality.mqar.vocab_size: the training needs about 3.48e+16 bytes",
        ),
        (("task=mqar", "n=64", "quality.mqar.lrs=0.001"), "quality.mqar.lrs: must be a list"),
        (
            ("task=mqar", "n=64", "+quality.mqar.lr=0.001"),
            "quality.mqar.lr: unknown key; did you mean quality.mqar.lrs?",
        ),
    ],
)
def test_bad_quality_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, args: tuple, needle: str, cli_in_process
) -> None:
    # in this process (the same cli.main, refusing before anything runs), not seconds of
    # imports each: a refusal of `attnbench run` in a fresh process is test_train.py's
    out = cli_in_process("run", *args, "model=tiny", "device=cpu", "dtype=fp32", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and out.stderr.count("\n") == 1 and not out.stdout
    assert not any(tmp_path.iterdir()), "nothing may be written"


def test_pareto_front_and_points_pair_quality_with_cost() -> None:
    assert _front([(1, 0.5), (2, 0.4), (3, 0.45), (4, 0.1)], better_low=True) == [
        (1, 0.5),
        (2, 0.4),
        (4, 0.1),
    ]
    assert _front([(1, 0.2), (2, 0.1), (3, 0.3)], better_low=False) == [(1, 0.2), (3, 0.3)]
    base = {"n": 64, "dtype": "fp32", "device": "cpu", "k": 8}
    k16 = {**base, "k": 16}
    rows = [
        Row(attention="performer", **base, time_per_seq_s=0.5),
        Row(attention="performer", **base, task="approx", quality={"rel_frobenius": 0.3}),
        Row(attention="performer", **k16, task="approx", quality={"rel_frobenius": 0.1}),
    ]
    # only the k=8 quality row has a cost row beside it
    assert pareto_points(rows) == [("performer", 0.5, 0.3, "approx")]
    assert json.dumps([r.to_dict() for r in rows])  # rows with quality serialise


@pytest.mark.parametrize("sweep", ["approx", "spectrum"])
def test_trained_model_sweeps_take_the_listops_model_shape(sweep: str) -> None:
    """``+sweep=approx|spectrum model=listops`` must measure the model ``+sweep=listops``
    trains: the command line's model group wins over the sweep file's own choice (a sweep
    that set ``model.*`` values instead silently kept d_model 256, one layer)."""
    from attnbench.sweep.config import expand_jobs

    extra = ["model=listops", "n=256", f"quality.{sweep}.inputs=listops"]
    jobs, multirun = expand_jobs([f"+sweep={sweep}", *extra])
    assert multirun and jobs
    for job in jobs:
        assert (job.model.layers, job.model.d_model, job.model.d_ff) == (2, 64, 128)
        assert job.n == 256 and job.quality[sweep].inputs == "listops"
    plain, _ = expand_jobs([f"+sweep={sweep}"])
    want = (1, 256) if sweep == "approx" else (12, 768)
    assert {(j.model.layers, j.model.d_model) for j in plain} == {want}


def test_listops_over_seeds_is_tabulated_with_its_spread() -> None:
    from attnbench.report.quality import listops_seeds_table, listops_table

    def row(attention: str, seed: int, accuracy: float, steps: int = 1) -> Row:
        q = {"test_accuracy": accuracy, "majority_accuracy": 0.2, "steps_per_s": 1.0}
        q |= {"peak_bytes": 2**20, "curve": [[1, accuracy]]}
        cell = {"quality": [["seed", seed], ["steps", steps]]}
        return Row(attention=attention, n=64, dtype="fp32", device="cpu", task="listops",
                   quality=q, cell=cell)  # fmt: skip

    one = [row("vanilla", 0, 0.3), row("local", 0, 0.25)]
    assert listops_seeds_table(one) is None  # one seed each: no spread to show
    assert "seed" not in listops_table(one).head
    rows = [*one, row("vanilla", 1, 0.34), row("vanilla", 2, 0.32)]
    grid = listops_seeds_table(rows)
    assert [b[:5] for b in grid.body] == [
        ["vanilla", "0, 1, 2", "32.00 %", "2.00", "30.00 – 34.00 %"]
    ]
    table = listops_table(rows)
    assert table.head[1] == "seed" and [b[1] for b in table.body] == ["0", "0", "1", "2"]

    # another setup of the same mechanism is another experiment, never pooled; a repeated
    # row (the same setup and seed, e.g. a run given twice with --also) counts once
    longer = [row("vanilla", 0, 0.5, steps=9), row("vanilla", 1, 0.7, steps=9)]
    grid = listops_seeds_table([*rows, *longer, row("vanilla", 1, 0.34)])
    assert [b[:3] for b in grid.body] == [
        ["vanilla (steps=1)", "0, 1, 2", "32.00 %"],
        ["vanilla (steps=9)", "0, 1", "60.00 %"],
    ]
    assert "1 repeated row(s)" in grid.notes[-1]
    names = [b[0] for b in listops_table([*rows, *longer]).body]
    assert names == ["vanilla (steps=1)", "local", *["vanilla (steps=1)"] * 2,
                     *["vanilla (steps=9)"] * 2]  # fmt: skip


def test_the_config_and_the_library_take_the_registry_defaults() -> None:
    """conf/config.yaml's ``quality`` block (Hydra's defaults) is the registry's, and the
    classifier's own defaults (a call without a cell) are the listops task's."""
    import inspect

    from omegaconf import OmegaConf

    from attnbench.quality import classify
    from attnbench.row.fields import TASKS

    config = OmegaConf.to_container(OmegaConf.load(CONFIG).quality)
    assert config == {name: task.defaults() for name, task in tasks.REGISTRY.items()}
    assert TASKS == ("cost", "approx", "spectrum", "listops", "mqar") == ("cost", *tasks.REGISTRY)
    listops = tasks.REGISTRY["listops"].defaults()
    assert {k: classify.DEFAULTS[k] for k in listops if k != "seed"} == {
        k: v for k, v in listops.items() if k != "seed"
    }
    assert inspect.signature(classify.train).parameters["seed"].default == listops["seed"]
    for task in tasks.REGISTRY.values():
        assert {f.kind for f in task.figures} <= set(tasks._FIGURES), task.name


def test_the_quality_tasks_import_no_cell() -> None:
    """cell.py imports the registry to validate a quality cell: the registry must not need
    the cell back (no import circle, not even a lazy one)."""
    import subprocess
    import sys

    code = (
        "import sys, attnbench.quality.tasks, attnbench.row.fields;"
        " assert 'attnbench.cell' not in sys.modules, 'cell imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
