"""The spectrum of the context matrix P = softmax(QKᵀ/√d_h): the Linformer paper's Figure 1.

Linformer's premise is that P is low rank: a few singular values hold most of its spectrum,
more so in higher layers. Figure 1 (left) plots the normalised cumulative singular values
Σ_{j≤i} σ_j / Σ_j σ_j against i, averaged per layer; Figure 1 (right) shows, per layer and
head, that cumulative value at the 128th largest singular value of 512. The paper used a
pretrained RoBERTa; here it is whatever vanilla model is given (a trained one, or a random
one, which a plot must then say).

With a padding mask, P's padded rows and columns are zero (a padded query is no row of the
sequence), so a sequence of L real tokens has at most L non-zero singular values and its
cumulative curve reaches 1 by the L-th: the curve has n points whatever the padding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnbench.model import Encoder
from attnbench.quality.approx import (
    check_inputs,
    check_softmax_layer,
    layer_inputs,
    softmax_reference,
)
from attnbench.validators import check_int

HAS_P = "softmax attention has the context matrix P"  # why another layer is refused


@torch.no_grad()
def context_matrices(layer: nn.Module, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """P = softmax(QKᵀ/√d_h) per head from a vanilla (or sdpa) layer's own projections:
    (b, h, n, n) float64, padded rows and columns zero (causal if the layer is).

    Another mechanism has no such P (or not this one), so it is refused in one line.
    """
    check_softmax_layer("layer", layer, HAS_P)
    check_inputs(x, key_padding_mask)
    if x.shape[-1] != layer.d_model:
        raise ValueError(f"x: must be (batch, n, {layer.d_model}), got {tuple(x.shape)}")
    causal = bool(getattr(layer.cfg, "causal", False))
    _, p = softmax_reference(layer, x, key_padding_mask, causal)
    if key_padding_mask is not None:
        p = p.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    return p


def cumulative_spectrum(p: Tensor) -> Tensor:
    """Σ_{j≤i} σ_j / Σ_j σ_j of each matrix in ``p`` (..., n, n), float64, (..., n).

    ``torch.linalg.svdvals`` in float64: P's small singular values are what the curve's
    tail is made of, and fp32 would blur them.
    """
    sigma = torch.linalg.svdvals(p.double())  # (..., n), descending
    return sigma.cumsum(-1) / sigma.sum(-1, keepdim=True)


def spectrum(
    model: Encoder, x: Tensor, key_padding_mask: Tensor | None = None, index: int = 128
) -> dict[str, Any]:
    """Figure 1 of the Linformer paper for a vanilla ``model`` on inputs ``x`` (b, n, d).

    Returns ``{"n", "index", "cumulative", "at_index"}``: ``cumulative`` is a list per layer
    of n floats, the normalised cumulative singular values averaged over the batch and the
    heads (Fig. 1 left); ``at_index`` is a layers × heads grid, the cumulative value at the
    ``index``-th largest singular value averaged over the batch (Fig. 1 right; the paper's
    128 of 512). Each layer's P is taken on that layer's real input (:func:`layer_inputs`).
    """
    if not isinstance(model, Encoder):
        raise ValueError(f"model: must be an attnbench Encoder, got {type(model).__name__}")
    check_inputs(x, key_padding_mask)
    for layer in model.layers:  # before any work: a model of another mechanism has no P
        check_softmax_layer("layer", layer.attn, HAS_P)
    n = x.shape[1]
    index = check_int("index", index, high=n)
    if key_padding_mask is not None and bool(key_padding_mask.all(-1).any()):
        raise ValueError("key_padding_mask: a sequence is all padding; its P has no spectrum")
    cumulative, at_index = [], []
    for layer, states in zip(model.layers, layer_inputs(model, x, key_padding_mask), strict=True):
        curves = cumulative_spectrum(context_matrices(layer.attn, states, key_padding_mask))
        cumulative.append(curves.mean(dim=(0, 1)).tolist())  # (n,): batch and heads
        at_index.append(curves[..., index - 1].mean(0).tolist())  # (h,): batch
    return {"n": n, "index": index, "cumulative": cumulative, "at_index": at_index}
