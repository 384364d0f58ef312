"""The GPU branch's measuring rules, driven on a CPU through its seam (``run.GPU = "cpu"``,
``measured_peak_cuda`` replaced by the tracker): a failed probe frees what it allocated, a
step that autotunes or compiles is warmed at each batch outside the cap, a CUDA row says
whether TF32 was allowed, and joblib never runs two GPU cells at once (issue #43)."""

from __future__ import annotations

import pytest
import torch

from attnbench.cell import Cell
from attnbench.measure.memory import MemoryTracker, Peak, module_bytes, rounded
from attnbench.plan import label as plan_label
from attnbench.plan import validate
from attnbench.runner import prepare, run
from attnbench.train import TrainStep
from attnbench.workload.decode_memory import ServingScenario

FITS = 2  # the largest batch the injected failures let through
SHAPE = dict(layers=2, d_model=32, n_heads=4, d_ff=64, min_repeats=2, min_seconds=0.0)


def _cell(mode: str, **kw: object) -> Cell:
    settings = {
        "inference": {},
        "train": {"optimizer": "none", "checkpoint": False},
        "decode": {"decode_tokens": 4, "prefill_chunk": 16},
    }[mode]
    # the ceiling: a100_40gb's 512 MiB overhead and 2 MiB the allocator may use (a dozen
    # or more sequences, so that the search probes a few batches)
    shape = {**SHAPE, "ceiling_bytes": (512 << 20) + (2 << 20), **kw}
    return Cell.of(
        "vanilla", n=32, dtype="fp32", device="a100_40gb", batch="max", mode=mode,
        params=(("causal", True),) if mode == "decode" else (), mode_settings=settings, **shape,
    )  # fmt: skip


class Probes:
    """``measured_peak_cuda`` on the CPU: each call tracked from the point where CUDA's peak
    statistics are reset, under the cap (the weights and the input counted live, as CUDA
    counts them). On entry, everything the previous call allocated must be gone: else this
    call's peak would be read with it alive, and under the cap beside it."""

    def __init__(self) -> None:
        self.trackers: list[MemoryTracker] = []
        self.batches: list[int] = []
        self.capped = False  # a call is under way

    def __call__(self, work, device, ceiling, grad=False) -> Peak:
        if self.trackers:
            last = self.trackers[-1]
            assert last.live == last.base, (
                f"b={self.batches[-1]}: {last.live - last.base} bytes of the last probe "
                f"still allocated when the probe at b={work.x.shape[0]} begins"
            )
        base = module_bytes(work.model) + rounded(work.x.nbytes)
        tracker = MemoryTracker(base, ceiling)
        self.trackers.append(tracker)
        self.batches.append(work.x.shape[0])
        self.capped = True
        try:
            with torch.enable_grad() if grad else torch.inference_mode(), tracker:
                out = work()
            del out
        finally:
            self.capped = False
        return Peak(tracker.peak, "measured", None)


def _oom_past_fits(x: torch.Tensor) -> None:
    """Out of memory above :data:`FITS` on real tensors (the memory model's meta ones run on)."""
    if x.shape[0] > FITS and x.device.type != "meta":
        raise torch.OutOfMemoryError(f"injected: b={x.shape[0]}")


@pytest.fixture
def gpu_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Probes:
    probes = Probes()
    monkeypatch.setattr(run, "GPU", "cpu")
    monkeypatch.setattr(run, "measured_peak_cuda", probes)
    return probes


def _inject(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """An OOM midway through every probe above :data:`FITS`: a forward's output made, a
    training step's gradients made (before its optimizer), a decode step's states made."""
    if mode == "decode":
        step = ServingScenario.step

        def failing_step(self: ServingScenario) -> torch.Tensor:
            _oom_past_fits(self.x)
            return step(self)

        monkeypatch.setattr(ServingScenario, "step", failing_step)
    elif mode == "train":
        optimizer = TrainStep.optimizer

        def failing_optimizer(self: TrainStep) -> None:
            _oom_past_fits(self.x)
            optimizer(self)

        monkeypatch.setattr(TrainStep, "optimizer", failing_optimizer)
    else:
        from attnbench.model import Encoder

        forward = Encoder.forward

        def failing_forward(self: Encoder, x: torch.Tensor, *a: object, **kw: object) -> object:
            out = forward(self, x, *a, **kw)
            _oom_past_fits(x)
            return out

        monkeypatch.setattr(Encoder, "forward", failing_forward)


@pytest.mark.parametrize("mode", ["inference", "train", "decode"])
def test_a_failed_probe_frees_everything_it_allocated(
    gpu_on_cpu: Probes, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Every probe above b = 2 runs out of memory midway; the search still finds b = 2, and
    no probe (nor the measurement at b = 2) begins with a failed one's tensors alive: a
    decode probe's states and first token, a training step's gradients."""
    _inject(monkeypatch, mode)
    cell = _cell(mode)
    plan = validate(cell)
    plan.on_gpu = True
    row = run.run_cell(cell, plan)
    assert row.status == "ok", row.reason
    assert row.max_batch == FITS and row.predicted_max_batch > FITS
    assert any(b > FITS for b in gpu_on_cpu.batches)  # a probe failed, and one followed it
    assert gpu_on_cpu.batches[-1] == FITS  # the measurement's, the last one checked
    assert row.warmup_s is None  # nothing here autotunes or compiles


def _has_params(name: str, **params: object) -> Cell:
    return Cell.of(name, n=64, params=tuple(params.items()))


def _hybrid(kind: dict) -> Cell:
    """A causal sdpa model whose other layer is ``kind``."""
    causal = (("causal", True),)
    return Cell.of(
        "sdpa", n=64, params=causal, layers=2, schedule="k, attention", kinds={"k": kind}
    )


@pytest.mark.parametrize(
    ("cell", "warms"),
    [
        (_has_params("gla", causal=True, kernel="fla"), True),
        (_has_params("gla", causal=True, kernel="torch"), False),
        (Cell.of("vanilla", n=64, compile=True, compile_mode="max-autotune"), True),
        (Cell.of("vanilla", n=64, compile=True, compile_mode="reduce-overhead"), True),
        (Cell.of("vanilla", n=64, compile=True), True),  # a new batch is a new graph
        (Cell.of("vanilla", n=64), False),
        (_hybrid({"attention": "gla", "params": {"kernel": "fla"}}), True),  # a kind's kernel
        (_hybrid({"attention": "flex"}), True),  # a kind that compiles its own kernel
        (_hybrid({"attention": "gla"}), False),
    ],
    ids=lambda v: plan_label(v) if isinstance(v, Cell) else str(v),
)
def test_which_cells_are_warmed_at_each_batch(cell: Cell, warms: bool) -> None:
    assert prepare.warms(cell) is warms


@pytest.mark.parametrize("mode", ["inference", "train", "decode"])
def test_autotuning_at_each_new_batch_runs_outside_the_cap_and_the_peak(
    gpu_on_cpu: Probes, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A step whose first call at each new b allocates far more than the cap (as fla's
    autotuner does: a 256 MB L2-flush buffer per configuration timed), in a cell that warms
    (as ``kernel=fla`` does): every such call runs before its probe, uncapped and untracked,
    so no probe fails on it and the peak is the step's; the warm-ups' seconds are a field of
    their own. Without the warm-up every probe runs out of memory: an ``oom`` row."""
    seen: set[int] = set()
    inside: list[int] = []  # batches whose autotuning landed in a probe or the measurement

    def autotune(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        b = args[0].shape[0]
        if b not in seen:
            seen.add(b)
            if gpu_on_cpu.capped:
                inside.append(b)
            buffer = torch.empty(256 << 20, dtype=torch.uint8)  # untouched: never paged in
            del buffer

    build = run.build

    def autotuning(cell: Cell, res: object, device: str, dtype: torch.dtype) -> torch.nn.Module:
        model = build(cell, res, device, dtype)
        if device != "meta":
            for layer in model.layers:
                layer.register_forward_pre_hook(autotune)
        return model

    monkeypatch.setattr(run, "build", autotuning)
    monkeypatch.setattr(prepare, "warms", lambda cell: True)  # as a kernel=fla cell
    cell = _cell(mode)
    plan = validate(cell)
    plan.on_gpu = True
    row = run.run_cell(cell, plan)
    assert row.status == "ok", row.reason
    # the stand-in caps live bytes, not reserved ones: the allocation-only answer
    assert inside == [] and row.max_batch == row.allocated_max_batch > 1
    assert row.peak_bytes <= row.ceiling_bytes
    assert row.warmup_s is not None and row.warmup_s > 0


@pytest.mark.parametrize("failing", ["probe", "timing"])
def test_a_gpu_step_that_fails_leaves_the_warm_ups_and_figures_before_it(
    gpu_on_cpu: Probes, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """Each warm-up's seconds are kept as it returns (here each takes 1 s): a probe that
    raises other than out of memory, after its warm-up, or a timing that raises, leaves
    every warm-up so far in the row, each once, beside the figures found before it."""
    monkeypatch.setattr(prepare, "warms", lambda cell: True)
    monkeypatch.setattr(prepare, "warm", lambda work, device, *, grad: 1.0)
    if failing == "probe":

        def second_probe_fails(work, device, ceiling, grad=False) -> Peak:
            if gpu_on_cpu.batches:
                raise RuntimeError("probe failed")
            return gpu_on_cpu(work, device, ceiling, grad)

        monkeypatch.setattr(run, "measured_peak_cuda", second_probe_fails)
    else:

        def timing_fails(*args: object, **kwargs: object) -> None:
            raise RuntimeError("timing failed")

        monkeypatch.setattr(prepare, "time_step", timing_fails)
    cell = _cell("inference")
    plan = validate(cell)
    plan.on_gpu = True
    row = run.run_cell(cell, plan)
    assert (row.status, row.reason) == ("error", f"RuntimeError: {failing} failed")
    assert row.flops > 0 and row.predicted_max_batch > 1 and row.time_median_s is None
    if failing == "probe":  # the first probe's warm-up, and the second's before it failed
        assert row.warmup_s == 2.0 and gpu_on_cpu.batches == [row.predicted_max_batch]
        assert row.max_batch is None and row.peak_bytes is None
    else:  # one warm-up before each probe and before the measurement, all of which ran
        assert row.warmup_s == len(gpu_on_cpu.batches) > 2
        assert row.max_batch == gpu_on_cpu.batches[-1] and row.peak_bytes is not None


@pytest.mark.parametrize(
    ("capability", "triton_default", "dot"),
    [((9, 0), None, "tf32"), ((9, 0), "ieee", "ieee"), ((7, 0), None, "ieee")],
)
def test_a_cuda_row_says_which_fp32_arithmetic_each_kernel_ran(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], triton_default, dot: str
) -> None:
    """On CUDA a row's env says whether torch let cuBLAS and cuDNN use TF32 (ours) and what
    Triton's tl.dot does with fp32 inputs (fla's): TF32 from Ampere on unless
    TRITON_F32_DEFAULT says otherwise. It is read when the row is made, stored and read
    back; without CUDA each is null."""
    from attnbench import env
    from attnbench.row import Row

    env.machine()  # what does not change, cached before CUDA is made to appear
    cpu = env.environment()
    assert {cpu[k] for k in ("tf32_matmul", "tf32_cudnn", "triton_fp32_dot")} == {None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    if triton_default is None:
        monkeypatch.delenv(env.TRITON_F32, raising=False)
    else:
        monkeypatch.setenv(env.TRITON_F32, triton_default)
    matmul = torch.backends.cuda.matmul.allow_tf32  # torch's flags: set, then put back
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        with torch.backends.cudnn.flags(allow_tf32=False):
            here = env.environment()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    assert (here["tf32_matmul"], here["tf32_cudnn"], here["triton_fp32_dot"]) == (True, False, dot)
    cell = Cell.of("vanilla", n=8)
    row = Row.new(cell, 10**9, 0, here)
    assert Row.from_dict(row.to_dict()).env == here
    with pytest.raises(ValueError, match=r"^env.tf32_matmul: must be true or false, got 'yes'$"):
        Row.from_dict({**row.to_dict(), "env": {**here, "tf32_matmul": "yes"}})


def _cuda(monkeypatch: pytest.MonkeyPatch, here: bool = True) -> None:
    """Validation sees CUDA (an 80 GB GPU: ``on_gpu``) or none, whatever this machine has;
    what it remembers of cells validated meanwhile is forgotten afterwards."""
    from types import SimpleNamespace

    from attnbench import plan

    monkeypatch.setattr(plan, "_VALIDATED", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: here)
    gpu = SimpleNamespace(total_memory=80 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: gpu)


JOBLIB = ["-m", "n=64", "device=a100_40gb", "hydra/launcher=joblib"]
TWO = "attention=vanilla,sdpa"


@pytest.mark.parametrize(
    ("extra", "says"),
    [([], "(one per CPU)"), (["hydra.launcher.n_jobs=4"], "(n_jobs=4)")],
)
def test_joblib_never_runs_two_cells_on_one_gpu_at_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cli_in_process, extra: list[str], says: str
) -> None:
    """Two cells of a GPU preset on a machine with CUDA under joblib's parallel workers:
    refused before anything runs, one line naming the key and what is allowed, exit 2,
    nothing written."""
    _cuda(monkeypatch)
    out = cli_in_process("run", *JOBLIB, TWO, *extra, f"out_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("attnbench run: error: hydra.launcher.n_jobs: joblib would run 2")
    assert says in lines[0] and lines[0].endswith("one fresh process per cell in turn)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "cuda"),
    [
        ([TWO, "hydra.launcher.n_jobs=1"], True),  # one cell at a time
        ([TWO, "device=cpu"], True),  # a CPU preset
        (["attention=vanilla"], True),  # one cell
        ([TWO], False),  # no CUDA: memory modeled, nothing runs on a GPU
    ],
    ids=["n_jobs=1", "cpu_preset", "one_cell", "no_cuda"],
)
def test_joblib_in_parallel_where_no_two_cells_share_a_gpu(
    tmp_path, monkeypatch: pytest.MonkeyPatch, extra: list[str], cuda: bool
) -> None:
    from attnbench.sweep.config import prevalidate

    _cuda(monkeypatch, cuda)
    plan = prevalidate([*JOBLIB, *extra, f"out_dir={tmp_path}"])
    assert len(plan) == (2 if TWO in extra else 1)


def test_submitit_local_never_runs_two_cells_on_one_gpu_at_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cli_in_process
) -> None:
    """submitit_local starts every job at once: two GPU cells refused as under joblib."""
    _cuda(monkeypatch)
    out = cli_in_process(
        "run",
        *JOBLIB[:3],
        "hydra/launcher=submitit_local",
        TWO,
        f"out_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("attnbench run: error: hydra/launcher: submitit_local starts all 2")
    assert list(tmp_path.iterdir()) == []
