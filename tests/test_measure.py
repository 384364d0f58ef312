"""Measurement engine: modeled vs tracked memory, max-batch search, timing, cell validation."""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable

import pytest
import torch

import attnbench
from attnbench.cell import Cell, Part, Shape, TimingSpec
from attnbench.measure import presets
from attnbench.measure.memory import MemoryTracker, module_bytes, rounded, tracked_peak
from attnbench.measure.search import largest_fitting, solve_affine
from attnbench.measure.timing import time_forward
from attnbench.plan import label as plan_label
from attnbench.plan import validate
from attnbench.row import Row
from attnbench.runner import build, modeled_peak, run_cell
from tests.conftest import runnable_here

D, H = 64, 4
MiB = 1 << 20


def _params(name: str, k: int = 16) -> dict:
    budget = attnbench.info(name).budget
    return {budget: k} if budget else {}


def _model(name: str, n: int, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        model = attnbench.build_model(
            name, layers=2, d_model=D, n_heads=H, d_ff=128, max_seq_len=n, **_params(name)
        )
    return model.to(device).eval()


def _real_peak(model: torch.nn.Module, b: int, n: int, ceiling: int | None = None) -> int:
    x = torch.randn(b, n, D)
    return tracked_peak(lambda: model(x), module_bytes(model) + rounded(x.nbytes), ceiling)


@pytest.mark.parametrize("name", runnable_here())
@pytest.mark.parametrize(("n", "b"), [(64, 1), (256, 3), (200, 2)])
def test_modeled_peak_matches_tracked_cpu_peak(name: str, n: int, b: int) -> None:
    if attnbench.info(name).compiles:  # test_memory_model holds its model against the profiler
        pytest.skip(f"{name}: its compiled kernel cannot run under the tracker on real tensors")
    cell = Cell(
        name,
        n=n,
        dtype="fp32",
        device="cpu",
        model=Shape(layers=2, d_model=D, n_heads=H, d_ff=128),
        params=tuple(sorted(_params(name).items())),
    )
    modeled = modeled_peak(_model(name, n, "meta"), cell, b, overhead=0)
    real = _real_peak(_model(name, n), b, n)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)


def test_tracker_sees_the_quadratic_scores() -> None:
    """Vanilla's peak must grow by at least the (b, h, n, n) fp32 scores when n doubles."""
    b = 2
    small, large = (_real_peak(_model("vanilla", n), b, n) for n in (128, 256))
    assert large - small >= b * H * (256**2 - 128**2) * 4


def test_rounding_is_the_caching_allocators() -> None:
    assert [rounded(v) for v in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]


def test_max_batch_search_finds_the_exact_boundary_in_log_probes() -> None:
    n, ceiling = 128, 64 * MiB
    model = _model("vanilla", n)
    seen: list[int] = []

    def fits(b: int) -> bool:
        seen.append(b)
        try:
            _real_peak(model, b, n, ceiling)
            return True
        except torch.OutOfMemoryError:
            return False

    b, probes = largest_fitting(fits, guess=1)
    assert b > 8, "the ceiling should allow a real search"
    assert _real_peak(model, b, n) <= ceiling < _real_peak(model, b + 1, n)  # b fits, b+1 not
    assert probes == len(seen) <= 2 * math.ceil(math.log2(b + 1)) + 2
    # the model, started from an exact guess, confirms in two probes
    assert largest_fitting(fits, guess=b) == (b, 2)


def test_an_oom_in_the_middle_leaves_no_memory_behind() -> None:
    n = 128
    model = _model("vanilla", n)
    x = torch.randn(40, n, D)
    base = module_bytes(model) + rounded(x.nbytes)
    tracker = MemoryTracker(base=base, ceiling=base + 8 * MiB)
    with pytest.raises(torch.OutOfMemoryError), torch.inference_mode(), tracker:
        model(x)
    gc.collect()
    assert tracker.live == base and tracker.peak > base


def test_cpu_preset_search_agrees_with_model_under_a_ceiling() -> None:
    """run_cell on the cpu preset with a 64 MiB ceiling gives the boundary the tracker gives."""
    n, ceiling = 128, 64 * MiB
    row = run_cell(
        Cell(
            "vanilla",
            n=n,
            dtype="fp32",
            device="cpu",
            ceiling_bytes=ceiling,
            model=Shape(layers=2, d_model=D, n_heads=H, d_ff=128),
            timing=TimingSpec(min_repeats=1, min_seconds=0.0),
        )
    )
    model = _model("vanilla", n)
    b = row.max_batch
    assert row.status == "ok" and row.memory_source == "modeled"
    assert _real_peak(model, b, n) <= ceiling < _real_peak(model, b + 1, n)


def scheduler(monkeypatch: pytest.MonkeyPatch, contended: Callable[[int], bool]) -> None:
    """Injected scheduler readings for the timings taken in this process: the n-th window
    around a repeat (:class:`attnbench.measure.contention.Window`, from 0) reads a delay of
    0.5 (contended) where ``contended(n)``, else 0, whatever the machine is doing."""
    from attnbench.measure import contention

    windows = itertools.count()

    class Window:
        def __init__(self, sched: contention.Sched) -> None:
            self.n = next(windows)

        def close(self) -> contention.Reading:
            return contention.Reading(1e-4, 1e-4, 0.5 if contended(self.n) else 0.0)

    monkeypatch.setattr(contention, "Window", Window)


def test_timing_repeats_and_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    def matmul() -> torch.Tensor:
        return torch.randn(64, 64) @ torch.randn(64, 64)

    cpu = torch.device("cpu")
    # the bookkeeping, on injected scheduler readings: the same on a busy machine
    with monkeypatch.context() as m:
        scheduler(m, lambda n: False)  # a quiet CPU: the repeats asked for, no more
        t = time_forward(matmul, cpu, min_repeats=7, min_seconds=0.0, warmup=1)
        assert (
            t.repeats == 7 and t.method == "perf_counter" and t.threads == torch.get_num_threads()
        )
        assert min(t.samples) <= t.median <= max(t.samples) and t.iqr >= 0
        assert not t.busy and t.contention.contended == 0 and t.contention.dropped_s == ()
        scheduler(m, lambda n: n in (0, 2, 3))  # three contended repeats are taken again
        t = time_forward(matmul, cpu, min_repeats=7, min_seconds=0.0, warmup=1)
        assert t.repeats == 7 and not t.busy and t.contention.contended == 3
        assert len(t.contention.dropped_s) == 3  # kept beside the figure, not in it
        scheduler(m, lambda n: n != 1)  # re-sampling runs out of patience: busy, all kept
        t = time_forward(matmul, cpu, min_repeats=7, min_seconds=0.0, warmup=1, patience_s=0)
        assert t.repeats == 7 and t.busy and t.contention.contended == 6
        assert t.contention.why == "6 of 7 samples waited over 10% of their time for a CPU"
    # real readings: exactly the repeats asked for, unless the machine was too busy to give
    # them uncontended (then every repeat taken is kept and the figure says busy)
    t = time_forward(matmul, cpu, min_repeats=7, min_seconds=0.0, warmup=1)
    assert t.repeats == 7 if not t.busy else t.repeats >= 7, t
    assert t.method == "perf_counter" and t.threads == torch.get_num_threads()
    assert min(t.samples) <= t.median <= max(t.samples) and t.iqr >= 0
    long = time_forward(
        lambda: sum(range(20000)), torch.device("cpu"), min_repeats=2, min_seconds=0.05
    )
    assert long.repeats >= 2 and sum(long.samples) >= 0.05 - max(long.samples)


def test_row_without_a_gpu_is_modeled_and_timed_on_cpu() -> None:
    row = run_cell(
        Cell(
            "linformer",
            n=256,
            k=32,
            params=(("sharing", "layerwise"),),
            model=Shape(layers=2, d_model=D, n_heads=H, d_ff=128),
            timing=TimingSpec(min_repeats=2, min_seconds=0.0),
        )
    )
    for key in (
        "attention",
        "params",
        "n",
        "k",
        "dtype",
        "device",
        "ceiling_bytes",
        "status",
        "reason",
        "max_batch",
        "batch",
        "time_median_s",
        "time_iqr_s",
        "repeats",
        "time_per_seq_s",
        "peak_bytes",
        "memory_source",
        "flops",
        "flops_per_s",
        "pct_of_peak",
        "env",
    ):
        assert hasattr(row, key)
    if torch.cuda.is_available():
        pytest.skip("with CUDA the row is measured")
    assert row.status == "ok" and row.memory_source == "modeled"
    assert row.device == "v100_16gb" and row.max_batch > 1000
    assert row.peak_bytes <= row.ceiling_bytes
    assert (row.time_device, row.time_dtype, row.time_batch) == ("cpu", "fp32", 1)
    assert row.time_per_seq_s > 0 and row.repeats >= 2
    assert row.pct_of_peak is None  # a CPU time against a V100's peak would mean nothing
    assert row.flops == _model_flops(row)
    assert set(row.env) >= {"device_name", "torch", "cuda", "attnbench", "git_revision"}


def _model_flops(row: Row) -> int:
    with torch.device("meta"):
        model = attnbench.build_model(
            "linformer",
            layers=2,
            d_model=D,
            n_heads=H,
            d_ff=128,
            max_seq_len=row.n,
            k=row.k,
            sharing="layerwise",
        )
    return model.flops(1, row.n)


def test_oom_at_b1_and_over_budget_time_are_rows_with_reasons() -> None:
    row = run_cell(
        Cell(
            "vanilla",
            n=65536,
            timing=TimingSpec(min_repeats=1),
        )
    )
    assert row.status == "oom" and "b=1 does not fit" in row.reason
    row = run_cell(
        Cell(
            "vanilla",
            n=1024,
            timing=TimingSpec(time_budget_s=0.001),
        )
    )
    assert row.status == "ok" and row.reason.startswith("time skipped:")
    assert row.time_per_seq_s is None and row.max_batch > 0


def test_unavailable_mechanism_is_skipped_with_its_reason() -> None:
    why = attnbench.info("xformers").unavailable
    if why is None:
        pytest.skip("xformers can run here")
    row = run_cell(Cell("xformers", n=512))
    assert row.status == "skipped" and row.reason == why


@pytest.mark.parametrize(
    ("cell", "needle"),
    [
        (Cell("vanilla", n=512, batch=0), "batch: must be an integer >= 1, got 0"),
        (Cell("vanilla", n=512, batch="most"), "batch: must be 'max' or an integer >= 1"),
        (Cell("vanilla", n=0), "n: must be an integer >= 1, got 0"),
        (Cell("vanilla", n=512, ceiling_bytes=10**12), "ceiling: 1000000000000 bytes is above"),
        (Cell("vanilla", n=512, device="tpu_v9"), "device: unknown preset 'tpu_v9'; allowed:"),
        (
            Cell("vanilla", n=512, dtype="bf16"),
            "dtype: v100_16gb (Tesla V100-SXM2-16GB) cannot run bf16; allowed: fp32, fp16",
        ),
        (Cell("vanilla", n=512, dtype="fp8"), "dtype: must be one of fp32, fp16, bf16"),
        (Cell("linformer", n=512, k=1024), "k: must be at most n=512, got 1024"),
        (Cell("nope", n=512), "attention: unknown mechanism 'nope'"),
    ],
)
def test_bad_cells_raise_one_line_before_running(cell: Cell, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        run_cell(cell)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_presets_say_what_they_hold() -> None:
    assert {"v100_16gb", "a100_40gb", "a100_80gb", "h100_80gb", "h200_141gb", "cpu"} <= set(
        presets.names()
    )
    v100 = presets.load("v100_16gb")
    assert v100.total_bytes == 16160 * MiB and v100.usable_bytes < v100.total_bytes
    assert "bf16" not in v100.peak_flops and presets.load("a100_40gb").peak_flops["bf16"] > 0
    assert presets.load("cpu").total_bytes > 0 and validate(Cell("vanilla", n=8, device="cpu"))
    # the card's compute capability: which kernels its run allocates (cuda_layouts.py)
    assert [presets.load(p).capability for p in ("v100_16gb", "a100_40gb", "h100_80gb", "cpu")] \
        == [(7, 0), (8, 0), (9, 0), None]  # fmt: skip
    with pytest.raises(ValueError, match=r"^device.compute_capability: must be MAJOR.MINOR"):
        presets.from_dict(dict(name="x", gpu="X", total_bytes=1, overhead_bytes=0,
                               peak_flops=None, compute_capability="sm90"))  # fmt: skip


def test_views_of_existing_tensors_cost_nothing_and_new_ones_cost_their_bytes() -> None:
    x, w = torch.randn(4, 8, 16), torch.randn(16, 32)
    assert tracked_peak(lambda: (x[:, None], x.view(32, 16), w.t(), x.add_(0)), 0) == 0
    assert tracked_peak(lambda: x.clone(), 0) == rounded(x.nbytes)
    assert tracked_peak(lambda: x @ w, 0) == rounded(4 * 8 * 32 * 4)  # exactly the output


def test_timing_statistics_of_known_samples() -> None:
    from attnbench.measure.timing import Timing

    t = Timing((5.0, 1.0, 4.0, 2.0, 3.0), "perf_counter", 2)
    assert (t.median, t.iqr, t.repeats) == (3.0, 2.0, 5)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_the_gpu_branch_driven_on_cpu(monkeypatch, mode: str) -> None:
    """The CUDA code path with the CPU standing in: real probes are tracker forwards (or
    training steps) under the ceiling less the overhead, as set_per_process_memory_fraction
    would enforce it."""
    from attnbench.measure.memory import Peak
    from attnbench.runner import run

    def fake_measured_peak(work, device, ceiling, grad=False):
        # weights, what a first step left (the optimizer's state) and the input
        state = work.state_tensors()
        base = module_bytes(work.model) + sum(rounded(t.nbytes) for t in state)
        peak = tracked_peak(work, base + rounded(work.x.nbytes), ceiling, grad=grad)
        return Peak(peak, "measured", None)

    monkeypatch.setattr(run, "GPU", "cpu")
    monkeypatch.setattr(run, "measured_peak_cuda", fake_measured_peak)
    cell = Cell(
        "linformer",
        n=128,
        k=32,
        params=(("sharing", "layerwise"),),
        dtype="fp32",
        device="a100_40gb",
        ceiling_bytes=(64 << 20) + (512 << 20),
        workload=Part(mode),
        model=Shape(layers=2, d_model=D, n_heads=H, d_ff=128),
        timing=TimingSpec(min_repeats=2, min_seconds=0.0),
    )
    plan = validate(cell)
    plan.on_gpu = True
    row = run_cell(cell, plan)
    assert row.status == "ok" and row.memory_source == "measured", row.reason
    # the CPU's stand-in for a card caps live bytes (the tracker), not what an allocator
    # reserves: its probes find the allocation-only answer, from the replay's lower guess
    assert row.max_batch == row.allocated_max_batch > 1
    assert row.predicted_max_batch <= row.allocated_max_batch
    assert row.model_error == row.predicted_max_batch - row.max_batch
    assert row.time_batch == row.max_batch
    assert row.peak_bytes <= row.ceiling_bytes
    assert row.pct_of_peak is None  # this is not the preset's A100


@pytest.mark.parametrize(
    "cell",
    [
        Cell(
            "vanilla", n=18, model=Shape(layers=2, d_model=64, n_heads=4, d_ff=128), model_only=True
        ),
        Cell("vanilla", n=512, model_only=True),
        Cell("linformer", n=4096, k=256, model_only=True),
        Cell("sdpa", n=2048, dtype="bf16", device="h100_80gb", model_only=True),
    ],
    ids=lambda c: plan_label(c),
)
def test_affine_solve_finds_the_searchs_answer_in_four_meta_forwards(cell: Cell) -> None:
    """The model's max batch from :func:`solve_affine` is exactly the galloping search's
    answer, in at most four meta forwards (two to solve, two to confirm b and b + 1)."""
    res = validate(cell)
    cell = res.cell  # planned: its workload's settings complete
    meta = build(cell, res, "meta", torch.float16 if cell.dtype == "fp16" else torch.bfloat16)
    overhead = res.preset.overhead_bytes
    calls: list[int] = []
    peaks: dict[int, int] = {}  # a meta forward per b, whichever asks first

    def peak(b: int) -> int:
        calls.append(b)
        if b not in peaks:
            peaks[b] = modeled_peak(meta, cell, b, overhead)
        return peaks[b]

    b, evaluations = solve_affine(peak, res.ceiling, module_bytes(meta) + overhead)
    assert evaluations == len(calls) <= 4
    assert peak(b) <= res.ceiling < peak(b + 1)
    exact, _ = largest_fitting(lambda b: peak(b) <= res.ceiling, 1)
    assert b == exact


def test_affine_solve_falls_back_to_the_search_where_the_peak_is_not_affine() -> None:
    """A transient that dominates only at small b bends the peak; the answer stays exact."""

    def peak(b: int) -> int:
        return max(1000 + 10 * b, 5000 + b)

    b, evaluations = solve_affine(peak, ceiling=20_000, fixed=0)
    assert evaluations > 4  # it had to search
    assert b == 1900 and peak(b) <= 20_000 < peak(b + 1)
    assert solve_affine(peak, ceiling=900, fixed=0) == (0, 1)  # b = 1 does not fit


def test_cuda_memory_calls_get_an_indexed_device(monkeypatch) -> None:
    """The first GPU run found it: torch.cuda.set_per_process_memory_fraction and
    mem_get_info refuse a bare torch.device("cuda") ("Expected a torch.device with a
    specified index"), and every GPU cell was an error row. Each call that takes a device
    is recorded here, with torch.cuda stubbed, and must see one with its index."""
    from attnbench.attention.base import indexed_device
    from attnbench.measure import memory

    seen: list[object] = []

    def record(*args: object, **kwargs: object) -> int:
        seen.extend(a for a in (*args, *kwargs.values()) if isinstance(a, torch.device))
        return 0

    class Props:
        total_memory = 16 << 30

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in (
        "synchronize",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "max_memory_reserved",
        "set_per_process_memory_fraction",
    ):
        monkeypatch.setattr(torch.cuda, name, record)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: record(d) or Props())
    assert indexed_device("cuda") == torch.device("cuda", 0)
    assert indexed_device("cpu") == torch.device("cpu")
    memory.measured_peak_cuda(lambda: None, torch.device("cuda"), ceiling=1 << 30)
    assert seen and all(d == torch.device("cuda", 0) for d in seen)
