"""The (gated) delta rule, the core shared by DeltaNet and Gated DeltaNet: a reference, a
chunked form and a decode step on tensors. Not a mechanism; registers nothing.

Per head, with a state S ∈ R^{dk×dv}, a write strength β_t ∈ (0, 1) and a decay α_t ∈ (0, 1]

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,    o_t = S_tᵀ q_t

(DeltaNet: Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", with α = 1; Gated DeltaNet: Yang et al. 2025, "Gated Delta Networks"). The
papers keep S as dv × dk and multiply on the right; this is its transpose, so that
the state reads (b, h, dk, dv) as q, k and v read (b, h, n, d). α_t arrives as its log,
g_t = log α_t ≤ 0; ``g=None`` is α = 1, DeltaNet. The core does not normalise keys: the layer
does (L2, as both papers). Along k_t the transition scales by 1 − β_t‖k_t‖², so the state stays
bounded only while β_t‖k_t‖² ≤ 2; with unit keys and β ∈ (0, 1) the transition has norm 1
(1 − β along k, 1 across it): it never amplifies the state.

The chunked form (the papers' chunkwise algorithm: the WY representation by the UT transform).
Within a chunk of c positions r = 1..c starting from S_0, with γ_r = Σ_{i≤r} g_i, Γ_r = e^{γ_r}
and the decay ratios D_ri = e^{γ_r − γ_i} (r ≥ i), unrolling gives S_r = Γ_r S_0 +
Σ_{i≤r} D_ri k_i u_iᵀ with pseudo-values u_r = β_r (v_r − Γ_r S_0ᵀk_r − Σ_{i<r} D_ri (k_rᵀk_i) u_i),
that is (I + A) U = diag(β)(V − diag(Γ) K S_0), A = strictly-lower(diag(β) (K Kᵀ ⊙ D)). So

    T = (I + A)⁻¹ diag(β),   W = T diag(Γ) K,   Ũ = T V,   U = Ũ − W S_0
    O = diag(Γ) Q S_0 + (Q Kᵀ ⊙ D, lower incl. the diagonal) U
    S_c = Γ_c S_0 + (diag(Γ_c / Γ) K)ᵀ U

Choices, and why:

* Everything that does not depend on S_0 (D, A, T, W, Ũ, the masked Q Kᵀ) is computed for all
  chunks at once, as batched c × c matmuls and one batched triangular solve
  (``solve_triangular``, unitriangular: A's diagonal is never read); the loop over chunks does
  only the four matmuls that carry S. That is the structure the fused kernels have, and it
  holds O(c²) per chunk, n·c numbers in all, never n². A training step also keeps the n/c
  carried states.
* Decays in log space: D is exp of γ_r − γ_i masked to the causal triangle with −∞ *before*
  exponentiating, Γ_r and Γ_c/Γ_i are exps of non-positive numbers; no ratio is ever formed as
  a quotient, so a strong decay underflows to 0 and nothing overflows.
* n need not be a multiple of c: the last chunk is padded with β = 0, g = 0, k = v = q = 0,
  which is exactly a padded token (state unchanged, output 0) and is cut off the output. A
  chunk past n is one chunk of n.
* Padding (``mask`` (b, n), True = a real token): at a padded position the state is carried
  unchanged (decay 1, no write) and the output is 0. The padded q, k, v, β and g are replaced
  by 0 with ``torch.where`` before any arithmetic, so a NaN there reaches no real output and no
  gradient (a multiplication by 0 would keep NaN).
* Arithmetic in at least fp32 (fp64 stays fp64); the output and the final state are returned
  in that accumulation dtype; callers cast back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.attention.decays import check_starts, segment_decays, suffix_sums
from attnbench.validators import check_int

DEFAULT_CHUNK = 64


def state_elements(dk: int, dv: int) -> int:
    """The state of one head, S ∈ R^{dk×dv}: dk·dv elements whatever the context length."""
    return dk * dv


def _wide_dtype(*ts: Tensor | None) -> torch.dtype:
    """The accumulation dtype: fp32 at least, fp64 if any input is fp64."""
    dtype = torch.float32
    for t in ts:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _clean(
    real: Tensor | None, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The inputs in the accumulation dtype, each 0 where ``real`` (broadcastable to beta's
    shape) is False: by ``torch.where``, so a NaN at a padded position is dropped, not kept
    as NaN · 0. β = 0 and g = 0 there make the step the identity, q = 0 makes its output 0."""
    dtype = _wide_dtype(q, k, v, beta, g)
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    g = None if g is None else g.to(dtype)
    if real is not None:
        zero = torch.zeros((), dtype=dtype, device=q.device)
        q, k, v = (torch.where(real[..., None], t, zero) for t in (q, k, v))
        beta = torch.where(real, beta, zero)
        g = None if g is None else torch.where(real, g, zero)
    return q, k, v, beta, g


def _state(initial_state: Tensor | None, q: Tensor, v: Tensor) -> Tensor:
    """S_0 in q's (accumulation) dtype: ``initial_state`` (b, h, dk, dv), else zeros."""
    b, h, dk, dv = *q.shape[:2], q.shape[-1], v.shape[-1]
    if initial_state is None:
        return q.new_zeros(b, h, dk, dv)
    return initial_state.to(q.dtype)


def delta_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The oracle: the recurrence token by token, I − β k kᵀ formed as a dk × dk matrix.
    q, k (b, h, n, dk), v (b, h, n, dv), beta and g (b, h, n), mask (b, n) True = real,
    initial_state (b, h, dk, dv), ``starts`` (b, n) True where a packed document begins
    (the state set to zeros there, before the token). Returns o (b, h, n, dv) and S_n
    (b, h, dk, dv)."""
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
        s = (eye - b_t * k_t @ k_t.mT) @ s
        if g is not None:
            s = g[:, :, t, None, None].exp() * s
        s = s + b_t * k_t @ v[:, :, t, None, :]
        outs.append((s.mT @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2), s


def delta_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    beta_t: Tensor,
    g_t: Tensor | None,
    state: Tensor,
    *,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One token per sequence, for decode: q_t, k_t (b, h, dk), v_t (b, h, dv), beta_t and
    g_t (b, h) (g_t None: DeltaNet), state (b, h, dk, dv), mask (b,) True = real. Returns
    o_t (b, h, dv) and the new state (a new tensor: ``state`` is not written). As a rank-one
    update, S' = α S + k (β (v − α Sᵀk))ᵀ: O(dk·dv), no dk × dk matrix."""
    real = None if mask is None else mask[:, None]
    q_t, k_t, v_t, beta_t, g_t = _clean(real, q_t, k_t, v_t, beta_t, g_t)
    s = state.to(q_t.dtype)
    if g_t is not None:
        s = g_t.exp()[..., None, None] * s
    u = beta_t[..., None] * (v_t - (s.mT @ k_t[..., None])[..., 0])  # (b, h, dv)
    s = s + k_t[..., :, None] * u[..., None, :]
    return (s.mT @ q_t[..., None])[..., 0], s


def _chunks(t: Tensor, c: int, pad: int) -> Tensor:
    """(b, h, n, ·) or (b, h, n) -> (b, h, N, c, ·) or (b, h, N, c), zero-padded to N·c."""
    if t.dim() == 3:
        return F.pad(t, (0, pad)).unflatten(2, (-1, c))
    return F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, c))


def _intra(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, resets: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Every chunk at once, nothing that depends on the carried state. In (b, h, N, c, ·):
    returns W, Ũ, P = Q Kᵀ ⊙ D (lower, diagonal included), the queries scaled by Γ (read
    S_0), the keys scaled by Γ_c / Γ (write S_c), and Γ_c (b, h, N) (None without a gate).
    ``resets``: g holds −∞ (a packed document's start), so each ratio's exponent is its
    segment's own sum (:mod:`~attnbench.attention.decays`), never a difference of
    cumulative sums, which would make −∞ − (−∞)."""
    c = q.shape[-2]
    kk, qk = k @ k.mT, q @ k.mT  # (b, h, N, c, c)
    if g is None:
        ratios, k_in, q_in, k_out, last = None, k, q, k, None
    else:
        gamma = g.cumsum(-1)  # (b, h, N, c)
        if resets:
            ratios = segment_decays(g[..., None])[..., 0]
            k_out = k * suffix_sums(g[..., None]).exp()
        else:
            future = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
            ratios = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(future, -torch.inf)
            ratios = ratios.exp()  # D_ri = e^{γ_r − γ_i}, r ≥ i; 0 above the diagonal
            k_out = k * (gamma[..., -1:] - gamma).exp()[..., None]
        k_in, q_in = (t * gamma.exp()[..., None] for t in (k, q))
        last = gamma[..., -1].exp()
        kk, qk = kk * ratios, qk * ratios
    a = (beta[..., None] * kk).tril(-1)  # strictly lower: the solve takes its diagonal as 1
    t = torch.linalg.solve_triangular(a, torch.diag_embed(beta), upper=False, unitriangular=True)
    p = qk.tril() if ratios is None else qk  # qk ⊙ D is already 0 above the diagonal
    return t @ k_in, t @ v, p, q_in, k_out, last


def delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    chunk: int = DEFAULT_CHUNK,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked form (module docstring), equal to :func:`delta_reference` to rounding:
    same arguments, plus ``chunk`` (an integer ≥ 1; the last chunk may be shorter, a chunk
    past n is one chunk of n) and ``starts`` (b, n) bool, True where a packed document
    begins: there the state is dropped (α = 0, g = −∞) before the token's write, so no
    document reads another. Returns o (b, h, n, dv) and S_n (b, h, dk, dv)."""
    chunk = check_int("chunk", chunk)
    real = None if mask is None else mask[:, None, :]
    q, k, v, beta, g = _clean(real, q, k, v, beta, g)
    check_starts(starts, q)
    if starts is not None:
        g = beta.new_zeros(beta.shape) if g is None else g
        g = torch.where(starts[:, None, :], float("-inf"), g)
    s = _state(initial_state, q, v)
    b, h, n, dv = *q.shape[:3], v.shape[-1]
    c = min(chunk, n)
    pad = -n % c
    q, k, v, beta = (_chunks(t, c, pad) for t in (q, k, v, beta))
    g = None if g is None else _chunks(g, c, pad)
    # unbind, not [:, :, j]: one stack in the backward, not a whole-size gradient per chunk
    w, u_tilde, p, q_in, k_out, last = _intra(q, k, v, beta, g, starts is not None)
    decay = (None,) * q.shape[2] if last is None else last[..., None, None].unbind(2)
    outs = []
    for w_j, u_j, p_j, q_j, k_j, d_j in zip(
        *(t.unbind(2) for t in (w, u_tilde, p, q_in, k_out)), decay, strict=True
    ):  # the state carried across chunks: four matmuls per chunk
        u = u_j - w_j @ s  # pseudo-values, (b, h, c, dv)
        outs.append(q_j @ s + p_j @ u)
        s = (s if d_j is None else d_j * s) + k_j.mT @ u
    return torch.stack(outs, dim=2).reshape(b, h, -1, dv)[:, :, :n], s


def chunked_flops(n: int, dk: int, dv: int, chunk: int) -> int:
    """Matmul FLOPs of :func:`delta_chunked` for one (batch, head), as FlopCounterMode counts
    them, with c = min(chunk, n) and N = ⌈n / c⌉ chunks (the last padded to c): per chunk
    K Kᵀ, Q Kᵀ and T·(ΓK) at 2·c²·dk each, T V and P U at 2·c²·dv each, and the three
    state matmuls W S, Q S and Kᵀ U at 2·c·dk·dv each. The triangular solve that makes T is
    no matmul (FlopCounterMode does not count it): about c³ more per chunk."""
    c = min(chunk, n)
    chunks = -(-n // c)
    return chunks * (2 * c * c * (3 * dk + 2 * dv) + 6 * c * dk * dv)


def solve_backward_flops(n: int, chunk: int) -> int:
    """The one matmul in the triangular solve's backward, per (batch, head): the gradient of
    its matrix, −G_B Tᵀ, 2·c³ per chunk (the backward beyond twice the forward's matmuls)."""
    c = min(chunk, n)
    return -(-n // c) * 2 * c**3


def step_flops(dk: int, dv: int) -> int:
    """Matmul FLOPs of :func:`delta_step` for one (sequence, head): Sᵀk and Sᵀq, 2·dk·dv each."""
    return 4 * dk * dv


def skipped_backward_flops(n: int, dk: int, dv: int, chunk: int) -> int:
    """What a backward of :func:`delta_chunked` from a zero state does not compute of twice
    its forward matmuls, per (batch, head), c = min(chunk, n): the first chunk's W S and Q S
    need no gradient of the zero state (2·c·dk·dv each), and the last chunk's write Kᵀ U
    reaches no output (2·2·c·dk·dv)."""
    c = min(chunk, n)
    return 8 * c * dk * dv
