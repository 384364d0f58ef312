"""``compile=true``: each encoder layer compiled before anything is timed, the compile time and
the graphs compiled in the row, no recompilation while timing, and a compiled cell's memory
from the profiler (never the eager model's figure under the compiled label).

Compiling costs seconds per shape on 2 cores: every cell here is tiny, and the compiled rows
are made once per module (one compile per workload).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench.cell import Cell
from attnbench.cell_key import key
from attnbench.measure import compiled, presets
from attnbench.plan import label as plan_label
from attnbench.runner import run_cell
from attnbench.workload import Work

TINY = dict(
    dtype="fp32", device="cpu", layers=2, d_model=32, n_heads=2, d_ff=64, batch=1,
    min_seconds=0.05, min_repeats=3,
)  # fmt: skip


def tiny(attention: str = "vanilla", n: int = 64, **kw: object) -> Cell:
    """A tiny cell; a decode one generates 6 tokens."""
    if kw.get("mode") == "decode":
        kw.setdefault("mode_settings", {"decode_tokens": 6})
    return Cell.of(attention, n, **{**TINY, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def rows() -> dict[str, object]:
    """One compiled row per workload (decode causal, as its cells always are)."""
    return {
        mode: run_cell(
            tiny(mode=mode, compile=True, params=(("causal", True),) if mode == "decode" else ())
        )
        for mode in ("inference", "train", "decode")
    }


@pytest.mark.parametrize("mode", ["inference", "train", "decode"])
def test_a_compiled_row_says_what_ran_and_what_compiling_cost(rows, mode: str) -> None:
    row = rows[mode]
    assert row.status == "ok", row.reason
    assert row.compile and row.compile_mode == "default" and row.compiled == "layers"
    assert row.compile_s > 0 and row.compilations >= 1
    assert row.time_per_seq_s > 0 and row.repeats >= 1
    # memory: the profiler's peak of the compiled step and of the eager one, at the timed b;
    # the eager meta model's max batch is not a compiled figure, so there is none
    assert row.memory_source == "profiled" and row.batch == 1
    assert row.max_batch is None and row.predicted_max_batch is None
    out_bytes = 1 * 64 * 32 * 4  # the layer's output, at least, is allocated by the step
    assert row.peak_bytes >= out_bytes and row.eager_peak_bytes >= out_bytes


def test_an_eager_row_has_no_compile_figures() -> None:
    row = run_cell(tiny())
    assert row.status == "ok" and not row.compile and row.compile_mode is None
    assert row.compiled is None and row.compile_s is None and row.compilations is None
    assert row.memory_source == "modeled" and row.eager_peak_bytes is None


def test_compile_enters_the_key_only_when_true() -> None:
    preset = presets.load("cpu")
    eager = tiny()
    assert key(eager, preset) == key(
        dataclasses.replace(eager, compile_mode="max-autotune"), preset
    )
    on = dataclasses.replace(eager, compile=True)
    assert key(on, preset) != key(eager, preset)
    assert key(on, preset) != key(dataclasses.replace(on, compile_mode="max-autotune"), preset)
    assert plan_label(on).endswith("compiled") and "compiled" not in plan_label(eager)
    assert plan_label(dataclasses.replace(on, compile_mode="max-autotune")).endswith(
        "compiled(max-autotune)"
    )


def _layers(d: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return attnbench.build_model(
        "vanilla", layers=2, d_model=d, n_heads=2, d_ff=64, max_seq_len=64
    ).eval()


def test_compiled_layers_compute_what_the_eager_ones_do() -> None:
    model, x = _layers(), torch.randn(2, 48, 32)
    with torch.inference_mode():
        eager = model(x)
        compiled.compile_layers(model, "default", dynamic=False)
        assert torch.allclose(model(x), eager, atol=1e-5, rtol=1e-5)


def test_a_recompilation_while_timing_raises_and_none_is_counted_otherwise() -> None:
    """The guard can fail: a step whose shape changes between repeats recompiles on the clock,
    which raises; the same step at one shape compiles nothing while timed."""
    compiled.reset()
    model = _layers()
    compiled.compile_layers(model, "default", dynamic=False)
    work = Work(model, torch.randn(1, 40, 32))
    warm = compiled.warm(work, torch.device("cpu"), grad=False)
    assert warm.graphs >= 1 and warm.seconds > 0
    _, graphs = compiled.timed(work, torch.device("cpu"), min_repeats=3, min_seconds=0.0)
    assert graphs == 0

    class Growing(Work):
        def __call__(self) -> torch.Tensor:
            self.x = torch.randn(1, self.x.shape[1] + 8, 32)
            return self.model(self.x)

    with pytest.raises(Exception, match="Recompil"):
        compiled.timed(Growing(model, work.x), torch.device("cpu"), min_repeats=3, min_seconds=0)


def test_a_compiler_failure_is_the_cells_error_row(tmp_path: Path, monkeypatch) -> None:
    """No working C++ compiler: the cell's row is an error with the compiler's first line
    (a sweep stores it and goes on, as any error row). A fresh cache and a shape compiled
    nowhere else, so that no cached kernel spares the compiler."""
    import torch._inductor.config as inductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",), "fx_graph_cache": False}):
        row = run_cell(tiny(n=40, d_model=24, layers=1, compile=True))
    assert row.status == "error"
    assert "InvalidCxxCompiler" in row.reason and "\n" not in row.reason


def _run(tmp_path: Path, *args: str, here: Callable[..., object], n: int = 64) -> object:
    """``attnbench run`` of tiny cells through ``here`` (the ``cli_in_process`` fixture): in
    this process, as the command line calls it."""
    flags = [a for a in args if a.startswith("-")]
    args = tuple(a for a in args if not a.startswith("-"))
    args = (
        "run", *flags, "model=tiny", "device=cpu", "dtype=fp32", "progress=false", f"n={n}",
        f"out_dir={tmp_path}", "timing.min_seconds=0", "timing.min_repeats=2", *args,
    )  # fmt: skip
    return here(*args, cwd=tmp_path)


BAD = [
    (["compile=maybe"], "compile: must be true or false"),
    (["compile=true", "compile_mode=fast"], "compile_mode: must be one of"),
    (["attention=flex", "mode=train"], "mode: attention=flex cannot train on a CPU: Flex"),
    (["attention=flex", "attention.params.pattern=diagonal"], "pattern: must be one of"),
    (["attention=flex_window", "k=0"], "k: must be an integer >= 1"),
]


@pytest.mark.parametrize(("args", "says"), BAD)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], says: str, cli_in_process
) -> None:
    # in this process (the same cli.main, refusing before anything runs), not seconds of
    # imports each: a refusal of `attnbench run` in a fresh process is test_train.py's
    attention = [] if any(a.startswith("attention=") for a in args) else ["attention=vanilla"]
    out = _run(tmp_path, *attention, *args, here=cli_in_process)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert not list(tmp_path.rglob("cells.jsonl"))


def test_a_sweep_leaves_flex_training_out_on_a_cpu_and_goes_on(
    tmp_path: Path, cli_in_process
) -> None:
    """flex with every layer eager still runs its compiled kernel (the row says ``kernel``),
    its block mask's build apart and its FLOPs block-sparse beside the dense count; a
    training sweep on a CPU leaves flex out and measures the rest. In this process (cli.main,
    as the command line calls it): the rows are the property, not the process (the real
    inference and training runs are test_run_cli.py's and test_train.py's)."""
    out = _run(
        tmp_path, "-m", "attention=flex_window,vanilla", "mode=inference,train", "k=64",
        "report=false", n=512, here=cli_in_process,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = attnbench.load([tmp_path])
    got = sorted(zip(rows.attention, rows["mode"], strict=True))
    assert got == [("flex", "inference"), ("vanilla", "inference"), ("vanilla", "train")]
    flex = rows[rows.attention == "flex"].iloc[0]
    assert flex.status == "ok" and flex.compiled == "kernel" and not flex.compile
    assert flex.compile_s > 0 and flex.mask_build_s >= 0 and flex.compilations >= 1
    # 128-token blocks: the band of 64 computes 10 of the 16 blocks (the diagonal and its
    # neighbours), so its attention FLOPs are 10/16 of dense; the projections are the same
    attention = flex.flops_dense - flex.flops
    assert attention > 0 and flex.flops < flex.flops_dense


def test_a_compiled_layer_around_flex_computes_what_flex_alone_does() -> None:
    """compile=true traces flex_attention into the layer's graph: Inductor's CPU flex template
    then takes q, k and v as buffers of their own (torch 2.13 failed on the projection's
    views: "not enough values to unpack"), and the result is flex's in the eager model."""
    torch.manual_seed(0)
    model = attnbench.build_model(
        "flex", layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=256,
        pattern="window", window=64,
    ).eval()  # fmt: skip
    x = torch.randn(1, 256, 32)
    with torch.inference_mode():
        eager = model(x)
        compiled.compile_layers(model, "default", dynamic=False)
        assert torch.allclose(model(x), eager, atol=2e-6, rtol=1e-5)
