"""A packed batch: documents laid end to end in rows, attention kept inside each document.

A row of T positions holds whole documents one after another, a document never spans two
rows, and every row is exactly T long (a filler document, whose outputs nobody reads, can
stand where a packer leaves a row short: it is just another document). What a mechanism needs
to keep documents apart is derived here once per forward and shared by every layer:

* ``bounds``: each document's (start, end) as Python ints, for a loop over documents (no
  device synchronisation: they come from the lengths, never from a tensor);
* :meth:`Packing.starts`: True at each document's first position, where a recurrence starts
  from a zero state again;
* :meth:`Packing.offsets`: each position's distance from its document's first position, so a
  short convolution can stop at the document's start;
* :meth:`Packing.documents`: each position's document, so a mask can keep pairs of one.

The convention is FlashAttention's ``cu_seqlens`` (:func:`attnbench.lengths.cu_seqlens`) per
row; a mechanism that packs natively reads the tensors, the per-document fallback
(:meth:`attnbench.attention.base.MultiHeadAttention.attend_packed`) the bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor

from attnbench.validators import check_int

# how a mechanism packs that does not say: MultiHeadAttention.attend_packed's loop
PER_DOCUMENT = "document by document: each document's slice of the row through the layer alone"


@dataclass(frozen=True)
class Packing:
    """Each row's document lengths, in order; every row sums to the same width T."""

    rows: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]]) -> Packing:
        """Validated: at least one row, each of documents of length >= 1, every row the same
        total (the packed input is a (b, T, d) tensor)."""
        if not rows or any(not row for row in rows):
            raise ValueError(f"packing: must be rows of at least one document each, got {rows!r}")
        checked = tuple(
            tuple(check_int(f"packing[{r}][{i}]", n) for i, n in enumerate(row))
            for r, row in enumerate(rows)
        )
        widths = {sum(row) for row in checked}
        if len(widths) != 1:
            raise ValueError(f"packing: every row must hold the same tokens, got {sorted(widths)}")
        return cls(checked)

    @property
    def width(self) -> int:
        """T, the positions of every row."""
        return sum(self.rows[0])

    @property
    def batch(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every document's length, row after row."""
        return tuple(n for row in self.rows for n in row)

    def bounds(self) -> list[list[tuple[int, int]]]:
        """Each row's documents as (start, end) positions."""
        out = []
        for row in self.rows:
            ends = list(accumulate(row))
            out.append(list(zip([0, *ends[:-1]], ends, strict=True)))
        return out

    def offsets(self, device: torch.device | str) -> Tensor:
        """(b, T) int64: each position's distance from its document's first position. Rows
        of the same documents share one (expanded, not copied)."""

        def row(lengths: tuple[int, ...]) -> Tensor:
            sizes = torch.tensor(lengths, device=device)
            first = torch.tensor([0, *accumulate(lengths)][:-1], device=device)
            t = self.width
            return torch.arange(t, device=device) - first.repeat_interleave(sizes, output_size=t)

        if len(set(self.rows)) == 1:
            return row(self.rows[0]).expand(self.batch, -1)
        return torch.stack([row(lengths) for lengths in self.rows])

    def starts(self, device: torch.device | str) -> Tensor:
        """(b, T) bool: True at each document's first position."""
        return self.offsets(device) == 0

    def check(self, layer: Any, x: Tensor, key_padding_mask: Tensor | None) -> None:
        """One ``ValueError`` line where ``layer`` cannot pack (its declared ``cannot_pack``)
        or x (and a mask) do not fit these rows."""
        name, capabilities = getattr(layer, "declared", (type(layer).__name__, {}))
        if why := capabilities.get("cannot_pack"):
            raise ValueError(f"packing: {name} cannot pack: {why}")
        if key_padding_mask is not None or x.shape[:2] != (self.batch, self.width):
            got = "a key_padding_mask too" if key_padding_mask is not None else tuple(x.shape)
            raise ValueError(
                f"packing: needs x of (batch, T) = {(self.batch, self.width)} and no "
                f"key_padding_mask (a filler document stands for padding), got {got}"
            )

    def documents(self, device: torch.device | str) -> Tensor:
        """(b, T) int64: each position's document, numbered from 0 in its row (a mask keeps
        a pair of positions only where these agree)."""
        return self.starts(device).cumsum(1) - 1


def each_document(attend: Callable[[Tensor, None], Tensor], x: Tensor, packing: Packing) -> Tensor:
    """``attend`` (a layer's, before ``out_proj``) on each document's positions of x (b, T, d)
    alone, laid back in place: exact by construction for any layer whose output on a sequence
    depends on that sequence only."""
    return _documents(lambda s, e, rows: attend(x[rows, s:e], None), packing, dim=1)


def per_document(fn: Callable[..., Tensor], packing: Packing, *ts: Tensor) -> Tensor:
    """``fn`` on each document's positions of (b, h, T, ·) tensors alone, its (1, h, l, ·)
    outputs laid back in place: a core that sums over a whole sequence (non-causal linear
    attention's φ(K)ᵀV, softmax over all keys) kept inside each document."""
    return _documents(lambda s, e, rows: fn(*(t[rows, :, s:e] for t in ts)), packing, dim=2)


def _documents(run: Callable[[int, int, slice], Tensor], packing: Packing, dim: int) -> Tensor:
    """``run(start, end, rows)`` for each document, its outputs laid back along ``dim``. Rows
    of the same documents (the copies of one draw) run each document once for all of them,
    as a batch: the same outputs in a D-long loop instead of a b·D-long one."""
    bounds = packing.bounds()
    if len(set(packing.rows)) == 1:
        return torch.cat([run(s, e, slice(None)) for s, e in bounds[0]], dim=dim)
    rows = [
        torch.cat([run(s, e, slice(r, r + 1)) for s, e in row], dim=dim)
        for r, row in enumerate(bounds)
    ]
    return torch.cat(rows, dim=0)


@dataclass(frozen=True)
class Positions:
    """What a mixer's call knows of its positions beyond the inputs, (b, n) each or None:
    ``real``, True at a real token (None: no padding); ``starts``, True where a packed
    document begins and the state starts from zeros again, and ``offsets``, each position's
    distance from its document's first (None: one sequence a row); ``lengths``, the packed
    documents' lengths row after row (a kernel that takes ``cu_seqlens``)."""

    real: Tensor | None = None
    starts: Tensor | None = None
    offsets: Tensor | None = None
    lengths: tuple[int, ...] | None = None

    @classmethod
    def of(cls, mask: Tensor | None, packing: Packing | None, device: torch.device) -> Positions:
        """From a key padding mask (True = padding) or a packing (never both)."""
        if packing is None:
            return cls(real=None if mask is None else ~mask)
        offsets = packing.offsets(device)
        return cls(starts=offsets == 0, offsets=offsets, lengths=packing.lengths)
