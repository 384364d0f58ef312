"""A mechanism with a decode form, added from this file alone.

The toy is "each token's output is the mean of the values of the tokens it sees": no query,
no key, no softmax, so that its incremental form is two running sums per head (the values'
and their count) and can be checked against its forward exactly. Loaded as a plugin
(``ATTNBENCH_PLUGINS=tests.toys.toy_decoder``), ``attnbench run mode=decode
attention=toy_mean`` prefills, decodes, times and reports it like a built-in decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import attnbench
from attnbench.attention.base import MultiHeadAttention
from attnbench.validators import check_bool


@dataclass
class MeanConfig:
    causal: bool = False

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)


@dataclass
class MeanState:
    """Per sequence and head, the sum of the values seen, ``s`` (b, h, dh), and how many
    there were, ``z`` (b, h, 1), in the state's dtype; neither depends on the position, so
    ``seek`` and ``admit`` have nothing to do."""

    s: Tensor
    z: Tensor

    def slot(self, i: int) -> MeanState:
        """Sequence i's part, emptied (views of this state's tensors)."""
        self.s[i].zero_()
        self.z[i].zero_()
        return MeanState(self.s[i : i + 1], self.z[i : i + 1])

    def seek(self, length: int) -> None:
        """Sums have no position."""

    def admit(self, part: MeanState) -> None:
        """Sums have no position."""


@attnbench.register(
    "toy_mean",
    config=MeanConfig,
    causal=True,
    cannot_decode=None,
    summary="each token's output is the mean of the values it sees (a test's toy decoder)",
)
class MeanAttention(MultiHeadAttention):
    def _values(self, x: Tensor, key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """V (b, h, n, dh) and a count of one per real token (b, 1, n, 1), padding zeroed
        (filled, not multiplied: a padded NaN stays out), both in fp32 at least."""
        v = self.split_heads(self.v_proj(x))
        wide = torch.promote_types(v.dtype, torch.float32)
        one = torch.ones(x.shape[0], 1, x.shape[1], 1, dtype=wide, device=x.device)
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, :, None]
            v, one = v.masked_fill(pad, 0.0), one.masked_fill(pad, 0.0)
        return v.to(wide), one

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        v, one = self._values(x, key_padding_mask)
        if self.cfg.causal:
            s, z = v.cumsum(2), one.cumsum(2)
        else:
            s, z = v.sum(2, keepdim=True), one.sum(2, keepdim=True)
        out = (s / z.clamp(min=1)).expand_as(v)  # no real token seen: 0, not 0/0
        return self.merge_heads(out.to(x.dtype))

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> MeanState:
        """Two sums per head whatever the capacity."""
        h, dh = self.n_heads, self.head_dim
        zeros = torch.zeros
        return MeanState(zeros(b, h, dh, dtype=dtype, device=device),
                         zeros(b, h, 1, dtype=dtype, device=device))  # fmt: skip

    def extend_attend(self, x: Tensor, state: MeanState, key_padding_mask: Tensor | None) -> Tensor:
        v, one = self._values(x, key_padding_mask)
        s = v.cumsum(2) + state.s[:, :, None].to(v.dtype)  # (b, h, c, dh)
        z = one.cumsum(2) + state.z[:, :, None].to(v.dtype)  # (b, h, c, 1)
        state.s.copy_(s[:, :, -1])
        state.z.copy_(z[:, :, -1])
        return self.merge_heads((s / z.clamp(min=1)).to(x.dtype))

    def context_elements(self, n: int) -> int:
        """The sums and counts, h·(dh + 1) whatever n."""
        return self.n_heads * (self.head_dim + 1)

    def state_bytes(self, n: int, itemsize: int) -> int:
        return self.context_bytes(n, itemsize)

    def flops(self, b: int, n: int) -> int:
        """Two projections (V and out; no query or key is made), and no matmul between."""
        return 2 * b * n * self.d_model * (self.d_model + self.kv_heads * self.head_dim)

    def step_flops(self, b: int, n: int) -> int:
        return self.flops(b, 1)
