"""A decode step modeled over a preset's datasheet (attnbench/measure/roofline.py,
workload/decode_roofline.py): the roofline's arithmetic, the presets' bandwidths, the bytes a
step reads counted by hand from the published configuration, and the bound held against the
decode steps timed on an H200 (results/gpu_check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnbench.measure import presets
from attnbench.measure.memory import module_bytes
from attnbench.measure.roofline import roofline
from attnbench.runner import build
from attnbench.workload.decode import DECODE
from tests.test_presets import composed_job, delta_state, kv

ROOT = Path(__file__).resolve().parents[1]


def test_the_roofline_takes_the_larger_bound_and_says_which() -> None:
    memory = roofline(4_800_000, 1_000, 4.8e12, 1e12)  # 1 us of bytes, 1 ns of FLOPs
    assert memory == {"memory_s": 1e-6, "compute_s": 1e-9, "step_s": 1e-6, "bound": "memory"}
    compute = roofline(4_800, 989_000_000, 4.8e12, 989e12)  # 1 ns of bytes, 1 us of FLOPs
    assert compute["bound"] == "compute" and compute["step_s"] == pytest.approx(1e-6)
    assert roofline(4_800, 10**12, 4.8e12, None)["compute_s"] == 0.0  # no peak: bytes only


def test_every_gpu_preset_has_a_bandwidth_and_a_bad_one_is_one_line() -> None:
    for name in presets.names():
        preset = presets.load(name)
        assert (preset.bandwidth is not None) == preset.is_gpu, name
    assert presets.load("h200_141gb").bandwidth == 4.8e12  # the datasheet's 4.8 TB/s
    base = dict(name="x", gpu="X", total_bytes=1, overhead_bytes=0, peak_flops=None)
    for bad in (0, -1, "fast", True, float("inf")):
        with pytest.raises(ValueError, match=r"^device.bandwidth: must be bytes per second"):
            presets.from_dict({**base, "bandwidth": bad})


def test_qwen3_next_steps_read_what_its_layers_hold_by_hand() -> None:
    """Qwen3-Next at 128K on the H200 preset, 64 sequences: every step reads 36 Gated
    DeltaNet states (32 value heads of 128², the convolution's last 3 inputs of q, k, v) and 12
    attention layers' K/V (2 heads of 256, a padding flag a token) at the steps' mean
    context, in bf16, and the weights; its FLOPs at the peak take less than its bytes."""
    res = composed_job("qwen3_next", "mode=decode", "device=h200_141gb", n=131072)
    model = build(res.cell, res, "meta", torch.bfloat16)
    preset = presets.load("h200_141gb")
    step = DECODE.modeled(model, res.cell, 64, preset)["modeled_step"]
    at = (131072 + 3 + 131072 + 128) // 2  # the timed steps' mean (the first 2 not timed)
    assert step["context"] == at
    gdn, attention = 36 * delta_state(16, 2048, v_heads=32) * 2, 12 * (kv(2, 256, at) * 2 + at)
    assert step["state_by_kind"] == {
        "linear": {"mechanism": "gated_deltanet", "layers": 36, "bytes": gdn},
        "attention": {"mechanism": "sdpa", "layers": 12, "bytes": attention},
    }
    weights = module_bytes(model)
    assert step["read_bytes"] == 64 * (gdn + attention) + weights
    assert step["memory_s"] == step["read_bytes"] / 4.8e12 == step["step_s"]
    assert step["bound"] == "memory" and step["per_token_s"] == step["step_s"] / 64
    assert DECODE.modeled(model, res.cell, 64, presets.load("cpu")) == {}  # no datasheet


def test_the_bound_holds_under_the_decode_steps_timed_on_an_h200() -> None:
    """results/gpu_check's decode rows ran on an H200 (4.8 TB/s, 989 TFLOP/s fp16): each
    measured step took at least the roofline of its own bytes and FLOPs (1.4x to 24x)."""
    rows = [json.loads(line) for line in (ROOT / "results/gpu_check/rows.jsonl").open()]
    decode = [r for r in rows if r.get("decode")]
    assert len(decode) == 5
    ratios = []
    for r in decode:
        flops = r["flops"] * r["batch"]  # per generated token and sequence
        bound = roofline(r["decode"]["read_bytes"], flops, 4.8e12, 989e12)["step_s"]
        ratios.append(r["time_median_s"] / bound)
    assert min(ratios) > 1.0, ratios
    assert [round(x, 1) for x in sorted(ratios)] == [1.4, 2.3, 4.4, 4.4, 23.8]
