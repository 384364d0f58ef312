"""The caching allocator's replay of the GPU run's code held to the H200's own rows
(``scripts/allocator_check.py``, issue #45 item 4): a sample of rows, each replayed at its
real max batch and one above, on meta (seconds each)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from attnbench.measure.allocator import replay
from attnbench.measure.cuda_layouts import CudaLayouts, persistent_workspaces
from attnbench.measure.memory import traced
from attnbench.measure.search import largest_fitting

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
ROWS = Path("results/gpu_check/rows.jsonl")

# (--only filter, tolerance on the replayed reserved peak at the real batch): vanilla, sdpa
# (cuDNN's layout), Linformer eager and with sdpa's kernel, a training step; each one's
# replayed max batch exact to the sequence
SAMPLE = [
    ("attention=vanilla,n=512,mode=inference,causal=false", 0.001),
    ("attention=sdpa,n=512,mode=inference", 0.001),
    ("attention=linformer,k=128,n=1024,mode=inference", 0.001),
    ("attention=linformer,k=256,n=512,mode=inference,kernel=none", 0.001),
    ("attention=sdpa,n=1024,mode=train,checkpoint=false", 0.005),
]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import allocator_check
    finally:
        sys.path.remove(str(SCRIPTS))
    return allocator_check


def _row(script: ModuleType, only: str) -> dict:
    rows = script.selected(script.load(ROWS), script.parse_only(only))
    rows = [r for r in rows if script.why_not(r) is None]
    assert len(rows) == 1, only
    return rows[0]


@pytest.mark.parametrize(("only", "reserved_tolerance"), SAMPLE)
def test_the_replay_of_the_gpu_runs_code_meets_the_cards_max_batch(
    script: ModuleType, only: str, reserved_tolerance: float
) -> None:
    row = _row(script, only)
    tracer = script.Tracer(row)
    real = row["max_batch"]
    # searched from the real batch (from the row's prediction the script's search takes
    # longer to land on the same b): two replays where it is exact
    assert largest_fitting(tracer.fits, real)[0] == real, only
    at_real = replay(tracer.trace(real), tracer.cap)
    reserved = at_real.peak_reserved + row["overhead_bytes"]
    assert abs(reserved / row["peak_reserved_bytes"] - 1) <= reserved_tolerance, (only, reserved)


def test_a_probe_after_another_cells_cache_fails_where_a_fresh_allocator_fits(
    script: ModuleType,
) -> None:
    """Vanilla at n = 4096 fits 19 sequences from a fresh allocator, 18 on the card: its
    first probe found the cache that the cell before (Linformer k = 256 at n = 2048) left,
    and its weights pinned some of it. Replayed as run, 18."""
    rows = script.load(ROWS)
    assert script.process_starts(ROWS) == (0, 53, 86)  # the run's three processes
    only = script.parse_only("attention=vanilla,n=4096,mode=inference")
    i = script.selected_indices(rows, only)[0]  # the eager cell; the compiled one ran later
    previous = script.previous_row(rows, i, (0, 53, 86))
    assert script.label_row(previous) == "linformer(k=256, sharing=layerwise) n=2048 inference"
    result = script.check(rows[i], previous=previous, allocated=False)
    assert (result.replayed_clean_max_batch, result.replayed_max_batch) == (19, 18)
    assert result.real_max_batch == 18


def test_the_switch_reproduces_the_gpu_runs_model(script: ModuleType) -> None:
    """431ec60's encoder, traced plainly on meta, predicts what the GPU run's model
    predicted (the row's ``predicted_max_batch``); today's encoder, which frees the
    attention's output, predicts more."""
    row = _row(script, "attention=linformer,k=128,n=512,mode=inference")
    tracer = script.Tracer(row, cuda=False)
    assert tracer.allocated_max_batch() == row["predicted_max_batch"] == 1720
    then = tracer.allocated_peak(1469)
    with pytest.MonkeyPatch.context() as mp:  # the switch off: today's liveness
        mp.setattr(script, "as_at_431ec60", contextlib.nullcontext)
        now = tracer.allocated_peak(1469)
    # at the real batch the layer peaks in the FFN, where 431ec60 still held the attention's
    # output: b·n·d fp16 more
    assert then - now == 1469 * 512 * 768 * 2


def test_cuda_layouts_writes_flash_attentions_output_and_log_sum_exp() -> None:
    b, h, n, dh = 2, 3, 64, 16
    q, k, v = (torch.empty(b, h, n, dh, device="meta", dtype=torch.float16) for _ in range(3))

    def step(sm90: bool = False) -> torch.Tensor:
        with CudaLayouts((9, 0) if sm90 else (8, 0)):
            out = F.scaled_dot_product_attention(q, k, v)
        assert out.shape == (b, h, n, dh) and out.transpose(1, 2).is_contiguous()
        return out.transpose(1, 2).reshape(b, n, h * dh)  # merging heads: a view

    with torch.inference_mode():
        events = traced(step)
    out, lse = b * n * h * dh * 2, b * h * n * 4
    assert events == [("alloc", 0, out), ("alloc", 1, lse), ("free", 1), ("free", 0)]
    with torch.inference_mode():  # sm90: cuDNN first, whose forward keeps no log-sum-exp
        assert traced(lambda: step(sm90=True)) == [("alloc", 0, out), ("free", 0)]
    merged = traced(
        lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)
    )
    assert [e[2] for e in merged if e[0] == "alloc"] == [out, out]  # meta: the merge copies
    # a boolean mask: the memory-efficient kernel, the mask made an additive bias first
    mask = torch.ones(b, 1, n, n, device="meta", dtype=torch.bool)

    def masked() -> torch.Tensor:
        with CudaLayouts((8, 0)):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    with torch.inference_mode():
        sizes = [e[2] for e in traced(masked) if e[0] == "alloc"]
    # logical_not, the two scalars (0 and -inf, each one 512-byte block), where, res
    assert sizes[0] == b * n * n and sizes[-2:] == [b * n * n * 2, out]
    assert len(sizes) == 5 and all(s <= 8 for s in sizes[1:3])
    assert persistent_workspaces((9, 0), unified=False) == (32 << 20, 1 << 20)  # torch 2.11


def test_the_script_prints_one_object_per_row(script: ModuleType) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "scripts/allocator_check.py",
            "--json",
            "--only",
            "attention=vanilla,n=16384,mode=inference",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    got = json.loads(line)
    assert {
        "attention",
        "params",
        "k",
        "n",
        "mode",
        "checkpoint",
        "real_max_batch",
        "replayed_max_batch",
        "allocated_max_batch",
        "real_reserved_bytes",
        "replayed_reserved_bytes",
    } <= set(got)
    assert got["real_max_batch"] == got["replayed_max_batch"] == got["allocated_max_batch"] == 1
    assert abs(got["replayed_reserved_bytes"] / got["real_reserved_bytes"] - 1) < 0.002
    assert "vanilla n=16384 inference" in done.stderr  # progress


@pytest.mark.parametrize(
    "args",
    [["--only", "colour=red"], ["--only", "n"], ["--rows", "/nonexistent.jsonl"], ["--nope"]],
)
def test_bad_arguments_are_one_line_and_exit_2(script: ModuleType, args: list[str], capsys) -> None:
    assert script.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("allocator_check: error: ")


def test_rows_out_of_reach_are_reported_with_the_reason(script: ModuleType) -> None:
    only = script.parse_only("attention=sdpa,n=4096,mode=inference")
    rows = script.selected(script.load(ROWS), only)
    compiled = [r for r in rows if r["compile"]]
    assert compiled
    result = script.check(compiled[0])
    assert result.replayed_max_batch is None and "compiled" in result.reason
    assert "compiled" in script.table([result])
