"""Local (sliding-window) attention, our own blocked implementation.

Each query attends only to the keys within a window around it, the banded attention of
Longformer (Beltagy et al., 2020, §3.1 "Sliding Window": "each token attends to ½w tokens on
each side") and of the local attention in Image Transformer (Parmar et al., 2018) and Sparse
Transformer's band (Child et al., 2019). With a window of w keys, per head:

    out_i = Σ_{j ∈ W(i)} softmax_j(q_i·k_j / √d_k) v_j,
    W(i) = {j : |i − j| ≤ w/2}        (non-causal: w/2 on each side and i itself, w + 1 keys)
    W(i) = {j : i − w < j ≤ i}        (causal: the w keys up to and including i)

so a layer costs O(n·w) time and memory instead of O(n²). The non-causal band is Longformer's
exactly (its ``attention_window`` is w and must be even, as ours), so ``window`` is refused
odd there rather than rounded silently.

How it is computed (never an n × n matrix):

* The sequence is cut into blocks of B = max(⌈w/2⌉, 32) positions (B = n if that is
  shorter), padded to a whole number of blocks. Query block t attends to the key blocks
  t − c_b … t + c_f, just enough to cover its queries' windows: c_b = c_f = 1 for the
  non-causal band, c_b = 2, c_f = 0 causal: 3·B = 1.5·w keys computed for each query
  against the band's w + 1 (or w), where blocks of w would compute 3·w (or 2·w). None when
  one block holds the whole sequence. The floor of 32 keeps tiny windows from degenerating
  into thousands of one-row matmuls (w/4 blocks, 1.25·w keys, timed no faster at n = 4096).
* The neighbouring key blocks are overlapping *views* (``unfold``) of one zero-padded copy
  of K (and of V), so they are never copied three times.
* Inside each block the exact band, the sequence's ends and the padding mask are one additive
  0 / −inf mask, and softmax·V runs in PyTorch's fused ``scaled_dot_product_attention`` (on a
  CPU its flash kernel, which keeps no per-block score matrix: at n = 4096 the whole layer
  ran about 1.4× faster than with an eager softmax, on 2 cores). A query whose window holds
  no real key gets 0, as sdpa and vanilla give.

So the result equals vanilla attention under the same band mask (and padding mask) to float
rounding; when the window covers the sequence (causal w ≥ n, non-causal w/2 ≥ n − 1) it is
causal vanilla attention, or vanilla.

Padded keys and values are zeroed before use, so even a non-finite value at a padded position
cannot reach a real output. One caveat of the flattened layout (the batch's sequences lie end
to end, so that the block windows are plain strided views): the first and last blocks of a
sequence also *read* the masked-out edge of its batch neighbour; a finite key there gets
weight 0 exactly, but a NaN or inf at a *real* position of one sequence could reach the
first or last block of the next.

Its incremental form (causal only) keeps the last w keys and values in a ring buffer
(:class:`Ring`), never more: a decode step writes its token over the oldest and attends over
the w slots; a prompt chunk after earlier tokens runs the same blocked band over the ring's
keys followed by the chunk's.

Grouped-query heads (``kv_heads`` < ``n_heads``, as gpt-oss's sliding layers: 64 query heads
over 8 key/value heads) keep the window's keys and values of ``kv_heads`` heads only, in the
forward's blocks and in the ring. Each group's query heads are stacked as
:func:`attnbench.attention.cache.grouped` stacks them for vanilla and sdpa, so one matmul (or
kernel call) per key/value head serves its group and the windows of K and V are never
repeated. What is repeated instead is the band mask, the same for every head: over a group's
g = n_heads / kv_heads stacked heads, g·B × W·B a block where full heads broadcast one B × W·B
(the queries are copied once too, into the stacked order).

``gate`` is the output gate and ``sinks`` the attention sinks of
:mod:`attnbench.attention.sinks_gate`. With sinks each block runs an eager softmax with the
sink in its rows' denominators (vanilla's :func:`~attnbench.attention.vanilla.softmax_attend`
over the same blocks and band), not sdpa's kernel, which takes no sink: so the blocks' scores
are materialised (b·nb·h·B·W·B of them, still O(n·w)) and no QKᵀ is recomputed backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.attention.cache import Ring, flag_bytes, grouped, kv_elements
from attnbench.attention.packing import Packing
from attnbench.attention.sinks_gate import SinksGateConfig
from attnbench.attention.vanilla import softmax_attend
from attnbench.validators import check_bool, check_int

MIN_BLOCK = 32  # below this, per-block overhead outweighs the masked work a larger block adds


@dataclass
class LocalConfig(SinksGateConfig):
    window: int = 256  # w: the same budget as Linformer's k and Performer's nb_features
    causal: bool = False

    def __post_init__(self) -> None:
        check_int("window", self.window)
        check_bool("causal", self.causal)
        super().__post_init__()
        if not self.causal and self.window % 2:
            raise ValueError(
                f"window: must be even when causal=false (w/2 keys on each side of a query, "
                f"as Longformer's attention_window), got {self.window}"
            )


def layout(window: int, causal: bool, n: int) -> tuple[int, int, int, int]:
    """(block B, blocks nb, key blocks looked back c_b, looked forward c_f) at length n."""
    block = min(n, max(-(-window // 2), MIN_BLOCK))
    blocks = -(-n // block)
    back, forward = (window - 1, 0) if causal else (window // 2, window // 2)
    return (
        block,
        blocks,
        min(-(-back // block), blocks - 1),
        min(-(-forward // block), blocks - 1),
    )


@declare(
    "local",
    packs="one pass: the band cut at each document's ends (a mask in its blocks)",
    config=LocalConfig,
    causal=True,
    budget="window",
    cannot_decode=None,
    gqa=True,
    head_dim=True,
    summary="sliding-window band |i−j| ≤ w/2 (causal: the w keys up to i), blocked, O(n·w)",
)
class LocalAttention(MultiHeadAttention):
    packs_in_one_pass = True  # the band over the row, cut at each document's ends

    def attention_flops(self, b: int, n: int) -> int:
        """QKᵀ and P·V over whole blocks: each of the nb·B padded queries meets
        (1 + c_b + c_f)·B keys, 2 matmuls of 2·d FLOPs a pair. The masked-out parts of each
        block are computed too, so they are counted: this is what runs, not the band's
        ideal 4·n·w·d."""
        block, blocks, back, forward = layout(self.cfg.window, self.cfg.causal, n)
        return 4 * b * blocks * block * (1 + back + forward) * block * self.width

    def packed_attention_flops(self, packing: Packing) -> int:
        """One blocked pass over each row of T: its blocks, whatever the documents."""
        return self.attention_flops(packing.batch, packing.width)

    def packed_flops_backward(self, packing: Packing) -> int:
        """One blocked pass over each row of T, backward as forward: the row's own count."""
        return self.flops_backward(packing.batch, packing.width)

    def recomputed_flops(self, b: int, n: int) -> int:
        """The flash kernel's backward recomputes the blocked QKᵀ; the eager softmax that
        sinks run keeps its weights and does not."""
        return 0 if self.sinks is not None else self.attention_flops(b, n) // 2

    def band_mask(
        self,
        n: int,
        key_padding_mask: Tensor | None,
        like: Tensor,
        documents: Tensor | None = None,
    ) -> Tensor:
        """Additive mask (b·nb, 1, B, W·B) in ``like``'s dtype: 0 where query i may see key j,
        −inf where not (:meth:`blocked_band`'s True)."""
        blocked = self.blocked_band(n, key_padding_mask, like.device, documents)
        bias = torch.zeros(blocked.shape, dtype=like.dtype, device=like.device)
        return bias.masked_fill_(blocked, float("-inf")).unsqueeze(1)

    def blocked_band(
        self,
        n: int,
        key_padding_mask: Tensor | None,
        device: torch.device,
        documents: Tensor | None = None,
    ) -> Tensor:
        """Bool (b·nb, B, W·B), True where query i may not see key j (outside the band,
        outside 0..n−1, padding, another packed document: ``documents`` (b, n), each
        position's document). Without a padding mask or documents it is (nb, B, W·B), the
        same for every sequence."""
        block, blocks, back, forward = layout(self.cfg.window, self.cfg.causal, n)
        width, w = (1 + back + forward) * block, self.cfg.window
        # Key j is in query i's window when i − lo ≤ j ≤ i + hi. Offsets are the same in
        # every block: query a of a block against key c of its window is j − i = c − a − back·B
        lo, hi = (w - 1, 0) if self.cfg.causal else (w // 2, w // 2)
        band = torch.ones(block, width, dtype=torch.bool, device=device)
        band = band.triu(back * block - lo).tril(back * block + hi)  # (B, W·B)
        j = (torch.arange(blocks, device=device)[:, None] - back) * block + torch.arange(
            width, device=device
        )  # (nb, W·B): each window's key positions
        outside = (j < 0) | (j >= n)
        if key_padding_mask is not None:
            b = key_padding_mask.shape[0]
            padded = F.pad(key_padding_mask, (0, blocks * block - n), value=True).view(-1)
            padded = F.pad(padded, (back * block, forward * block), value=True)
            outside = outside | padded.unfold(0, width, block).view(b, blocks, width)
        blocked = ~band | outside.view(-1, 1, width)  # (b·nb or nb, B, W·B)
        if documents is not None:  # the window cut at each document's ends
            b = documents.shape[0]
            ids = F.pad(documents, (0, blocks * block - n), value=-1)  # (b, nb·B)
            keys = F.pad(ids.view(-1), (back * block, forward * block), value=-1)
            keys = keys.unfold(0, width, block).view(b * blocks, 1, width)
            other = ids.view(b, blocks, block, 1) != keys.view(b, blocks, 1, width)
            blocked = (blocked.view(-1, blocks, block, width) | other).flatten(0, 1)
        return blocked

    def _windows(self, t: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """(b, n, kv_heads·dh) -> (b·nb, kv_heads, W·B, dh): each query block's keys (or
        values), overlapping views of one copy zero-padded before the first block and after
        the last."""
        b, n, d = t.shape
        block, blocks, back, forward = layout(self.cfg.window, self.cfg.causal, n)
        width, tail = (1 + back + forward) * block, blocks * block - n
        if key_padding_mask is not None:  # zeroed: a non-finite padded value cannot leak
            t = t.masked_fill(key_padding_mask[:, :, None], 0.0)
        if b == 1:  # one copy: the tail and the ends padded at once
            t = F.pad(t.view(n, d), (0, 0, back * block, tail + forward * block))
        else:
            t = F.pad(t, (0, 0, 0, tail)) if tail else t
            t = F.pad(t.reshape(b * blocks * block, d), (0, 0, back * block, forward * block))
        t = t.unfold(0, width, block)  # (b·nb, d, W·B), a view
        return t.view(b * blocks, self.kv_heads, self.head_dim, width).transpose(2, 3)

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        return self._banded(self.q_proj(x), self.k_proj(x), self.v_proj(x), key_padding_mask)

    def slots(self, n: int) -> int:
        """Keys and values a sequence keeps at length n: the window, min(w, n)."""
        return min(self.cfg.window, n)

    def new_state(self, b: int, capacity: int, dtype: torch.dtype, device: torch.device) -> Ring:
        return Ring.empty(b, self.kv_heads, self.slots(capacity), self.head_dim, dtype, device)

    def context_elements(self, n: int) -> int:
        """The window's min(w, n) keys and values of every key/value head (``kv_heads``),
        2·kv_heads·d_h·min(w, n), causal or not: the ring a decode step reads. The
        non-causal band reads one key more, w/2 on each side and the query's own (w + 1);
        counted as w, the budget, so that both forms of one w sit at one memory (one key of
        w + 1 is under 2 % at w ≥ 64)."""
        return kv_elements(self.slots(n), self.kv_heads, self.head_dim)

    def state_bytes(self, n: int, itemsize: int) -> int:
        """The ring: its keys and values (:meth:`context_elements`), and a padding flag each."""
        return self.context_bytes(n, itemsize) + flag_bytes(self.slots(n))

    def step_attention_flops(self, b: int, n: int) -> int:
        """One query against the ring's min(w, n) written slots (whatever its capacity),
        counted per query head (grouped heads alike)."""
        return 4 * b * min(self.cfg.window, n) * self.width

    def extend_attend(self, x: Tensor, state: Ring, key_padding_mask: Tensor | None) -> Tensor:
        b, c, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (b, c, d)
        if key_padding_mask is not None:  # zeroed: a non-finite padded value cannot leak
            pad = key_padding_mask[:, :, None]
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        if c == 1 and state.length:  # a decode step: the token over the oldest, then the ring
            state.write(self.split_heads(k), self.split_heads(v), key_padding_mask)
            qh = grouped(self.split_heads(q), self.kv_heads)  # (b, kv_heads, g, dh)
            # until the ring is full, position p is in slot p: the written slots are the
            # first min(n, r): the min(w, n) keys step_flops counts, not unwritten ones masked
            seen = min(state.length, state.size)
            allowed = None
            if state.has_padding:
                allowed = ~state.padded[:, None, None, :seen]  # (b, 1, 1, seen)
            keys, values = state.k[:, :, :seen].to(q.dtype), state.v[:, :, :seen].to(q.dtype)
            if self.sinks is not None:  # no kernel takes a sink: the eager softmax with it
                blocked = None if allowed is None else ~allowed
                padded = state.has_padding
                out = softmax_attend(qh, keys, values, blocked, self.scale, padded, self.sinks)
                return self._merged(out, 1)
            return self._merged(F.scaled_dot_product_attention(qh, keys, values, allowed), 1)
        if state.length == 0:  # the first chunk: the band over it alone
            out = self._banded(q, k, v, key_padding_mask)
        else:  # the band over the ring's keys, then the chunk's; the ring's queries dropped
            r = state.size
            ring_k, ring_v, ring_pad = state.ordered()  # (b, h, r, dh), (b, r)
            mask = key_padding_mask
            if mask is None:
                mask = torch.zeros(b, c, dtype=torch.bool, device=x.device)
            out = self._banded(
                torch.cat([q.new_zeros(b, r, self.width), q], dim=1),
                torch.cat([ring_k.to(k.dtype).transpose(1, 2).flatten(2), k], dim=1),
                torch.cat([ring_v.to(v.dtype).transpose(1, 2).flatten(2), v], dim=1),
                torch.cat([ring_pad, mask], dim=1),
            )[:, r:]
        state.write(self.split_heads(k), self.split_heads(v), key_padding_mask)
        return out

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """One pass over the packed rows: the band, cut at each document's ends."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self._banded(q, k, v, None, packing.documents(x.device))

    def _banded(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        documents: Tensor | None = None,
    ) -> Tensor:
        """The blocked band over projected q (b, n, width) and k, v (b, n, kv_heads·dh) ->
        (b, n, width), kept inside each packed document where ``documents`` (b, n) says
        which each position is in."""
        b, n, _ = q.shape
        block, blocks, _, _ = layout(self.cfg.window, self.cfg.causal, n)
        tail = blocks * block - n
        g = self.n_heads // self.kv_heads
        q = F.pad(q, (0, 0, 0, tail)) if tail else q  # (b, nb·B, width)
        q = q.view(b * blocks, block, self.n_heads, self.head_dim).transpose(1, 2)  # a view
        q = grouped(q, self.kv_heads)  # (b·nb, kv_heads, g·B, dh): a copy only when g > 1
        k = self._windows(k, key_padding_mask)  # (b·nb, kv_heads, W·B, dh)
        v = self._windows(v, key_padding_mask)
        if self.sinks is not None:  # no kernel takes a sink: the eager softmax with it
            blocked = self.blocked_band(n, key_padding_mask, q.device, documents).unsqueeze(1)
            if blocked.shape[0] != b * blocks:
                blocked = blocked.repeat(b, 1, 1, 1)
            # softmax_attend repeats the band over the g stacked heads itself
            out = softmax_attend(q, k, v, blocked, self.scale, True, self.sinks)
        else:
            bias = self.band_mask(n, key_padding_mask, q, documents)  # (b·nb | nb, 1, B, W·B)
            # the same band for every sequence without a padding mask, and for every one of
            # a group's g stacked heads (grouped's row order: head-major, then position)
            if bias.shape[0] != b * blocks or g > 1:
                bias = bias.repeat(b * blocks // bias.shape[0], 1, g, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        merged = self._merged(out, block)  # (b·nb, B, width)
        merged = merged.view(b, blocks * block, self.width)
        return merged[:, :n] if tail else merged

    def _merged(self, out: Tensor, rows: int) -> Tensor:
        """Grouped output (m, kv_heads, g·rows, dh), laid out as :func:`grouped` stacks the
        queries, into (m, rows, width) by one explicit copy. The CPU kernel lays its output
        out as (m, g·rows, kv_heads, dh), where a reshape would be a view (g = 1) or a copy
        (g > 1); sdpa on meta (the memory model) returns it contiguous, where the same
        reshape is a copy (g = 1) or a view. Copying on both keeps them equal (the eager
        softmax's output, with sinks, is contiguous on both: one copy too)."""
        m, g = out.shape[0], self.n_heads // self.kv_heads
        merged = out.new_empty(m, rows, self.width)
        heads = merged.view(m, rows, self.kv_heads, g, self.head_dim)  # head = kv·g + i
        heads.copy_(out.unflatten(2, (g, rows)).permute(0, 3, 1, 2, 4))
        return merged
