"""``mode=decode`` (serving): the memory model against independent instruments, the max
batch's serving rule, FLOPs per token against FlopCounterMode, and the CLI end to end.

The incremental forms themselves (exactness, padding, state bytes of one layer) are held to
their contract in ``tests/test_decode_contract.py``; this file tests the workload built on
them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench.cell import Cell
from attnbench.cell_key import cell_of, key, stored_key
from attnbench.cell_rules import complete
from attnbench.measure.flops import count_flops
from attnbench.measure.memory import module_bytes, profiled_peak, rounded, tracked_peak
from attnbench.plan import validate
from attnbench.runner import MemoryModel, build, make_input, run_cell
from attnbench.store import read_rows
from attnbench.workload import get as get_workload
from attnbench.workload.decode import DecodeWork, context
from tests.conftest import run_cli, runnable_here

DECODERS = [m for m in runnable_here() if attnbench.info(m).cannot_decode is None]
BUDGETS = {"window": 16, "nb_features": 32}


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cell(name: str, **kw: object) -> Cell:
    budget = attnbench.info(name).budget
    k = BUDGETS[budget] if budget else None
    base = dict(
        attention=name, n=40, k=k, dtype="fp32", device="cpu", layers=2, d_model=32,
        n_heads=4, d_ff=64, mode="decode", params=(("causal", True),), batch=3,
    )  # fmt: skip
    names = ("decode_tokens", "state_dtype", "prefill_chunk", "contexts", "lengths")
    settings = {"decode_tokens": 6, "prefill_chunk": 16}
    settings.update({name: kw.pop(name) for name in names if name in kw})
    return complete(Cell.of(**{**base, **kw}, mode_settings=settings))


def _gqa(name: str) -> list[int | None]:
    return [None, 2] if attnbench.info(name).gqa else [None]


CASES = [(name, kv) for name in DECODERS for kv in _gqa(name)]
MIX = (60, 200, 17, 140)  # prompts of a mix: the caches for 200 (n = 256), left-padded to it


@pytest.mark.parametrize(
    ("name", "kv_heads", "lengths"),
    [(*case, None) for case in CASES]
    + [pytest.param(m, None, MIX, id=f"{m}-mix") for m in DECODERS],
)
def test_the_modeled_serving_peak_equals_the_profilers(
    name: str, kv_heads: int | None, lengths: tuple[int, ...] | None
) -> None:
    """The serving scenario at b = 3 (three states resident, one prompt prefilled into its
    slot in chunks, one step of all three) on real CPU tensors, read by the CPU profiler,
    against the memory model's figure on meta: within 1 %. And the model's shortcut (the
    prefill traced at its peak chunks, the step apart) equals tracing one whole call.

    At n = 256, d_model 128 the residual is 0 for every mechanism but sdpa, whose CPU
    kernel allocates scratch inside the one op the model keeps whole: 0.28 % (0.47 % with
    kv_heads=2) here, 2–4 % at toy sizes (n = 40, d_model 32). With a mix of contexts
    (``lengths``) the step reads three of the four sequences' caches through their left
    padding's mask, which the model traces too."""
    mix = {"contexts": "drawn", "lengths": lengths} if lengths else {}
    c = _cell(name, kv_heads=kv_heads, n=256, d_model=128, d_ff=256, prefill_chunk=64, **mix)
    res = validate(c)
    c = res.cell  # planned: its workload's settings complete
    memory = MemoryModel(c, res)
    model = build(c, res, "cpu", torch.float32)
    x = make_input(3, c, "cpu", torch.float32)
    work = get_workload(c.mode).work(model, c, x, "cpu", gpu=False)
    with torch.inference_mode():
        work()  # the first call pays for lazy initialisation
        real = profiled_peak(work)
    modeled = memory.peak(3) - memory.fixed - rounded(x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)
    meta_work = DecodeWork(memory.model, c, make_input(3, c, "meta", torch.float32), "meta")
    whole = tracked_peak(meta_work, 0)
    assert meta_work.modeled_peak(0) == whole


@pytest.mark.parametrize(("name", "kv_heads"), CASES)
def test_state_bytes_are_what_the_profiler_and_the_meta_tracker_see(
    name: str, kv_heads: int | None
) -> None:
    """One formula per mechanism (``state_bytes``), the row's figure, against the bytes an
    empty state of one sequence allocates: the CPU profiler's count and the tracker's on
    meta, within 1 %, or within the allocator's 512-byte rounding of each tensor for a
    state smaller than 512 × 100 bytes a tensor (a ring of 16 keys, linear's S and z)."""
    c = _cell(name, kv_heads=kv_heads, n=1000, d_model=128, d_ff=256)
    row = run_cell(Cell.of(**{**c.to_dict(), "model_only": True}))
    cap = c.n + c.settings["decode_tokens"]
    model = build(c, validate(c), "cpu", torch.float32)
    assert row.state_bytes == model.state_bytes(cap, 4)
    real = profiled_peak(lambda: model.new_state(1, cap, torch.float32, torch.device("cpu")))
    meta = build(c, validate(c), "meta", torch.float32)
    tracked = tracked_peak(lambda: meta.new_state(1, cap, torch.float32, torch.device("meta")), 0)
    states = model.new_state(1, cap, torch.float32, torch.device("cpu"))
    tensors = sum(isinstance(v, torch.Tensor) for s in states for v in vars(s).values())
    for other in (real, tracked):
        assert abs(row.state_bytes - other) <= max(0.01 * other, 512 * tensors), (
            row.state_bytes,
            other,
        )


@pytest.mark.parametrize("name", DECODERS)
def test_flops_per_token_are_flopcountermodes(name: str) -> None:
    """The row's FLOPs (per generated token, at the mean context of the timed steps) equal
    FlopCounterMode's count of one step of the whole model at that context."""
    c = _cell(name)
    res = validate(c)
    c = res.cell  # planned: its workload's settings complete
    model = build(c, res, "cpu", torch.float32)
    flops, backward = get_workload(c.mode).flops(model, c)
    n = context(c)
    states = model.new_state(1, n, torch.float32, torch.device("cpu"))
    x = torch.randn(1, n, c.model.d_model)
    with torch.inference_mode():
        model.extend(x[:, : n - 1], states)
        counted = count_flops(lambda: model.extend(x[:, n - 1 :], states))
    assert backward is None and flops == counted, (flops, counted)


def test_the_max_batch_is_serving_s_kv_caches_fall_like_one_over_n_gqa_lifts_them() -> None:
    """Under one ceiling: vanilla's max batch roughly halves when n doubles (its cache
    dominates), grouped-query heads lift it by about n_heads / kv_heads, and linear's does
    not move with n (its state is fixed)."""

    def max_batch(name: str, n: int, kv: int | None = None) -> int:
        c = _cell(name, n=n, batch="max", model_only=True, ceiling_bytes=256 << 20, kv_heads=kv)
        row = run_cell(c)
        assert row.status == "ok", row.reason
        return row.max_batch

    v1, v2 = max_batch("vanilla", 2048), max_batch("vanilla", 4096)
    assert 1.8 < v1 / v2 < 2.1, (v1, v2)
    g = max_batch("vanilla", 4096, kv=1)
    assert 2.5 < g / v2 <= 4.0, (g, v2)  # 4 heads over 1: the cache is 4× smaller
    l1, l2 = max_batch("linear", 2048), max_batch("linear", 4096)
    assert abs(l1 - l2) <= 0.05 * l1, (l1, l2)


def test_a_mix_of_contexts_is_served_from_caches_allocated_for_its_longest() -> None:
    """contexts=drawn: every cache is allocated for the longest prompt (a static cache), so
    vanilla's max batch over prompts of 512 and 2048 is about its max batch over 2048s (less
    the padding mask's transient), while a sequence's own cache is on average (512 + 2048)
    / 2 + decode_tokens long: the share the padding takes is counted by hand here. Linear's
    state is the same whatever the mix. A cell of every prompt n keeps its key whatever its
    (unused) draw settings say."""
    from attnbench.measure import presets

    def row(name: str, n: int, **mix: object) -> object:
        c = _cell(name, n=n, batch="max", model_only=True, ceiling_bytes=256 << 20, **mix)
        r = run_cell(c)
        assert r.status == "ok", r.reason
        return r

    mix = {"contexts": "drawn", "lengths": (512, 2048)}
    static = row("vanilla", 4096, contexts="drawn", lengths=(2048,))
    mixed = row("vanilla", 4096, **mix)
    assert mixed.state_bytes == static.state_bytes
    # the padding's mask costs the step a masked copy of its scores (b × heads × L): at
    # d_head 8 that is 1/16 of a layer's cache, and 3 % fewer fit (232 against 239)
    assert 0.95 * static.max_batch <= mixed.max_batch < static.max_batch
    tokens = 6  # _cell's decode_tokens
    own = ((512 + tokens) + (2048 + tokens)) / 2 / (2048 + tokens)
    assert mixed.prompts["state_padding_share"] == pytest.approx(1 - own, abs=1e-3)
    assert row("linear", 4096, **mix).max_batch == row("linear", 4096).max_batch
    plain = _cell("vanilla")
    other = Cell.of(**{**plain.to_dict(), "mode_settings": {**plain.settings, "length_seed": 7}})
    assert key(plain, presets.load("cpu")) == key(other, presets.load("cpu"))
    drawn = Cell.of(**{**plain.to_dict(), "mode_settings": {**plain.settings, "contexts": "drawn"}})
    assert key(drawn, presets.load("cpu")) != key(plain, presets.load("cpu"))


def test_a_cell_times_its_steps_and_its_prefill_apart() -> None:
    """Each of decode_tokens steps after warm-up is a sample; the prefill has its own
    figure; tokens per second follow from the step's median and the batch."""
    row = run_cell(_cell("vanilla", min_seconds=0.0, min_repeats=2, batch=2, decode_tokens=8))
    assert row.status == "ok", row.reason
    d = row.decode
    dropped = len((row.contention or {}).get("dropped_s") or [])  # contended steps, not kept
    assert row.repeats + dropped == 6 and d["steps"] == 6  # 8 tokens, 2 not counted
    assert d["filled_by"] == "prefill" and d["prefill_s"] > 0
    assert d["tokens_per_s"] == pytest.approx(2 / row.time_median_s)
    assert row.time_per_seq_s == pytest.approx(row.time_median_s / 2)
    model = build(_cell("vanilla"), validate(_cell("vanilla")), "cpu", torch.float32)
    weights = module_bytes(model)
    assert d["read_bytes"] == 2 * model.state_bytes(d["context"], 4) + weights


def test_a_cpu_that_cannot_prefill_in_budget_times_steps_over_random_states(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the CPU's GEMM rate, which decides it, injected: measured, a quiet 2-core run read
    # enough (> 136 GFLOP/s) to prefill in the budget, and the rule was not exercised
    from attnbench.measure import gemm

    monkeypatch.setattr(gemm, "cpu_matmul_rate", lambda: gemm.Rate(5e10, 5e10, False))
    c = _cell(
        "linear",
        n=16384,
        d_model=256,
        d_ff=512,
        batch=1,
        decode_tokens=4,
        time_budget_s=0.5,
        min_seconds=0.0,
    )  # fmt: skip: ~4 prefills of 17 GFLOP each take 1.4 s at 50 GFLOP/s; 4 steps do not
    row = run_cell(c)
    assert row.status == "ok" and row.decode["filled_by"] == "random", row.reason
    dropped = len((row.contention or {}).get("dropped_s") or [])
    assert row.decode["prefill_s"] is None and row.repeats + dropped == 2


def _run(tmp_path: Path, *args: str, here: Callable[..., object] | None = None) -> object:
    """``attnbench run`` of a decode cell: a fresh process, or ``here`` (the
    ``cli_in_process`` fixture) for a refusal that needs none."""
    args = (
        "run", "mode=decode", "model=tiny", "device=cpu", "dtype=fp32", "progress=false",
        f"out_dir={tmp_path}", "timing.min_seconds=0", "timing.min_repeats=2", *args,
    )  # fmt: skip
    return run_cli(*args) if here is None else here(*args, cwd=tmp_path)


def test_decode_end_to_end_through_the_cli(tmp_path: Path, cli_in_process) -> None:
    """A real ``attnbench run``: one row per cell with the serving figures, kv_heads in the
    model and the label, a sweep leaving out what cannot decode; running it again measures
    nothing."""
    args = [
        "attention=vanilla,linear,linformer",
        "n=64",
        "batch=2",
        "decode_tokens=5",
        "k=16",
        "report=false",  # the rows are this test's; the serving report is test_report_serving's
        "-m",
    ]
    out = _run(tmp_path, *args)
    assert out.returncode == 0, out.stderr
    assert "1 combinations left out" in out.stderr and "linformer" in out.stderr
    rows = read_rows(next(tmp_path.rglob("cells.jsonl")))  # flat: the spec's fields too
    assert sorted(r["attention"] for r in rows) == ["linear", "vanilla"]
    for r in rows:
        assert r["mode"] == "decode" and r["status"] == "ok" and r["params"]["causal"] is True
        assert r["decode_tokens"] == 5 and r["decode"]["steps"] == 3 and r["state_bytes"] > 0
    # the same command again, and a single cell, in this process (cli.main, as the command
    # line calls it): the sweep above is the real process
    again = _run(tmp_path, *args, here=cli_in_process)
    assert again.returncode == 0 and len(list(next(tmp_path.rglob("cells.jsonl")).open())) == 2
    # a context too long for one sequence under the ceiling: a sweep leaves it out beside the
    # cells that fit (here stored already: nothing to measure), a single cell is refused
    long = ("attention=vanilla", "batch=2", "decode_tokens=5", "ceiling=1GB", "report=false")
    swept = _run(tmp_path, *long, "n=64,1048576", "-m", here=cli_in_process)
    assert swept.returncode == 0 and "1 combinations left out" in swept.stderr, swept.stderr
    assert "n: a context of n=1048576 plus decode_tokens=5 needs" in swept.stderr
    single = _run(tmp_path, *long, "n=1048576", here=cli_in_process)
    assert single.returncode == 2 and single.stderr.count("\n") == 1, single.stderr
    gqa = _run(
        tmp_path, "attention=sdpa", "n=64", "batch=1", "decode_tokens=4", "model.kv_heads=1",
        "report=false", here=cli_in_process,
    )  # fmt: skip
    assert gqa.returncode == 0, gqa.stderr
    last = read_rows(next(tmp_path.rglob("cells.jsonl")))[-1]
    assert last["model"]["kv_heads"] == 1
    mix = _run(
        tmp_path, "attention=vanilla", "n=64", "batch=3", "decode_tokens=4", "contexts=drawn",
        "lengths=[8,40,20]", "report=false", here=cli_in_process,
    )  # fmt: skip
    assert mix.returncode == 0 and "contexts 8..40 ×3" in mix.stdout, mix.stderr
    last = read_rows(next(tmp_path.rglob("cells.jsonl")))[-1]
    assert last["contexts"] == "drawn" and last["prompts"]["lengths"] == [8, 40, 20]
    assert last["decode"]["context"] > last["decode"]["own_context"]  # padding read too


BAD = [
    (["attention=linformer", "k=16"], "mode: attention=linformer cannot decode: has no causal"),
    (["attention=reformer"], "mode: attention=reformer cannot decode: has no honest"),
    (["decode_tokens=0"], "decode_tokens: must be an integer >= 1, got 0"),
    (["decode_tokens=1.5"], "decode_tokens: must be an integer >= 1, got 1.5"),
    # the run's own rule, before anything runs: the first 2 steps are warm-up, never timed
    (["decode_tokens=2"], "decode_tokens: must be an integer > 2 (the first 2 steps are warm"),
    (["model.kv_heads=3"], "kv_heads: must divide n_heads=4"),
    (["attention=linear", "model.kv_heads=2"], "kv_heads: attention=linear has no grouped"),
    (["state_dtype=fp64"], "state_dtype: must be one of"),
    (["prefill_chunk=-1"], "prefill_chunk: must be an integer >= 0, got -1"),
    (["n=40000000", "device=v100_16gb", "dtype=fp16"], "n: a context of n=40000000"),
    (["contexts=sometimes"], "contexts: must be one of n, drawn; got 'sometimes'"),
    (["contexts=drawn", "lengths=[0]"], "lengths[0]: must be an integer >= 1, got 0"),
    (["contexts=drawn", "lengths=[100]"], "lengths[0]: must be an integer in [1, 64]"),
    (["contexts=drawn", "lengths=[]"], "lengths: must be a list of at least one length"),
    (["contexts=drawn", "distribution=zipf"], "distribution: must be one of uniform"),
    (["contexts=drawn", "total_tokens=8"], "total_tokens: must be an integer >= 16"),
    (
        ["contexts=drawn", "lengths=[4,39000000]", "n=40000000", "device=v100_16gb", "dtype=fp16"],
        "lengths: the longest prompt, 39000000 tokens, plus decode_tokens",
    ),
]


@pytest.mark.parametrize(("args", "says"), BAD)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], says: str, cli_in_process
) -> None:
    # in this process (the same cli.main, refusing before anything runs), not seconds of
    # imports each: a refusal of `attnbench run` in a fresh process is test_train.py's
    attention = [] if any(a.startswith("attention=") for a in args) else ["attention=vanilla"]
    out = _run(tmp_path, *attention, "n=64", *args, here=cli_in_process)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert not list(tmp_path.rglob("cells.jsonl"))


def test_the_gpu_branch_driven_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA code path of a decode cell with the CPU standing in: each real probe is one
    whole serving scenario (b states, a prefill of every chunk, a step of all b) on real
    tensors under the tracker's ceiling, and must agree with the model's max batch, which
    traced only the prefill's peak chunks and the step apart."""
    from attnbench.measure.memory import Peak
    from attnbench.runner import run

    def fake_measured_peak(work, device, ceiling, grad=False):
        base = module_bytes(work.model) + rounded(work.x.nbytes)
        return Peak(tracked_peak(work, base, ceiling, grad=grad), "measured", None)

    monkeypatch.setattr(run, "GPU", "cpu")
    monkeypatch.setattr(run, "measured_peak_cuda", fake_measured_peak)
    for name, kv in (("vanilla", 2), ("local", None)):
        cell = _cell(
            name, kv_heads=kv, batch="max", device="a100_40gb", n=256, min_repeats=2,
            min_seconds=0.0, ceiling_bytes=(512 << 20) + (4 << 20),
        )  # fmt: skip
        plan = validate(cell)
        plan.on_gpu = True
        row = run_cell(cell, plan)
        assert row.status == "ok" and row.memory_source == "measured", row.reason
        assert row.max_batch == row.predicted_max_batch > 1 and row.model_error == 0
        assert row.time_batch == row.max_batch and row.decode["filled_by"] == "prefill"


@pytest.mark.parametrize("name", [m for m in DECODERS if attnbench.info(m).gqa])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_grouped_query_heads_in_the_forward_and_training_modes(name: str, mode: str) -> None:
    """kv_heads is a model key for every mode: the modeled peak of a forward and of a
    training step with grouped heads against the CPU profiler (within 1 %), fewer FLOPs
    than full heads (K and V project to fewer heads), and a cell of each mode is ok."""
    from attnbench.workload.train import train_step

    c = Cell.of(
        name, n=256, dtype="fp32", device="cpu", layers=2, d_model=128, n_heads=4, d_ff=256,
        mode=mode, kv_heads=1, min_seconds=0.0, min_repeats=2,
    )  # fmt: skip
    res = validate(c)
    c = res.cell  # planned: its workload's settings complete
    memory, model = MemoryModel(c, res), build(c, res, "cpu", torch.float32)
    x = make_input(2, c, "cpu", torch.float32)
    if mode == "train":
        step = train_step(model, c, x, "cpu", gpu=False)
        step()
        step()
        real = profiled_peak(step)
    else:
        with torch.inference_mode():
            model(x)
            real = profiled_peak(lambda: model(x))
    modeled = memory.peak(2) - memory.fixed - rounded(x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)
    row = run_cell(c)
    full = run_cell(Cell.of(**{**c.to_dict(), "kv_heads": None}))
    assert row.status == full.status == "ok", (row.reason, full.reason)
    assert row.flops < full.flops and row.model["kv_heads"] == 1


KEEPS_KEYS = [m for m in DECODERS if m in ("vanilla", "sdpa", "xformers", "local")]


@pytest.mark.parametrize("name", KEEPS_KEYS)
def test_marking_left_padding_is_what_a_left_padded_prefill_leaves(name: str) -> None:
    """The mix's shortcut (every slot the longest prompt's state, its first longest − own
    positions marked padding: ``pad_left``) against the real thing, a left-padded prefill
    with the key padding mask, on one layer (whose keys are the tokens' own projections, so
    that the real tokens' keys agree): the same flags, zeros in the same places, the same
    next step (float64). The ring of local (window 16) holds positions 4..19, some padded.

    A recurrent state keeps no positions: its ``pad_left`` marks nothing, and each slot
    holds the longest prompt's sums, which a step reads as it would its own."""
    lengths = (5, 20, 12)
    c = _cell(name, n=40, layers=1, dtype="fp32")
    model = build(c, validate(c), "cpu", torch.float64)
    pads = [max(lengths) - n for n in lengths]
    torch.manual_seed(3)
    x = torch.randn(3, max(lengths), c.model.d_model, dtype=torch.float64)
    step = torch.randn(3, 1, c.model.d_model, dtype=torch.float64)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(pads)[:, None]  # True: padding
    cpu = torch.device("cpu")
    with torch.inference_mode():
        real = model.new_state(3, 30, torch.float64, cpu)
        model.extend(x, real, mask)
        marked = model.new_state(3, 30, torch.float64, cpu)
        model.extend(x, marked)  # no mask: the padding's keys written as if real
        for state in marked:
            state.pad_left(pads)
        for a, b in zip(real, marked, strict=True):
            assert torch.equal(a.padded, b.padded) and a.has_padding and b.has_padding
            assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
        torch.testing.assert_close(
            model.extend(step, marked), model.extend(step, real), rtol=0, atol=1e-12
        )


def test_a_decode_row_stored_before_contexts_reads_as_every_prompt_n() -> None:
    """The serving reference run was stored before ``contexts`` and the draw were decode's
    settings: its rows read as every prompt n (the settings' defaults), so that they group
    with rows stored since, and its cells keep their keys (the run resumes)."""
    from attnbench.measure import presets
    from attnbench.row import read

    path = Path(__file__).parent.parent / "results/reference/serving-v100_16gb-cpu/cells.jsonl"
    assert '"contexts"' not in path.read_text()
    rows = list(read(path))
    assert {r.contexts for r in rows} == {"n"} and {r.length_seed for r in rows} == {0}
    preset = presets.load("v100_16gb")
    assert all(key(cell_of(r.cell), preset) == stored_key(r.to_dict()) for r in rows)
