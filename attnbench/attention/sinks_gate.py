"""Attention sinks and the output gate: two options the softmax mechanisms (``vanilla``,
``sdpa``, ``local``, ``flex``) share, declared once (:class:`SinksGateConfig`, which their
configs extend) and applied by the helpers here, so one rule serves all four.

**Sinks** (``sinks=true``): one learned logit s_h per query head joins every row's softmax
and its column is dropped, so it shifts no value but lets a head attend to "nothing":

    out_i = Σ_j e^{z_ij} v_j / (Σ_j e^{z_ij} + e^{s_h})

as gpt-oss's attention (Hugging Face transformers, ``models/gpt_oss/modeling_gpt_oss.py``,
``eager_attention_forward``: the sink logits concatenated to the scores as a last column,
softmax, that column dropped). A query that sees no key gets 0 (its denominator is e^{s_h}
alone), never NaN. Where a kernel returns the row's log-sum-exp L_i = log Σ_j e^{z_ij}, its
output times σ(L_i − s_h) is the same quantity exactly (Σ/(Σ + e^s) = 1/(1 + e^{s − L})):
``flex`` uses that (:func:`lse_sink_scale`); ``vanilla``, ``sdpa`` (none of whose kernels
takes a sink, so ``sinks=true`` runs its math) and ``local`` run the eager softmax with the
sink in the denominator (:func:`sink_softmax`). The logits start at 0 (a sink worth one key
of score 0); gpt-oss draws them from N(0, σ²).

**Output gate** (``gate=headwise|elementwise``): the attention's output, before
``out_proj``, times σ(x W_g + b_g), W_g of d_model × n_heads (one gate per head, broadcast
over its channels) or d_model × d_model (one per channel): Qiu et al. 2025, "Gated Attention
for Large Language Models" (its code, github.com/qiuzh20/gated_attention ``modeling_qwen3.py``
``Qwen3Attention.forward``, widens ``q_proj`` by the gate's width and splits it off;
Qwen3-Next's attention, transformers ``models/qwen3_next/modeling_qwen3_next.py``, is the
elementwise form). Here the gate is its own ``gate_proj`` (the same function as a widened
``q_proj``, whose other outputs are untouched), so ``q_proj`` stays the d_model × d_model that
every mechanism shares; its matmul is counted with the projections (:func:`gate_width`).

Both default off: a layer without them has no extra parameter and computes what it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnbench.validators import check_bool, check_choice

GATES = ("none", "headwise", "elementwise")
# the settings this module owns: a mechanism whose config lacks them refuses them in one line
# (attnbench.registry.make_config names the mechanisms that take them)
FIELDS = {
    "sinks": "an attention sink (a learned logit in a softmax's denominator)",
    "gate": "an output gate σ(x W_g) after attention",
}


@dataclass(kw_only=True)
class SinksGateConfig:
    """What a softmax mechanism's config extends (keyword-only, so its own fields keep
    their positions): ``sinks`` and ``gate``, off by default, so a cell that names neither
    keys and measures as before."""

    gate: str = "none"
    sinks: bool = False

    def __post_init__(self) -> None:
        check_choice("gate", self.gate, GATES)
        check_bool("sinks", self.sinks)


def gate_width(cfg: object, n_heads: int, width: int) -> int:
    """The gate projection's outputs: n_heads (headwise), the attention's width (elementwise:
    n_heads · head_dim, d_model unless head_dim says otherwise), 0 (none,
    and any config that is not a :class:`SinksGateConfig`: a plugin's own ``gate`` field is
    its own business)."""
    if not isinstance(cfg, SinksGateConfig):
        return 0
    return {"none": 0, "headwise": n_heads, "elementwise": width}[cfg.gate]


def parameters(
    cfg: object, n_heads: int, d_model: int, width: int
) -> tuple[nn.Parameter | None, nn.Module | None]:
    """A layer's sink logits (n_heads,) and gate projection (from d_model), each None where
    off."""
    held = isinstance(cfg, SinksGateConfig) and cfg.sinks
    sinks = nn.Parameter(torch.zeros(n_heads)) if held else None
    outputs = gate_width(cfg, n_heads, width)
    return sinks, (nn.Linear(d_model, outputs) if outputs else None)


def gated(gate_proj: nn.Module | None, x: Tensor, out: Tensor, n_heads: int) -> Tensor:
    """``out`` (b, n, width), the heads merged, times σ(gate_proj(x)): one gate per head
    broadcast over its channels, or one per channel; ``out`` itself where there is no gate."""
    if gate_proj is None:
        return out
    gate = torch.sigmoid(gate_proj(x))  # (b, n, h) or (b, n, d)
    if gate.shape[-1] == out.shape[-1]:
        return out * gate
    b, n, d = out.shape
    return (out.view(b, n, n_heads, d // n_heads) * gate[..., None]).view(b, n, d)


def sink_rows(sinks: Tensor, kv_heads: int, rows: int) -> Tensor:
    """The sink logit of every score row as (kv_heads, g·rows, 1), for queries grouped as
    :func:`attnbench.attention.cache.grouped` stacks them (g = n_heads / kv_heads query
    heads of ``rows`` rows each per key/value head); (h, rows, 1) when kv_heads = n_heads."""
    g = sinks.shape[0] // kv_heads
    return sinks.view(kv_heads, g, 1, 1).expand(kv_heads, g, rows, 1).reshape(kv_heads, -1, 1)


def sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """softmax over [scores, sink] along the last axis, the sink's column dropped: each row's
    weights sum to 1 − σ(s − L). ``sink`` broadcasts against ``scores`` with a last axis of 1.
    A row whose keys are all −inf gets weights 0. Only the weights are kept for the backward,
    as ``softmax`` keeps its output, so a sink costs no more memory than the softmax it joins
    (:class:`_SinkSoftmax`)."""
    return _SinkSoftmax.apply(scores, sink)


class _SinkSoftmax(torch.autograd.Function):
    """p_j = e^{z_j} / (Σ_k e^{z_k} + e^s), stabilised by the larger of the row's max and s.
    Its gradients from the weights alone: ∂p_j/∂z_k = p_j(δ_jk − p_k) as softmax's, and
    ∂p_j/∂s = −p_j·p_s with the sink's own weight p_s = 1 − Σ_k p_k, so
    dz = p ⊙ (g − Σ_k g_k p_k) and ds = −p_s·Σ_k g_k p_k, summed over what ``sink``
    was broadcast across."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, sink: Tensor) -> Tensor:
        sink = sink.to(scores.dtype)
        top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)
        weights = (scores - top).exp_()
        weights.div_(weights.sum(dim=-1, keepdim=True) + (sink - top).exp())
        ctx.save_for_backward(weights)
        ctx.sink_shape = sink.shape
        return weights

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        (weights,) = ctx.saved_tensors
        mean = (grad * weights).sum(dim=-1, keepdim=True)  # Σ_k g_k p_k, per row
        d_scores = weights * (grad - mean)
        d_sink = -(1 - weights.sum(dim=-1, keepdim=True)) * mean
        return d_scores, _sum_to(d_sink, ctx.sink_shape)


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """``t`` summed over the axes ``shape`` was broadcast along (autograd's reduction)."""
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead else t
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=axes, keepdim=True) if axes else t


def lse_sink_scale(out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """A kernel's softmax output ``out`` (b, h, n, dh) with its rows' log-sum-exp ``lse``
    (b, h, n) turned into the output with sinks, exactly: out·σ(lse − s_h)."""
    # a row that sees no key has lse −inf and out 0: with a sink of −inf, 0 too, not NaN
    scale = torch.sigmoid(lse - sinks.to(lse.dtype)[:, None]).nan_to_num(0.0)  # (b, h, n)
    return out * scale[..., None].to(out.dtype)
