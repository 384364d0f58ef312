"""FlexAttention's block masks for ``flex``: not a mechanism, registers nothing.

A block mask tells the kernel which (query block, key block) pairs of :data:`BLOCK`
positions to compute, which of them whole and which through the ``mask_mod``. The patterns
here are bands of i − j (a :class:`Pattern`'s span), so a block mask depends only on
(n, the pattern, the device): it is built once (:func:`prepare`, which the runner times as the
mask build) and shared by every layer and call in the process. Key padding differs from call
to call: :func:`padded_block_mask` derives that call's mask from the cached one, block by
block, without evaluating the n × n pairs again.

Every cached tensor is made outside ``inference_mode`` (:func:`_shareable`), so that a mask
first built by a forward also serves a later training step, which must save it for backward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from attnbench.attention.base import indexed_device
from attnbench.attention.packing import Packing

BLOCK = 128  # create_block_mask's BLOCK_SIZE: the kernel's unit of sparsity
UNBOUNDED = 2**31 - 1  # an i − j bound no sequence reaches
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

# (n, *pattern.key(), device) -> the block mask, shared by every layer
_block_masks: dict[tuple[Any, ...], BlockMask] = {}
_mask_mods: dict[tuple[Any, ...], MaskMod] = {}  # (*pattern.key(), device) -> mask_mod


class Pattern(Protocol):
    """What a block mask is made from (``flex``'s config is one): the band of i − j a query
    sees, and a hashable key that tells bands apart."""

    def key(self) -> tuple[Any, ...]:
        """What the mask depends on besides n and the device: the cache's key."""
        ...

    def span(self) -> tuple[float, float]:
        """The allowed i − j, [lo, hi]: key j is seen by query i when lo ≤ i − j ≤ hi."""
        ...


@contextmanager
def _shareable() -> Iterator[None]:
    """Where the cached masks are built: outside ``inference_mode``, whose tensors a
    training step cannot save for backward, so that a mask first built by a forward (an
    inference cell, a probe) serves a later training step too (on CUDA the first training
    cell after an inference one failed so); ``no_grad``, as a mask is no parameter."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def mask_mod(pattern: Pattern, device: torch.device | str) -> MaskMod:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``: True where query i sees key j, i.e.
    lo ≤ i − j ≤ hi. The bounds are tensors, not constants: the compiled kernel takes them
    as inputs, so every pattern and window at one shape runs one compiled graph (a sweep over
    windows compiles once)."""
    device = indexed_device(device)
    key = (*pattern.key(), str(device))
    if key not in _mask_mods:
        lo, hi = (max(-UNBOUNDED, min(UNBOUNDED, v)) for v in pattern.span())
        with _shareable():
            bounds = torch.tensor([lo, hi], dtype=torch.int64, device=device)
        low, high = bounds[0], bounds[1]

        def allowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            d = q_idx - kv_idx
            return (d >= low) & (d <= high)

        _mask_mods[key] = allowed
    return _mask_mods[key]


def prepare(n: int, pattern: Pattern, device: torch.device | str) -> float:
    """Build and cache the block mask at length n: the seconds it took, 0.0 when it was
    cached already (by any layer) and on meta (where none is built)."""
    device = indexed_device(device)
    if device.type == "meta":
        return 0.0
    key = (n, *pattern.key(), str(device))
    if key in _block_masks:
        return 0.0
    start = time.perf_counter()
    with _shareable():
        _block_masks[key] = create_block_mask(
            mask_mod(pattern, device), None, None, n, n, device=device
        )
    return time.perf_counter() - start


def block_mask(
    n: int, pattern: Pattern, device: torch.device, key_padding_mask: Tensor | None
) -> BlockMask:
    """The block mask of one call: the cached one, or with padding one for this batch
    (:func:`padded_block_mask`)."""
    prepare(n, pattern, device)
    cached = _block_masks[(n, *pattern.key(), str(indexed_device(device)))]
    if key_padding_mask is None:
        return cached
    return padded_block_mask(cached, mask_mod(pattern, device), key_padding_mask)


def computed_blocks(n: int, pattern: Pattern, block: int = BLOCK) -> list[tuple[int, int]]:
    """For each query block t, the (first, last) key position of the key blocks the block
    mask computes for it (full or partial ones; contiguous for these patterns), with no
    mask built: block (t, s) is computed when some i − j in it lies in :meth:`Pattern.span`."""
    lo, hi = pattern.span()
    blocks = -(-n // block)
    out = []
    for t in range(blocks):
        r0, r1 = t * block, min(n, (t + 1) * block) - 1
        # key block s (columns c0..c1) is computed iff r0 − c1 ≤ hi and r1 − c0 ≥ lo
        first = 0 if hi == float("inf") else max(0, int(r0 - hi) // block)
        last = blocks - 1 if lo == float("-inf") else min(blocks - 1, int(r1 - lo) // block)
        out.append((first * block, min(n, (last + 1) * block) - 1))
    return out


def _dense(num: Tensor, indices: Tensor) -> Tensor:
    """(…, nq, nkv) bool: the blocks listed by a block mask's ``num`` (…, nq) and ``indices``
    (…, nq, nkv) (the first num of each row's indices)."""
    listed = torch.arange(indices.shape[-1], device=num.device) < num[..., None]
    dense = torch.zeros(indices.shape, dtype=torch.bool, device=num.device)
    return dense.scatter_(-1, indices.long(), listed)


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """A block mask's (num, indices) from a dense (…, nq, nkv) bool of blocks: each row's
    listed blocks first, in order."""
    num = dense.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
    return num, indices.to(torch.int32)


def _base_blocks(base: BlockMask) -> tuple[Tensor, Tensor]:
    """A cached block mask's blocks, dense (1, 1, nq, nkv) bool: those it computes (full or
    partial), and those it computes whole."""
    computed = _dense(base.kv_num_blocks, base.kv_indices)
    full = torch.zeros_like(computed)
    if base.full_kv_num_blocks is not None:
        full = _dense(base.full_kv_num_blocks, base.full_kv_indices)
    return computed | full, full


def _document_ranges(rows: tuple[tuple[int, ...], ...], size: int) -> tuple[Tensor, Tensor]:
    """Each row's blocks of ``size`` positions as the (first, last) document they hold,
    (b, blocks) each: documents are numbered in order along a row, so two blocks hold a
    common document exactly when these ranges meet."""
    t = sum(rows[0])
    blocks = -(-t // size)
    ids = Packing(rows).documents("cpu")
    ids = torch.cat([ids, ids[:, -1:].expand(-1, blocks * size - t)], dim=1)  # the last's
    ids = ids.view(len(rows), blocks, size)
    return ids[..., 0], ids[..., -1]


def document_block_mask(
    rows: tuple[tuple[int, ...], ...], pattern: Pattern, device: torch.device
) -> BlockMask:
    """The block mask of packed rows (each row's document lengths, end to end): the
    pattern's band kept inside each document. Derived from the cached block mask at the
    rows' width, block by block, as :func:`padded_block_mask` is: a block is computed when
    the band computes it and its query and key blocks hold a common document, and whole when
    the band's is whole and both blocks lie in one and the same document. Its ``mask_mod``
    is the band's and the same document; one batch entry per row."""
    t = sum(rows[0])
    prepare(t, pattern, device)
    base = _block_masks[(t, *pattern.key(), str(indexed_device(device)))]
    size = base.BLOCK_SIZE[1]
    with _shareable():
        first, last = (r.to(device) for r in _document_ranges(rows, size))
        meet = (first[:, :, None] <= last[:, None, :]) & (first[:, None, :] <= last[:, :, None])
        one = first == last
        alone = one[:, :, None] & one[:, None, :] & (first[:, :, None] == first[:, None, :])
        computed, full = _base_blocks(base)
        computed = computed & meet[:, None]  # (b, 1, nq, nkv)
        full = full & alone[:, None]
        doc = Packing(rows).documents("cpu").to(device)
    allowed = mask_mod(pattern, device)

    def inside(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return allowed(b, h, q_idx, kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    return BlockMask.from_kv_blocks(
        *_ordered(computed & ~full),
        *_ordered(full),
        BLOCK_SIZE=base.BLOCK_SIZE,
        mask_mod=inside,
        seq_lengths=(t, t),
    )


def document_pairs(rows: tuple[tuple[int, ...], ...], pattern: Pattern, block: int = BLOCK) -> int:
    """Query-key pairs in the blocks :func:`document_block_mask` computes, summed over the
    rows, with no mask built (the FLOP count's, arithmetic): for each query block, the keys
    of every key block in the band's :func:`computed_blocks` that holds a document of the
    query block's."""
    t = sum(rows[0])
    band = computed_blocks(t, pattern, block)
    extent = [min(t, (s + 1) * block) - s * block for s in range(len(band))]
    pairs = 0
    for row in rows:
        first, last = (r[0].tolist() for r in _document_ranges((row,), block))
        for q, (lo, hi) in enumerate(band):
            keys = sum(
                extent[s]
                for s in range(lo // block, hi // block + 1)
                if first[q] <= last[s] and first[s] <= last[q]
            )
            pairs += extent[q] * keys
    return pairs


def padded_block_mask(base: BlockMask, allowed: MaskMod, key_padding_mask: Tensor) -> BlockMask:
    """The block mask of ``base``'s pattern with the padded keys (``key_padding_mask``
    (b, n), True = padded) hidden too, one batch entry per sequence: its ``mask_mod`` is
    ``allowed`` and not padded, and its blocks are derived from ``base``'s without evaluating
    the mask over all n × n pairs (``create_block_mask`` would, for every call): a block is
    computed when ``base`` computes it and one of its keys is real, and full when ``base``'s is
    full and none of its keys is padded."""
    b, n = key_padding_mask.shape
    size = base.BLOCK_SIZE[1]
    blocks = -(-n // size)
    padded = F.pad(key_padding_mask, (0, blocks * size - n), value=True).view(b, blocks, size)
    real = F.pad(~key_padding_mask, (0, blocks * size - n), value=False).view(b, blocks, size)
    some_real, all_real = real.any(dim=-1), ~padded.any(dim=-1)  # (b, nkv)
    computed, full = _base_blocks(base)  # (1, 1, nq, nkv)
    computed = computed & some_real[:, None, None, :]  # (b, 1, nq, nkv)
    full = full & all_real[:, None, None, :]
    pad = key_padding_mask

    def unpadded(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return allowed(b, h, q_idx, kv_idx) & ~pad[b, kv_idx]

    return BlockMask.from_kv_blocks(
        *_ordered(computed & ~full),
        *_ordered(full),
        BLOCK_SIZE=base.BLOCK_SIZE,
        mask_mod=unpadded,
        seq_lengths=(n, n),
    )
