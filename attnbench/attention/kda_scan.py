"""The delta rule with a decay per key channel, the core of Kimi Delta Attention (KDA): a
reference, a chunked form and a decode step on tensors, beside the scalar-decay core of
:mod:`attnbench.attention.delta_scan` (whose arithmetic it shares). Not a mechanism.

Per head, with S ∈ R^{dk×dv}, β_t ∈ (0, 1) and a decay per key channel α_t ∈ (0, 1]^{dk},

    S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ,    o_t = S_tᵀ q_t

(Kimi Team 2025, "Kimi Linear", eq. 1; flash-linear-attention's ``naive_recurrent_kda`` in
``fla/ops/kda/naive.py``: decay first, then the delta update on the decayed state). α_t
arrives as its log, g_t = log α_t ≤ 0, of shape (b, h, n, dk); with every channel's g equal
this is Gated DeltaNet's S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ. The arguments
run (q, k, v, g, beta), fla's ``chunk_kda`` order: g is per position and channel, like the
tokens, so the mixers' dispatch (:meth:`RecurrentMixer._recur`) slices it with them.

The chunked form. Writing the decayed state Diag(α_r) S_{r−1} as D_r, S_r = D_r + k_r u_rᵀ
with u_r = β_r (v_r − D_rᵀ k_r). In a chunk starting from S_0, with γ_r = Σ_{i≤r} g_i per
channel, Γ_r = e^{γ_r} and the per-channel ratios E_ri = e^{γ_r − γ_i} (r ≥ i), unrolling
gives S_r = Diag(Γ_r) S_0 + Σ_{i≤r} Diag(E_ri) k_i u_iᵀ, so the pseudo-values solve
(I + A) U = diag(β)(V − (Γ ⊙ K) S_0) with A_ri = β_r Σ_d k_rd k_id E_rid (i < r), and

    T = (I + A)⁻¹ diag(β),   W = T (Γ ⊙ K),   Ũ = T V,   U = Ũ − W S_0
    O = (Γ ⊙ Q) S_0 + P U,   P_ri = Σ_d q_rd k_id E_rid (i ≤ r)
    S_c = Diag(Γ_c) S_0 + (K ⊙ E_c·)ᵀ U

— :mod:`~attnbench.attention.delta_scan`'s WY / UT form, with the c × c decay matrix D
turned into a ratio per channel inside A and P. Choices, and why:

* A and P are no longer matmuls of the inputs (the ratio depends on d), and the tempting
  factorisation (k ⊙ e^{γ})(k ⊙ e^{−γ})ᵀ overflows fp32 once a chunk's decay passes about
  −88 per channel. We take GLA's secondary chunking (as :mod:`~attnbench.attention.gated_scan`
  does; fla's ``chunk_kda`` does the same in sub-chunks of 16, ``fla/ops/kda/chunk_intra.py``):
  each chunk is cut into sub-blocks of s positions; for i in a sub-block before r's,
  E_ri = e^{Σ over r's sub-block up to r} · e^{Σ over the sub-blocks between} · e^{Σ over i's
  sub-block after i}, all three exponents ≤ 0 and each a segment's own sum, so those scores
  are a matmul of (q or k) ⊙ e^{first} and k ⊙ e^{between + after}; only the s × s diagonal
  sub-blocks are formed elementwise (s × s × dk). A chunk then holds c·dk·(c/s + s) numbers,
  least at s = √c: :data:`SUB` = 8 for c = 64. The alternative, every E_ri formed
  elementwise (c² · dk per chunk), holds c/16 times more.
* No exponent is a difference of cumulative sums: a −∞ (a packed document's start, where the
  state is dropped) only ever adds, so resets cost nothing extra and never make −∞ − (−∞).
* Everything that does not depend on S_0 (the scores, T, W, Ũ) is computed for all chunks at
  once (one batched triangular solve, unitriangular); the loop over chunks does the four
  matmuls that carry S, as :func:`~attnbench.attention.delta_scan.delta_chunked`.
* Padding, the last chunk, the dtype: as :mod:`~attnbench.attention.delta_scan` (a padded
  token is β = 0, g = 0, q = k = v = 0, set by ``torch.where``; at least fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.attention.decays import check_starts, segment_decays, suffix_sums
from attnbench.attention.delta_scan import DEFAULT_CHUNK, _chunks, _state, _wide_dtype
from attnbench.validators import check_int

SUB = 8  # positions per sub-block of a chunk: the cross-block scores are matmuls


def _clean(
    real: Tensor | None, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The inputs in the accumulation dtype, g checked against k's shape, each 0 where
    ``real`` (broadcastable to beta's shape) is False, by ``torch.where`` (a NaN there is
    dropped, not kept as NaN · 0): β = 0, g = 0 make the step the identity, q = 0 its output 0."""
    if g.shape != k.shape:
        raise ValueError(f"g: must be (b, h, n, dk) = {tuple(k.shape)}, got {tuple(g.shape)}")
    dtype = _wide_dtype(q, k, v, beta, g)
    q, k, v, beta, g = (t.to(dtype) for t in (q, k, v, beta, g))
    if real is not None:
        zero = torch.zeros((), dtype=dtype, device=q.device)
        q, k, v, g = (torch.where(real[..., None], t, zero) for t in (q, k, v, g))
        beta = torch.where(real, beta, zero)
    return q, k, v, beta, g


def kda_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The oracle: the recurrence token by token, I − β k kᵀ formed as a dk × dk matrix.
    q, k (b, h, n, dk), v (b, h, n, dv), g (b, h, n, dk), beta (b, h, n), mask (b, n) True = real,
    initial_state (b, h, dk, dv), ``starts`` (b, n) True where a packed document begins (the
    state set to zeros there, before the token). Returns o (b, h, n, dv) and S_n."""
    check_starts(starts, q)
    real = None if mask is None else mask[:, None, :]
    q, k, v, beta, g = _clean(real, q, k, v, beta, g)
    s = _state(initial_state, q, v)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    outs = []
    for t in range(q.shape[2]):
        if starts is not None:
            s = torch.where(starts[:, t, None, None, None], 0.0, s)
        k_t, b_t = k[:, :, t, :, None], beta[:, :, t, None, None]  # (b, h, dk, 1), (b, h, 1, 1)
        s = g[:, :, t, :, None].exp() * s  # Diag(α_t) S
        s = (eye - b_t * k_t @ k_t.mT) @ s + b_t * k_t @ v[:, :, t, None, :]
        outs.append((s.mT @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2), s


def kda_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    g_t: Tensor,
    beta_t: Tensor,
    state: Tensor,
    *,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One token per sequence, for decode: q_t, k_t (b, h, dk), v_t (b, h, dv), g_t (b, h, dk),
    beta_t (b, h), state (b, h, dk, dv), mask (b,) True = real. Returns o_t (b, h, dv) and the new
    state (``state`` is not written). As a rank-one update on the decayed state D = Diag(α) S,
    S' = D + k (β (v − Dᵀk))ᵀ: O(dk·dv), no dk × dk matrix."""
    real = None if mask is None else mask[:, None]
    q_t, k_t, v_t, beta_t, g_t = _clean(real, q_t, k_t, v_t, beta_t, g_t)
    s = g_t.exp()[..., None] * state.to(q_t.dtype)
    u = beta_t[..., None] * (v_t - (s.mT @ k_t[..., None])[..., 0])  # (b, h, dv)
    s = s + k_t[..., :, None] * u[..., None, :]
    return (s.mT @ q_t[..., None])[..., 0], s


def decayed_scores(a: Tensor, b: Tensor, g: Tensor) -> Tensor:
    """M_ri = Σ_d a_rd b_id e^{Σ_{i<t≤r} g_td} for i ≤ r, 0 above the diagonal: a, b, g
    (…, c, dk) -> (…, c, c), in sub-blocks of :data:`SUB` positions (module docstring):
    matmuls across sub-blocks, the diagonal sub-blocks elementwise."""
    c = a.shape[-2]
    s = min(SUB, c)
    pad = -c % s  # zero positions after the chunk: no score reaches them that is kept
    if pad:
        a, b, g = (F.pad(t, (0, 0, 0, pad)) for t in (a, b, g))
    blocks = (c + pad) // s
    a, b, g = (t.unflatten(-2, (blocks, s)) for t in (a, b, g))  # (…, P, s, dk)
    a_in = a * g.cumsum(-2).exp()  # × e^{Σ over r's sub-block up to r}
    b_out = b * suffix_sums(g).exp()  # × e^{Σ over i's sub-block after i}
    between = segment_decays(g.sum(-2))  # [p, m]: e^{Σ_{m < m' ≤ p} total_m'}, 0 for m > p
    # [p, m]: e^{Σ_{m < m' < p} total_m'} for m < p (row p − 1 of between), else 0
    upto = torch.cat([torch.zeros_like(between[..., :1, :, :]), between[..., :-1, :, :]], -3)
    keys = (upto.unsqueeze(-2) * b_out.unsqueeze(-4)).flatten(-3, -2)  # (…, P, P·s, dk)
    cross = (a_in @ keys.mT).unflatten(-1, (blocks, s))  # (…, P, s, P, s): 0 where m ≥ p
    inner = (a.unsqueeze(-2) * b.unsqueeze(-3) * segment_decays(g)).sum(-1)  # (…, P, s, s)
    eye = torch.eye(blocks, dtype=a.dtype, device=a.device)[:, None, :, None]
    full = (cross + inner.unsqueeze(-2) * eye).flatten(-4, -3).flatten(-2, -1)
    return full[..., :c, :c]


def _intra(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every chunk at once, nothing that depends on the carried state. In (b, h, N, c, ·):
    W, Ũ, P (lower, diagonal included), Γ ⊙ Q (reads S_0), K ⊙ E_c· (writes S_c), and
    Γ_c (b, h, N, dk)."""
    a = (beta[..., None] * decayed_scores(k, k, g)).tril(-1)  # the solve takes 1 on the diagonal
    t = torch.linalg.solve_triangular(a, torch.diag_embed(beta), upper=False, unitriangular=True)
    gamma = g.cumsum(-2)  # γ_r; −∞ from a document's start on, never subtracted
    read = gamma.exp()
    return (
        t @ (k * read),
        t @ v,
        decayed_scores(q, k, g),
        q * read,
        k * suffix_sums(g).exp(),
        gamma[..., -1, :].exp(),
    )


def kda_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    chunk: int = DEFAULT_CHUNK,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked form (module docstring), equal to :func:`kda_reference` to rounding: same
    arguments, plus ``chunk`` (an integer ≥ 1; the last chunk may be shorter, a chunk past n
    is one chunk of n); at a packed document's start (``starts``) g = −∞ drops the state
    before the token's write. Returns o (b, h, n, dv) and S_n (b, h, dk, dv)."""
    chunk = check_int("chunk", chunk)
    real = None if mask is None else mask[:, None, :]
    q, k, v, beta, g = _clean(real, q, k, v, beta, g)
    check_starts(starts, q)
    if starts is not None:
        g = torch.where(starts[:, None, :, None], float("-inf"), g)
    s = _state(initial_state, q, v)
    b, h, n, dv = *q.shape[:3], v.shape[-1]
    if n == 0:
        return v, s
    c = min(chunk, n)
    pad = -n % c
    q, k, v, beta, g = (_chunks(t, c, pad) for t in (q, k, v, beta, g))
    w, u_tilde, p, q_in, k_out, last = _intra(q, k, v, beta, g)
    outs = []
    for w_j, u_j, p_j, q_j, k_j, d_j in zip(
        *(t.unbind(2) for t in (w, u_tilde, p, q_in, k_out, last)), strict=True
    ):  # the state carried across chunks: four matmuls per chunk
        u = u_j - w_j @ s  # pseudo-values, (b, h, c, dv)
        outs.append(q_j @ s + p_j @ u)
        s = d_j[..., None] * s + k_j.mT @ u
    return torch.stack(outs, dim=2).reshape(b, h, -1, dv)[:, :, :n], s


def chunked_flops(n: int, dk: int, dv: int, chunk: int) -> int:
    """Matmul FLOPs of :func:`kda_chunked` for one (batch, head), as FlopCounterMode counts
    them, c = min(chunk, n), N = ⌈n / c⌉ chunks (the last padded to c): per chunk the two
    score matrices' cross-block matmuls (K with K, Q with K) at 2·z²·dk each, z = c rounded
    up to a multiple of min(:data:`SUB`, c) (the diagonal sub-blocks are elementwise), T·(Γ⊙K)
    at 2·c²·dk, T V and P U at 2·c²·dv each, and the three state matmuls W S, Q S and Kᵀ U at
    2·c·dk·dv each. The triangular solve is no matmul (FlopCounterMode does not count it)."""
    if n == 0:
        return 0
    c = min(chunk, n)
    u = min(SUB, c)
    z = -(-c // u) * u
    return -(-n // c) * (4 * z * z * dk + 2 * c * c * (dk + 2 * dv) + 6 * c * dk * dv)
