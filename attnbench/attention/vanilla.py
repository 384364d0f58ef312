"""The paper's Transformer: eager softmax(QKᵀ/√d)V that materialises the n × n matrix.

Kept deliberately naive: it is the baseline of Table 3 and the memory it spends on the
(b, h, n, n) scores is exactly what the efficient mechanisms are measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnbench.attention.base import MultiHeadAttention, blocked_keys
from attnbench.registry import register
from attnbench.validators import check_bool


@dataclass
class VanillaConfig:
    causal: bool = False

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)


@register(
    "vanilla",
    config=VanillaConfig,
    causal=True,
    summary="eager softmax(QKᵀ/√d)V materialising n×n (the paper's Transformer)",
)
class VanillaAttention(MultiHeadAttention):
    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (b, h, n, n)
        blocked = blocked_keys(key_padding_mask, self.cfg.causal, x.shape[1], x.device)
        if blocked is None:
            return self.merge_heads(scores.softmax(dim=-1) @ v)  # (b, n, d)
        probs = scores.masked_fill(blocked, float("-inf")).softmax(dim=-1)
        if key_padding_mask is not None:  # a query that sees no key gets 0, as in sdpa, not NaN
            probs = probs.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
        return self.merge_heads(probs @ v)  # (b, n, d)
