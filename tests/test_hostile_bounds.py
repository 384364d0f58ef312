"""Every new key bounded before anything runs (docs/reliability.md, "Bounds before work"):
a value that would hang or allocate without bound is one line naming the key and what is
allowed, exit code 2, nothing written, and the bound is held where it is decided.

* the draw: ``total_tokens`` (packed, decode with ``contexts=drawn``) holds at most
  ``lengths.MAX_LENGTHS`` lengths, refused at the exact budget that would pass it; an
  explicit ``lengths`` list as long;
* the mechanisms' keys: a mixer's short ``conv``, Nyströmformer's ``pinv_iterations`` and
  ``conv_kernel``; decode's ``decode_tokens``;
* the memory model's trace: a cell whose trace would take more than
  ``MAX_LOOP_STEPS`` Python steps (a recurrence's chunks, a packed row's documents, decode's
  prefill calls) is refused before it traces, naming the key that sets their number;
* ``attnbench check --json`` / ``--write-baseline`` into a path that cannot be written;
* a trained quality cell estimated at more than a few minutes says so before it starts.

In this process (:func:`attnbench.cli.main`, the validators themselves); nothing here
depends on how fast this machine is: the GEMM rate the estimate reads is fixed here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from torch.utils.flop_counter import FlopCounterMode

import attnbench
import attnbench.lengths as draws
from attnbench.cell import Cell
from attnbench.cell_rules import complete
from attnbench.measure import gemm
from attnbench.plan import validate
from attnbench.quality import estimate, recall
from attnbench.sweep.config import prevalidate
from attnbench.workload.base import MAX_LOOP_STEPS, encoder
from attnbench.workload.decode import _NO_PREFILL, DECODE
from attnbench.workload.packed import Plan

QUIET = ("progress=false", "report=false")
SHAPE = {"layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128}


def _tree(where: Path) -> set[str]:
    return {p.relative_to(where).as_posix() for p in where.rglob("*")}


def _one_line(out: subprocess.CompletedProcess[str], command: str, needle: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith(f"attnbench {command}: error: "), out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert needle in out.stderr, out.stderr


RUN = {
    "a packed draw of 10^12 tokens": (
        "mode=packed total_tokens=1000000000000 length_mean=256",
        "total_tokens: must be at most 13597639 with these draw settings (a draw holds at "
        "most 65536 lengths",
    ),
    "a decode mix of 10^12 tokens": (
        "mode=decode contexts=drawn causal=true batch=1 total_tokens=1000000000000 length_mean=256",
        "total_tokens: must be at most 13597639 ",
    ),
    "a mixer's conv of 10^6": (
        "attention=mamba2 causal=true +attention.params.conv=1000000",
        "conv: must be an integer in [0, 64], got 1000000",
    ),
    "a conv one past the bound": (
        "attention=deltanet causal=true +attention.params.conv=65",
        "conv: must be an integer in [0, 64]",
    ),
    "retnet at n = 10^6 on the base model": (
        "attention=retnet causal=true n=1000000 model=base",
        "n: the memory model traces retnet on meta one Python step at a time (a chunk of a "
        "recurrence, a packed document): 15625 steps per layer × 12 layers = 187500 per "
        "traced step, above the 16384 allowed (each traced step would take minutes); allowed: "
        "n <= 87360 here, a larger attention.params.chunk or fewer layers",
    ),
    "deltanet's training step at n = 10^6": (
        "attention=deltanet causal=true mode=train n=1000000 model=base",
        "n: the memory model traces deltanet on meta",
    ),
    "a chunk of 1 at n = 65536": (
        "attention=retnet causal=true n=65536 +attention.params.chunk=1",
        "= 131072 per traced step, above the 16384 allowed (each traced step would take "
        "minutes); allowed: n <= 8192 here",
    ),
    "a packed row of 65536 documents, each traced alone": (
        "mode=packed total_tokens=13597639 length_mean=256",
        "total_tokens: the memory model traces vanilla on meta one Python step at a time (a "
        "chunk of a recurrence, a packed document): 65536 steps per layer × 2 layers",
    ),
    "a whole prompt of 2^20 prefilled by a mixer": (
        "attention=retnet causal=true mode=decode batch=1 n=1048576 prefill_chunk=0",
        "prefill_chunk: the memory model traces retnet on meta one Python step at a time",
    ),
    "decode_tokens one past the bound": (
        "mode=decode causal=true batch=1 decode_tokens=65537",
        "decode_tokens: must be an integer <= 65536 (each token is a step a GPU times",
    ),
    "Nyströmformer's pseudo-inverse iterated 10^6 times": (
        "attention=nystromformer attention.params.pinv_iterations=1000000",
        "pinv_iterations: must be an integer in [1, 100], got 1000000",
    ),
    "Nyströmformer's conv kernel of 10^6 taps": (
        "attention=nystromformer attention.params.conv_kernel=1000001",
        "conv_kernel: must be at most 1023 (2n - 1, or the authors' 33",
    ),
}


@pytest.mark.parametrize("case", list(RUN))
def test_a_run_key_past_its_bound_is_one_line_and_writes_nothing(
    case: str, tmp_path: Path, cli_in_process
) -> None:
    args, says = RUN[case]
    model = () if "model=" in args else ("model=tiny",)
    out = cli_in_process("run", *QUIET, *model, *args.split(), cwd=tmp_path)
    _one_line(out, "run", says)
    assert not any(tmp_path.iterdir())


CHECK = {
    "--json under a file": (("--json", "afile/latest.json"), "--json: cannot write afile/"),
    "--write-baseline under a file": (
        ("--write-baseline", "afile/b.json"),
        "--write-baseline: cannot write afile/b.json: 'afile' is not a directory",
    ),
    "--json a directory": (("--json", "adir"), "--json: cannot write adir: it is a directory"),
    "--json in /proc": (  # refused even to root, who writes into a read-only directory
        ("--json", "/proc/attnbench-x/latest.json"),
        "--json: cannot write /proc/attnbench-x/latest.json: [Errno",
    ),
}


@pytest.mark.parametrize("case", list(CHECK))
def test_a_check_output_that_cannot_be_written_is_refused_before_the_suite(
    case: str, tmp_path: Path, cli_in_process
) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    flags, says = CHECK[case]
    out = cli_in_process("check", *flags, "--quiet", cwd=tmp_path)
    _one_line(out, "check", says)
    assert _tree(tmp_path) == {"afile", "adir"}


# --- where each bound is decided ----------------------------------------------------------


def test_the_draws_refusal_names_exactly_the_largest_budget_it_allows() -> None:
    """A draw is a prefix of the draw under any larger budget: the budget named is the
    largest whose draw holds MAX_LENGTHS lengths, and one more token is refused."""
    kw = {"seed": 3, "max_len": 64, "length_min": 1}
    with pytest.raises(ValueError, match=r"^total_tokens: must be at most (\d+) ") as e:
        draws.draw("uniform", total_tokens=10**12, **kw)
    most = int(str(e.value).split()[5])
    assert len(draws.draw("uniform", total_tokens=most, **kw)) == draws.MAX_LENGTHS
    with pytest.raises(ValueError, match=rf"^total_tokens: must be at most {most} "):
        draws.draw("uniform", total_tokens=most + 1, **kw)


def test_an_explicit_list_holds_at_most_as_many_lengths() -> None:
    assert len(draws.explicit([1] * draws.MAX_LENGTHS)) == draws.MAX_LENGTHS
    with pytest.raises(ValueError, match=r"^lengths: must be a list of at most 65536 lengths"):
        draws.explicit([1] * (draws.MAX_LENGTHS + 1))


def test_a_trace_at_the_bound_is_allowed_and_one_chunk_more_is_not() -> None:
    """retnet's 2 tiny layers at chunk 64: n = 8192 · 64 is 16384 steps, one more is over."""
    most = MAX_LOOP_STEPS // SHAPE["layers"] * 64
    validate(Cell.of("retnet", most, params=(("causal", True),), **SHAPE))
    with pytest.raises(ValueError, match=rf"^n: .* allowed: n <= {most} here"):
        validate(Cell.of("retnet", most + 1, params=(("causal", True),), **SHAPE))


@pytest.mark.parametrize(
    ("name", "params", "steps"),
    [
        ("vanilla", {}, 3),  # each document through its own softmax
        ("linear", {}, 3),  # not causal: each document's own sums
        ("linear", {"causal": True}, 2),  # one chunked pass over the row of 100
        ("retnet", {"causal": True}, 2),
        ("local", {}, 1),  # one banded pass
    ],
)
def test_a_packed_rows_steps_are_its_documents_or_its_chunks(
    name: str, params: dict, steps: int
) -> None:
    layer = attnbench.create(name, d_model=64, n_heads=4, max_seq_len=64, **params)
    assert Plan("packed", (50, 30, 20), 4096).loop_steps(layer) == steps
    chunked = name == "retnet" or params.get("causal")
    assert layer.loop_steps(64) == 1 and layer.loop_steps(65) == (2 if chunked else 1)


@pytest.mark.parametrize(("chunk", "timed"), [(1, False), (512, True)])
def test_a_prefill_of_more_calls_than_the_bound_is_not_timed_on_a_cpu(
    chunk: int, timed: bool
) -> None:
    """However fast the CPU (an absurd rate here), a prefill of 16384 one-token calls per
    layer is left out of the timing (its steps over random states), as its FLOPs say
    nothing of its Python overhead: it ran for over 5 minutes at time_budget_s=30."""
    cell = complete(Cell.of("retnet", 16384, mode="decode", batch=1, params=(("causal", True),),
                         mode_settings={"prefill_chunk": chunk}, **SHAPE))  # fmt: skip
    model = encoder(cell, {"causal": True}, "meta")
    DECODE.cost_s(model, cell, 1, 1e30)
    assert (cell not in _NO_PREFILL) is timed


def _rate(monkeypatch: pytest.MonkeyPatch, flops_per_s: float) -> None:
    monkeypatch.setattr(gemm, "cpu_matmul_rate", lambda: gemm.Rate(flops_per_s, flops_per_s, False))


def test_a_base_sized_quality_cell_says_its_estimate_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _rate(monkeypatch, 1e11)
    monkeypatch.chdir(tmp_path)
    prevalidate(["task=mqar", "model=base"])
    assert capsys.readouterr().err == (
        "attnbench run: task=mqar on vanilla (12 layers of d_model 768): about 24.3 h of "
        "training on this CPU (2 rates × 2000 steps of 64 sequences at 2.1 TFLOP each, 4 "
        "evaluations of 3000, at its fp32 GEMM rate of 100 GFLOP/s)\n"
    )
    assert not any(tmp_path.iterdir())


def test_a_small_quality_cell_says_nothing_and_reads_no_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unread() -> gemm.Rate:
        raise AssertionError("the rate was read")

    monkeypatch.setattr(gemm, "cpu_matmul_rate", unread)
    mqar = Cell.of("vanilla", 64, task="mqar", device="cpu", dtype="fp32", batch=1,
                layers=2, d_model=64, n_heads=1, d_ff=128)  # fmt: skip
    assert estimate.note(mqar) is None
    assert estimate.note(Cell.of("vanilla", 64, device="cpu", dtype="fp32")) is None


@pytest.mark.parametrize("attention", ["vanilla", "retnet"])
def test_the_estimates_flops_are_what_the_training_runs(attention: str) -> None:
    """Counted by FlopCounterMode over a whole (tiny) MQAR run: steps and evaluations. The
    short convolution, a few taps, is left out of the estimate (and here)."""
    q = {"steps": 2, "eval_every": 1, "test_examples": 50, "train_examples": 200,
         "lrs": [0.001], "batch": 8, "short_conv": 0}  # fmt: skip
    shape = {"layers": 2, "d_model": 64, "n_heads": 1, "d_ff": 128}
    cell = Cell.of(attention, 64, task="mqar", device="cpu", dtype="fp32", batch=1,
                quality=tuple(q.items()), **shape)  # fmt: skip
    with FlopCounterMode(display=False) as counted:
        recall.train(attention, {}, n=64, **shape, **q)
    found = estimate.training_flops(cell)
    assert found is not None and found[0] == counted.get_total_flops()
