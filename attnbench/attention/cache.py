"""The key/value cache of the exact mechanisms (vanilla, sdpa, xformers), and their base
:class:`CachedAttention`, which keeps it: not a mechanism.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

import torch
from torch import Tensor

from attnbench.attention.base import MultiHeadAttention


@dataclass
class KeyValues:
    """Keys and values kept per sequence: ``k``, ``v`` (b, heads, slots, dh) in the state's
    dtype, ``padded`` (b, slots) True where a slot holds padding (or, for a ring, nothing
    yet), ``length`` the tokens seen so far (the same for every sequence: left padding),
    ``has_padding`` whether any token seen was padding. The K/V cache and local's ring
    (:class:`Ring`, local's) are both this, told apart by how they write."""

    k: Tensor
    v: Tensor
    padded: Tensor
    length: int = 0
    has_padding: bool = False

    UNWRITTEN: ClassVar[bool] = False  # what ``padded`` says of a slot not written yet

    @classmethod
    def empty(
        cls,
        b: int,
        heads: int,
        slots: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Self:
        shape = (b, heads, slots, head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            torch.full((b, slots), cls.UNWRITTEN, dtype=torch.bool, device=device),
        )

    def slot(self, i: int) -> Self:
        """Sequence i's part as an empty state of its own (views of this one's tensors): a
        serving engine prefills a new sequence into its slot while the others stay."""
        self.padded[i] = self.UNWRITTEN
        return type(self)(self.k[i : i + 1], self.v[i : i + 1], self.padded[i : i + 1])

    def admit(self, part: Self) -> None:
        """After every slot was filled: the batch is at ``part``'s position."""
        self.length = part.length
        self.has_padding = self.has_padding or part.has_padding

    def pad_left(self, pads: Sequence[int]) -> None:
        """Sequence i's first ``pads[i]`` positions are left padding: its prompt is that much
        shorter than the longest, which every slot is positioned after. Marks them as a
        left-padded prefill writes them (``padded``, zeros), without prefilling each
        sequence: serving a mix of contexts (``mode=decode contexts=drawn``)."""
        device = self.padded.device
        held = self.positions()  # (slots,): the position each slot holds, -1 none yet
        short = torch.tensor(list(pads), device=device)[:, None]  # (b, 1)
        mask = (held[None, :] >= 0) & (held[None, :] < short)  # (b, slots)
        self.padded |= mask
        self.k.masked_fill_(mask[:, None, :, None], 0.0)
        self.v.masked_fill_(mask[:, None, :, None], 0.0)
        self.has_padding = self.has_padding or any(p > 0 for p in pads)

    def positions(self) -> Tensor:
        """The position each slot holds at ``length`` tokens, -1 where none is held yet."""
        raise NotImplementedError


@dataclass
class KVCache(KeyValues):
    """Every token's key and value, preallocated to the capacity (slot p holds position p)."""

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def seek(self, length: int) -> None:
        """The whole batch at ``length`` tokens as if every slot were filled: the memory
        model's shortcut to a decode step's shapes (on meta, contents do not matter)."""
        self.length = length

    def positions(self) -> Tensor:
        """Slot p holds position p once written."""
        slot = torch.arange(self.capacity, device=self.k.device)
        return slot.masked_fill(slot >= self.length, -1)

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


def kv_elements(slots: int, heads: int, head_dim: int) -> int:
    """One sequence's keys and values in ``slots`` slots of one layer, 2·heads·head_dim·slots
    elements: the context memory of every mechanism that keeps keys and values (a cache at
    capacity n: n slots; local's ring: min(w, n)), and what :class:`KeyValues` allocates per
    sequence besides its padding flags."""
    return 2 * heads * head_dim * slots


def flag_bytes(slots: int) -> int:
    """The padding flags of ``slots`` slots, a bool each: which slot holds padding. A state
    keeps them (``state_bytes``), but they are bookkeeping, not context: no output reads
    them as keys or values, so ``context_bytes`` leaves them out."""
    return slots * torch.bool.itemsize


class CachedAttention(MultiHeadAttention):
    """Base of the exact mechanisms that decode over a :class:`KVCache` (vanilla, sdpa,
    xformers): the cache, its context memory and its bytes, one formula for the three. A
    subclass implements ``extend_attend`` over it."""

    def new_state(self, b: int, capacity: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        return KVCache.empty(b, self.kv_heads, capacity, self.head_dim, dtype, device)

    def context_elements(self, n: int) -> int:
        """Every token's key and value, the K/V cache at n: 2·kv_heads·d_h·n."""
        return kv_elements(n, self.kv_heads, self.head_dim)

    def state_bytes(self, n: int, itemsize: int) -> int:
        """The cache at capacity n: its keys and values, and a padding flag a token."""
        return self.context_bytes(n, itemsize) + flag_bytes(n)


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


@dataclass
class Ring(KeyValues):
    """The last r = min(w, capacity) keys and values, position p in slot p mod r; a slot
    not written yet counts as padding."""

    UNWRITTEN: ClassVar[bool] = True

    @property
    def size(self) -> int:
        return self.k.shape[2]

    def seek(self, length: int) -> None:
        """The whole batch at ``length`` tokens as if every slot were filled (the memory
        model's shortcut to a decode step's shapes)."""
        self.length = length
        self.padded[:, : min(length, self.size)] = False

    def positions(self) -> Tensor:
        """Slot s holds the latest position p < ``length`` with p ≡ s (mod r)."""
        slot, r = torch.arange(self.size, device=self.k.device), self.size
        held = slot + (self.length - 1 - slot).div(r, rounding_mode="floor") * r
        return held.masked_fill(slot >= self.length, -1)

    def write(self, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
        """The c new tokens' k, v (b, h, c, dh); only the last r of them are kept."""
        c, r = k.shape[2], self.size
        keep = min(c, r)
        slots = torch.arange(self.length + c - keep, self.length + c, device=k.device) % r
        self.k.index_copy_(2, slots, k[:, :, c - keep :].to(self.k.dtype))
        self.v.index_copy_(2, slots, v[:, :, c - keep :].to(self.v.dtype))
        if key_padding_mask is None:
            self.padded[:, slots] = False
        else:
            self.padded[:, slots] = key_padding_mask[:, c - keep :]
            self.has_padding = self.has_padding or bool(key_padding_mask.any())
        self.length += c

    def ordered(self) -> tuple[Tensor, Tensor, Tensor]:
        """K, V (b, h, r, dh) and ``padded`` (b, r), oldest first: the r positions before
        the next token (slots never written count as padding)."""
        shift = -(self.length % self.size)
        return tuple(
            t.roll(shift, dims=-2 if t.dim() == 4 else -1) for t in (self.k, self.v, self.padded)
        )
