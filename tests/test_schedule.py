"""A model's layer schedule (``model.schedule``, ``model.kinds``): the pattern tiles the
layers, each kind is built as declared, a hybrid's cache is each layer's own (counted here
by hand), a decode over it is its forward in float64, its FLOPs are FlopCounterMode's, its
modeled peak is the profiler's, it is keyed apart from its all-attention twin (which keys as
before), and a bad schedule is one line naming the key, from Python and from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnbench.cell import Cell
from attnbench.cell_key import key
from attnbench.measure import presets
from attnbench.measure.flops import count_flops
from attnbench.plan import validate
from attnbench.runner import build
from attnbench.schedule import expand, layers_of, tiled
from attnbench.store import read_rows
from tests.conftest import run_cli
from tests.profiled import peaks

D, H, FF = 32, 4, 64
# a small Qwen3-Next: three Gated DeltaNet layers, then one gated softmax attention of heads
# wider than d_model / n_heads with grouped keys; and an MLA kind for Kimi Linear's pairing
KINDS = {
    "lin": {"attention": "gated_deltanet", "params": {"conv": 4}},
    "mla": {"attention": "mla", "params": {"latent": 8, "rope_dim": 4}, "n_heads": 2},
}
HYBRID = {
    "layers": 8, "d_model": D, "n_heads": H, "d_ff": FF, "kv_heads": 2, "head_dim": 12,
    "schedule": "(2*lin, mla, attention)", "kinds": KINDS,
}  # fmt: skip
OWN = (("causal", True), ("gate", "elementwise"), ("sinks", True))


def hybrid(n: int = 16, **kw: object) -> Cell:
    return Cell.of("sdpa", n, dtype="fp32", device="cpu", params=OWN, **{**HYBRID, **kw})


@pytest.mark.parametrize(
    ("pattern", "layers"),
    [
        ("3*a, b", ["a", "a", "a", "b"]),
        ("(3*a, b)*2", ["a", "a", "a", "b"] * 2),
        ("a*2, (b, 2*c)", ["a", "a", "b", "c", "c"]),
        (" a , b ", ["a", "b"]),
    ],
)
def test_a_pattern_is_its_layers(pattern: str, layers: list[str]) -> None:
    assert expand(pattern) == layers


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        ("", "a pattern such as '3*linear, attention' is needed"),
        ("3*a, (b", "a '(' is not closed"),
        ("0*a", "a repeat count must be >= 1, got 0"),
        ("a; b", "unexpected ';'"),
        ("a,", "it ends where a kind was expected"),
        ("3*a, b, c", "its 5 layers do not tile model.layers=8"),
    ],
)
def test_a_bad_pattern_is_one_line_naming_the_key(pattern: str, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        tiled(pattern, 8)
    assert str(e.value).startswith("model.schedule: ") and needle in str(e.value)
    assert "\n" not in str(e.value)


def test_the_layers_are_the_kinds_in_order_each_as_declared() -> None:
    """Kinds inherit the cell's causal; their heads are their own where they say so."""
    layers = layers_of(hybrid())
    assert [x.kind for x in layers] == ["lin", "lin", "mla", "attention"] * 2
    lin, mla, own = layers[0], layers[2], layers[3]
    assert dict(lin.params) == {"conv": 4, "causal": True} and lin.n_heads == H
    assert (mla.n_heads, mla.kv_heads, mla.head_dim) == (2, None, None)  # its own, not sdpa's
    assert own.attention == "sdpa" and dict(own.params) == dict(OWN)
    model = build(validate(hybrid()).cell, validate(hybrid()), "cpu", torch.float32)
    names = [type(layer.attn).__name__ for layer in model.layers]
    assert names == ["GatedDeltaNet", "GatedDeltaNet", "MLAAttention", "SDPAAttention"] * 2


def test_each_layers_cache_is_its_own_counted_by_hand() -> None:
    """Per sequence at n: Gated DeltaNet h·d_h² + (conv − 1)·3d, MLA (latent + rope)·n,
    sdpa 2·kv_heads·head_dim·n; the model's context is their sum over the schedule."""
    res = validate(hybrid())
    model = build(res.cell, res, "meta", torch.float32)
    n, dh = 1000, D // H
    lin, mla, sdpa = H * dh * dh + 3 * 3 * D, (8 + 4) * n, 2 * 2 * 12 * n
    assert model.layer_context_elements(n) == [lin, lin, mla, sdpa] * 2
    assert model.context_elements(n) == 2 * (2 * lin + mla + sdpa)


def test_a_decode_over_the_hybrid_is_its_forward_in_float64() -> None:
    res = validate(hybrid())
    model = build(res.cell, res, "cpu", torch.float32).double()
    x = torch.randn(2, 16, D, dtype=torch.float64)
    with torch.no_grad():
        whole = model(x)
        states = model.new_state(2, 16, torch.float64, "cpu")
        steps = [model.extend(x[:, :6], states)]
        steps += [model.extend(x[:, t : t + 1], states) for t in range(6, 16)]
    assert (torch.cat(steps, dim=1) - whole).abs().max() < 1e-10


def test_the_hybrids_flops_are_flop_counter_modes() -> None:
    res = validate(hybrid())
    model = build(res.cell, res, "cpu", torch.float32)
    x = torch.randn(2, 16, D, requires_grad=True)
    assert count_flops(model, x) == model.flops(2, 16)
    loss = model(x).sum()
    assert count_flops(loss.backward) == model.flops_backward(2, 16)


def test_the_hybrids_modeled_peak_is_the_profilers() -> None:
    """Inference on the CPU, vanilla as its own kind (every op seen by the tracker)."""
    n = 256
    cell = Cell.of(
        "vanilla", n, dtype="fp32", device="cpu", params=(("causal", True),), layers=4,
        d_model=64, n_heads=4, d_ff=128, schedule="lin, attention", kinds=KINDS,
    )  # fmt: skip
    modeled, real = peaks(cell, 2)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)


def test_a_schedule_is_keyed_apart_from_its_twin_whose_key_is_as_before() -> None:
    v100 = presets.load("v100_16gb")
    twin = Cell.of("sdpa", 512, params=(("causal", True),))
    scheduled = Cell.of("sdpa", 512, params=(("causal", True),), schedule="lin, attention",
                        kinds=KINDS)  # fmt: skip
    reordered = Cell.of("sdpa", 512, params=(("causal", True),), schedule="lin, attention",
                        kinds=dict(reversed(KINDS.items())))  # fmt: skip
    assert (
        key(scheduled, v100) != key(twin, v100) == key(Cell("sdpa", 512, params=twin.params), v100)
    )
    assert key(scheduled, v100) == key(reordered, v100)  # the kinds' order is no part of it
    # its one form: the layers' shortest block, the kinds it uses (mla is not)
    assert scheduled.model.shape["schedule"] == "(lin, attention)*6; lin=gated_deltanet(conv=4)"


@pytest.mark.parametrize(
    "spelling",
    ["3*lin, attention", "3*lin,attention", "(3*lin, attention)*3", "lin,lin,lin,attention"],
)
def test_one_schedule_however_written_is_one_key(spelling: str) -> None:
    """Spellings of one schedule, a kind's n_heads equal to the model's, a kind declared but
    unused: one cell, one key; every layer the cell's own mechanism is the twin itself."""
    v100 = presets.load("v100_16gb")
    kinds = {"lin": {"attention": "gated_deltanet", "n_heads": 12}, "unused": {"attention": "gla"}}
    causal = (("causal", True),)
    lin = {"lin": {"attention": "gated_deltanet"}}
    one = Cell.of("sdpa", 512, params=causal, layers=12, schedule="(3*lin, attention)*3", kinds=lin)
    other = Cell.of(
        "sdpa", 512, params=(("causal", True),), layers=12, schedule=spelling, kinds=kinds
    )
    assert other == one and key(other, v100) == key(one, v100)
    assert one.model.schedule == "(3*lin, attention)*3"
    twin = Cell.of("sdpa", 512, params=(("causal", True),), layers=12, schedule="attention*12",
                   kinds=kinds)  # fmt: skip
    assert twin == Cell.of("sdpa", 512, params=(("causal", True),), layers=12)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"params": ()}, "model.kinds.lin: attention=gated_deltanet is causal only"),
        ({"kinds": {**KINDS, "lin": {"attention": "nope"}}}, "model.kinds.lin.attention: "),
        ({"kinds": {**KINDS, "lin": {"attention": "gla", "heads": 2}}}, "unknown key 'heads'"),
        ({"kinds": {**KINDS, "attention": {"attention": "sdpa"}}}, "the cell's own mechanism"),
        ({"schedule": "(2*lin, gdn, attention)"}, "kind 'gdn' is not declared in model.kinds"),
        (
            {"kinds": {**KINDS, "lin": {"attention": "gla", "n_heads": 3}}},
            "model.kinds.lin: d_model",
        ),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_key(change: dict, needle: str) -> None:
    with pytest.raises(ValueError) as e:  # at the cell's making, or at its planning
        validate(
            Cell.of("sdpa", 16, dtype="fp32", device="cpu", **{**HYBRID, "params": OWN, **change})
        )
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_two_chunked_kinds_are_held_to_one_traced_bound_together() -> None:
    """Six RetNet and six GLA layers at n = 131072 in chunks of 64: each kind's 6 × 2048
    steps is under the 16384 allowed, both kinds' 24576 together are not; at n = 65536 the
    12288 together pass."""
    mixers = dict(layers=12, d_model=64, n_heads=2, d_ff=128, schedule="(gla, attention)",
                  kinds={"gla": {"attention": "gla"}}, params=(("causal", True),))  # fmt: skip
    with pytest.raises(ValueError) as e:
        validate(Cell.of("retnet", 131072, batch=1, **mixers))
    assert "6 layers = 12288 + 12288 of the schedule's other layers per traced step" in str(e.value)
    assert "\n" not in str(e.value)
    validate(Cell.of("retnet", 65536, batch=1, **mixers))


def test_a_hybrid_serves_through_the_cli_and_a_bad_one_exits_2(tmp_path: Path) -> None:
    """One real ``attnbench run`` of a decoding hybrid: its row holds the schedule in its
    model and its state is every layer's own; a kind that cannot decode is one line, exit 2,
    nothing written."""
    args = (
        "run", "mode=decode", "attention=sdpa", "model=tiny", "device=cpu", "dtype=fp32",
        "n=32", "decode_tokens=4", "model.layers=4", "progress=false", "timing.min_seconds=0",
        "timing.min_repeats=2", "model.schedule='3*lin, attention'",
        "+model.kinds.lin.attention=gated_deltanet",
    )  # fmt: skip
    out = run_cli(*args, f"out_dir={tmp_path / 'ok'}")
    assert out.returncode == 0, out.stderr
    (row,) = read_rows(next((tmp_path / "ok").rglob("cells.jsonl")))
    assert row["status"] == "ok" and row["model"]["schedule"].startswith("3*lin, attention; lin=")
    res = validate(Cell.from_dict({**row["cell"], "ceiling_bytes": None}))
    model = build(res.cell, res, "meta", torch.float32)
    assert row["state_bytes"] == model.state_bytes(32 + 4, 4)  # n + the tokens generated
    bad = run_cli(*args[:-1], "+model.kinds.lin.attention=linformer", f"out_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "model.kinds.lin: " in bad.stderr and not (tmp_path / "bad").exists()
    assert json.loads(json.dumps(row["model"]))  # plain JSON
