"""A mechanism, added from this file alone: softmax attention within a band of ±window
positions, the example of docs/mechanisms.md ("Add a mechanism"), which quotes this file.

Loaded as a plugin (``ATTNBENCH_PLUGINS=tests.toys.toy_mechanism``), ``attnbench run
attention=local_window`` measures it like a built-in, and the registry-wide suites hold it
to what they hold every mechanism to without an edit (tests/test_toy_mechanism.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import attnbench
from attnbench.attention.base import MultiHeadAttention
from attnbench.validators import check_int


@dataclass
class LocalConfig:
    window: int = 128

    def __post_init__(self) -> None:
        check_int("window", self.window)  # bad values: one clear ValueError


@attnbench.register(
    "local_window",
    config=LocalConfig,
    causal=False,
    budget="window",
    summary="softmax attention within a band of ±window positions",
)
class LocalWindowAttention(MultiHeadAttention):
    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh)
        n = x.shape[1]
        idx = torch.arange(n, device=x.device)
        far = (idx[:, None] - idx[None, :]).abs() > self.cfg.window  # (n, n)
        scores = (q @ k.transpose(-2, -1) * self.scale).masked_fill(far, float("-inf"))
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        return self.merge_heads(scores.softmax(-1) @ v)  # (b, n, d)
