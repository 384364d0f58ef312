"""The paper's Transformer: eager softmax(QKᵀ/√d)V that materialises the n × n matrix.

Kept deliberately naive: it is the baseline of Table 3 and the memory it spends on the
(b, h, n, n) scores is exactly what the efficient mechanisms are measured against.

Grouped-query heads (``kv_heads``) are served by stacking each group's query heads
(:func:`attnbench.attention.cache.grouped`), not by repeating K and V: the scores are the
same (b, h, n, n), and no copy of K or V is made. Its incremental form keeps a preallocated
K/V cache (:class:`attnbench.attention.cache.KVCache`). ``sinks`` and ``gate``: attention
sinks and the output gate (:mod:`attnbench.attention.sinks_gate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnbench.attention.base import declare
from attnbench.attention.cache import CachedAttention, KVCache, grouped, ungrouped
from attnbench.attention.masks import blocked_keys
from attnbench.attention.packing import Packing, per_document
from attnbench.attention.sinks_gate import SinksGateConfig, sink_rows, sink_softmax
from attnbench.validators import check_bool


@dataclass
class VanillaConfig(SinksGateConfig):
    causal: bool = False

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        super().__post_init__()


def softmax_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    blocked: Tensor | None,
    scale: float,
    padded: bool,
    sinks: Tensor | None = None,
) -> Tensor:
    """Eager softmax(QKᵀ·scale)V over (b, g, ·, dh) operands with ``blocked`` (True: may
    not see) broadcastable to the scores. ``padded``: a query may see no key at all (padding
    only), which gets 0, as in sdpa, not NaN. ``sinks`` (n_heads,): each query head's sink
    logit in its rows' denominators (:func:`attnbench.attention.sinks_gate.sink_softmax`),
    the g = n_heads / kv_heads query heads of a group stacked in its rows (``grouped``)."""
    scores = (q @ k.transpose(-2, -1)) * scale  # (b, g, c, L)
    if blocked is not None and blocked.shape[-2] not in (1, scores.shape[-2]):
        # grouped queries: every group's heads are stacked rows, each with the same mask
        blocked = blocked.repeat(
            *[1] * (blocked.dim() - 2), scores.shape[-2] // blocked.shape[-2], 1
        )
    if sinks is not None:  # a row that sees no key gets 0: its denominator is the sink alone
        rows = q.shape[2] * k.shape[1] // sinks.shape[0]  # each query head's rows
        if blocked is not None:
            scores = scores.masked_fill(blocked, float("-inf"))
        probs = sink_softmax(scores, sink_rows(sinks, k.shape[1], rows))
        if blocked is not None and padded:  # a sink of −inf: the row is 0/0
            probs = probs.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
        return probs @ v
    if blocked is None:
        return scores.softmax(dim=-1) @ v
    probs = scores.masked_fill(blocked, float("-inf")).softmax(dim=-1)
    if padded:
        probs = probs.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
    return probs @ v


@declare(
    "vanilla",
    packs="one pass of projections, then softmax over each document's own block of the row",
    config=VanillaConfig,
    causal=True,
    gqa=True,
    head_dim=True,
    cannot_decode=None,
    summary="eager softmax(QKᵀ/√d)V materialising n×n (the paper's Transformer)",
)
class VanillaAttention(CachedAttention):
    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh); k, v (b, kv_heads, n, dh)
        blocked = blocked_keys(key_padding_mask, self.cfg.causal, x.shape[1], x.device)
        padded = key_padding_mask is not None
        out = softmax_attend(
            grouped(q, self.kv_heads), k, v, blocked, self.scale, padded, self.sinks
        )
        return self.merge_heads(ungrouped(out, self.n_heads))  # (b, n, d)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """The projections over the packed rows at once, softmax over each document's own
        keys: its block of the row (the scores across documents are never computed, as a
        variable-length kernel skips them)."""
        q, k, v = self.qkv_heads(x)

        def alone(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            blocked = blocked_keys(None, self.cfg.causal, q.shape[2], q.device)
            out = softmax_attend(
                grouped(q, self.kv_heads), k, v, blocked, self.scale, False, self.sinks
            )
            return ungrouped(out, self.n_heads)

        return self.merge_heads(per_document(alone, packing, q, k, v))

    def extend_attend(self, x: Tensor, state: KVCache, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, c, dh); k, v (b, kv_heads, c, dh)
        keys, values = state.append(k, v, key_padding_mask)  # (b, kv_heads, L, dh)
        blocked = state.blocked(x.shape[1])  # (b | 1, 1, c | 1, L)
        out = softmax_attend(
            grouped(q, self.kv_heads),
            keys,
            values,
            blocked,
            self.scale,
            state.has_padding,
            self.sinks,
        )
        return self.merge_heads(ungrouped(out, self.n_heads))  # (b, c, d)
