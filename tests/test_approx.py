"""Approximation error on the same weights: exact cases give 0, errors fall with the budget,
implied rows against hand-built float64 references, padding, layer inputs, refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnbench
from attnbench.quality import approx
from attnbench.quality.approx import (
    approximation_error,
    copy_projections,
    exact_counterpart,
    implied_rows,
    layer_inputs,
    layerwise_error,
    random_inputs_error,
)

D, H, N = 32, 2, 16
DH = D // H


def inputs(seed: int, b: int = 2, n: int = N, d: int = D, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def by_hand(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None):
    """Softmax attention written out in float64 from ``layer``'s weights: (Y, P, Q, K)."""
    x = x.double()
    b, n, _ = x.shape

    def proj(name: str) -> torch.Tensor:
        lin = getattr(layer, name)
        return x @ lin.weight.double().T + lin.bias.double()

    q, k, v = (proj(p).view(b, n, H, DH).transpose(1, 2) for p in ("q_proj", "k_proj", "v_proj"))
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)
    if mask is not None:
        scores = scores.masked_fill(mask[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, -1)
    out = (p @ v).transpose(1, 2).reshape(b, n, D)
    y = out @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()
    return y, p, q, k


def tv(rows: torch.Tensor, p: torch.Tensor) -> float:
    return float((0.5 * (rows - p).abs().sum(-1)).mean())


# --- exact where the mechanism is exact ---------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", ["vanilla", "sdpa"])
def test_exact_mechanisms_have_zero_error(name: str, masked: bool) -> None:
    mask = None
    if masked:
        mask = torch.zeros(2, N, dtype=torch.bool)
        mask[1, 10:] = True
    err = approximation_error(name, {}, x=inputs(0), key_padding_mask=mask, n_heads=H, seed=3)
    assert err["rel_frobenius"] < 1e-6
    assert err["cosine"] > 1 - 1e-10
    assert err["row_error"] < 1e-12


def test_local_with_window_covering_the_sequence_is_exact() -> None:
    err = approximation_error("local", {"window": 2 * N}, x=inputs(1), n_heads=H, seed=0)
    assert err["rel_frobenius"] < 1e-6 and err["row_error"] < 1e-12
    causal = approximation_error(
        "local", {"window": N, "causal": True}, x=inputs(1), n_heads=H, seed=0
    )  # the reference is causal softmax too
    assert causal["rel_frobenius"] < 1e-6 and causal["row_error"] < 1e-12


def test_nystromformer_with_a_landmark_per_token_is_exact() -> None:
    params = {"num_landmarks": N, "conv_kernel": 0, "pinv_iterations": 20}
    err = approximation_error("nystromformer", params, x=inputs(2), n_heads=H, seed=0)
    assert err["rel_frobenius"] < 1e-4  # fp32 through a pseudo-inverse
    assert err["row_error"] < 1e-9  # the float64 probe: A⁺ itself
    few = approximation_error(
        "nystromformer", params | {"pinv_iterations": 1}, x=inputs(2), n_heads=H, seed=0
    )
    assert few["rel_frobenius"] > 100 * err["rel_frobenius"]  # the test can tell


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv", "layerwise"])
@pytest.mark.parametrize("projection", ["linear", "random"])
def test_linformer_with_identity_e_and_f_at_k_n_is_exact(
    monkeypatch: pytest.MonkeyPatch, projection: str, sharing: str
) -> None:
    """E = F = I (n × n) makes eq. (7) softmax attention. Per-head E lives in proj_k/proj_v
    ``weight`` (heads, k, n); shared ones (headwise: two, kv/layerwise: one object) have one
    group, and their path applies E before v_proj, which the probe must undo."""
    real_create = attnbench.create

    def create_with_identity(name: str, **kwargs):
        layer = real_create(name, **kwargs)
        if name == "linformer":
            with torch.no_grad():
                for proj in {
                    id(layer.proj_k): layer.proj_k,
                    id(layer.proj_v): layer.proj_v,
                }.values():
                    proj.weight.copy_(torch.eye(N).expand_as(proj.weight))
        return layer

    monkeypatch.setattr(approx, "create", create_with_identity)
    params = {"k": N, "projection": projection, "sharing": sharing}
    err = approximation_error("linformer", params, x=inputs(3), n_heads=H, seed=0)
    assert err["rel_frobenius"] < 1e-6
    assert err["row_error"] < 1e-12
    monkeypatch.setattr(approx, "create", real_create)  # the same without the identity: not 0
    assert (
        approximation_error("linformer", params, x=inputs(3), n_heads=H, seed=0)["rel_frobenius"]
        > 0.1
    )


# --- errors fall as the budget grows --------------------------------------------------------


def seed_mean(name: str, params: dict, key: str, n: int = 64, scale: float = 1.0) -> float:
    runs = [
        approximation_error(name, params, x=inputs(s, n=n, scale=scale), n_heads=H, seed=s)[key]
        for s in range(3)
    ]
    return sum(runs) / len(runs)


def test_performer_error_falls_with_nb_features() -> None:
    small = seed_mean("performer", {"nb_features": 8}, "rel_frobenius")
    large = seed_mean("performer", {"nb_features": 512}, "rel_frobenius")
    assert large < 0.5 * small  # measured 0.33 -> 0.08 (4 seeds)


def test_linformer_random_projection_error_falls_with_k() -> None:
    """The Johnson–Lindenstrauss setting of Theorem 2: E, F with N(0, 1/k) entries."""
    errors = [
        seed_mean("linformer", {"k": k, "projection": "random"}, "rel_frobenius") for k in (4, 64)
    ]
    assert errors[1] < 0.25 * errors[0]  # measured 8.1 -> 0.66


# --- implied rows against float64 references built by hand ----------------------------------


def test_row_error_of_linear_attention_by_hand() -> None:
    x = inputs(4)
    exact = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N)
    err = approximation_error("linear", {}, x=x, exact_layer=exact, n_heads=H, seed=0)
    _, p, q, k = by_hand(exact, x)
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)  # φ(Q)φ(K)ᵀ
    rows = a / a.sum(-1, keepdim=True)
    assert err["row_error"] == pytest.approx(tv(rows, p), rel=1e-9)
    assert 0.01 < err["row_error"] < 1


def test_row_error_of_performer_by_hand() -> None:
    """FAVOR+ features with performer-pytorch's stabilisers and eps, in float64. The mechanism
    is built right after torch.manual_seed(seed) (documented), so its features are these."""
    x, seed, m = inputs(5), 7, 32
    exact = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N)
    err = approximation_error(
        "performer", {"nb_features": m}, x=x, exact_layer=exact, n_heads=H, seed=seed
    )
    torch.manual_seed(seed)
    w = attnbench.create(
        "performer", d_model=D, n_heads=H, max_seq_len=N, nb_features=m
    ).projection_matrix.double()  # (m, dh)
    _, p, q, k = by_hand(exact, x)
    c = DH**-0.25

    def dash(t: torch.Tensor) -> torch.Tensor:
        return (c * t) @ w.T - (c * t).square().sum(-1, keepdim=True) / 2  # wᵀx' − ‖x'‖²/2

    q_f = torch.exp(dash(q) - ((c * q) @ w.T).amax(-1, keepdim=True)) + 1e-4
    k_f = torch.exp(dash(k) - ((c * k) @ w.T).amax((-1, -2), keepdim=True)) + 1e-4
    a = q_f @ k_f.transpose(-1, -2)
    rows = a / a.sum(-1, keepdim=True)
    assert err["row_error"] == pytest.approx(tv(rows, p), rel=1e-6)


def test_linformer_rows_are_p_bar_times_f_on_both_paths() -> None:
    """Rows of P̄F from projection_matrices(), for per-head E (late path) and a shared E
    (applied before v_proj: the probe's late path must give the same map)."""
    x = inputs(6)
    for sharing in ("none", "headwise", "kv"):
        layer = attnbench.create(
            "linformer", d_model=D, n_heads=H, max_seq_len=N, k=4, sharing=sharing
        ).eval()
        rows = implied_rows(layer, x)
        e, f = (t.double() for t in layer.projection_matrices(N))  # (h, k, n)
        _, _, q, _ = by_hand(layer, x)
        k = (
            (x.double() @ layer.k_proj.weight.double().T + layer.k_proj.bias.double())
            .view(2, N, H, DH)
            .transpose(1, 2)
        )
        p_bar = torch.softmax(q @ (e @ k).transpose(-1, -2) / math.sqrt(DH), -1)  # (b, h, n, k)
        assert torch.allclose(rows, p_bar @ f, atol=1e-10), sharing


@pytest.mark.parametrize("projection", ["max", "conv"])
def test_no_rows_where_the_output_is_not_one_map_of_v(projection: str) -> None:
    err = approximation_error(
        "linformer", {"k": 4, "projection": projection}, x=inputs(7), n_heads=H, seed=0
    )
    assert err["row_error"] is None
    assert err["rel_frobenius"] > 0


# --- padding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name,params", [("linear", {}), ("local", {"window": 4})])
def test_padding_is_the_sequence_cut_short(name: str, params: dict) -> None:
    """Real length 10 of 16 with garbage in the padding gives the numbers of the 10 alone."""
    x = inputs(8, b=1)
    padded = x.clone()
    padded[:, 10:] = 1e4
    mask = torch.zeros(1, N, dtype=torch.bool)
    mask[:, 10:] = True
    got = approximation_error(name, params, x=padded, key_padding_mask=mask, n_heads=H, seed=1)
    cut = approximation_error(name, params, x=x[:, :10], n_heads=H, seed=1)
    for key in ("rel_frobenius", "cosine", "row_error"):
        assert got[key] == pytest.approx(cut[key], rel=1e-5, abs=1e-7), key


def test_padding_content_does_not_matter() -> None:
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[0, 12:] = True
    mask[1, 5:] = True
    x, other = inputs(9), inputs(9)
    other[mask] = torch.randn(int(mask.sum()), D) * 50
    a = approximation_error("performer", {}, x=x, key_padding_mask=mask, n_heads=H, seed=0)
    b = approximation_error("performer", {}, x=other, key_padding_mask=mask, n_heads=H, seed=0)
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-5), key


# --- the trained-model case: layer inputs ----------------------------------------------------


def test_layer_inputs_are_what_each_attention_sees() -> None:
    model = attnbench.build_model("vanilla", layers=3, d_model=D, n_heads=H, d_ff=16, max_seq_len=N)
    x = inputs(10)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[1, 11:] = True
    states = layer_inputs(model, x, mask)
    with torch.no_grad():
        expected = [x]
        for layer in model.layers[:-1]:
            expected.append(layer(expected[-1], mask))
    assert len(states) == 3
    for got, want in zip(states, expected, strict=True):
        assert torch.equal(got, want)


def test_layerwise_error_uses_each_layers_weights() -> None:
    model = attnbench.build_model("vanilla", layers=2, d_model=D, n_heads=H, d_ff=16, max_seq_len=N)
    exact = layerwise_error(model, "sdpa", {}, x=inputs(11))
    assert [e["rel_frobenius"] < 1e-6 for e in exact] == [True, True]
    perf = layerwise_error(model, "performer", {"nb_features": 16}, x=inputs(11))
    assert len(perf) == 2 and all(e["rel_frobenius"] > 1e-3 for e in perf)
    # layer 1 against its own weights: the same call by hand gives the same numbers
    x1 = layer_inputs(model, inputs(11))[1]
    alone = approximation_error(
        "performer",
        {"nb_features": 16},
        x=x1,
        exact_layer=model.layers[1].attn,
        n_heads=H,
        seed=0,
    )
    assert alone == perf[1]


def test_seed_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    approximation_error("performer", {}, x=inputs(0), n_heads=H, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)


# --- refusals: one line each, naming the key -------------------------------------------------


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_mechanisms_without_an_exact_counterpart_are_refused() -> None:
    for name in ("vanilla", "sdpa", "performer", "linformer", "nystromformer", "linear", "local"):
        exact_counterpart(name)
    with pytest.raises(ValueError) as e:
        exact_counterpart("reformer")
    text = one_line(e)
    assert text.startswith("attention: reformer has no exact counterpart: ")
    assert "allowed: vanilla, sdpa, linformer" in text
    with pytest.raises(ValueError, match=r"^attention: xformers has no exact counterpart"):
        approximation_error("xformers", {}, x=inputs(0), n_heads=H, seed=0)
    with pytest.raises(ValueError, match=r"^attention: unknown mechanism 'nope'"):
        exact_counterpart("nope")


@pytest.mark.parametrize(
    "kwargs,starts",
    [
        ({"x": torch.randn(N, D)}, "x: must be a float tensor"),
        ({"x": torch.ones(2, N, D, dtype=torch.long)}, "x: must be a float tensor"),
        ({"key_padding_mask": torch.zeros(2, N)}, "key_padding_mask: must be bool"),
        ({"key_padding_mask": torch.ones(2, N, dtype=torch.bool)}, "key_padding_mask: every"),
        ({"n_heads": 0}, "n_heads: must be an integer >= 1"),
        ({"n_heads": 3}, "d_model: must be divisible by n_heads=3"),
        ({"seed": -1}, "seed: must be an integer >= 0"),
        ({"params": {"k": 4}}, "performer: unknown parameter 'k'"),
        ({"params": {"causal": True}}, "causal: the mechanism's causal=True differs"),
        ({"params": [1]}, "params: must be a dict"),
        ({"exact_layer": torch.nn.Linear(D, D)}, "exact_layer: must be a vanilla or sdpa"),
        (
            {"exact_layer": attnbench.create("vanilla", d_model=D, n_heads=4, max_seq_len=N)},
            "exact_layer: has d_model=32, n_heads=4",
        ),
    ],
)
def test_bad_input_is_one_line(kwargs: dict, starts: str) -> None:
    call = {"x": inputs(0), "n_heads": H, "seed": 0, "params": {}}
    call["exact_layer"] = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N)
    call |= kwargs
    params = call.pop("params")
    with pytest.raises(ValueError) as e:
        approximation_error("performer", params, **call)
    assert one_line(e).startswith(starts)


def test_copy_projections() -> None:
    exact = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N)
    perf = attnbench.create("performer", d_model=D, n_heads=H, max_seq_len=N)
    copy_projections(exact, perf)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert torch.equal(getattr(perf, name).weight, getattr(exact, name).weight)
        assert torch.equal(getattr(perf, name).bias, getattr(exact, name).bias)
    reformer = attnbench.create("reformer", d_model=D, n_heads=H, max_seq_len=N)
    with pytest.raises(ValueError) as e:
        copy_projections(exact, reformer)
    assert one_line(e).startswith("k_proj: ReformerAttention has no nn.Linear k_proj")
    wider = attnbench.create("performer", d_model=2 * D, n_heads=H, max_seq_len=N)
    with pytest.raises(ValueError, match=r"^q_proj: shapes differ"):
        copy_projections(exact, wider)


def test_random_inputs_error_averages_seeds() -> None:
    kw = {"n": N, "d_model": D, "n_heads": H, "batch": 1}
    both = random_inputs_error("linear", {}, seeds=(0, 1), **kw)
    each = [random_inputs_error("linear", {}, seeds=(s,), **kw) for s in (0, 1)]
    for key in both:
        assert both[key] == pytest.approx((each[0][key] + each[1][key]) / 2, rel=1e-12)
    maxed = random_inputs_error("linformer", {"k": 4, "projection": "max"}, **kw)
    assert maxed["row_error"] is None
    with pytest.raises(ValueError, match=r"^scale: must be a number > 0"):
        random_inputs_error("linear", {}, scale=0.0, **kw)


def test_performer_error_does_not_fall_on_sharp_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """On inputs 4× larger (sharp, trained-like attention) more features buy nothing, where
    at scale 1 they buy much. performer-pytorch's key features exp(wᵀk − ‖k‖²/2 − max) then
    fall below its eps (1e-4, added to every feature), so the estimate collapses to uniform
    attention; without the eps it is the estimator's variance, which grows like
    exp(‖q‖² + ‖k‖²), that keeps the error up. This is what the trained ListOps states show
    (docs/quality.md)."""
    import functools

    from attnbench.attention import performer

    def error(scale: float, name: str = "performer", **params: object) -> float:
        return seed_mean(name, params, "rel_frobenius", scale=scale)

    assert error(1, nb_features=1024) < 0.5 * error(1, nb_features=16)  # 0.257 -> 0.063
    uniform = error(4, "linformer", k=1, projection="mean", sharing="none")  # 0.975
    sharp = [error(4, nb_features=m) for m in (16, 1024)]  # 0.982, 0.980
    assert all(abs(e - uniform) < 0.05 for e in sharp)
    monkeypatch.setattr(
        performer, "softmax_kernel", functools.partial(performer.softmax_kernel, eps=0.0)
    )
    no_eps = [error(4, nb_features=m) for m in (16, 1024)]  # 1.128, 1.048
    assert min(no_eps) > uniform and no_eps[1] > 0.8 * no_eps[0]
