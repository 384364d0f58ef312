"""Linear attention from feature maps, causal by chunked prefix sums: shared by ``linear`` and
``performer``. Not a mechanism; registers nothing.

With features φ(q_i), φ(k_j) ∈ R^m (Katharopoulos et al. 2020, section 3.2, eq. 4–5;
Choromanski et al. 2021, section 2), attention is

    out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i,   S_i = Σ_{j∈J(i)} φ(k_j) v_jᵀ,   z_i = Σ_{j∈J(i)} φ(k_j)

with J(i) every position (non-causal) or j ≤ i (causal: Katharopoulos section 3.3, eq. 8–11;
the "prefix-sum" of Choromanski Figure 2). Forming every S_i is n·m·e numbers and as many
multiply-adds done as broadcast products: performer-pytorch's ``causal_linear_attention_noncuda``
does that, in 128 slices, and autograd keeps every slice for the backward. Here the sequence is
cut into chunks of c positions instead: within a chunk the masked c × c product φ(Q_c)φ(K_c)ᵀ
(quadratic, but small), across chunks one carried m × e state, all of it matmuls. A forward
holds O(n·(m + e) + c² + m·e) numbers; a training step keeps the n/c chunk states, n·m·e/c.

Choices shared by both callers:

* The normaliser's z (m numbers) is carried beside S rather than folded into V as a column of
  ones: that would copy V, hold a (b, h, n, e + 1) tensor more at the peak, and give every
  matmul e + 1 columns, an awkward width for GPU kernels.
* A query whose every visible key has zero features (all padding, since callers zero padded
  keys' features) gets 0, not 0/0: the normaliser is exactly 0 only there (features are
  positive), and dividing by 1 instead keeps the output and its gradient finite.
* Sums run in at least fp32: a prefix sum over n positions runs past fp16's range and bf16's
  precision. The result is returned in that accumulation dtype; callers cast back.

Their incremental form (serving) is the same recurrence: a :class:`RecurrentState` keeps S
and z between calls, :func:`causal_linear_attention` starts from it and leaves it updated, so a
prefill (in chunks or whole) and then one token at a time equal one causal pass over the whole
sequence. Its size is fixed, m·(e + 1) numbers per head whatever the context
(:func:`recurrent_state_elements`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.attention.gated_scan import gated_chunked

DEFAULT_CHUNK = 64


@dataclass
class RecurrentState:
    """S = Σ φ(k_j) v_jᵀ (b, h, m, e) and z = Σ φ(k_j) (b, h, m, 1) over every token so far,
    kept in the state's dtype (serving code often keeps fp32 whatever the compute dtype)."""

    s: Tensor
    z: Tensor

    @classmethod
    def empty(
        cls, b: int, heads: int, m: int, e: int, dtype: torch.dtype, device: torch.device
    ) -> RecurrentState:
        return cls(
            torch.zeros(b, heads, m, e, dtype=dtype, device=device),
            torch.zeros(b, heads, m, 1, dtype=dtype, device=device),
        )

    def slot(self, i: int) -> RecurrentState:
        """Sequence i's state as an empty one of its own (views of this one's tensors)."""
        self.s[i].zero_()
        self.z[i].zero_()
        return RecurrentState(self.s[i : i + 1], self.z[i : i + 1])

    def seek(self, length: int) -> None:
        """A recurrent state has no position: nothing to set."""

    def admit(self, part: RecurrentState) -> None:
        """After every slot was filled: nothing to take, a recurrent state has no position."""

    def pad_left(self, pads: Sequence[int]) -> None:
        """Left padding leaves no trace in a recurrent state (padded tokens add nothing to
        it) and a step reads the same bytes whatever the context: nothing to mark."""


def recurrent_state_elements(heads: int, m: int, e: int) -> int:
    """One sequence's S and z in one layer: heads · m · (e + 1) elements, whatever n. The
    context memory of linear attention and Performer, causal or not: the non-causal form
    computes the same Σ φ(k_j) v_jᵀ and Σ φ(k_j), over the whole sequence."""
    return heads * m * (e + 1)


def _wide(*ts: Tensor) -> tuple[Tensor, ...]:
    """Each in the accumulation dtype: fp32 at least, fp64 stays fp64 (no copy when it is)."""
    dtype = torch.float32
    for t in ts:
        dtype = torch.promote_types(dtype, t.dtype)
    return tuple(t.to(dtype) for t in ts)


def _divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den, 0 where den is 0 (no key was visible)."""
    return num / den.masked_fill(den == 0, 1.0)


def linear_attention(q_f: Tensor, k_f: Tensor, v: Tensor) -> Tensor:
    """Non-causal: φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1). (b, h, n, m) ×2, (b, h, n, e) -> (b, h, n, e)."""
    q_f, k_f, v = _wide(q_f, k_f, v)
    num = q_f @ (k_f.transpose(-2, -1) @ v)  # (b, h, n, e)
    den = q_f @ k_f.sum(-2).unsqueeze(-1)  # (b, h, n, 1)
    return _divide(num, den)


def causal_linear_attention(
    q_f: Tensor, k_f: Tensor, v: Tensor, chunk: int, carry: RecurrentState | None = None
) -> Tensor:
    """Causal: out_i sees keys j ≤ i only, in chunks of ``chunk`` positions (the last may be
    shorter; ``chunk`` ≥ n is one quadratic block). Shapes as :func:`linear_attention`.
    ``carry``: the state of every earlier token, which the sums start from and which is
    left holding these tokens too (the incremental form).

    Chunk t: A = tril(φ(Q_t)φ(K_t)ᵀ), numerator φ(Q_t)S + A V_t and normaliser φ(Q_t)z + A 1,
    where S = Σ_{s<t} φ(K_s)ᵀV_s and z = Σ_{s<t} φ(K_s)ᵀ1 are carried. The inputs are split
    once and the chunks' outputs concatenated once, so the backward is one cat and one split:
    slicing each chunk out, or writing it into a preallocated output, would make autograd
    allocate a whole-sequence gradient per chunk.
    """
    q_f, k_f, v = _wide(q_f, k_f, v)
    c = min(chunk, q_f.shape[-2])  # a chunk past n is one block of n
    future = torch.ones(c, c, dtype=torch.bool, device=q_f.device).triu(1)
    state = z = None  # (b, h, m, e), (b, h, m, 1): over the chunks before this one
    if carry is not None:
        state, z = carry.s.to(q_f.dtype), carry.z.to(q_f.dtype)
    outs = []
    q_cs, k_cs, v_cs = (t.split(chunk, dim=-2) for t in (q_f, k_f, v))
    for i, (q_c, k_c, v_c) in enumerate(zip(q_cs, k_cs, v_cs, strict=True)):  # (b, h, c, ·)
        size = q_c.shape[-2]
        scores = (q_c @ k_c.transpose(-2, -1)).masked_fill_(future[:size, :size], 0.0)
        num, den = scores @ v_c, scores.sum(-1, keepdim=True)  # (b, h, c, e), (b, h, c, 1)
        if state is not None:
            num, den = num + q_c @ state, den + q_c @ z
        if i < len(q_cs) - 1 or carry is not None:  # else no later query sees these keys
            update, z_update = k_c.transpose(-2, -1) @ v_c, k_c.sum(-2).unsqueeze(-1)
            state = update if state is None else state + update  # not in place: saved for
            z = z_update if z is None else z + z_update  # the backward by q_c @ state
        outs.append(_divide(num, den))
    if carry is not None:
        carry.s.copy_(state)
        carry.z.copy_(z)
    return torch.cat(outs, dim=-2)


def packed_causal_linear_attention(
    q_f: Tensor, k_f: Tensor, v: Tensor, starts: Tensor, chunk: int
) -> Tensor:
    """Causal over packed documents: the prefix sums start again at each document's first
    position (``starts`` (b, n), True there). That is the gated recurrence with decay 1
    everywhere but a reset at each start, its values widened by a column of ones so that the
    normaliser φ(Q)z rides along: one chunked pass over the row
    (:func:`~attnbench.attention.gated_scan.gated_chunked`). Shapes as
    :func:`causal_linear_attention`."""
    q_f, k_f, v = _wide(q_f, k_f, v)
    ones = v.new_ones(*v.shape[:-1], 1)
    no_decay = v.new_zeros(1, 1, 1, 1)
    out, _ = gated_chunked(q_f, k_f, torch.cat([v, ones], -1), no_decay, chunk=chunk, starts=starts)
    return _divide(out[..., :-1], out[..., -1:])


def extend(q_f: Tensor, k_f: Tensor, v: Tensor, chunk: int, carry: RecurrentState) -> Tensor:
    """The incremental form for c new tokens: one decode step (:func:`recurrent_step`) or a
    prompt's chunk (:func:`causal_linear_attention` from ``carry``), ``carry`` updated."""
    if q_f.shape[-2] == 1:
        return recurrent_step(q_f, k_f, v, carry)
    return causal_linear_attention(q_f, k_f, v, chunk, carry)


def recurrent_step(q_f: Tensor, k_f: Tensor, v: Tensor, carry: RecurrentState) -> Tensor:
    """One token per sequence, (b, h, 1, m) ×2 and (b, h, 1, e): S and z updated in place,
    then read once by the query, the decode step a serving engine runs (a handful of ops,
    where the chunked path would run a dozen for one position)."""
    q_f, k_f, v = _wide(q_f, k_f, v)
    k_t = k_f.transpose(-2, -1)  # (b, h, m, 1)
    carry.s += (k_t @ v).to(carry.s.dtype)
    carry.z += k_t.to(carry.z.dtype)
    return _divide(q_f @ carry.s.to(q_f.dtype), q_f @ carry.z.to(q_f.dtype))


def linear_flops(n: int, m: int, e: int) -> int:
    """Matmul FLOPs of :func:`linear_attention` for one (batch, head): φ(K)ᵀV and φ(Q)(φ(K)ᵀV),
    2·n·m·e each, and the normaliser φ(Q)z, 2·n·m (the sum z itself is no matmul)."""
    return 4 * n * m * e + 2 * n * m


def causal_linear_flops(n: int, m: int, e: int, chunk: int) -> int:
    """Matmul FLOPs of :func:`causal_linear_attention` for one (batch, head), exactly as
    FlopCounterMode counts them: per chunk of size s, the full s × s scores (2·s²·m, the
    masked half included) and their product with V_t (2·s²·e; their row sums are no matmul);
    φ(Q_t)S and φ(Q_t)z for every chunk but the first (2·s·m·(e + 1)), φ(K_t)ᵀV_t for every
    chunk but the last (2·s·m·e)."""
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    quadratic = sum(2 * s * s * (m + e) for s in sizes)
    return quadratic + 2 * m * (e + 1) * (n - sizes[0]) + 2 * m * e * (n - sizes[-1])
