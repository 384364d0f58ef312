"""Linformer: eq. (7) for every sharing and projection kind, padding, slicing, refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnbench
from attnbench.attention.linformer import PROJECTIONS, SHARING

D, H, N = 32, 4, 64
VARIANTS = list(itertools.product(SHARING, PROJECTIONS))
MATRIX_KINDS = ("linear", "random", "mean")


def lin(**params) -> torch.nn.Module:
    params = {"k": 16} | params
    return attnbench.create("linformer", d_model=D, n_heads=H, max_seq_len=N, **params).eval()


def copy_qkvo(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


def eq7(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Paper eq. (7) written out per head from the module's weights and its dense E, F."""
    n = x.shape[1]
    e, f = m.projection_matrices(n)  # (h, k, n)
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)  # (b, n, d)
    dh = D // H
    heads = []
    for i in range(H):
        sl = slice(i * dh, (i + 1) * dh)
        scores = q[..., sl] @ (e[i] @ k[..., sl]).transpose(-2, -1) / math.sqrt(dh)  # (b, n, k)
        p_bar = torch.softmax(scores, dim=-1)
        heads.append(p_bar @ (f[i] @ v[..., sl]))  # (b, n, dh)
    return m.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("sharing", SHARING)
def test_identity_projection_with_k_equal_n_is_vanilla(sharing: str) -> None:
    n = 24
    van = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=n).eval()
    m = attnbench.create("linformer", d_model=D, n_heads=H, max_seq_len=n, k=n, sharing=sharing)
    copy_qkvo(van, m)
    with torch.no_grad():
        for proj in {id(m.proj_k): m.proj_k, id(m.proj_v): m.proj_v}.values():
            proj.weight.copy_(torch.eye(n).expand_as(proj.weight))
    x = torch.randn(3, n, D)
    torch.testing.assert_close(m.eval()(x), van(x))  # float32 tolerances


@pytest.mark.parametrize("projection", ["mean", "max"])
@pytest.mark.parametrize("padded", [False, True])
def test_pooling_with_window_one_is_vanilla_with_padding(projection: str, padded: bool) -> None:
    """k = n makes each pooling window one position; a padded position's slot is left out."""
    n = 24
    van = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=n).eval()
    m = attnbench.create(
        "linformer",
        d_model=D,
        n_heads=H,
        max_seq_len=n,
        k=n,
        sharing="headwise",
        projection=projection,
    ).eval()
    copy_qkvo(van, m)
    x = torch.randn(2, n, D)
    mask = None
    if padded:
        mask = torch.zeros(2, n, dtype=torch.bool)
        mask[0, 17:], mask[1, 3::5] = True, True
    torch.testing.assert_close(m(x, mask), van(x, mask))


@pytest.mark.parametrize("sharing", SHARING)
@pytest.mark.parametrize("projection", MATRIX_KINDS)
@pytest.mark.parametrize("n", [N, 40])
def test_matches_equation_7_with_first_n_columns(sharing: str, projection: str, n: int) -> None:
    m = lin(sharing=sharing, projection=projection)
    if projection == "linear":
        with torch.no_grad():  # non-default values so E and F differ from any init pattern
            m.proj_k.weight.normal_()
            m.proj_v.weight.normal_()
    x = torch.randn(2, n, D)
    torch.testing.assert_close(m(x), eq7(m, x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("sharing", "projection"), VARIANTS)
def test_padded_positions_contribute_nothing(sharing: str, projection: str) -> None:
    m = lin(sharing=sharing, projection=projection)
    x = torch.randn(3, N, D)
    mask = torch.zeros(3, N, dtype=torch.bool)
    mask[0, 37:] = True
    mask[1, 5::3] = True
    y = x.clone()
    y[mask] = 50 * torch.randn_like(y[mask])
    out = m(x, mask)
    torch.testing.assert_close(out[~mask], m(y, mask)[~mask])
    # right padding gives exactly what the unpadded shorter sequence gives
    torch.testing.assert_close(out[0, :37], m(x[:1, :37])[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("sharing", "projection"), VARIANTS)
def test_sdpa_and_eager_kernels_agree(sharing: str, projection: str) -> None:
    torch.manual_seed(1)
    a = lin(sharing=sharing, projection=projection, kernel="sdpa")
    torch.manual_seed(1)
    b = lin(sharing=sharing, projection=projection, kernel="eager")
    x, mask = torch.randn(2, 50, D), torch.zeros(2, 50, dtype=torch.bool)
    mask[1, 20:] = True
    torch.testing.assert_close(a(x, mask), b(x, mask), atol=1e-5, rtol=1e-4)


def _distinct_matrices(model: torch.nn.Module, k: int, n: int) -> int:
    """Distinct k × n projection matrices, counted from the tensors themselves, not flags."""
    tensors = {}
    for mod in model.modules():
        for proj in (getattr(mod, "proj_k", None), getattr(mod, "proj_v", None)):
            if proj is not None:
                for t in itertools.chain(proj.parameters(), proj.buffers()):
                    tensors[t.data_ptr()] = t
    return sum(t.numel() for t in tensors.values()) // (k * n)


@pytest.mark.parametrize(
    ("sharing", "count"), [("none", 288), ("headwise", 24), ("kv", 12), ("layerwise", 1)]
)
@pytest.mark.parametrize("projection", ["linear", "random"])
def test_distinct_projection_counts_of_the_paper(sharing: str, count: int, projection: str) -> None:
    model = attnbench.build_model(
        "linformer",
        layers=12,
        d_model=48,
        n_heads=12,
        d_ff=64,
        max_seq_len=32,
        k=8,
        sharing=sharing,
        projection=projection,
    )
    assert _distinct_matrices(model, k=8, n=32) == count


@pytest.mark.parametrize("sharing", SHARING)
def test_conv_kernel_and_stride_are_n_over_k(sharing: str) -> None:
    m = lin(sharing=sharing, projection="conv", k=8)
    assert m.proj_k.conv.kernel_size == (N // 8,) and m.proj_k.conv.stride == (N // 8,)
    assert m(torch.randn(2, N, D)).shape == (2, N, D)


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_projection_shapes(projection: str) -> None:
    m = lin(sharing="none", projection=projection)
    if projection in MATRIX_KINDS:
        for n in (N, 40):
            e, f = m.projection_matrices(n)
            # pooling keeps only the windows that start before n: the rest would be empty
            rows = 16 if projection != "mean" else math.ceil(n / (N // 16))
            assert e.shape == f.shape == (H, rows, n)
    else:
        with pytest.raises(ValueError, match=r"projection: .* is not a matrix"):
            m.projection_matrices()


def test_mean_projection_is_window_average() -> None:
    e, _ = lin(sharing="kv", projection="mean").projection_matrices()
    want = torch.kron(torch.eye(16), torch.full((1, N // 16), 16 / N))
    torch.testing.assert_close(e[0], want)


def test_random_projection_is_fixed_and_not_trained() -> None:
    m = lin(sharing="headwise", projection="random").train()
    assert not list(m.proj_k.parameters())
    assert "proj_k.weight" in m.state_dict()
    before = m.proj_k.weight.clone()
    std = (before.var() ** 0.5).item()
    assert abs(std - 16**-0.5) < 0.05 * 16**-0.5  # N(0, 1/k)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    m(torch.randn(2, N, D)).square().sum().backward()
    opt.step()
    assert torch.equal(m.proj_k.weight, before)


def test_longer_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"n: Linformer was built for max_seq_len=64"):
        lin()(torch.randn(1, N + 1, D))


def test_per_layer_k_list_and_rule() -> None:
    model = attnbench.build_model(
        "linformer", layers=3, d_model=D, n_heads=H, d_ff=64, max_seq_len=N, k=[32, 16, 8]
    )
    assert [layer.attn.k for layer in model.layers] == [32, 16, 8]
    model = attnbench.build_model(
        "linformer",
        layers=4,
        d_model=D,
        n_heads=H,
        d_ff=64,
        max_seq_len=N,
        k=32,
        k_decay=0.5,
        k_min=8,
    )
    assert [layer.attn.k for layer in model.layers] == [32, 16, 8, 8]
    assert model(torch.randn(2, N, D)).shape == (2, N, D)


def test_per_layer_k_errors() -> None:
    with pytest.raises(ValueError, match=r"k: 2 values for 3 layer\(s\)"):
        attnbench.build_model("linformer", layers=3, d_model=D, n_heads=H, max_seq_len=N, k=[8, 8])
    with pytest.raises(ValueError, match="k: layerwise sharing uses one E for every layer"):
        attnbench.build_model(
            "linformer",
            layers=2,
            d_model=D,
            n_heads=H,
            max_seq_len=N,
            k=[16, 8],
            sharing="layerwise",
        )


def test_layerwise_shares_one_object_across_layers() -> None:
    model = attnbench.build_model(
        "linformer",
        layers=3,
        d_model=D,
        n_heads=H,
        d_ff=64,
        max_seq_len=N,
        k=8,
        sharing="layerwise",
    )
    projs = {id(p) for layer in model.layers for p in (layer.attn.proj_k, layer.attn.proj_v)}
    assert len(projs) == 1


def test_shared_projection_goes_before_key_projection() -> None:
    """Where one E serves every head, K W^K is computed on k rows, not n (authors' order)."""
    seen = []
    m = lin(sharing="kv")
    m.k_proj.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    m(torch.randn(1, N, D))
    assert m.early and not seen  # the layer's weight is used on k rows via F.linear
    assert not lin(sharing="none").early and not lin(sharing="kv", projection="max").early


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"k": 16, "k_min": 32}, "k_min: must be at most k=16, got 32"),
        ({"k": [16, 8], "k_decay": 0.5}, "k_decay: a list k already fixes every layer's k"),
        ({"k": [16, 8]}, r"k: 2 values for 1 layer\(s\); give one per layer"),
    ],
)
def test_settings_are_refused_not_silently_ignored(params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        lin(**params)


def test_k_decay_rounds_half_up() -> None:
    model = attnbench.build_model(
        "linformer", layers=3, d_model=D, n_heads=H, d_ff=64, max_seq_len=N, k=5, k_decay=0.5
    )
    assert [layer.attn.k for layer in model.layers] == [5, 3, 1]
