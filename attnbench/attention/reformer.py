"""Reformer: LSH attention (Kitaev, Kaiser & Levskaya, 2020), via reformer-pytorch.

Full attention, eq. (1), is softmax(QKᵀ/√d)V. Reformer lets query i attend only to a set
P_i of keys that an angular locality-sensitive hash puts in its bucket, eq. (4):
P_i = {j : h(q_i) = h(k_j)}, with h(x) = argmax([xR; −xR]) for a random d × b/2 matrix R
(section 2, b buckets). Queries and keys are one projection (shared QK, k_j = q_j/‖q_j‖),
and a query never attends to itself unless nothing else is there (eq. 8's 10⁵ penalty).
Items are sorted by bucket, then position, and cut into chunks of ``bucket_size`` items; a
chunk attends to itself and the chunk before it, eq. (5). ``n_hashes`` rounds with fresh
rotations each give an output o_i^(r) and a log-normaliser z(i, P_i^(r)); they are combined
as o_i = Σ_r exp(z(i, P_i^(r)) − z(i, P_i)) o_i^(r), eq. (7). Per round a query scores
2·``bucket_size`` keys, so time and memory are O(n_hashes · n · bucket_size).

The budget the sweeps map ``k`` onto is ``bucket_size``: it is the number of keys a query sees
per round (2·bucket_size), Linformer's k and Performer's m in spirit, and the sweeps' k values
(64 … 2048) are sensible bucket sizes; ``n_hashes`` is a small count of rounds (1 … 8) that
multiplies the cost. Defaults are the library's, bucket_size 64 and n_hashes 8 (its comment:
the paper needed buckets of at least 64 with 8 rounds).

We take the library's conventions (sort key bucket·n + t, key normalisation, look-one-back
chunks wrapping around across rounds, ``TOKEN_SELF_ATTN_VALUE``, duplicates not discounted as
its default ``allow_duplicate_attention=True``) and its helper ``max_neg_value``, but assemble
the forward here rather than call ``LSHAttention.forward``, because:

* it draws new rotations on every forward: outputs then differ from call to call (an fp16
  copy of a model could not be compared with its fp32 original). We draw R once, a buffer
  sized for ``max_seq_len`` whose first b/2 columns serve any shorter n (a prefix of iid
  Gaussian columns is itself such a matrix); :meth:`ReformerAttention.redraw_rotations`
  draws afresh. Inputs longer than ``max_seq_len`` raise;
* it hashes padded positions by their values, so padding moves the chunk boundaries of real
  tokens and its values reach real outputs. We put padded positions in a bucket of their own
  after the real ones, and zero their q/k and v;
* its ``causal=True`` masks later keys but is not causal: a future token's bucket moves the
  chunk boundaries, so which past keys a query sees depends on the future (measured: past
  outputs move by 0.5 when only later tokens change). Under ``causal`` a query attends only to
  keys of its own bucket and round among the ``bucket_size`` items sorted just before it, that
  is its bucket's latest ``bucket_size`` earlier tokens, which depend on no later token;
* the sequence must be a multiple of 2·bucket_size: we pad it internally (masked as padding),
  so the number of buckets depends on the padded length. Padding is therefore not the
  sequence cut short (a different n hashes into other buckets); ``info().limits`` says so.

Shared QK: ``q_proj`` is the one query/key projection and ``k_proj`` is removed, so a layer
has three d × d projections, not four: fewer parameters and FLOPs than the other mechanisms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from reformer_pytorch.reformer_pytorch import TOKEN_SELF_ATTN_VALUE, max_neg_value
from torch import Tensor

from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.validators import check_bool, check_int


@dataclass
class ReformerConfig:
    bucket_size: int = 64
    n_hashes: int = 8
    causal: bool = False

    def __post_init__(self) -> None:
        check_int("bucket_size", self.bucket_size)
        check_int("n_hashes", self.n_hashes)
        check_bool("causal", self.causal)


def look_one_back(t: Tensor) -> Tensor:
    """(B, C, m, ...) -> (B, C, 2m, ...): each chunk followed by the one before it (chunk 0
    by the last one), as the library's ``look_one_back``, written once rather than through
    two concatenations."""
    m = t.shape[2]
    out = t.new_empty(t.shape[0], t.shape[1], 2 * m, *t.shape[3:])
    out[:, :, :m] = t
    out[:, 1:, m:] = t[:, :-1]
    out[:, :1, m:] = t[:, -1:]
    return out


def rows(t: Tensor, index: Tensor) -> Tensor:
    """t (B, M, e), index (B, K) in [0, M) -> (B, K, e): whole rows, which index_select copies
    several times faster than a ``gather`` with the index expanded over e."""
    B, M, e = t.shape
    flat = index + torch.arange(B, device=t.device)[:, None] * M
    return t.reshape(B * M, e).index_select(0, flat.view(-1)).view(B, -1, e)


@declare(
    "reformer",
    config=ReformerConfig,
    causal=True,
    padding_mask=True,
    budget="bucket_size",
    cannot_decode=(
        "has no honest incremental form: keys are sorted by LSH bucket and cut into fixed-size "
        "chunks over the whole sequence, so every new key moves the chunk boundaries of earlier "
        "queries; a step would re-sort and rerun the sequence"
    ),
    summary="LSH attention, O(n·bucket_size·n_hashes) (reformer-pytorch); shared QK",
    cannot_pack=(
        "keys are sorted by LSH bucket over the whole row and cut into fixed-size chunks, so "
        "a chunk mixes documents and where it is cut depends on every document in the row"
    ),
    limits=(
        "shared QK (q_proj serves as key projection, no k_proj: 3 of 4 d×d projections, fewer "
        "parameters and FLOPs); padding is not the sequence cut short (buckets depend on n)"
    ),
)
class ReformerAttention(MultiHeadAttention):
    def __init__(
        self, *, d_model: int, n_heads: int, max_seq_len: int, cfg: ReformerConfig
    ) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg)
        del self.k_proj  # shared QK: an unused projection would be a parameter with no gradient
        half = self.n_buckets(max_seq_len) // 2
        self.register_buffer("rotations", torch.randn(self.head_dim, cfg.n_hashes, half))

    def padded_length(self, n: int) -> int:
        """n rounded up to a multiple of 2·bucket_size (an even number of buckets)."""
        step = 2 * self.cfg.bucket_size
        return -(-n // step) * step

    def n_buckets(self, n: int) -> int:
        return self.padded_length(n) // self.cfg.bucket_size

    def context_elements(self, n: int) -> int:
        """All n keys and values, 2·n·d: LSH picks which keys a query meets only after hashing
        the whole sequence, so nothing is compressed (the keys are the shared-QK projection,
        normalised; the padding to a multiple of 2·bucket_size holds no context)."""
        return 2 * n * self.d_model

    @torch.no_grad()
    def redraw_rotations(self) -> None:
        """Draw a fresh R (the library does so on every forward)."""
        self.rotations.normal_()

    def flops(self, b: int, n: int) -> int:
        """Three d × d projections (no k_proj), plus :meth:`attention_flops`."""
        return 3 * 2 * b * n * self.d_model**2 + self.attention_flops(b, n)

    def attention_flops(self, b: int, n: int) -> int:
        """At the padded length N with b' = N/bucket_size buckets and r rounds, c = bucket_size:
        hashing x R, 2·N·d·r·b'/2; per round and chunk QKᵀ and P V over 2c keys, 4·N·c·d each."""
        pad, r, c = self.padded_length(n), self.cfg.n_hashes, self.cfg.bucket_size
        return b * self.d_model * pad * r * (self.n_buckets(n) + 8 * c)

    def frozen_flops(self, b: int, n: int) -> int:
        """Hashing runs on detached q/k through argmax: its backward costs nothing, so both of
        its would-be gradient matmuls (twice its forward) come off."""
        pad, r = self.padded_length(n), self.cfg.n_hashes
        return 2 * b * self.d_model * pad * r * self.n_buckets(n)

    def hash(self, qk: Tensor, n_buckets: int) -> Tensor:
        """Bucket of each position in each round, (B, n_hashes, N) in [0, n_buckets)."""
        bh, pad, dh = qk.shape
        r = self.cfg.n_hashes
        rot = self.rotations[:, :, : n_buckets // 2].reshape(dh, -1).to(qk.dtype)
        rotated = (qk @ rot).view(bh, pad, r, n_buckets // 2)
        # argmax([xR; −xR]) without building it: the max of xR, unless the min is larger in
        # magnitude (ties go to xR, the first half, as argmax's first occurrence)
        top, up = rotated.max(dim=-1)
        low, down = rotated.min(dim=-1)
        buckets = torch.where(top >= -low, up, down + n_buckets // 2)  # (B, N, r)
        return buckets.transpose(1, 2).contiguous()  # rows to sort along are contiguous

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        b, n, _ = x.shape
        if n > self.max_seq_len:
            raise ValueError(
                f"n: reformer was built for max_seq_len={self.max_seq_len} (its rotations "
                f"have one column per bucket pair); got an input of length {n}"
            )
        c, r, h, dh = self.cfg.bucket_size, self.cfg.n_hashes, self.n_heads, self.head_dim
        pad, nb = self.padded_length(n), self.n_buckets(n)
        qk = self.split_heads(self.q_proj(x))  # (b, h, n, dh)
        v = self.split_heads(self.v_proj(x))
        padded = None
        if key_padding_mask is not None or pad > n:
            mask = key_padding_mask
            if mask is None:
                mask = torch.zeros(b, n, dtype=torch.bool, device=x.device)
            padded = F.pad(mask, (0, pad - n), value=True)  # (b, N)
            padded = padded[:, None].expand(b, h, pad).reshape(b * h, 1, pad)
        if key_padding_mask is not None:  # no value at a padded position reaches anything
            qk = qk.masked_fill(key_padding_mask[:, None, :, None], 0.0)
            v = v.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        qk = F.pad(qk, (0, 0, 0, pad - n)).reshape(b * h, pad, dh)  # (B, N, dh), B = b·h
        v = F.pad(v, (0, 0, 0, pad - n)).reshape(b * h, pad, dh)

        # sort by (round, bucket, position); padded positions in bucket nb, after the real ones
        buckets = self.hash(qk.detach(), nb)  # (B, r, N)
        if padded is not None:
            buckets = buckets.masked_fill(padded, nb)
        rounds = torch.arange(r, device=x.device)[:, None] * (nb + 1)
        key = (buckets + rounds) * pad + torch.arange(pad, device=x.device)
        skey, st = key.sort(dim=-1)  # st: the position at each sorted slot, (B, r, N)
        sbucket = (skey // pad).view(b * h, -1, c)  # (B, C, c), C = r·nb chunks
        st = st.view(b * h, r * pad)
        bq, bv = rows(qk, st).view(b * h, -1, c, dh), rows(v, st).view(b * h, -1, c, dh)
        # the library's eps 1e-12 is 0 in fp16, where a zero (padded) vector would turn NaN
        eps = max(1e-12, torch.finfo(bq.dtype).tiny)
        bk = look_one_back(F.normalize(bq, p=2, dim=-1, eps=eps))  # (B, C, 2c, dh)
        bv = look_one_back(bv)

        dots = (bq * dh**-0.5) @ bk.transpose(-1, -2)  # (B, C, c, 2c)
        neg = max_neg_value(dots)
        if self.cfg.causal:  # own bucket and round, among the c items sorted just before
            dots.masked_fill_(sbucket[..., :, None] != look_one_back(sbucket)[..., None, :], neg)
            o, j = torch.arange(c, device=x.device)[:, None], torch.arange(c, device=x.device)
            dots.masked_fill_(torch.cat([j > o, j < o], dim=1), neg)  # (c, 2c): the window
        elif padded is not None:
            dots.masked_fill_(look_one_back(sbucket % (nb + 1) == nb)[..., None, :], neg)
        # the query itself: the diagonal of its own chunk; and, as the library compares
        # positions, its copy from the previous round where a round's first chunk looks back
        dots[..., :c].diagonal(dim1=-2, dim2=-1).fill_(TOKEN_SELF_ATTN_VALUE)
        if not self.cfg.causal:  # (under causal the bucket mask keeps other rounds out)
            bt = st.view(b * h, -1, c)  # (B, C, c) positions
            first, before = bt[:, ::nb], bt[:, nb - 1 :: nb].roll(1, dims=1)  # (B, r, c)
            same = first[..., :, None] == before[..., None, :]
            dots[:, ::nb, :, c:].masked_fill_(same, TOKEN_SELF_ATTN_VALUE)

        # softmax and its log-normaliser z(i, P_i^(r)) by hand: torch.logsumexp makes a hidden
        # (B, C, c, 2c) temporary on the CPU that the memory model cannot see; in place when
        # no gradient is wanted. The max needs none: z's gradient through it cancels.
        # Normalised after P·V, on c × dh outputs rather than c × 2c probabilities.
        top = dots.amax(dim=-1, keepdim=True).detach()  # (B, C, c, 1)
        e = torch.exp(dots - top) if dots.requires_grad else dots.sub_(top).exp_()
        total = e.sum(dim=-1, keepdim=True)
        lse = (top + total.log()).view(b * h, r * pad)
        so = ((e @ bv) / total).view(b * h, r * pad, dh)  # per-round outputs, sorted order

        # unsort the first n positions of every round and combine the rounds, eq. (7)
        slot = torch.arange(pad, device=x.device).expand(b * h, r, pad)
        undo = torch.empty_like(slot).scatter_(-1, st.view(b * h, r, pad), slot)[..., :n]
        undo = (undo + torch.arange(r, device=x.device)[:, None] * pad).view(b * h, r * n)
        out = rows(so, undo).view(b * h, r, n, dh)
        weights = lse.gather(1, undo).view(b * h, r, n).softmax(dim=1)
        out = (out * weights[..., None]).sum(dim=1)  # (B, n, dh)
        return self.merge_heads(out.view(b, h, n, dh))
