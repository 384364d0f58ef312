"""The key/value cache of the exact mechanisms (vanilla, sdpa, xformers): not a mechanism.

Serving exact attention keeps every earlier token's key and value: a decode step computes
one token's K and V, writes them after the others and attends over all of them. The cache is
preallocated to its capacity (the prompt plus the tokens to generate), as serving engines
do; growing it by ``torch.cat`` instead copies the whole cache at every token
(``docs/serving.md`` measures the difference).

Prompts of different lengths are padded on the **left**, so that every sequence's next token
lands at the same position. Padded positions are written into the cache as zeros and marked
in ``padded``, which every attention over the cache masks: neither their scores nor (a zero
times a NaN is a NaN) their values reach a real output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVCache:
    """``k``, ``v``: (b, kv_heads, capacity, dh) in the state's dtype; ``padded``: (b,
    capacity), True at padding; ``length``: the tokens written so far, the same for every
    sequence (left padding); ``has_padding``: whether any written token is padding, so that
    a batch without any attends without a mask."""

    k: Tensor
    v: Tensor
    padded: Tensor
    length: int = 0
    has_padding: bool = False

    @classmethod
    def empty(
        cls,
        b: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (b, kv_heads, capacity, head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(b, capacity, dtype=torch.bool, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def slot(self, i: int) -> KVCache:
        """Sequence i's cache as an empty one of its own (views of this one's tensors): a
        serving engine prefills a new sequence into its slot while the others stay."""
        self.padded[i] = False
        return KVCache(self.k[i : i + 1], self.v[i : i + 1], self.padded[i : i + 1])

    def seek(self, length: int) -> None:
        """The whole batch at ``length`` tokens as if every slot were filled: the memory
        model's shortcut to a decode step's shapes (on meta, contents do not matter)."""
        self.length = length

    def admit(self, part: KVCache) -> None:
        """After every slot was filled: the batch is at ``part``'s position."""
        self.length = part.length
        self.has_padding = self.has_padding or part.has_padding

    def append(
        self, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Write the c new tokens' ``k``, ``v`` (b, kv_heads, c, dh) after the others; returns
        every token's keys and values so far (views of the cache, in the compute dtype:
        a copy only when the state is kept in another dtype)."""
        c, start = k.shape[2], self.length
        if start + c > self.capacity:
            raise ValueError(
                f"decode: {start + c} tokens, but the cache holds {self.capacity} "
                f"(the prompt plus decode_tokens)"
            )
        if key_padding_mask is not None and bool(key_padding_mask.any()):
            pad = key_padding_mask[:, None, :, None]  # (b, 1, c, 1)
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
            self.padded[:, start : start + c] = key_padding_mask
            self.has_padding = True
        self.k[:, :, start : start + c] = k
        self.v[:, :, start : start + c] = v
        self.length = start + c
        keys, values = self.k[:, :, : self.length], self.v[:, :, : self.length]
        return keys.to(k.dtype), values.to(v.dtype)

    def blocked(self, c: int) -> Tensor | None:
        """Bool (b, 1, c, length), True where one of the c newest queries may not see a
        key: padding, or a later position among the c; None when nothing is blocked (one
        token and no padding)."""
        length = self.length
        blocked = None
        if self.has_padding:
            blocked = self.padded[:, None, None, :length]  # (b, 1, 1, L)
        if c > 1:
            i = torch.arange(length - c, length, device=self.k.device)[:, None]
            future = torch.arange(length, device=self.k.device)[None, :] > i  # (c, L)
            blocked = future if blocked is None else blocked | future
        return blocked


def kv_cache_bytes(n: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """One sequence's K and V at context n in one layer, plus its padding flags (a byte a
    token): what :class:`KVCache` allocates per sequence at capacity n."""
    return 2 * kv_heads * head_dim * n * itemsize + n


def grouped(q: Tensor, kv_heads: int) -> Tensor:
    """Queries (b, h, c, dh) as (b, kv_heads, g·c, dh), g = h / kv_heads: the g query heads
    of a group stacked, so that one matmul per key/value head serves them all without
    copying K or V g times (the copy is of Q, which is c tokens, not the cache)."""
    b, h, c, dh = q.shape
    return q.reshape(b, kv_heads, (h // kv_heads) * c, dh)


def ungrouped(out: Tensor, n_heads: int) -> Tensor:
    """The inverse of :func:`grouped`: (b, kv_heads, g·c, dh) -> (b, h, c, dh)."""
    b, _, gc, dh = out.shape
    return out.reshape(b, n_heads, gc * out.shape[1] // n_heads, dh)
