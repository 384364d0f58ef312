"""Kimi Delta Attention: its core (attention/kda_scan.py, the delta rule with a decay per key
channel) and its layer (attention/kda.py).

The core: chunked = reference = step by step in float64; with every channel's decay equal
it is Gated DeltaNet's scalar core; fla's own naive references agree; strong decays neither
overflow nor lose the reference in fp32; padding and packed documents; gradients. The
layer: the chunked layer is the reference layer (outputs and gradients), its FLOPs are
FlopCounterMode's forward and backward, and ``kernel=fla`` (fla's ``chunk_kda`` and
``fused_recurrent_kda`` through Triton's interpreter, tests/fla_interpret.py) equals ours.

Residuals as measured on this machine (float64 unless said; b = 2, h = 3, dk = 4, dv = 5, a
random initial state; asserted below the bounds in the tests): chunked against the reference
over n ∈ {1, 5, 37} and chunks 1, 8, 12, 64, at most 1.8e-15 on outputs, 4.4e-16 on states;
a prefill by the chunked form then kda_step token by token, 1.8e-15; equal channels against
Gated DeltaNet's delta_chunked, 2.7e-15; every input's gradient, chunked against the
reference, 3.6e-15. fla's naive_recurrent_kda and naive_chunk_kda (computed in fp32 whatever
the input) against our float64 reference: 1.3e-7 and 2.5e-7 of the largest output. fp32
chunked with g down to −115 per token against the float64 reference: 1.1e-7 of the largest
output (the fp32 reference itself: 1.2e-7). The layer (d 32, 4 heads, float64): chunked
against reference 8.3e-16 on outputs, 1.7e-15 relative on gradients. kernel=fla in fp32
against ours (d 32, 2 heads, n 80): outputs 3.3e-7, gradients 7.1e-7 but the decay's
weights' 5.9e-5 to 2.3e-4 (see that test), prefill + decode 2.9e-7, packed 3.1e-7 of the
largest.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.nn.functional import logsigmoid, normalize
from torch.utils.flop_counter import FlopCounterMode

import attnbench
from attnbench.attention import fla_kernels, kda_scan
from attnbench.attention.delta_scan import delta_chunked, delta_reference, delta_step
from attnbench.attention.kda_scan import kda_chunked, kda_reference, kda_step
from attnbench.attention.packing import Packing
from tests import fla_naive

B, H, DK, DV = 2, 3, 4, 5
F64 = torch.float64


def inputs(n: int, *, dtype: torch.dtype = F64, seed: int = 0, strong: float = 2.0) -> dict:
    """q, k (unit), v, g ≤ 0 per channel, beta ∈ (0, 1), initial_state."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64)

    x = {
        "q": r(B, H, n, DK),
        "k": normalize(r(B, H, n, DK), dim=-1),
        "v": r(B, H, n, DV),
        "g": logsigmoid(r(B, H, n, DK) + strong),
        "beta": torch.sigmoid(r(B, H, n)),
        "initial_state": r(B, H, DK, DV),
    }
    return {k: v.to(dtype) for k, v in x.items()}


def args(x: dict) -> tuple:
    return x["q"], x["k"], x["v"], x["g"], x["beta"]


def diff(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


# --- the core --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 8, 12, 64])
@pytest.mark.parametrize("n", [1, 5, 37])
def test_chunked_equals_the_reference_in_float64(n: int, chunk: int) -> None:
    x = inputs(n)
    o, s = kda_reference(*args(x), initial_state=x["initial_state"])
    o_c, s_c = kda_chunked(*args(x), chunk=chunk, initial_state=x["initial_state"])
    assert diff(o, o_c) < 1e-13 and diff(s, s_c) < 1e-13


@pytest.mark.parametrize("prefill", [0, 9])
def test_prefill_then_steps_equal_the_whole(prefill: int) -> None:
    x = inputs(14)
    want, s_want = kda_reference(*args(x), initial_state=x["initial_state"])
    s, outs = x["initial_state"], []
    if prefill:
        o, s = kda_chunked(*(t[:, :, :prefill] for t in args(x)), chunk=4, initial_state=s)
        outs.append(o)
    for t in range(prefill, 14):
        o_t, s_next = kda_step(*(a[:, :, t] for a in args(x)), s)
        assert s_next is not s
        outs.append(o_t[:, :, None])
        s = s_next
    assert diff(torch.cat(outs, 2), want) < 1e-13 and diff(s, s_want) < 1e-13


def test_one_decay_across_channels_is_gated_deltanets_core() -> None:
    """g the same in every channel: Diag(α) = α I commutes with I − β k kᵀ, so the
    recurrence is Gated DeltaNet's (delta_scan, whose g is a scalar per head)."""
    x = inputs(29)
    scalar = x["g"][..., 0]
    x["g"] = scalar[..., None].expand_as(x["g"])
    kw = {"initial_state": x["initial_state"]}
    q, k, v, _, beta = args(x)
    want, s_want = delta_chunked(q, k, v, beta, scalar, chunk=8, **kw)
    assert diff(delta_reference(q, k, v, beta, scalar, **kw)[0], want) < 1e-13
    for o, s in (kda_chunked(*args(x), chunk=8, **kw), kda_reference(*args(x), **kw)):
        assert diff(o, want) < 1e-13 and diff(s, s_want) < 1e-13
    o_t, s_t = kda_step(*(a[:, :, 0] for a in args(x)), x["initial_state"])
    want_t, s_want_t = delta_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0],
                                  scalar[:, :, 0], x["initial_state"])  # fmt: skip
    assert diff(o_t, want_t) < 1e-13 and diff(s_t, s_want_t) < 1e-13


@pytest.mark.parametrize("name", ["naive_recurrent_kda", "naive_chunk_kda"])
def test_flas_naive_references_agree(name: str) -> None:
    """fla's ``fla/ops/kda/naive.py`` (its layout (B, T, H, ·), computed in fp32 whatever the
    input, so a float64 agreement is out of reach: within 1e-5 of the largest output)."""
    fn, why = fla_naive.function("kda", name)
    if fn is None:
        pytest.skip(why)
    x = inputs(64)
    want, s_want = kda_reference(*args(x), initial_state=x["initial_state"])
    ours = [t.transpose(1, 2) for t in args(x)]
    o, s = fn(*ours, scale=1.0, initial_state=x["initial_state"], output_final_state=True)
    scale = want.abs().max().item()
    assert diff(o.transpose(1, 2).to(F64), want) < 1e-5 * scale
    assert diff(s.to(F64), s_want) < 1e-5 * s_want.abs().max().item()


def test_gradients_of_the_chunked_form_equal_the_reference() -> None:
    x = {k: v[:1, :2].clone().requires_grad_() for k, v in inputs(11).items()}
    w = torch.randn(1, 2, 11, DV, dtype=F64)
    grads = []
    for run in (kda_reference, lambda *a, **k: kda_chunked(*a, chunk=4, **k)):
        o, s = run(*args(x), initial_state=x["initial_state"])
        grads.append(torch.autograd.grad((o * w).sum() + s.sum(), list(x.values())))
    for ours, want in zip(*grads, strict=True):
        assert diff(ours, want) < 1e-13


def test_strong_decays_neither_overflow_nor_lose_the_reference() -> None:
    """log-decays down to −115 per token and channel: a chunk of 64 sums to thousands, far
    past fp32's e^{±88}; every exponent is a segment's own sum ≤ 0, so fp32 stays finite and
    within 1e-5 of the float64 reference's largest output."""
    x = inputs(128, strong=-4.0)
    x["g"] = x["g"] * 15  # down to about −115
    want, _ = kda_reference(*args(x), initial_state=x["initial_state"])
    x32 = {k: v.float() for k, v in x.items()}
    o, s = kda_chunked(*args(x32), chunk=64, initial_state=x32["initial_state"])
    assert o.dtype == torch.float32 and torch.isfinite(o).all() and torch.isfinite(s).all()
    assert diff(o.to(F64), want) < 1e-5 * want.abs().max().item()


def test_a_padded_token_changes_no_state_and_its_nan_reaches_nothing() -> None:
    x = inputs(12)
    mask = torch.ones(B, 12, dtype=torch.bool)
    mask[0, :3] = False
    for key in ("q", "k", "v", "g"):
        x[key][0, :, :3] = float("nan")
    x["beta"][0, :, :3] = float("nan")
    kw = {"mask": mask, "initial_state": x["initial_state"]}
    o, s = kda_chunked(*args(x), chunk=5, **kw)
    want, s_want = kda_reference(*args(x), **kw)
    cut = {k: v[:1, :, 3:] if v.dim() > 3 or k == "beta" else v[:1] for k, v in x.items()}
    cut["initial_state"] = x["initial_state"][:1]
    short, s_short = kda_reference(*args(cut), initial_state=cut["initial_state"])
    assert torch.isfinite(o).all() and (o[0, :, :3] == 0).all()
    assert diff(o, want) < 1e-13 and diff(s, s_want) < 1e-13
    assert diff(o[:1, :, 3:], short) < 1e-13 and diff(s[:1], s_short) < 1e-13


@pytest.mark.parametrize("chunk", [4, 64])
def test_a_reset_at_each_document_is_each_document_alone(chunk: int) -> None:
    x = inputs(20)
    starts = torch.zeros(B, 20, dtype=torch.bool)
    starts[:, [0, 7, 16]] = True
    o, s = kda_chunked(*args(x), chunk=chunk, starts=starts)
    want, s_want = kda_reference(*args(x), starts=starts)
    assert diff(o, want) < 1e-13 and diff(s, s_want) < 1e-13
    for lo, hi in ((0, 7), (7, 16), (16, 20)):
        alone, s_alone = kda_reference(*(t[:, :, lo:hi] for t in args(x)))
        assert diff(o[:, :, lo:hi], alone) < 1e-13
    assert diff(s, s_alone) < 1e-13


def test_a_g_not_per_channel_is_refused_naming_it() -> None:
    x = inputs(3)
    with pytest.raises(ValueError, match=r"^g: must be \(b, h, n, dk\) = \(2, 3, 3, 4\), got"):
        kda_chunked(x["q"], x["k"], x["v"], x["g"][..., 0], x["beta"])


# --- the layer -------------------------------------------------------------------------------

D, LH = 32, 4


def _layer(dtype: torch.dtype = F64, **params: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return attnbench.create("kda", d_model=D, n_heads=LH, max_seq_len=64, **params).to(dtype)


def test_the_chunked_layer_is_the_reference_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """n = 37 in chunks of 8, a left-padded row: outputs and every parameter's gradient."""
    x = torch.randn(2, 37, D, dtype=F64)
    mask = torch.zeros(2, 37, dtype=torch.bool)
    mask[1, :5] = True

    def run() -> tuple[Tensor, list[Tensor]]:
        m = _layer(chunk=8)
        out = m(x, mask)
        return out[~mask], list(torch.autograd.grad(out[~mask].pow(2).sum(), m.parameters()))

    got, got_grads = run()

    def reference(*a: object, chunk: int, **kw: object) -> tuple[Tensor, Tensor]:
        return kda_reference(*a, **kw)

    monkeypatch.setattr(kda_scan, "kda_chunked", reference)
    want, want_grads = run()
    assert diff(got, want) < 1e-12
    for g, w in zip(got_grads, want_grads, strict=True):
        assert diff(g, w) <= 1e-10 * max(1.0, w.abs().max().item())


@pytest.mark.parametrize(("n", "chunk"), [(64, 16), (40, 12), (40, 64)])
def test_flops_forward_and_backward_are_flopcountermodes(n: int, chunk: int) -> None:
    """Forward: every linear layer and the core's matmuls (sub-blocks padded, chunk 12);
    backward: every matmul's two gradients, the solve's one, less what a zero state skips."""
    m = _layer(torch.float32, chunk=chunk)
    x = torch.randn(2, n, D, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        loss = m(x).sum()
    assert counter.get_total_flops() == m.flops(2, n)
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    assert counter.get_total_flops() == m.flops_backward(2, n)


def test_the_chunk_size_changes_nothing_but_speed() -> None:
    x = torch.randn(1, 50, D, dtype=F64)
    outs = [_layer(chunk=c)(x) for c in (1, 16, 50, 256)]
    for out in outs[1:]:
        assert diff(out, outs[0]) < 1e-11


# --- kernel=fla through Triton's interpreter -------------------------------------------------

N = 80  # two chunks of 64, the second partial


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    ours = attnbench.create("kda", d_model=D, n_heads=2, max_seq_len=N)
    theirs = attnbench.create("kda", d_model=D, n_heads=2, max_seq_len=N, kernel="fla")
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _close(ours: Tensor, theirs: Tensor, tolerance: float) -> None:
    assert diff(ours.float(), theirs.float()) <= tolerance * ours.abs().max().item()


DECAY = ("a_log", "dt_bias", "f_down.weight", "f_up.weight")  # what reaches only g


def test_kernel_fla_a_padded_forward_and_its_backward(calls: list[str]) -> None:
    """fp32: outputs within 1e-5 of the largest, gradients 4e-5, but those of the weights
    that reach only the decay 2e-3: chunk_kda's gradient of g is itself that far off.
    Measured against our layer in float64 (this input, left-padded): a_log's gradient 2.2e-4
    and dt_bias's 2.3e-4 relative for theirs, 2.3e-7 each for ours in fp32; every other
    gradient within 1.1e-6 for both. Unpadded, theirs 8.9e-4 and 2.9e-4."""
    torch.manual_seed(1)
    x = torch.randn(1, N, D)
    mask = torch.zeros(1, N, dtype=torch.bool)
    mask[0, :7] = True
    w = torch.randn(1, N, D)
    outs, grads = [], []
    for layer in _pair():
        xi = x.clone().requires_grad_()
        o = layer(xi, mask)
        (o * w).masked_fill(mask[..., None], 0).sum().backward()
        outs.append(o[~mask])
        grads.append({"x": xi.grad, **{k: p.grad for k, p in layer.named_parameters()}})
    _close(*outs, 1e-5)
    for key, ours in grads[0].items():
        _close(ours, grads[1][key], 2e-3 if key in DECAY else 4e-5)
    assert calls == ["chunk_kda"]


def test_kernel_fla_a_prefill_then_decode_steps_and_a_packed_batch(calls: list[str]) -> None:
    torch.manual_seed(1)
    x = torch.randn(2, N, D)
    runs = []
    for layer in _pair():
        state = layer.new_state(1, 72, torch.float32, torch.device("cpu"))
        outs = [layer.extend(x[:1, :70], state)]
        outs += [layer.extend(x[:1, t : t + 1], state) for t in (70, 71)]
        runs.append([*outs, state.s])
    for ours, theirs in zip(*runs, strict=True):
        _close(ours, theirs, 1e-5)
    packing = Packing.of([(30, 34, 16), (64, 16)])
    ours, theirs = _pair()
    _close(ours.attend_packed(x, packing), theirs.attend_packed(x, packing), 1e-5)
    step = "fused_recurrent_kda"
    assert calls == ["chunk_kda", step, step, "chunk_kda"]


def test_kernel_fla_chunk_is_what_chunk_kda_takes() -> None:
    with pytest.raises(ValueError, match=r"^chunk: kernel=fla runs kda on chunk_kda, whose"):
        fla_kernels.check_chunk("kda", 16)
    fla_kernels.check_chunk("kda", 32)
