"""Performer (FAVOR+) and xformers: approximation, padding, causality (the chunked prefix sums
against float64 references and the fallback they replaced), FLOPs, memory, features,
availability."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

import attnbench
import attnbench.attention.performer
import attnbench.attention.xformers as xf
from attnbench.attention.masks import blocked_keys
from attnbench.measure.flops import count_flops
from attnbench.measure.memory import profiled_peak
from attnbench.registry import info
from tests.conftest import assert_peaks_match_the_profiler

D_MODEL, N_HEADS, N = 64, 4, 64
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def performer(**params) -> attnbench.attention.performer.PerformerAttention:
    return attnbench.create("performer", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=N, **params)


def copy_projections(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    for name in PROJECTIONS:
        getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


def right_padding(lengths: list[int], n: int) -> torch.Tensor:
    """(b, n) bool, True past each row's length."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


# --- performer: approximation -------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_as_nb_features_grows(causal: bool) -> None:
    """Mean relative error against exact softmax attention, same q/k/v/out weights.

    Inputs ~ N(0, 1) give scores (q·k/√dh) of std ≈ 0.34 here: not saturated, not uniform.
    Measured (5 seeds): non-causal 0.35, 0.20, 0.13, 0.08; causal 0.39, 0.22, 0.14, 0.08 for
    m = 16, 64, 256, 1024. A broken feature map plateaus instead, so the ratio can fail.
    """
    sizes, seeds = (16, 64, 256, 1024), range(5)
    errors = []
    for m in sizes:
        total = 0.0
        for seed in seeds:
            torch.manual_seed(seed)
            exact = attnbench.create(
                "vanilla", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=N, causal=causal
            )
            approx = performer(nb_features=m, causal=causal).eval()
            copy_projections(exact, approx)
            x = torch.randn(2, N, D_MODEL)
            with torch.no_grad():
                want, got = exact(x), approx(x)
            total += ((got - want).norm() / want.norm()).item()
        errors.append(total / len(seeds))
    print(
        f"performer causal={causal} rel. error by nb_features:",
        dict(zip(sizes, (round(e, 4) for e in errors), strict=True)),
    )
    assert errors[-1] < 0.5 * errors[0], errors


# --- performer: padding --------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
@pytest.mark.parametrize("causal", [False, True])
def test_performer_padding_is_invisible(causal: bool, kernel: str) -> None:
    """Padded keys leave numerator and normaliser alike: new padding values change nothing,
    and the output equals the one for the truncated sequence."""
    torch.manual_seed(0)
    layer = performer(nb_features=64, causal=causal, kernel=kernel).eval()
    n, lengths = 24, [24, 17, 9]
    mask = right_padding(lengths, n)
    x = torch.randn(len(lengths), n, D_MODEL)
    x_other = torch.where(mask[..., None], torch.randn_like(x) * 3, x)
    with torch.no_grad():
        out = layer(x, mask)
        out_other = layer(x_other, mask)
        for i, length in enumerate(lengths):
            alone = layer(x[i : i + 1, :length])  # (1, length, d)
            torch.testing.assert_close(out[i, :length], alone[0])
            torch.testing.assert_close(out_other[i, :length], alone[0])


def test_performer_padding_anywhere_non_causal() -> None:
    """Not only right padding: any padded key is gone, wherever it sits."""
    torch.manual_seed(1)
    layer = performer(nb_features=64).eval()
    mask = torch.rand(3, 20) < 0.4
    mask[:, 5] = False  # every row keeps a key
    x = torch.randn(3, 20, D_MODEL)
    x_other = torch.where(mask[..., None], torch.randn_like(x) * 3, x)
    with torch.no_grad():
        out, out_other = layer(x, mask), layer(x_other, mask)
    keep = ~mask
    torch.testing.assert_close(out[keep], out_other[keep])


# --- performer: causal ---------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_performer_causal_ignores_the_future(kernel: str) -> None:
    """Output i must not move when inputs after i do, even by a lot: the library's key
    max-stabiliser plus eps would leak them (see performer.py)."""
    torch.manual_seed(0)
    layer = performer(nb_features=64, causal=True, kernel=kernel).eval()
    x = torch.randn(2, N, D_MODEL)
    with torch.no_grad():
        out = layer(x)
        for j, scale in ((1, 1.0), (N // 2, 1.0), (N // 2, 10.0), (N // 2, 50.0), (N - 1, 3.0)):
            later = x.clone()
            later[:, j:] = torch.randn(2, N - j, D_MODEL) * scale
            got = layer(later)[:, :j]
            assert torch.isfinite(got).all(), f"large later keys (x{scale}) made NaN before {j}"
            torch.testing.assert_close(got, out[:, :j])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [True, False])
def test_performer_half_precision_close_to_fp32(causal: bool, dtype: torch.dtype) -> None:
    """Causal runs its prefix sums in fp32: in fp16 they reach NaN at n = 512 with inputs of
    std 1.5 (measured), and bf16 drifts."""
    torch.manual_seed(0)
    n = 512
    layer = attnbench.create(
        "performer", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=n, nb_features=64, causal=causal
    ).eval()
    x = torch.randn(2, n, D_MODEL) * 1.5
    mask = right_padding([n, 300], n)
    with torch.no_grad():
        want = layer(x, mask)
        got = copy.deepcopy(layer).to(dtype)(x.to(dtype), mask)
    assert got.dtype == dtype
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


# --- performer: the chunked causal prefix sums --------------------------------------------


def _quadratic_causal(q_f: torch.Tensor, k_f: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """φ(Q)φ(K)ᵀ masked lower-triangular, rows normalised: the reference the prefix sums must
    equal (written here, not imported)."""
    a = (q_f @ k_f.transpose(-2, -1)).tril()
    return a @ v / a.sum(-1, keepdim=True)


@pytest.mark.parametrize("n", [7, 64, 100])  # < chunk, = chunk, not a multiple of it
@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_performer_causal_equals_the_quadratic_reference_in_float64(kernel: str, n: int) -> None:
    """The whole layer in float64 against the masked quadratic product of its own features,
    and against performer-pytorch's own prefix-sum path (the fallback this replaced)."""
    from performer_pytorch.performer_pytorch import causal_linear_attention_noncuda

    torch.manual_seed(0)
    layer = attnbench.create(
        "performer", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=n, nb_features=24,
        kernel=kernel, causal=True,
    ).double()  # fmt: skip
    x = torch.randn(2, n, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x)
        q, k, v = layer.qkv_heads(x)
        q_f, k_f = layer.features(q, k)
        fallback = causal_linear_attention_noncuda(q_f, k_f, v, eps=0.0)
        want = layer.out_proj(layer.merge_heads(_quadratic_causal(q_f, k_f, v)))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fallback, _quadratic_causal(q_f, k_f, v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "params", [{"causal": True}, {"causal": True, "kernel": "relu"}, {}], ids=str
)
@pytest.mark.parametrize("n", [64, 40])
def test_performer_flops_match_the_counter_forward_and_backward(params: dict, n: int) -> None:
    """Causal included: the chunked matmuls are all visible to FlopCounterMode."""
    b = 3
    model = attnbench.build_model(
        "performer", layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_ff=48, max_seq_len=64,
        nb_features=16, **params,
    ).train()  # fmt: skip
    x = torch.randn(b, n, D_MODEL, requires_grad=True)
    assert count_flops(model, x) == model.flops(b, n)
    loss = model(x).pow(2).mean()
    assert count_flops(loss.backward) == model.flops_backward(b, n)


def test_performer_causal_leading_padding_gives_zero_and_finite_gradients() -> None:
    """Queries before the first real key see none: 0 before out_proj (not 0/0), and no NaN
    flows back from them."""
    layer = performer(nb_features=32, causal=True)
    mask = right_padding([16, 16], 16)
    mask[1, :5] = True
    x = torch.randn(2, 16, D_MODEL)
    inner = layer.attend(x, mask)
    assert torch.equal(inner[1, :5], torch.zeros(5, D_MODEL))
    layer(x, mask).square().sum().backward()
    for name, p in layer.named_parameters():
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_performer_causal_modeled_peak_equals_the_profilers(kernel: str) -> None:
    """The generic memory tests run performer non-causal; the causal loop here, forward and
    training step, within 1 % of the CPU profiler."""
    assert_peaks_match_the_profiler("performer", causal=True, kernel=kernel)


def test_performer_causal_training_peak_is_far_below_the_fallbacks() -> None:
    """Same features, n = 1024, m = 64, d_h = 32, forward and backward: the fallback forms
    every prefix state by broadcast products and autograd keeps them all for the backward
    (b·h·n·m·d_h·4 B = 16.8 MB; measured peak 19.5 MB); the chunked sums keep the n/c chunk
    states (measured 2.4 MB). A forward alone is no test: there the fallback holds only 1/128
    of the states at a time."""
    from performer_pytorch.performer_pytorch import causal_linear_attention_noncuda

    from attnbench.attention.prefix import causal_linear_attention

    b, h, n, m, dh = 1, 2, 1024, 64, 32
    q_f, k_f = torch.rand(2, b, h, n, m, requires_grad=True)
    v = torch.randn(b, h, n, dh, requires_grad=True)

    def step(fn: Callable[[], torch.Tensor]) -> int:
        return profiled_peak(lambda: fn().sum().backward())

    ours = step(lambda: causal_linear_attention(q_f, k_f, v, 64))
    fallback = step(lambda: causal_linear_attention_noncuda(q_f, k_f, v, eps=0.0))
    print(f"training peak bytes: chunked {ours}, fallback {fallback}")
    assert fallback >= b * h * n * m * dh * 4
    assert ours < fallback / 5, (ours, fallback)


# --- performer: random features ------------------------------------------------------------


def test_performer_redraws_in_training_only() -> None:
    torch.manual_seed(0)
    layer = performer(nb_features=32, feature_redraw_interval=2)
    x = torch.randn(1, 8, D_MODEL)
    first = layer.projection_matrix.clone()
    layer.train()
    layer(x)
    layer(x)
    torch.testing.assert_close(layer.projection_matrix, first)  # 2 calls on the first draw
    layer(x)
    assert not torch.allclose(layer.projection_matrix, first)
    drawn = layer.projection_matrix.clone()
    layer.eval()
    for _ in range(5):
        layer(x)
    torch.testing.assert_close(layer.projection_matrix, drawn)


def test_performer_no_redraw_without_interval() -> None:
    layer = performer(nb_features=32).train()
    first = layer.projection_matrix.clone()
    for _ in range(5):
        layer(torch.randn(1, 8, D_MODEL))
    torch.testing.assert_close(layer.projection_matrix, first)


def _max_offdiag_cosine(w: torch.Tensor, block: int) -> float:
    """Largest |cos| between two different rows of the same block of ``block`` rows."""
    worst = 0.0
    for rows in w.split(block):
        unit = rows / rows.norm(dim=1, keepdim=True)
        cos = unit @ unit.T - torch.eye(len(rows))
        worst = max(worst, cos.abs().max().item())
    return worst


@pytest.mark.parametrize("ortho", [True, False])
def test_performer_feature_kind_survives_redraw(ortho: bool) -> None:
    """Orthogonal rows within each block of dh rows when ortho_features, iid rows otherwise,
    before and after a redraw (the library alone would always draw orthogonal blocks)."""
    torch.manual_seed(0)
    layer = performer(nb_features=40, ortho_features=ortho, feature_redraw_interval=1).train()
    dh = D_MODEL // N_HEADS
    for _ in range(2):
        cos = _max_offdiag_cosine(layer.projection_matrix, dh)
        if ortho:
            assert cos < 1e-5
        else:
            assert cos > 0.3  # 16 iid Gaussian rows in 16 dims are nowhere near orthogonal
        layer(torch.randn(1, 4, D_MODEL))
        layer(torch.randn(1, 4, D_MODEL))  # the second call redraws


# --- performer: gradients ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("causal", "kernel"), [(False, "softmax"), (True, "softmax"), (False, "relu"), (True, "relu")]
)
def test_performer_gradients_reach_every_parameter(causal: bool, kernel: str) -> None:
    torch.manual_seed(0)
    layer = performer(nb_features=32, causal=causal, kernel=kernel)
    x = torch.randn(2, 16, D_MODEL)
    layer(x, right_padding([16, 11], 16)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.requires_grad
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_performer_registry_metadata() -> None:
    meta = info("performer")
    assert (meta.budget, meta.causal, meta.padding_mask) == ("nb_features", True, True)
    assert meta.unavailable is None
    assert meta.params["nb_features"] == 256


# --- config errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("performer", {"nb_features": 0}, "nb_features"),
        ("performer", {"nb_features": 1.5}, "nb_features"),
        ("performer", {"kernel": "foo"}, "kernel"),
        ("performer", {"ortho_features": "yes"}, "ortho_features"),
        ("performer", {"feature_redraw_interval": 0}, "feature_redraw_interval"),
        ("performer", {"causal": 1}, "causal"),
        ("performer", {"nb_feature": 64}, "nb_feature"),
        ("xformers", {"causal": "no"}, "causal"),
        ("xformers", {"backend": "flash"}, "backend"),
    ],
)
def test_config_errors_name_the_parameter(name: str, params: dict, named: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{named}\b"):
        attnbench.create(name, d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=N, **params)


# --- xformers ------------------------------------------------------------------------------


def xformers_layer(**params) -> torch.nn.Module:
    return attnbench.create("xformers", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=N, **params)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without CUDA")
def test_xformers_unavailable_without_cuda_says_why_in_one_line() -> None:
    reason = info("xformers").unavailable
    assert reason and "\n" not in reason
    with pytest.raises(RuntimeError, match=f"^{re.escape(reason)}$"):
        xformers_layer()(torch.randn(1, 8, D_MODEL))


def test_xformers_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xformers", None)  # find_spec and import now fail
    assert info("xformers").unavailable == xf.NOT_INSTALLED
    with pytest.raises(RuntimeError, match=re.escape(xf.NOT_INSTALLED)):
        xformers_layer()(torch.randn(1, 8, D_MODEL))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with CUDA, info() imports xformers to check that it loads"
)
def test_xformers_import_and_info_are_silent() -> None:
    """Without CUDA, neither importing the module nor asking why it is unavailable imports
    xformers, whose import can log a page of build warnings."""
    code = (
        "import sys, attnbench, attnbench.attention.xformers; "
        "attnbench.info('xformers'); assert 'xformers' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


@pytest.mark.parametrize("causal", [False, True])
def test_xformers_padding_bias_is_aligned_and_means_blocked_keys(causal: bool) -> None:
    """The bias the GPU path hands to xformers, checked where it can be: on CPU. n = 13 is not a
    multiple of 8, so the rows must come from a wider allocation to stay 16-byte aligned."""
    b, n = 3, 13
    layer = xformers_layer(causal=causal).half()
    mask = right_padding([13, 8, 1], n)
    q = torch.zeros(b, n, N_HEADS, D_MODEL // N_HEADS, dtype=torch.float16)  # (b, n, h, dh)
    bias = layer._bias(blocked_keys(mask, causal, n, q.device), b, n, n, q)
    assert bias.shape == (b, N_HEADS, n, n) and bias.dtype == torch.float16
    assert bias.stride(-1) == 1 and all(s % 8 == 0 for s in bias.stride()[:-1]), bias.stride()
    blocked = blocked_keys(mask, causal, n, q.device).expand(b, N_HEADS, n, n)
    assert torch.equal(bias == float("-inf"), blocked)
    assert torch.equal(bias[~blocked], torch.zeros_like(bias[~blocked]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="xformers has no CPU kernels")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_xformers_matches_vanilla_on_gpu(causal: bool, padded: bool) -> None:
    """fp16 xformers against fp32 vanilla on the same (fp16-exact) weights and inputs; n = 37
    is not a multiple of 8, so the padding path's aligned bias is exercised."""
    torch.manual_seed(0)
    n = 37
    fast = xformers_layer(causal=causal).cuda().half()
    exact = attnbench.create(
        "vanilla", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=N, causal=causal
    ).cuda()
    copy_projections(fast, exact)
    x = torch.randn(3, n, D_MODEL, device="cuda").half()
    mask = right_padding([n, 30, 5], n).cuda() if padded else None
    with torch.no_grad():
        got = fast(x, mask)
        want = exact(x.float(), mask)
    assert got.dtype == torch.float16
    keep = slice(None) if mask is None else ~mask
    torch.testing.assert_close(got.float()[keep], want[keep], atol=2e-3, rtol=2e-3)
