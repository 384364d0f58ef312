"""Approximation error of an efficient attention against softmax attention on the same weights.

An approximate mechanism's speed says nothing of what it throws away. Here it gets an exact
(vanilla) layer's q_proj/k_proj/v_proj/out_proj and is compared with exact softmax attention
on the same input, so the difference is the approximation alone, not different weights:

* ``rel_frobenius`` = ‖Y − Ŷ‖_F / ‖Y‖_F over the real (unpadded) positions of the batch;
* ``cosine`` = the mean over real tokens of cos(y_i, ŷ_i);
* ``row_error`` = the mean over heads and real query rows of the total-variation distance
  ½‖a_i − p_i‖₁ between the mechanism's implied attention row a_i and softmax's row p_i.

The reference Y and P are computed here in float64 from the exact layer's own weights (not by
running it), so they carry no fp32 rounding. The mechanism runs in fp32, as it would be used,
for ``rel_frobenius`` and ``cosine``; its rows are probed on a float64 copy, so ``row_error``
is the mechanism's map itself (Nyströmformer at m = n: rows exact, fp32 output not quite).

Calibration: at initialisation softmax attention on x ~ N(0, 1) is close to uniform (logits
of std ≈ 1/3), so uniform attention — ``linformer`` with ``projection=mean, k=1``, whose one
slot is the mean of every key and value — is the baseline any number here should beat
(n = 512, d_model 256, 4 heads: rel_frobenius 0.195, row_error 0.132). A mechanism's own
parameters (Linformer's E and F, Nyströmformer's convolution) are fresh draws, never trained,
in case (b) too: that measures swapping the attention of a trained model without fine-tuning.

Inputs are (a) random inputs to a freshly initialised, seeded layer: for Linformer with
``projection=random`` that is the Johnson–Lindenstrauss setting of the paper's Theorem 2, and a
Linformer with ``projection=linear`` at initialisation is a random projection too (its E is
drawn N(0, 1/k) and nothing trained it) — a table should say so rather than call it
"Linformer's error"; or (b) a trained model's hidden states: :func:`layer_inputs` gives each
layer's input and ``exact_layer=model.layers[l].attn`` its weights (:func:`layerwise_error`).

Implied rows. Where a mechanism's output at fixed x is linear in V, one n × n matrix per head
maps V to the output (before out_proj), and its rows play the part of softmax's rows.
:func:`implied_rows` obtains it by probing: V (v_proj's output, through a forward hook) is set
to unit vectors, d_h positions per pass, n/d_h passes; the matrix is accepted only if it then
reproduces the real output from the real V (so a mechanism that is not linear in V this way
gets None, never a wrong row). What a row is, per mechanism:

* vanilla, sdpa: softmax's own row (error 0 to rounding);
* linformer (projection linear, random, mean; any sharing): the row of P̄F, P̄ = softmax(Q(EK)ᵀ)
  (n × k) and F (k × n). With a random or learned F it is signed and does not sum to 1, so it
  is not a distribution (TV = ½‖·‖₁ of a signed difference is still defined); mean pooling
  gives a distribution. Where one E serves every head Linformer applies E before v_proj
  (``early``); the probe runs the equivalent late path (E after v_proj) instead.
  ``max`` (not linear in V) and ``conv`` (mixes a head's channels): None;
* performer: D⁻¹φ(Q)φ(K)ᵀ, positive, rows sum to 1 (both kernels);
* linear: the same with φ = elu + 1;
* nystromformer: softmax(QK̃ᵀ) A⁺ softmax(Q̃Kᵀ) plus the band of its depthwise convolution of V
  (the per-head filter around the diagonal): signed, rows do not sum to 1;
* local: softmax over the window, zero outside it: a distribution.

Refused (:func:`exact_counterpart`): reformer (its shared QK has no k_proj, so no exact layer's
weights fit it, and its self-mask changes the attention itself: no softmax on the same weights
is its target), and a mechanism that cannot run in fp32 here (xformers: fp16/bf16, CUDA only).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench import registry
from attnbench.attention.base import MultiHeadAttention
from attnbench.attention.linformer import LinformerAttention
from attnbench.attention.masks import blocked_keys
from attnbench.model import Encoder
from attnbench.registry import create, info, mechanism_class, names
from attnbench.validators import check_int, check_number

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
EXACT = ("vanilla", "sdpa")  # softmax attention itself: what an exact_layer may be
# |M V − real| / |real| above this (both float64): the probed map does not reproduce the
# output, so the mechanism is not linear in V that way and gets no rows
LINEAR_TOLERANCE = 1e-6
METRICS = ("rel_frobenius", "cosine", "row_error")


def _why_no_counterpart(name: str) -> str | None:
    """Why ``name``'s error against softmax on the same weights is undefined here, or None:
    it cannot run in fp32 here, or it lacks one of the four projections the exact layer's
    weights are copied into (the registry's ``limits`` say why: Reformer's shared QK)."""
    spec = info(name)
    if "fp32" not in spec.dtypes:
        return f"it runs in {'/'.join(spec.dtypes)} only and the error is measured in fp32"
    if spec.unavailable:
        return spec.unavailable
    if missing := _missing_projections(name):
        return f"it has no {', '.join(missing)} for the exact layer's weights ({spec.limits})"
    return None


@functools.cache
def _missing_projections(name: str) -> tuple[str, ...]:
    """Which of the four projections a layer of ``name`` lacks, asked once per mechanism
    (every refusal lists the allowed ones) of a throwaway layer on meta, built without
    touching the caller's RNG (Performer draws its features on the CPU whatever the device)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        layer = registry.create(name, d_model=8, n_heads=2, max_seq_len=1024)
    return tuple(p for p in PROJECTIONS if not isinstance(getattr(layer, p, None), nn.Linear))


def exact_counterpart(name: str) -> None:
    """Raise a one-line ``ValueError`` if ``name`` has no exact counterpart to be compared with.

    An unknown name raises the registry's own line. Exact mechanisms (vanilla, sdpa) pass:
    their error is 0 to rounding, which is a check of the measurement itself.
    """
    why = _why_no_counterpart(name)
    if why is not None:
        allowed = [n for n in names() if _why_no_counterpart(n) is None]
        raise ValueError(
            f"attention: {name} has no exact counterpart: {why}; allowed: {', '.join(allowed)}"
        )


@torch.no_grad()
def copy_projections(exact: nn.Module, approx: nn.Module) -> None:
    """Copy q/k/v/out_proj weights and biases from ``exact`` into ``approx`` in place.

    Both must own the four projections as same-shaped ``nn.Linear``s; a mechanism without one
    (reformer has no k_proj) raises naming it.
    """
    for name in PROJECTIONS:
        src, dst = getattr(exact, name, None), getattr(approx, name, None)
        if not isinstance(src, nn.Linear):
            raise ValueError(f"{name}: the exact layer {type(exact).__name__} has no nn.Linear")
        if not isinstance(dst, nn.Linear):
            raise ValueError(
                f"{name}: {type(approx).__name__} has no nn.Linear {name}, so the exact "
                "layer's weights do not fit it"
            )
        if dst.weight.shape != src.weight.shape or (dst.bias is None) != (src.bias is None):
            raise ValueError(
                f"{name}: shapes differ, {tuple(src.weight.shape)} (exact) vs "
                f"{tuple(dst.weight.shape)}, or one has a bias and the other not"
            )
        dst.weight.copy_(src.weight)
        if src.bias is not None:
            dst.bias.copy_(src.bias)


def _linear64(layer: nn.Linear, x: Tensor) -> Tensor:
    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x, layer.weight.double(), bias)


@torch.no_grad()
def softmax_reference(
    layer: MultiHeadAttention, x: Tensor, key_padding_mask: Tensor | None, causal: bool
) -> tuple[Tensor, Tensor]:
    """Exact attention from ``layer``'s four projections, in float64: (Y (b, n, d), P (b, h, n, n)).

    P = softmax(QKᵀ/√d_h) with padded (and, if ``causal``, future) keys blocked; a query that
    sees no key gets a zero row, as vanilla and sdpa give. Computed by hand rather than by
    running the layer, so the reference has float64's accuracy whatever the layer's dtype.
    """
    x = x.double()
    b, n, _ = x.shape
    h, dh = layer.n_heads, layer.head_dim

    def heads(t: Tensor) -> Tensor:
        return t.view(b, n, h, dh).transpose(1, 2)  # (b, h, n, dh)

    q, k, v = (heads(_linear64(getattr(layer, p), x)) for p in PROJECTIONS[:3])
    scores = q @ k.transpose(-2, -1) / math.sqrt(dh)  # (b, h, n, n)
    blocked = blocked_keys(key_padding_mask, causal, n, x.device)
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    p = scores.softmax(dim=-1)
    if blocked is not None:
        p = p.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)  # NaN rows of no key -> 0
    y = _linear64(layer.out_proj, (p @ v).transpose(1, 2).reshape(b, n, h * dh))
    return y, p


@contextmanager
def _hooks(*pairs: tuple[nn.Module, str, Callable[..., Any]]) -> Iterator[None]:
    """Forward hooks (``"post"``) or pre-hooks (``"pre"``), removed however the block ends."""
    handles = [
        m.register_forward_pre_hook(fn) if kind == "pre" else m.register_forward_hook(fn)
        for m, kind, fn in pairs
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _late_projection(layer: nn.Module) -> Iterator[None]:
    """Linformer with one E for every head projects X before v_proj (``early``), so no hook on
    v_proj sees V. Its late path, E after v_proj, is the same map (E(XWᵀ + 1bᵀ) = (EX)Wᵀ +
    (E1)bᵀ, and padding is zeroed in both), so the probe runs that one."""
    early = isinstance(layer, LinformerAttention) and layer.early
    if early:
        layer.early = False
    try:
        yield
    finally:
        if early:
            layer.early = True


@torch.no_grad()
def implied_rows(
    layer: MultiHeadAttention, x: Tensor, key_padding_mask: Tensor | None = None
) -> Tensor | None:
    """The n × n map from V to the output (before out_proj) per head, (b, h, n, n) float64.

    Row i is query i's implied attention row (see the module docstring for what that is per
    mechanism). None when the output is not M·V for one M per head shared by the head's
    channels: the probed M must reproduce the real output from the real V to within
    ``LINEAR_TOLERANCE``, and v_proj must run once per forward.

    The probe runs a float64 copy of ``layer``: the rows are the mechanism's map itself, not
    fp32 rounding (Nyströmformer's A⁺ of a near-singular A amplifies rounding differently in
    F(A⁺(BV)) and (FA⁺B)V, so an fp32 probe would refuse a map that is linear).
    """
    layer = copy.deepcopy(layer).to(torch.float64)
    x = x.detach().to(torch.float64)
    b, n, d = x.shape
    h, dh = layer.n_heads, layer.head_dim
    seen: dict[str, Any] = {"calls": 0}

    def keep_output_input(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        seen["before_out"] = args[0]

    def replace_v(module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> Tensor:
        seen["calls"] += 1
        return seen["probe"]

    with _hooks((layer.out_proj, "pre", keep_output_input)):
        layer(x, key_padding_mask)
    real = seen["before_out"].view(b, n, h, dh).transpose(1, 2)  # (b, h, n, dh)
    v = layer.v_proj(x).view(b, n, h, dh).transpose(1, 2)

    eye = torch.eye(dh, dtype=x.dtype, device=x.device)
    columns = []
    passes = -(-n // dh)
    with (
        _late_projection(layer),
        _hooks((layer.out_proj, "pre", keep_output_input), (layer.v_proj, "post", replace_v)),
    ):
        for start in range(0, n, dh):  # V's rows start..start+dh−1 are unit vectors, per head
            width = min(dh, n - start)
            probe = x.new_zeros(b, n, d)
            probe[:, start : start + width] = eye[:width].repeat(1, h)  # channel h·dh + c
            seen["probe"] = probe
            layer(x, key_padding_mask)
            out = seen["before_out"].view(b, n, h, dh)[..., :width]  # (b, n, h, width)
            columns.append(out.permute(0, 2, 1, 3))  # (b, h, n, width)
    if seen["calls"] != passes:
        return None
    rows = torch.cat(columns, dim=-1)  # (b, h, n, n)
    miss = torch.linalg.vector_norm(rows @ v - real)
    if miss > LINEAR_TOLERANCE * torch.linalg.vector_norm(real) + 1e-12:
        return None
    return rows


def check_inputs(x: Any, mask: Any) -> None:
    if not isinstance(x, Tensor) or x.dim() != 3 or not x.is_floating_point() or x.shape[1] < 1:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x: must be a float tensor (batch, n >= 1, d_model), got {shape}")
    if mask is not None and (
        not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != x.shape[:2]
    ):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else mask
        raise ValueError(
            f"key_padding_mask: must be bool of shape {tuple(x.shape[:2])} (True = padding), "
            f"got {got}"
        )
    if mask is not None and bool(mask.all()):
        raise ValueError("key_padding_mask: every position is padding; nothing to compare")


def check_softmax_layer(name: str, layer: Any, what: str = "softmax attention") -> None:
    """One ``ValueError`` line unless ``layer`` is softmax attention itself (:data:`EXACT`):
    the reference of an error, and the only layer with a context matrix P."""
    if not isinstance(layer, tuple(mechanism_class(n) for n in EXACT)):
        raise ValueError(
            f"{name}: must be a {' or '.join(EXACT)} layer ({what}), got {type(layer).__name__}"
        )


def _exact_layer(layer: Any, d_model: int, n_heads: int, causal: bool) -> MultiHeadAttention:
    check_softmax_layer("exact_layer", layer)
    if layer.d_model != d_model or layer.n_heads != n_heads:
        raise ValueError(
            f"exact_layer: has d_model={layer.d_model}, n_heads={layer.n_heads}; x and "
            f"n_heads give d_model={d_model}, n_heads={n_heads}"
        )
    if bool(getattr(layer.cfg, "causal", False)) != causal:
        raise ValueError(
            f"causal: the mechanism's causal={causal} differs from exact_layer's; "
            "compare like with like"
        )
    return layer


def approximation_error(
    attention: str,
    params: dict[str, Any],
    *,
    x: Tensor,
    key_padding_mask: Tensor | None = None,
    exact_layer: nn.Module | None = None,
    n_heads: int,
    seed: int,
) -> dict[str, float | None]:
    """Error of ``attention`` (with ``params``) against softmax attention on the same weights.

    Builds the mechanism at max_seq_len = n with :func:`attnbench.create` right after
    ``torch.manual_seed(seed)`` (so the same call after that seed rebuilds it, e.g. to read
    its random features), then, unless ``exact_layer`` is given (e.g. a trained model's), a
    fresh exact vanilla layer; the global RNG is left as it was. It copies the exact layer's
    projections into the mechanism and returns ``{"rel_frobenius", "cosine", "row_error"}``
    (see the module docstring); ``row_error`` is None where the mechanism defines no rows.
    ``params["causal"]`` makes the reference causal too. Bad input raises one ``ValueError``
    line naming the key.
    """
    exact_counterpart(attention)
    if not isinstance(params, dict):
        raise ValueError(f"params: must be a dict of {attention}'s parameters, got {params!r}")
    check_inputs(x, key_padding_mask)
    check_int("n_heads", n_heads)
    check_int("seed", seed, low=0)
    if key_padding_mask is not None and not info(attention).padding_mask:
        raise ValueError(f"key_padding_mask: attention={attention} takes no padding mask")
    b, n, d = x.shape
    causal = bool(params.get("causal", False))
    with torch.random.fork_rng(devices=[]):  # the mechanism's draws do not depend on exact_layer
        torch.manual_seed(seed)
        layer = create(attention, d_model=d, n_heads=n_heads, max_seq_len=n, **params)
        if exact_layer is None:
            exact_layer = create(
                "vanilla", d_model=d, n_heads=n_heads, max_seq_len=n, causal=causal
            )
    exact = _exact_layer(exact_layer, d, n_heads, causal)
    layer = layer.to(device=x.device, dtype=torch.float32).eval()
    copy_projections(exact, layer)

    x32 = x.detach().to(torch.float32)
    y, p = softmax_reference(exact, x.detach(), key_padding_mask, causal)  # float64
    with torch.no_grad():
        y_hat = layer(x32, key_padding_mask).double()
    real = torch.ones(b, n, dtype=torch.bool, device=x.device)
    if key_padding_mask is not None:
        real = ~key_padding_mask
    diff = torch.linalg.vector_norm((y - y_hat)[real])
    rel = diff / torch.linalg.vector_norm(y[real]).clamp_min(torch.finfo(torch.float64).tiny)
    cosine = F.cosine_similarity(y[real], y_hat[real], dim=-1, eps=1e-30).mean()

    rows = implied_rows(layer, x32, key_padding_mask)
    row_error = None
    if rows is not None:
        tv = 0.5 * (rows - p).abs().sum(-1)  # (b, h, n)
        row_error = float(tv.mean(1)[real].mean())
    return {"rel_frobenius": float(rel), "cosine": float(cosine), "row_error": row_error}


@torch.no_grad()
def layer_inputs(model: Encoder, x: Tensor, key_padding_mask: Tensor | None = None) -> list[Tensor]:
    """The hidden states entering each layer's attention, in layer order: one forward of
    ``model`` with a pre-hook on every ``layer.attn`` (so whatever the encoder does between
    layers, the states are exactly what each attention saw)."""
    if not isinstance(model, Encoder):
        raise ValueError(f"model: must be an attnbench Encoder, got {type(model).__name__}")
    check_inputs(x, key_padding_mask)
    inputs: list[Tensor | None] = [None] * len(model.layers)

    def keeper(index: int) -> Callable[..., None]:
        def keep(module: nn.Module, args: tuple[Tensor, ...]) -> None:
            inputs[index] = args[0].detach().clone()

        return keep

    pairs = [(layer.attn, "pre", keeper(i)) for i, layer in enumerate(model.layers)]
    with _hooks(*pairs):
        model(x, key_padding_mask)
    return inputs  # type: ignore[return-value]  (every layer ran, so none is None)


def layerwise_error(
    model: Encoder,
    attention: str,
    params: dict[str, Any],
    *,
    x: Tensor,
    key_padding_mask: Tensor | None = None,
    seed: int = 0,
) -> list[dict[str, float | None]]:
    """:func:`approximation_error` of ``attention`` on each layer of a (trained, vanilla or
    sdpa) ``model``: layer l's real input and its own attention weights."""
    states = layer_inputs(model, x, key_padding_mask)
    return [
        approximation_error(
            attention,
            params,
            x=states[i],
            key_padding_mask=key_padding_mask,
            exact_layer=layer.attn,
            n_heads=layer.attn.n_heads,
            seed=seed,
        )
        for i, layer in enumerate(model.layers)
    ]


def random_inputs_error(
    attention: str,
    params: dict[str, Any],
    *,
    n: int = 512,
    d_model: int = 256,
    n_heads: int = 4,
    batch: int = 2,
    seeds: Sequence[int] = (0, 1, 2),
    scale: float = 1.0,
) -> dict[str, float | None]:
    """The metrics averaged over ``seeds``, each a fresh seeded layer pair and x ~ N(0, scale²)
    (batch, n, d_model): random inputs to fresh layers. ``scale`` 1 is a post-LayerNorm hidden
    state's; a larger one sharpens the softmax (logits grow as scale²) away from the near-
    uniform attention of an untrained layer. A metric that is None for any seed is None."""
    check_int("n", n)
    check_int("d_model", d_model)
    check_int("batch", batch)
    check_number("scale", scale, low=0, open_low=True)
    if not seeds:
        raise ValueError("seeds: must name at least one seed, got none")
    runs = []
    for seed in seeds:
        g = torch.Generator().manual_seed(check_int("seed", seed, low=0))
        x = scale * torch.randn(batch, n, d_model, generator=g)
        runs.append(approximation_error(attention, params, x=x, n_heads=n_heads, seed=seed))
    return mean_metrics(runs)


def mean_metrics(runs: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Each of :data:`METRICS` averaged over ``runs`` (seeds, or a model's layers); None
    where any run has none (a mechanism without rows has none in every run)."""
    out: dict[str, float | None] = {}
    for key in METRICS:
        values = [r[key] for r in runs]
        out[key] = None if any(v is None for v in values) else sum(values) / len(values)
    return out
