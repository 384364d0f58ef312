"""An independent float64 multi-head attention, written from the formula, used as the oracle.

It shares no code with attnbench: per head, per batch element, with explicit loops, so a bug
in the package's reshapes or masks cannot hide in the oracle too.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def reference_mha(
    module: nn.Module, x: Tensor, key_padding_mask: Tensor | None = None, causal: bool = False
) -> Tensor:
    """softmax(Q_i K_iᵀ/√d_k) V_i per head, concatenated, then W^O — in float64."""
    x = x.double()
    w = {
        name: (getattr(module, name).weight.double(), getattr(module, name).bias.double())
        for name in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    b, n, d = x.shape
    h = module.n_heads
    dh = d // h
    out = torch.empty(b, n, d, dtype=torch.float64)
    for bi in range(b):
        xb = x[bi]
        q, k, v = (xb @ w[p][0].T + w[p][1] for p in ("q_proj", "k_proj", "v_proj"))
        heads = []
        for i in range(h):
            sl = slice(i * dh, (i + 1) * dh)
            scores = q[:, sl] @ k[:, sl].T / math.sqrt(dh)  # (n, n)
            for qi in range(n):
                for kj in range(n):
                    padded = key_padding_mask is not None and bool(key_padding_mask[bi, kj])
                    if padded or (causal and kj > qi):
                        scores[qi, kj] = -math.inf
            heads.append(torch.softmax(scores, dim=-1) @ v[:, sl])
        out[bi] = torch.cat(heads, dim=-1) @ w["out_proj"][0].T + w["out_proj"][1]
    return out
