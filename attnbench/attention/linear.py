"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), our own implementation.

Softmax attention's similarity exp(qᵀk/√d) is replaced by a kernel φ(q)ᵀφ(k) (eq. 4), so that
by associativity (eq. 5–6), per head,

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ (Σ_j φ(k_j)),      φ(x) = elu(x) + 1   (eq. 7)

costs O(n·d²) instead of O(n²·d). φ is the paper's: positive (so the normaliser is too),
with a gradient everywhere, unlike relu; q and k are not scaled by 1/√d, as in the paper's
code. Causal attention (eq. 8–10) sums over j ≤ i only: prefix sums, run in chunks by
:func:`attnbench.attention.prefix.causal_linear_attention` (shared with ``performer``), so a
forward holds O(n·d) numbers, not the (n × d × d) tensor of every prefix state.

Choices of ours where the paper is silent:

* Padded keys contribute nothing: their features are zeroed, which takes them out of both
  sums. A query that sees no real key gets 0 (as in sdpa), not 0/0.
* Sums run in fp32 for fp16/bf16 inputs: over n positions they pass fp16's range and drift in
  bf16. The output is cast back.
* No budget: the only size is d_k = d_model / n_heads, fixed by the model shape.

Its incremental form is the paper's RNN (section 3.4): S and z per head, d_k·(d_k + 1)
numbers whatever the context (:class:`attnbench.attention.prefix.RecurrentState`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.attention import gated_scan
from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.attention.packing import Packing, per_document
from attnbench.attention.prefix import (
    DEFAULT_CHUNK,
    RecurrentState,
    causal_linear_attention,
    causal_linear_flops,
    extend,
    linear_attention,
    linear_flops,
    packed_causal_linear_attention,
    recurrent_state_elements,
)
from attnbench.validators import check_bool, check_int


@dataclass
class LinearConfig:
    """``chunk_size``: positions per block of the causal prefix sums (ignored when not causal).

    Default 64: per position, a chunk's masked c × c products cost 4·c·d_k FLOPs beside the
    carried state's ≈ 4·d_k², so up to c = d_k (64 in a base-sized model) they at most double
    the FLOPs, while smaller chunks pay per-chunk overhead (n/c rounds of small matmuls);
    of 16–512, 64 was the fastest at n = 4096, d_k = 64 on the CPU (16 ms; 128: 19, 32: 101,
    512: 50; the prefix sums alone, 12 heads). Memory: a c × c block per head, and, when
    training, the n/c carried d_k × d_k states autograd keeps: n·d_k numbers per head at
    c = d_k, the size of Q itself.
    """

    causal: bool = False
    chunk_size: int = DEFAULT_CHUNK

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        check_int("chunk_size", self.chunk_size)


def feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (eq. 7): positive, smooth, 1 at 0. The + 1 in place (elu's backward
    needs its input, not its output), so no second (b, h, n, d_h) tensor is made."""
    return F.elu(x).add_(1)


@declare(
    "linear",
    packs="one pass: causal, the prefix sums start again at each document; else per-document sums",
    config=LinearConfig,
    causal=True,
    padding_mask=True,
    budget=None,
    cannot_decode=None,
    summary="linear attention, φ = elu + 1 (Transformers are RNNs); causal by chunked prefix sums",
)
class LinearAttention(MultiHeadAttention):
    def _features(self, x: Tensor, key_padding_mask: Tensor | None) -> tuple[Tensor, ...]:
        """φ(Q), φ(K), V as (b, h, n, dh), padded keys' features and values zeroed."""
        # features straight from the projections: Q and K themselves are not kept (in a
        # forward without autograd they are freed at once)
        q_f = feature_map(self.split_heads(self.q_proj(x)))  # (b, h, n, dh)
        k_f = feature_map(self.split_heads(self.k_proj(x)))
        v = self.split_heads(self.v_proj(x))
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :, None]  # (b, 1, n, 1)
            # V too, so even a non-finite padded value cannot reach 0·v
            k_f, v = k_f.masked_fill_(padded, 0.0), v.masked_fill(padded, 0.0)
        return q_f, k_f, v

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> RecurrentState:
        dh = self.head_dim
        return RecurrentState.empty(b, self.n_heads, dh, dh, dtype, device)

    def extend_attend(
        self, x: Tensor, state: RecurrentState, key_padding_mask: Tensor | None
    ) -> Tensor:
        q_f, k_f, v = self._features(x, key_padding_mask)
        out = extend(q_f, k_f, v, self.cfg.chunk_size, state)
        return self.merge_heads(out.to(x.dtype))  # (b, c, d)

    def context_elements(self, n: int) -> int:
        """S (d_h × d_h) and z (d_h) per head, h·d_h·(d_h + 1) whatever n, causal or not
        (the non-causal form computes the same sums over the whole sequence)."""
        return recurrent_state_elements(self.n_heads, self.head_dim, self.head_dim)

    def state_bytes(self, n: int, itemsize: int) -> int:
        """S and z: the state is the context memory, nothing else."""
        return self.context_bytes(n, itemsize)

    def step_attention_flops(self, b: int, n: int) -> int:
        """Per head φ(k)ᵀv and φ(q)S, 2·d_k² each, and φ(q)z, 2·d_k: whatever n."""
        dh = self.head_dim
        return b * self.n_heads * (4 * dh * dh + 2 * dh)

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        q_f, k_f, v = self._features(x, key_padding_mask)
        if self.cfg.causal:
            out = causal_linear_attention(q_f, k_f, v, self.cfg.chunk_size)
        else:
            out = linear_attention(q_f, k_f, v)
        return self.merge_heads(out.to(x.dtype))  # (b, n, d)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """One pass over the packed rows, the features and values projected once: causal,
        the prefix sums start again at each document; not causal, each document's sums over
        its own positions."""
        q_f, k_f, v = self._features(x, None)
        if self.cfg.causal:
            starts = packing.starts(x.device)
            out = packed_causal_linear_attention(q_f, k_f, v, starts, self.cfg.chunk_size)
        else:
            out = per_document(linear_attention, packing, q_f, k_f, v)
        return self.merge_heads(out.to(x.dtype))

    @property
    def step_chunk(self) -> int:  # causal: the prefix sums' chunks, one Python step each
        return self.cfg.chunk_size

    def packed_attention_flops(self, packing: Packing) -> int:
        """Causal: one chunked pass of the gated recurrence over each row of T, the values
        one column wider for the normaliser; not causal: each document's sums alone."""
        if not self.cfg.causal:
            return super().packed_attention_flops(packing)
        dh, chunk = self.head_dim, self.cfg.chunk_size
        per_head = gated_scan.chunked_flops(packing.width, dh, dh + 1, chunk, False)
        return packing.batch * self.n_heads * per_head

    def packed_flops_backward(self, packing: Packing) -> int:
        """Causal: twice the forward but what the gated recurrence's backward skips at each
        row's first and last chunk (``gated_scan.skipped_backward_flops``); not causal: each
        document's alone."""
        if not self.cfg.causal:
            return super().packed_flops_backward(packing)
        dh, chunk = self.head_dim, self.cfg.chunk_size
        skipped = gated_scan.skipped_backward_flops(packing.width, dh, dh + 1, chunk)
        return 2 * self.packed_flops(packing) - packing.batch * self.n_heads * skipped

    def attention_flops(self, b: int, n: int) -> int:
        """Per head: non-causal φ(K)ᵀV, φ(Q)(φ(K)ᵀV) and the normaliser φ(Q)z
        (prefix.linear_flops); causal the chunked prefix sums' (prefix.causal_linear_flops)."""
        dh = self.head_dim
        if self.cfg.causal:
            per_head = causal_linear_flops(n, dh, dh, self.cfg.chunk_size)
        else:
            per_head = linear_flops(n, dh, dh)
        return b * self.n_heads * per_head
