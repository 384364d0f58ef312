"""Performer: FAVOR+ random-feature attention (Choromanski et al., 2021), via performer-pytorch.

Softmax attention D⁻¹AV, with A = exp(QKᵀ/√d), is approximated through a feature map φ with
A ≈ φ(Q)φ(K)ᵀ, computed right to left: ``D⁻¹ (φ(Q) (φ(K)ᵀ V))``, D = diag(φ(Q) (φ(K)ᵀ 1)). Time
and memory are then linear in n for m random features w (``nb_features``, the sweep's budget).
``kernel=softmax`` is FAVOR+'s positive features, lemma 1: φ(x) = exp(wᵀx − ‖x‖²/2)/√m;
``kernel=relu`` is the paper's generalized attention, φ(x) = ReLU(wᵀx), which only resembles
softmax. Either way x is scaled by d^(-1/4) first, so φ(q)ᵀφ(k) sees qᵀk/√d.

We take the projection buffer, the kernel functions and the linear-attention contractions from
performer-pytorch, but assemble them here rather than call ``FastAttention.forward``, because:

* its ``mask`` only zeroes padded *values*: padded keys still add to the normaliser D, so the
  output depends on how much padding there is. We zero padded keys' features instead, which
  removes them from both φ(K)ᵀV and φ(K)ᵀ1;
* its ``causal=True`` prints a message and wants fast-transformers' CUDA extension, and its
  plain reference path, ``causal_linear_attention_noncuda``, forms every position's m × d_h
  prefix state by broadcast products, which autograd keeps for the backward (at n = 4096,
  12 heads, m = 256: ~10× slower forward, 3.7 GB for a training step's peak). We run the
  chunked prefix sums shared with ``linear`` instead
  (:func:`attnbench.attention.prefix.causal_linear_attention`: a c × c block per chunk and one
  carried m × d_h state, all matmuls; 0.38 GB), in fp32 so fp16/bf16 inputs work;
* under causal its eps terms leak future keys into past outputs, so we set them to 0 (see
  :meth:`PerformerAttention.features`);
* its ``ortho_scaling`` only picks how rows are scaled — the rows are always orthogonal — so for
  ``ortho_features=False`` we draw plain iid Gaussian features ourselves.

Its incremental form (causal only) is linear attention's recurrence over the same features,
drawn once and fixed across steps: S and z per head, m·(d_h + 1) numbers whatever the
context (:class:`attnbench.attention.prefix.RecurrentState`). The causal key features use a
data-independent stabiliser, so a key's feature does not change as later keys arrive.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from performer_pytorch import FastAttention
from performer_pytorch.performer_pytorch import generalized_kernel, linear_attention, softmax_kernel
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
    packed_causal_linear_attention,
    recurrent_state_elements,
)
from attnbench.validators import check_bool, check_choice, check_int

KERNELS = ("softmax", "relu")
# positions per block of the causal prefix sums: at m = 256 features and d_h = 64 a block's
# c × c products cost 2·c·(m + d_h) FLOPs per position beside the carried state's ≈ 4·m·d_h,
# under two thirds of it at c = 64; smaller blocks pay per-block overhead (of 16–512, 32 and
# 64 were the fastest at n = 4096 on the CPU, 42 ms; 128: 51, 512: 114). The same default as
# linear's chunk_size.
CHUNK = DEFAULT_CHUNK


@dataclass
class PerformerConfig:
    nb_features: int = 256
    ortho_features: bool = True
    kernel: str = "softmax"
    causal: bool = False
    feature_redraw_interval: int | None = None

    def __post_init__(self) -> None:
        check_int("nb_features", self.nb_features)
        check_bool("ortho_features", self.ortho_features)
        check_choice("kernel", self.kernel, KERNELS)
        check_bool("causal", self.causal)
        if self.feature_redraw_interval is not None:
            check_int("feature_redraw_interval", self.feature_redraw_interval)


@declare(
    "performer",
    packs=(
        "one pass of projections: causal, the prefix sums start again at each document; "
        "else each document's own features and sums"
    ),
    config=PerformerConfig,
    causal=True,
    padding_mask=True,
    budget="nb_features",
    cannot_decode=None,
    summary="FAVOR+ random features, linear in n (performer-pytorch); kernel softmax|relu",
)
class PerformerAttention(MultiHeadAttention):
    step_chunk = CHUNK  # causal: the prefix sums' chunks, one Python step each

    def __init__(
        self, *, d_model: int, n_heads: int, max_seq_len: int, cfg: PerformerConfig
    ) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg)
        # causal=False here: we run the causal path ourselves (see the module docstring).
        # Drawn on the CPU whatever the default device: the library's QR runs via .cpu(), which
        # a module built under torch.device("meta") (the memory model) could not do.
        with torch.device("cpu"):
            self.fast_attention = FastAttention(
                self.head_dim,
                nb_features=cfg.nb_features,
                ortho_scaling=0,
                causal=False,
                generalized_attention=cfg.kernel == "relu",
            )
        self._calls_since_redraw = 0
        if not cfg.ortho_features:
            self.redraw_features()

    @property
    def projection_matrix(self) -> Tensor:
        """The random features w, one per row: (m, dh)."""
        return self.fast_attention.projection_matrix

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Draw fresh random features of the configured kind, in place in the buffer.

        Orthogonal: the library's blocks of orthogonal rows with Gaussian-distributed norms
        (``ortho_scaling=0``), the paper's ORFs. Otherwise iid N(0, I) rows, which the library
        cannot draw.
        """
        p = self.projection_matrix  # (m, dh)
        with torch.device("cpu"):  # as in __init__: the library's QR needs real tensors
            new = (
                self.fast_attention.create_projection()
                if self.cfg.ortho_features
                else torch.randn(p.shape)
            )
        p.copy_(new)

    def _count_call(self) -> None:
        """Redraw after every ``feature_redraw_interval`` training calls; never in eval."""
        interval = self.cfg.feature_redraw_interval
        if not self.training or interval is None:
            return
        if self._calls_since_redraw >= interval:
            self.redraw_features()
            self._calls_since_redraw = 0
        self._calls_since_redraw += 1

    def features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """φ(Q), φ(K) from (b, h, n, dh) each to (b, h, n, m) each, with the library's kernels."""
        w = self.projection_matrix  # (m, dh)
        if self.cfg.kernel == "relu":
            kernel_fn = self.fast_attention.kernel_fn
            return (
                generalized_kernel(q, projection_matrix=w, kernel_fn=kernel_fn),
                generalized_kernel(k, projection_matrix=w, kernel_fn=kernel_fn),
            )
        q_f = softmax_kernel(q, projection_matrix=w, is_query=True)  # per-query max: no leak
        if not self.cfg.causal:
            return q_f, softmax_kernel(k, projection_matrix=w, is_query=False)
        return q_f, self._causal_key_features(k)

    def _causal_key_features(self, k: Tensor) -> Tensor:
        """φ(K) = exp(wᵀk' − ‖k'‖²/2 − c)/√m with k' = k·d^(-1/4) and a constant c.

        softmax_kernel stabilises keys by the max of wᵀk' over the whole sequence and adds eps:
        under causal that max comes from future keys and, through eps, leaks them into past
        outputs; without eps, a large later key underflows every earlier feature to 0 (0/0).
        Since wᵀk' − ‖k'‖²/2 = ‖w‖²/2 − ‖k' − w‖²/2 ≤ ‖w‖²/2, the data-independent
        c = max_j ‖w_j‖²/2 keeps every feature ≤ 1/√m, uses no future key, and cancels
        exactly between numerator and normaliser.
        """
        w = self.projection_matrix.to(k.dtype)  # (m, dh)
        k = k * self.head_dim**-0.25  # k' (b, h, n, dh)
        c = w.square().sum(-1).max() / 2
        dash = k @ w.T  # (b, h, n, m)
        return torch.exp(dash - k.square().sum(-1, keepdim=True) / 2 - c) * w.shape[0] ** -0.5

    def attention_flops(self, b: int, n: int) -> int:
        """φ(Q), φ(K): 2·n·m·d each. Non-causal: φ(K)ᵀV and φ(Q)(φ(K)ᵀV), 2·n·m·d each, and the
        normaliser 2·h·n·m. Causal: the chunked prefix sums' matmuls, per head
        (prefix.causal_linear_flops)."""
        m = self.cfg.nb_features
        features = 4 * b * n * m * self.d_model
        if self.cfg.causal:
            per_head = causal_linear_flops(n, m, self.head_dim, CHUNK)
            return features + b * self.n_heads * per_head
        return features + 4 * b * n * m * self.d_model + 2 * b * self.n_heads * n * m

    def packed_attention_flops(self, packing: Packing) -> int:
        """Causal: the features over each row of T and one chunked pass of the gated
        recurrence, the values one column wider for the normaliser; not causal: each
        document's features and sums alone."""
        if not self.cfg.causal:
            return super().packed_attention_flops(packing)
        b, t, m = packing.batch, packing.width, self.cfg.nb_features
        per_head = gated_scan.chunked_flops(t, m, self.head_dim + 1, CHUNK, False)
        return 4 * b * t * m * self.d_model + b * self.n_heads * per_head

    def packed_flops_backward(self, packing: Packing) -> int:
        """Causal: twice the forward, less the fixed features' second gradient and what the
        gated recurrence's backward skips at each row's first and last chunk; not causal:
        each document's alone."""
        if not self.cfg.causal:
            return super().packed_flops_backward(packing)
        b, t = packing.batch, packing.width
        skipped = gated_scan.skipped_backward_flops(
            t, self.cfg.nb_features, self.head_dim + 1, CHUNK
        )
        frozen = self.frozen_flops(b, t)
        return 2 * self.packed_flops(packing) - frozen - b * self.n_heads * skipped

    def frozen_flops(self, b: int, n: int) -> int:
        """φ(Q) and φ(K) multiply by the fixed random features (a buffer): no gradient."""
        return 4 * b * n * self.cfg.nb_features * self.d_model

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> RecurrentState:
        m = self.cfg.nb_features
        return RecurrentState.empty(b, self.n_heads, m, self.head_dim, dtype, device)

    def context_elements(self, n: int) -> int:
        """S (m × d_h) and z (m) per head over the m random features, h·m·(d_h + 1)
        whatever n, causal or not (the non-causal form computes the same sums over the whole
        sequence)."""
        return recurrent_state_elements(self.n_heads, self.cfg.nb_features, self.head_dim)

    def state_bytes(self, n: int, itemsize: int) -> int:
        """S and z: the state is the context memory, nothing else."""
        return self.context_bytes(n, itemsize)

    def step_attention_flops(self, b: int, n: int) -> int:
        """φ(q), φ(k): 2·m·d each; per head φ(k)ᵀv and φ(q)S, 2·m·d_h each, φ(q)z 2·m."""
        m, dh = self.cfg.nb_features, self.head_dim
        return 4 * b * m * self.d_model + b * self.n_heads * (4 * m * dh + 2 * m)

    def extend_attend(
        self, x: Tensor, state: RecurrentState, key_padding_mask: Tensor | None
    ) -> Tensor:
        q_f, k_f, v = self._masked_features(x, key_padding_mask)
        return self.merge_heads(extend(q_f, k_f, v, CHUNK, state).to(x.dtype))  # (b, c, d)

    def _masked_features(
        self, x: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """φ(Q), φ(K) (b, h, n, m) and V (b, h, n, dh), padded keys' features and values
        zeroed; causal: in fp32 at least (fp64 stays fp64), as prefix sums over n run past
        fp16's range and bf16's precision, and with eps=0 a key far below the max must not
        underflow to a zero feature."""
        q, k, v = self.qkv_heads(x)  # (b, h, n, dh)
        if self.cfg.causal:
            wide = torch.promote_types(x.dtype, torch.float32)
            q, k, v = q.to(wide), k.to(wide), v.to(wide)
        padded = None
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :, None]  # (b, 1, n, 1)
            # zeroed before the kernel too, so a padded key cannot dominate softmax_kernel's max;
            # V too, so even a non-finite padded value cannot reach 0·v
            k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
        q_f, k_f = self.features(q, k)  # (b, h, n, m)
        if padded is not None:
            k_f = k_f.masked_fill(padded, 0.0)  # out of both φ(K)ᵀV and the normaliser φ(K)ᵀ1
        return q_f, k_f, v

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """Packed rows, the projections run once and the features drawn once: causal, the
        key features are data-independent (no max over keys), so they are computed over the
        row and the prefix sums start again at each document; not causal, softmax_kernel
        stabilises keys by their max over the whole sequence (plus an eps that does not
        cancel), so each document's features and sums are its own."""
        self._count_call()
        if self.cfg.causal:
            q_f, k_f, v = self._masked_features(x, None)
            out = packed_causal_linear_attention(q_f, k_f, v, packing.starts(x.device), CHUNK)
        else:
            q, k, v = self.qkv_heads(x)

            def alone(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return linear_attention(*self.features(q, k), v)

            out = per_document(alone, packing, q, k, v)
        return self.merge_heads(out.to(x.dtype))

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        self._count_call()
        q_f, k_f, v = self._masked_features(x, key_padding_mask)
        if self.cfg.causal:
            # no eps: the keys' constant stabiliser cancels exactly, an eps would not; a query
            # that sees no real key gets 0 there already (its normaliser is exactly 0)
            out = causal_linear_attention(q_f, k_f, v, CHUNK).to(x.dtype)  # (b, h, n, dh)
            return self.merge_heads(out)  # (b, n, d)
        out = linear_attention(q_f, k_f, v)  # (b, h, n, dh)
        if key_padding_mask is not None:  # a row that is all padding gets 0, as in sdpa
            empty = key_padding_mask.all(-1)[:, None, None, None]  # (b, 1, 1, 1)
            out = out.masked_fill(empty, 0.0)
        return self.merge_heads(out)  # (b, n, d)
