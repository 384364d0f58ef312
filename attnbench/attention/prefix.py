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

Two choices shared by both callers:

* The normaliser rides along as one more column of V: with V' = [V, 1], φ(Q)(φ(K)ᵀV') gives
  numerator and normaliser from the same matmuls, so both see exactly the same keys.
* A query whose every visible key has zero features (all padding, since callers zero padded
  keys' features) gets 0, not 0/0: the normaliser is exactly 0 only there (features are
  positive), and dividing by 1 instead keeps the output and its gradient finite.

Sums run in at least fp32: a prefix sum over n positions runs past fp16's range and bf16's
precision. The result is returned in that accumulation dtype; callers cast back.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_CHUNK = 64


def _with_ones(q_f: Tensor, k_f: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """φ(Q), φ(K) and V' = [V, 1] in the accumulation dtype: fp32 at least, fp64 stays fp64."""
    dtype = torch.promote_types(torch.promote_types(q_f.dtype, v.dtype), torch.float32)
    ones = v.new_ones(()).to(dtype).expand(*v.shape[:-1], 1)
    return q_f.to(dtype), k_f.to(dtype), torch.cat((v.to(dtype), ones), dim=-1)


def _normalise(out: Tensor) -> Tensor:
    """(…, e + 1) numerator and normaliser -> (…, e); 0 where no key was visible."""
    den = out[..., -1:]
    return out[..., :-1] / den.masked_fill(den == 0, 1.0)


def linear_attention(q_f: Tensor, k_f: Tensor, v: Tensor) -> Tensor:
    """Non-causal: φ(Q)(φ(K)ᵀ[V, 1]), normalised. (b, h, n, m) ×2, (b, h, n, e) -> (b, h, n, e)."""
    q_f, k_f, v1 = _with_ones(q_f, k_f, v)
    return _normalise(q_f @ (k_f.transpose(-2, -1) @ v1))


def causal_linear_attention(q_f: Tensor, k_f: Tensor, v: Tensor, chunk: int) -> Tensor:
    """Causal: out_i sees keys j ≤ i only, in chunks of ``chunk`` positions (the last may be
    shorter; ``chunk`` ≥ n is one quadratic block). Shapes as :func:`linear_attention`.

    Chunk t's output is φ(Q_t)S + tril(φ(Q_t)φ(K_t)ᵀ)V'_t, where S = Σ_{s<t} φ(K_s)ᵀV'_s is the
    carried state. The inputs are split once and the chunks' outputs concatenated once, so the
    backward is one cat and one split: slicing each chunk out, or writing it into a
    preallocated output, would make autograd allocate a whole-sequence gradient per chunk.
    """
    q_f, k_f, v1 = _with_ones(q_f, k_f, v)
    c = min(chunk, q_f.shape[-2])  # a chunk past n is one block of n
    future = torch.ones(c, c, dtype=torch.bool, device=q_f.device).triu(1)
    state = None  # (b, h, m, e + 1): Σ φ(k_j) [v_j, 1]ᵀ over the chunks before this one
    outs = []
    q_cs, k_cs, v_cs = (t.split(chunk, dim=-2) for t in (q_f, k_f, v1))
    for i, (q_c, k_c, v_c) in enumerate(zip(q_cs, k_cs, v_cs, strict=True)):  # (b, h, c, ·)
        size = q_c.shape[-2]
        scores = (q_c @ k_c.transpose(-2, -1)).masked_fill_(future[:size, :size], 0.0)
        out = scores @ v_c  # (b, h, c, e + 1)
        if state is not None:
            out = out + q_c @ state
        if i < len(q_cs) - 1:  # the last chunk's keys are seen by no later query
            update = k_c.transpose(-2, -1) @ v_c  # (b, h, m, e + 1)
            state = update if state is None else state + update
        outs.append(out)
    return _normalise(torch.cat(outs, dim=-2))


def linear_flops(n: int, m: int, e: int) -> int:
    """Matmul FLOPs of :func:`linear_attention` for one (batch, head): φ(K)ᵀV' and φ(Q)(·),
    2·n·m·(e + 1) each."""
    return 4 * n * m * (e + 1)


def causal_linear_flops(n: int, m: int, e: int, chunk: int) -> int:
    """Matmul FLOPs of :func:`causal_linear_attention` for one (batch, head), exactly as
    FlopCounterMode counts them: per chunk of size s, the full s × s scores (2·s²·m, the
    masked half included) and their product with V' (2·s²·(e + 1)); φ(Q_t)S for every chunk
    but the first and φ(K_t)ᵀV'_t for every chunk but the last (2·s·m·(e + 1) each)."""
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    quadratic = sum(2 * s * s * (m + e + 1) for s in sizes)
    carried = 2 * m * (e + 1) * (2 * n - sizes[0] - sizes[-1])
    return quadratic + carried
