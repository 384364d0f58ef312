"""``mode=packed`` and ``mode=packed_train``: one draw of documents in three layouts.

The layouts are held to each other (every real token's output is the same whether its
document was padded, packed or bucketed, float64), the modeled peak of each to the CPU
profiler within 1 % (forward and training step), the FLOPs each row records to the formulas
and to what the layout computes, and bad input to one line, exit 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnbench
from attnbench.cell import Cell
from attnbench.cell_rules import complete
from attnbench.measure.flops import count_flops
from attnbench.measure.memory import profiled_peak, rounded
from attnbench.plan import validate
from attnbench.runner import MemoryModel, build, make_input
from attnbench.store import read_rows
from attnbench.workload import get as get_workload
from attnbench.workload.packed import LAYOUTS, Layout, Plan, real_positions
from attnbench.workload.train import TRAIN
from tests.conftest import runnable_here

LENGTHS = (37, 100, 5, 64, 18)  # distinct, so that a bucketed batch's order is known
SHAPE = {"layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128}
CAUSAL = (("causal", True),)
MEMORY = [("sdpa", ()), ("linear", CAUSAL), ("local", ()), ("mamba2", CAUSAL)]


def _cell(attention: str, layout: str, params: tuple = (), train: bool = False, **kw) -> Cell:
    settings = {"layout": layout, "lengths": LENGTHS, "bucket_tokens": 160, **kw}
    return complete(Cell.of(
        attention, n=128, dtype="fp32", device="cpu", params=params,
        mode="packed_train" if train else "packed", mode_settings=settings, **SHAPE,
    ))  # fmt: skip


def _laid_out(plan: Plan, docs: list[torch.Tensor]) -> torch.Tensor:
    """One copy of the documents (each (l, d)) as the plan's input, padding zero."""
    d = docs[0].shape[-1]
    if plan.layout == "packed":
        return torch.cat(docs)[None]
    order = {n: i for i, n in enumerate(plan.lengths)}
    parts = []
    for batch in plan.batches:
        width = max(batch)
        part = torch.zeros(len(batch), width, d, dtype=docs[0].dtype)
        for r, n in enumerate(batch):
            part[r, :n] = docs[order[n]]
        parts.append(part.reshape(-1, d))
    flat = torch.cat(parts)
    if plan.layout == "padded":
        return flat.view(len(plan.lengths), max(plan.lengths), d)
    return flat[None]


def _by_document(plan: Plan, out: torch.Tensor) -> dict[int, torch.Tensor]:
    """The Layout's real outputs (R, d) split back into documents, keyed by length."""
    order = plan.lengths if plan.layout != "bucketed" else [n for b in plan.batches for n in b]
    return dict(zip(order, out.split(list(order)), strict=True))


@pytest.mark.parametrize(("attention", "params"), [("vanilla", ()), *MEMORY])
def test_every_layout_gives_each_real_token_the_same_output(attention: str, params: tuple) -> None:
    outs = {}
    docs = [torch.randn(n, SHAPE["d_model"], dtype=torch.float64) for n in LENGTHS]
    for layout in LAYOUTS:
        cell = _cell(attention, layout, params)
        res = validate(cell)
        cell = res.cell  # planned: its workload's settings complete
        model = build(cell, res, "cpu", torch.float64)
        plan = get_workload(cell.mode).plan(cell)
        with torch.inference_mode():
            outs[layout] = _by_document(plan, Layout(model, plan)(_laid_out(plan, docs)))
    for layout in ("padded", "bucketed"):
        for n in LENGTHS:
            torch.testing.assert_close(outs[layout][n], outs["packed"][n], atol=1e-10, rtol=1e-10)


def packers(names: list[str]) -> list[tuple[str, tuple, str, bool]]:
    """Every mechanism of ``names`` that packs, beyond :data:`MEMORY`'s (every layout), in
    the packed layout: forward and training step (where a CPU trains it) in its main form,
    causal where it has one (a mechanism without a causal form may have no ``causal``
    setting at all, as docs/mechanisms.md's example); a causal one also not causal, the forward
    (each document through its own sums), where it has that form. Not flex: its compiled
    CPU kernel keeps ~0.5 MB of scratch a call whatever the shape, which the fused stand-in
    on meta leaves out (28 % of this toy layer's peak, under 1 % of a base layer's:
    tests/test_memory_model.py); tests/test_flex.py holds its packed call's peak to its
    unpacked one's instead."""
    shown = {name for name, _ in MEMORY} | {"flex"}
    cases = []
    for name in names:
        info = attnbench.info(name)
        if info.cannot_pack or name in shown:
            continue
        trains = TRAIN.refuses(info) is None and TRAIN.refuses_on_cpu(info) is None
        main = CAUSAL if info.causal else ()
        cases += [(name, main, "packed", train) for train in (False, True)[: 1 + trains]]
        theirs_per_block = name in ("vanilla", "sdpa")
        if info.causal and info.causal_only is None and not theirs_per_block:
            cases.append((name, (("causal", False),), "packed", False))
    return cases


CASES = [
    (name, params, layout, train)
    for name, params in MEMORY
    for layout in LAYOUTS
    for train in (False, True)
] + packers(runnable_here())


@pytest.mark.parametrize(("attention", "params", "layout", "train"), CASES)
def test_modeled_peak_equals_the_profilers(
    attention: str, params: tuple, layout: str, train: bool
) -> None:
    """b = 2 copies of the draw: the meta model's peak above weights, input and (training)
    the optimizer's state, against the CPU profiler's of the same step; every layout for
    four mechanisms, the packed one for every other that packs."""
    cell = _cell(attention, layout, params, train=train)
    res = validate(cell)
    cell = res.cell  # planned: its workload's settings complete
    memory = MemoryModel(cell, res)
    model = build(cell, res, "cpu", torch.float32)
    x = make_input(2, cell, "cpu", torch.float32)
    work = get_workload(cell.mode).work(model, cell, x, "cpu", gpu=False)
    if train:
        work()  # the optimizer's state, as the model counts it (fixed)
        work()
        real = profiled_peak(work)
    else:
        with torch.inference_mode():
            work()
            real = profiled_peak(work)
    modeled = memory.peak(2) - memory.fixed - rounded(work.x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)


def test_the_rows_flops_are_the_layouts() -> None:
    """Per copy of the draw: padded is every document at the longest, bucketed each batch at
    its own longest, packed the documents alone (vanilla packs each document's block), so
    the padded layout's wasted share is 1 − Σ f(l) ÷ D·f(max) by hand."""
    for layout in LAYOUTS:
        cell = _cell("vanilla", layout)
        res = validate(cell)
        cell = res.cell  # planned: its workload's settings complete
        model = MemoryModel(cell, res).model
        desc = get_workload(cell.mode).describe(model, cell)["packed"]
        real = sum(model.flops(1, n) for n in LENGTHS)
        assert desc["flops_real"] == real
        want = {
            "padded": model.flops(len(LENGTHS), max(LENGTHS)),
            "packed": real,
            "bucketed": sum(
                model.flops(len(b), max(b)) for b in get_workload(cell.mode).plan(cell).batches
            ),
        }[layout]
        assert desc["flops_layout"] == want == get_workload(cell.mode).flops(model, cell)[0]
        assert desc["flops_wasted_share"] == pytest.approx(1 - real / want)
        assert desc["real_tokens"] == sum(LENGTHS) and desc["documents"] == len(LENGTHS)


def test_a_training_rows_backward_flops_are_what_its_step_computes() -> None:
    """packed_train, causal linear (one pass over the row packed): the backward FLOPs a row
    records are FlopCounterMode's count of the backward of the layout's forward, in every
    layout, for the whole 2-layer model."""
    for layout in LAYOUTS:
        cell = _cell("linear", layout, CAUSAL, train=True)
        model = build(cell, validate(cell), "cpu", torch.float32)
        plan = get_workload(cell.mode).plan(cell)
        x = torch.randn(plan.input_shape(1, SHAPE["d_model"]), requires_grad=True)
        loss = Layout(model, plan)(x).sum()
        assert count_flops(loss.backward) == get_workload(cell.mode).flops(model, cell)[1], layout


def test_real_positions_by_hand() -> None:
    got = real_positions(torch.tensor([2, 0, 3]), 4, 5)
    assert got.tolist() == [0, 1, 8, 9, 10]


BAD = [
    (("attention=linformer", "k=16"), "layout: linformer cannot pack: E and F project"),
    (("lengths=[3,0,5]",), "lengths[1]: must be"),
    (("lengths=[3,500]",), "lengths[1]: must be"),
    (("lengths=[]",), "lengths: must"),
    (("lengths=null", "distribution=zipf"), "distribution: must be one of"),
    (("lengths=null", "total_tokens=4", "length_min=16"), "total_tokens: "),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, cli_in_process, args: tuple[str, ...], message: str
) -> None:
    base = ("run", "mode=packed", "attention=sdpa", "n=128", "device=cpu", "dtype=fp32",
            "lengths=[30,50]", "model.layers=1", f"out_dir={tmp_path / 'runs'}")  # fmt: skip
    given = {a.split("=")[0] for a in args}
    argv = [a for a in base if a.split("=")[0] not in given] + list(args)
    proc = cli_in_process(*argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_packed_cell_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    """One real subprocess: a drawn batch, packed, timed on this CPU; the row holds the draw
    and the FLOPs the formulas give."""
    from tests.conftest import run_cli

    out = tmp_path / "runs"
    args = ("run", "mode=packed", "attention=mamba2", "causal=true",
            "n=256", "device=cpu", "dtype=fp32", "model.layers=1", "total_tokens=600",
            "length_mean=100", "length_seed=3", f"out_dir={out}", "timing.min_repeats=2",
            "timing.min_seconds=0")  # fmt: skip
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(next(out.rglob("cells.jsonl")))  # flat: the spec's fields too
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
    packed = rows[0]["packed"]
    assert packed["real_tokens"] == sum(packed["lengths"]) <= 600
    assert rows[0]["layout"] == "packed" and rows[0]["time_median_s"] > 0
