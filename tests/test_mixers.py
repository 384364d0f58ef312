"""The five recurrent mixers as layers (retnet, gla, mamba2, deltanet, gated_deltanet).

What the registry-wide tests already hold for them, as for every mechanism: no future leak,
padding is the sequence cut short, NaN at a padded position reaches no real output
(test_contract); prefill + decode = the causal forward in float64 and fp32
(test_decode_contract); the context memory is the hand count and the decode state's tensors
(test_context_memory); forward FLOPs are FlopCounterMode's (test_flops); the modeled peak is
the CPU profiler's within 1 % in a forward, a training step and serving (test_memory_model,
test_train, test_decode_workload). Here: what only these have. The chunked form the layer
runs equals the token-by-token reference through the whole layer, outputs and gradients, in
float64; the backward's FLOPs; the chunk size changes nothing but speed; a causal-only
mechanism is refused non-causal, and each of its settings out of range is one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnbench
from attnbench.attention import mixer
from attnbench.attention.delta_scan import delta_reference
from attnbench.attention.gated_scan import gated_reference
from attnbench.cell import Cell, Part
from attnbench.cell_rules import left_out
from attnbench.plan import validate

MIXERS = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
D, H = 32, 4
SETTINGS = {"mamba2": {"d_state": 8, "groups": 2}}  # groups of heads sharing B and C


def _layer(name: str, dtype: torch.dtype = torch.float64, **params: object) -> torch.nn.Module:
    torch.manual_seed(0)
    m = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=64, **SETTINGS.get(name, {}),
                         **params)  # fmt: skip
    return m.to(dtype)


def _with_references(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' chunked cores replaced by the token-by-token references (which take no
    ``chunk``): the layer as the readable definition computes it."""

    def gated(*args: object, chunk: int, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        return gated_reference(*args, **kw)

    def delta(*args: object, chunk: int, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        return delta_reference(*args, **kw)

    monkeypatch.setattr(mixer, "gated_chunked", gated)
    monkeypatch.setattr(mixer, "delta_chunked", delta)


@pytest.mark.parametrize("name", MIXERS)
def test_the_chunked_layer_is_the_reference_layer_outputs_and_gradients(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n = 37 with chunks of 8 (n not a multiple) and of 64 (n < chunk), and a padded
    batch: outputs and every parameter's gradient within float64 rounding."""
    x = torch.randn(2, 37, D, dtype=torch.float64)
    mask = torch.zeros(2, 37, dtype=torch.bool)
    mask[1, :5] = True  # left padding, as attnbench pads prompts

    def run(m: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = m(x, mask)
        grads = torch.autograd.grad(out[~mask].pow(2).sum(), list(m.parameters()))
        return out[~mask], list(grads)

    for chunk in (8, 64):
        got, got_grads = run(_layer(name, chunk=chunk))
        with monkeypatch.context() as patch:
            _with_references(patch)
            want, want_grads = run(_layer(name, chunk=chunk))
        assert (got - want).abs().max() < 1e-11, (name, chunk)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert (g - w).abs().max() <= 1e-10 * max(1.0, w.abs().max()), (name, chunk)


@pytest.mark.parametrize("name", MIXERS)
def test_the_chunk_size_changes_nothing_but_speed(name: str) -> None:
    x = torch.randn(1, 50, D, dtype=torch.float64)
    outs = [_layer(name, chunk=c)(x) for c in (1, 16, 50, 256)]
    for out in outs[1:]:
        assert (out - outs[0]).abs().max() < 1e-11, name


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("name", MIXERS)
def test_backward_flops_are_flopcountermodes(name: str, chunk: int) -> None:
    """Every matmul's two gradients, less what a backward from a zero state skips, and for
    the delta rule the triangular solve's one backward matmul; n = 40 in chunks of 16 (the
    last short) and of 64 (one chunk, the first and the last)."""
    m = _layer(name, torch.float32, chunk=chunk)
    x = torch.randn(2, 40, D, requires_grad=True)
    loss = m(x).sum()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    assert counter.get_total_flops() == m.flops_backward(2, 40)


def test_parameters_beyond_the_transformers_are_counted() -> None:
    """attention_params counts each layer's own weights: RetNet's output gate adds a
    d × d + d linear layer and a d_h norm to vanilla's 4·d·(d + 1)."""
    vanilla = attnbench.build_model("vanilla", layers=2, d_model=D, n_heads=H, d_ff=64,
                                    max_seq_len=64)  # fmt: skip
    retnet = attnbench.build_model("retnet", layers=2, d_model=D, n_heads=H, d_ff=64,
                                   max_seq_len=64)  # fmt: skip
    assert vanilla.attention_params() == 2 * 4 * D * (D + 1)
    assert retnet.attention_params() == 2 * (4 * D * (D + 1) + D * (D + 1) + D // H)


def _cell(name: str, **params: object) -> Cell:
    return Cell(name, n=256, k=None, dtype="fp32", device="cpu", params=tuple(params.items()))


@pytest.mark.parametrize("name", MIXERS)
def test_a_non_causal_cell_is_refused_and_left_out_of_sweeps(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^causal: attention={name} is causal only \("):
        validate(_cell(name))
    assert left_out(_cell(name)) == "is causal only"
    assert left_out(_cell(name, causal=True)) is None
    validate(_cell(name, causal=True))
    # MQAR trains every mechanism with a causal form causally, whatever causal says
    recall = Cell(
        name,
        n=64,
        k=None,
        dtype="fp32",
        device="cpu",
        task=Part("mqar"),
    )
    assert left_out(recall) is None
    validate(recall)


BAD = [
    ("retnet", {"chunk": 0}, r"^chunk: must be an integer >= 1, got 0$"),
    ("gla", {"chunk": 2.5}, r"^chunk: must be an integer >= 1, got 2.5$"),
    ("mamba2", {"groups": 3}, r"^groups: must divide n_heads=4 \(one of 1, 2, 4\), got 3$"),
    ("mamba2", {"d_state": 0}, r"^d_state: must be an integer >= 1, got 0$"),
    ("deltanet", {"conv": -1}, r"^conv: must be an integer in \[0, 64\], got -1$"),
    ("gated_deltanet", {"causal": False}, r"^causal: gated_deltanet is causal only \("),
    ("retnet", {"conv": 4}, r"^retnet: unknown parameter 'conv'; allowed: causal, chunk, kernel$"),
]


@pytest.mark.parametrize(("name", "params", "says"), BAD)
def test_each_setting_out_of_range_is_one_line(name: str, params: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        attnbench.create(name, d_model=D, n_heads=H, max_seq_len=64, **params)


def test_refusals_through_the_cli_exit_2_and_write_nothing(tmp_path: Path, cli_in_process) -> None:
    """The user's path: the key and what is allowed, exit 2, no run directory."""
    for args, says in [
        (["attention=gla"], "causal: attention=gla is causal only"),
        (["attention=mamba2", "causal=true", "+attention.params.groups=5"], "groups: must divide"),
        (["attention=deltanet", "causal=true", "+attention.params.chunk=0"], "chunk: must be"),
    ]:
        r = cli_in_process("run", *args, "out_dir=out", "progress=false", cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", MIXERS)
def test_kernel_fla_is_refused_where_it_cannot_run(name: str) -> None:
    """No CUDA here (or no package): one line naming the key and the reason."""
    with pytest.raises(ValueError, match=r"^kernel: fla cannot run here: .*; use kernel=torch$"):
        attnbench.create(name, d_model=D, n_heads=H, max_seq_len=64, kernel="fla")


def test_the_gate_times_each_mixer_in_its_causal_form() -> None:
    """The regression suite names the mixers without causal=true, as every mechanism; the
    gate times their only form, a forward, a backward and a decode step each."""
    from attnbench.check.suite import load_suite

    names = {c.name for c in load_suite().cells}
    for name in MIXERS:
        for cell in ("n=256 b=1", "n=512 b=1", "n=256 b=1 backward", "n=1024 b=1 decode"):
            assert f"{name} (causal=True) {cell}" in names
