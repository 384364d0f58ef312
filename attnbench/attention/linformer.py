"""Linformer (Wang et al. 2020), our own implementation of every variant in section 4.

Paper eq. (7), per head i:

    head_i = softmax(Q W_i^Q (E_i K W_i^K)ᵀ / √d_k) · F_i V W_i^V,     E_i, F_i: k × n

so attention costs O(nk) instead of O(n²). Section 4's "additional efficiency techniques" are
all here:

* sharing ``none`` (an E_i and F_i per head), ``headwise`` (one E, one F per layer), ``kv``
  (E = F per layer), ``layerwise`` (one E for every layer, head, K and V; built by
  :meth:`LinformerAttention.build_stack`). A 12-layer, 12-head model has 288, 24, 12 and 1
  distinct projection matrices.
* projection ``linear`` (learned k × n), ``random`` (fixed i.i.d. N(0, 1/k) entries, the
  random R of the Johnson–Lindenstrauss argument in the proof of Theorem 2, never trained;
  the proof's E = δR, F = e^-δ R come from one R, our E and F are drawn apart unless
  shared), ``mean`` and
  ``max`` pooling and ``conv`` (kernel = stride = n/k, learned).
* non-uniform k: a list with one k per layer, or ``k_decay`` < 1 to shrink k in higher layers
  (higher layers have lower-rank context matrices, Figure 1).

Choices of ours where the paper is silent:

* Inputs shorter than ``max_seq_len`` use the first n columns of E and F; longer ones raise.
* Padded positions contribute nothing to the projected keys and values: they are zeroed
  before a linear projection and left out of a pooling window's mean or max. A pooling or
  conv slot that received only padding is masked out of the softmax, so its zero key cannot
  soak up attention. (The authors' fairseq code takes ``key_padding_mask`` and ignores it.)
* Where one E serves every head and the projection is linear along the sequence (linear,
  random, mean), E is applied to the input before W^K and W^V, as in the authors' code:
  E (X Wᵀ + 1 bᵀ) = (E X) Wᵀ + (E 1) bᵀ, so only k rows go through the key and value
  projections. ``max`` is not linear and ``conv`` mixes the head's channels, so those two
  project after W^K and W^V.
* The softmax over the n × k scores runs in PyTorch's fused ``scaled_dot_product_attention``
  by default (``kernel=sdpa``); ``kernel=eager`` materialises P̄ as the paper's code did.
* Causal masking is refused: E mixes all n positions into each projected row, so every
  output would see the future.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.validators import check_bool, check_choice, check_int

SHARING = ("none", "headwise", "kv", "layerwise")
PROJECTIONS = ("linear", "random", "mean", "max", "conv")
POOLED = ("mean", "max", "conv")  # act on windows of n/k positions: need k | max_seq_len
SEQUENCE_LINEAR = ("linear", "random", "mean")  # commute with W^K, so may go first
KERNELS = ("sdpa", "eager")


@dataclass
class LinformerConfig:
    k: int | list[int] = 256
    sharing: str = "none"
    projection: str = "linear"
    k_decay: float = 1.0  # layer l uses max(k_min, round(k * k_decay**l)) when k is an int
    k_min: int = 1
    kernel: str = "sdpa"  # softmax over the n × k scores: fused sdpa, or eager as in the paper
    causal: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.k, (list, tuple)):
            if not self.k:
                raise ValueError("k: must be an integer >= 1 or a non-empty list of them, got []")
            self.k = [check_int("k", v) for v in self.k]
        else:
            check_int("k", self.k)
        check_choice("sharing", self.sharing, SHARING)
        check_choice("projection", self.projection, PROJECTIONS)
        ok = isinstance(self.k_decay, (int, float)) and not isinstance(self.k_decay, bool)
        if not ok or not 0 < self.k_decay <= 1:
            raise ValueError(f"k_decay: must be a number in (0, 1], got {self.k_decay!r}")
        check_int("k_min", self.k_min)
        if isinstance(self.k, list) and (self.k_decay != 1.0 or self.k_min != 1):
            raise ValueError(
                "k_decay: a list k already fixes every layer's k; give k_decay and "
                "k_min only with an integer k"
            )
        if isinstance(self.k, int) and self.k_min > self.k:
            raise ValueError(f"k_min: must be at most k={self.k}, got {self.k_min}")
        check_choice("kernel", self.kernel, KERNELS)
        check_bool("causal", self.causal)
        if self.causal:
            raise ValueError(
                "causal: Linformer cannot be causal (its projection E mixes all n positions "
                "into every projected key, so each output would see the future); allowed: false"
            )

    def k_for(self, layer: int) -> int:
        if isinstance(self.k, list):
            return self.k[layer]
        return max(self.k_min, math.floor(self.k * self.k_decay**layer + 0.5))  # half up


def _sequence_matmul(w: Tensor, t: Tensor) -> Tensor:
    """``w[:, :, :n] @ t`` for w (g, k, N) and t (b, G, n, c): (b, G, k, c), the same products.

    Written for the training step, where autograd adds work around a plain ``@``: at n = N
    there is no slice, whose backward copies E's whole gradient into a fresh zero buffer; where
    the batch dimensions already agree (batch 1 and g = G) it is the one bmm matmul would run,
    without the broadcast whose backward sums E's gradient over the expanded batch (and with
    ``squeeze``, not ``[0]``, whose backward would be a zero buffer the size of t). Each of those
    is an extra pass over g·k·N floats (12·256·4096 per layer for per-head E at n = 4096).
    """
    n = t.shape[2]
    if n != w.shape[-1]:
        w = w[:, :, :n]
    if t.shape[0] == 1 and w.shape[0] == t.shape[1]:
        return torch.bmm(w, t.squeeze(0)).unsqueeze(0)
    return w @ t


class SequenceProjection(nn.Module):
    """Maps (b, G, n, c) to (b, G, s, c) along the sequence: the paper's E_i (or F_i).

    ``groups`` is the number of distinct matrices: ``n_heads`` for per-head E_i (then G must
    equal it), or 1 for a projection shared by every head (then any G broadcasts). ``s`` is k,
    or for the pooled kinds the number of n/k windows that start before n.
    """

    def __init__(self, kind: str, groups: int, k: int, max_seq_len: int, channels: int) -> None:
        super().__init__()
        self.kind, self.groups, self.k, self.max_seq_len = kind, groups, k, max_seq_len
        self.window = max_seq_len // k
        if kind in ("linear", "random"):
            e = torch.randn(groups, k, max_seq_len) / k**0.5  # (g, k, N), entries N(0, 1/k)
            if kind == "linear":
                self.weight = nn.Parameter(e)
            else:  # fixed, saved with the model, never trained
                self.register_buffer("weight", e)
        elif kind == "conv":
            c = groups * channels
            self.conv = nn.Conv1d(c, c, self.window, stride=self.window, groups=groups, bias=False)

    def forward(self, t: Tensor, valid: Tensor | None) -> Tensor:
        """``valid``: float (b, n), 1 at real tokens and 0 at padding, or None."""
        b, g, n, c = t.shape
        if valid is not None and self.kind != "max":  # padded positions contribute nothing,
            t = t.masked_fill(valid[:, None, :, None] == 0, 0.0)  # not even an inf or NaN
        if self.kind in ("linear", "random"):
            return _sequence_matmul(self.weight, t)  # (g, k, n) @ (b, G, n, c) -> (b, G, k, c)
        if self.kind == "conv":
            x = t.transpose(2, 3)  # (b, G, c, n): channels first, as Conv1d wants
            x = x.reshape(b * g, c, n) if self.groups == 1 else x.reshape(b, g * c, n)
            x = F.pad(x, (0, -n % self.window))  # a partial last window sees zeros
            y = self.conv(x)  # (b*G, c, s) or (b, g*c, s)
            return y.view(b, g, c, -1).transpose(2, 3)  # (b, G, s, c)
        windows = self._windows(t, fill=0.0 if self.kind == "mean" else float("-inf"), valid=valid)
        if self.kind == "max":
            out = windows.amax(dim=3)  # (b, G, s, c)
            return out.masked_fill(out == float("-inf"), 0.0)  # empty windows
        count = self._counts(valid, n, t)  # (b or 1, 1, s, 1)
        return windows.sum(dim=3) / count.clamp(min=1)  # (b, G, s, c)

    def _windows(self, t: Tensor, fill: float, valid: Tensor | None) -> Tensor:
        if valid is not None and fill != 0.0:
            t = t.masked_fill(valid[:, None, :, None] == 0, fill)
        b, g, n, c = t.shape
        t = F.pad(t, (0, 0, 0, -n % self.window), value=fill)
        return t.view(b, g, -1, self.window, c)  # (b, G, s, w, c)

    def _counts(self, valid: Tensor | None, n: int, like: Tensor) -> Tensor:
        """Real tokens per window, (b or 1, 1, s, 1)."""
        ones = like.new_ones(1, n) if valid is None else valid
        ones = F.pad(ones, (0, -n % self.window))
        return ones.view(ones.shape[0], 1, -1, self.window).sum(-1, keepdim=True)

    def empty_slots(self, valid: Tensor | None, n: int) -> Tensor | None:
        """Bool (b, s), True where a pooled slot holds only padding; None if none can."""
        if valid is None or self.kind not in POOLED:
            return None
        empty = self._counts(valid, n, valid)[:, 0, :, 0] == 0  # (b, s)
        return empty & ~empty.all(dim=1, keepdim=True)  # an all-padding row stays unmasked

    def matrix(self, n: int, like: Tensor) -> Tensor:
        """The dense (g, s, n) matrix this projection applies to an unpadded input of length n,
        on ``like``'s device and in its dtype."""
        if self.kind in ("linear", "random"):
            return self.weight[:, :, :n].detach().clone()
        if self.kind == "mean":
            eye = torch.eye(n, device=like.device, dtype=like.dtype)[None, None]  # (1, 1, n, n)
            return self.forward(eye, None)[0]  # (1, s, n)
        raise ValueError(
            f"projection: {self.kind} is not a matrix; projection_matrices() needs one of "
            "linear, random, mean"
        )


@declare(
    "linformer",
    config=LinformerConfig,
    causal=False,
    fixed_max_len=True,
    budget="k",
    cannot_decode=(
        "has no causal form: E and F mix all n positions into k rows, so no prefix of the "
        "sequence has its own projected keys to keep between tokens"
    ),
    summary="Linformer eq. (7): K, V projected to k rows; every sharing and projection kind",
    cannot_pack=(
        "E and F project all positions of a row (its n = max_seq_len, fixed) into k rows, so "
        "documents packed in one row would read each other; one document a row is padding"
    ),
)
class LinformerAttention(MultiHeadAttention):
    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        max_seq_len: int,
        cfg: LinformerConfig,
        layer: int = 0,
        layers: int = 1,
        shared: SequenceProjection | None = None,
    ) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg)
        if isinstance(cfg.k, list) and len(cfg.k) != layers:
            raise ValueError(
                f"k: {len(cfg.k)} values for {layers} layer(s); give one per layer "
                "(build_model(..., layers=len(k)) for a stack)"
            )
        k = check_int("k", cfg.k_for(layer), high=max_seq_len)
        if cfg.projection in POOLED and max_seq_len % k:
            raise ValueError(
                f"k: the {cfg.projection} projection uses windows of max_seq_len/k positions, "
                f"so k must divide max_seq_len={max_seq_len}; got k={k}"
            )
        self.k = k
        per_head = cfg.sharing == "none"
        self.early = not per_head and cfg.projection in SEQUENCE_LINEAR

        def make() -> SequenceProjection:
            return SequenceProjection(
                cfg.projection, n_heads if per_head else 1, k, max_seq_len, self.head_dim
            )

        self.proj_k = shared if shared is not None else make()
        self.proj_v = self.proj_k if cfg.sharing in ("kv", "layerwise") else make()

    @classmethod
    def build_stack(cls, layers: int, **kwargs: Any) -> list[MultiHeadAttention]:
        """Per-layer k, and for ``layerwise`` one projection object shared by every layer."""
        cfg: LinformerConfig = kwargs["cfg"]
        first = cls(layer=0, layers=layers, **kwargs)  # checks a list k's length
        ks = [cfg.k_for(i) for i in range(layers)]
        if cfg.sharing == "layerwise" and len(set(ks)) > 1:
            raise ValueError(
                f"k: layerwise sharing uses one E for every layer, so k must be the same in every "
                f"layer; got {ks}"
            )
        shared = first.proj_k if cfg.sharing == "layerwise" else None
        return [first] + [
            cls(layer=i, layers=layers, shared=shared, **kwargs) for i in range(1, layers)
        ]

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = x.shape[1]
        if n > self.max_seq_len:
            raise ValueError(
                f"n: Linformer was built for max_seq_len={self.max_seq_len} (E is k × "
                f"{self.max_seq_len}); got an input of length {n}"
            )
        valid = None if key_padding_mask is None else (~key_padding_mask).to(x.dtype)  # (b, n)
        q = self.split_heads(self.q_proj(x))  # (b, h, n, dh)
        if self.early:
            k, v = self._project_first(x, valid)
        else:
            k = self.proj_k(self.split_heads(self.k_proj(x)), valid)  # (b, h, s, dh)
            v = self.proj_v(self.split_heads(self.v_proj(x)), valid)  # (b, h, s, dh)
        empty = self.proj_k.empty_slots(valid, n)  # (b, s) or None
        empty = None if empty is None else empty[:, None, None, :]  # (b, 1, 1, s)
        if self.cfg.kernel == "sdpa":  # fused: the n × k matrix P̄ is never stored whole
            # the CPU flash kernel wants unit stride along dh; a conv projection's output
            # has none, and sdpa then silently ran its math path (P̄ kept, QKᵀ not recomputed)
            k, v = k.contiguous(), v.contiguous()
            allowed = None if empty is None else ~empty
            return self.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (b, h, n, s): P̄ before softmax
        if empty is not None:
            scores = scores.masked_fill(empty, float("-inf"))
        return self.merge_heads(scores.softmax(dim=-1) @ v)  # (b, n, d)

    def _project_first(self, x: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
        """E X first, then W^K on k rows: (E X) Wᵀ + (E 1) bᵀ equals E (X Wᵀ + 1 bᵀ)."""
        ones = x.new_ones(1, 1, x.shape[1], 1)  # (1, 1, n, 1)
        # squeeze, not [:, 0]: the same view, but its backward is a view too, not a zero buffer
        ex, e1 = self.proj_k(x[:, None], valid).squeeze(1), self.proj_k(ones, valid).squeeze(1)
        fx, f1 = (  # (b, s, d) and (b or 1, s, 1)
            (ex, e1)
            if self.proj_v is self.proj_k
            else (self.proj_v(x[:, None], valid).squeeze(1), self.proj_v(ones, valid).squeeze(1))
        )
        k = F.linear(ex, self.k_proj.weight) + e1 * self.k_proj.bias  # (b, s, d)
        v = F.linear(fx, self.v_proj.weight) + f1 * self.v_proj.bias  # (b, s, d)
        return self.split_heads(k), self.split_heads(v)  # (b, h, s, dh)

    def slots(self, n: int) -> int:
        """Projected length at input length n: k, or the pooling windows that start before n."""
        if self.cfg.projection in ("linear", "random"):
            return self.k
        return -(-n // self.proj_k.window)

    def context_elements(self, n: int) -> int:
        """Context memory, not a recurrent state (Linformer has no causal form): the projected
        keys and values K̄ = E K and V̄ = F V that every query attends over, s = k rows of d
        each (:meth:`slots`: for the pooled kinds at n < max_seq_len, the windows that start
        before n), 2·s·d; a layer of its own k under k_decay or a list k.

        The same for every sharing: sharing decides how many distinct E and F there are (the
        parameters), not what a sequence is compressed into. ``none`` and ``headwise`` give
        each head k projected keys and values of d_h; ``kv`` (E = F) still projects K and V
        apart; ``layerwise`` shares E across layers, yet each layer projects its own K and V.
        Under ``kv`` and ``layerwise`` with a sequence-linear projection both come from one
        E X (k × d, and E 1), which a cache could keep instead (k·(d + 1)); counted here is
        what the attention reads, K̄ and V̄, as the K/V cache counts K and V rather than the
        n × d input they come from."""
        return 2 * self.slots(n) * self.kv_heads * self.head_dim

    def recomputed_flops(self, b: int, n: int) -> int:
        """kernel=sdpa's fused backward recomputes Q (EK)ᵀ: 2·n·s·d; eager keeps P̄."""
        return 2 * b * n * self.slots(n) * self.d_model if self.cfg.kernel == "sdpa" else 0

    def frozen_flops(self, b: int, n: int) -> int:
        """Matmuls one of whose operands needs no gradient. Projecting first, E 1 (for the
        bias) has a constant operand; with projection=random E (and F) are fixed buffers
        too, so E X and E 1 need no backward at all, and E K, F V only K's and V's."""
        s, d = self.slots(n), self.d_model
        es = 1 if self.proj_v is self.proj_k else 2
        ones = 2 * s * n * es if self.early else 0  # E 1: the ones need no gradient
        if self.cfg.projection != "random":
            return ones
        if self.early:
            return (2 * b * s * n * d + 2 * s * n) * es + ones
        return 2 * 2 * b * s * n * d

    def flops(self, b: int, n: int) -> int:
        """Matmul FLOPs of one forward without a padding mask (see the base class)."""
        d, s, kind = self.d_model, self.slots(n), self.cfg.projection
        one_e = self.proj_v is self.proj_k
        q_out = 2 * 2 * b * n * d * d
        attention = 4 * b * n * s * d  # Q (EK)ᵀ and P̄ (FV)
        matrix = kind in ("linear", "random")  # pooling is no matmul; conv is counted below
        if self.early:  # E X (and F X), E·1 for the bias, then W^K and W^V on s rows
            ex = (2 * b * s * n * d + 2 * s * n) * (1 if one_e else 2) if matrix else 0
            return q_out + ex + 2 * 2 * b * s * d * d + attention
        kv = 2 * 2 * b * n * d * d
        if matrix:
            proj = 2 * 2 * b * s * n * d  # E K and F V, every head
        elif kind == "conv":
            proj = 2 * 2 * b * d * self.head_dim * s * self.proj_k.window
        else:
            proj = 0
        return q_out + kv + proj + attention

    def projection_matrices(self, n: int | None = None) -> tuple[Tensor, Tensor]:
        """The effective dense E and F, (heads, k, n) each, for linear, random and mean.

        For looking at what E and F learned (e.g. their spectra, Figure 1 of the paper). For
        ``mean`` at n < max_seq_len only the ceil(n·k/max_seq_len) windows that start before n
        exist (the others would be empty), so there are that many rows instead of k.
        """
        n = self.max_seq_len if n is None else check_int("n", n, high=self.max_seq_len)
        like = self.q_proj.weight
        e, f = self.proj_k.matrix(n, like), self.proj_v.matrix(n, like)  # (g, k, n)
        return e.expand(self.n_heads, -1, -1), f.expand(self.n_heads, -1, -1)
