"""The gated linear recurrence that RetNet, GLA and Mamba-2 (SSD) share, as cores on tensors:
the recurrence token by token (the oracle), its chunked form (what is benchmarked) and the
decode step. Not a mechanism; registers nothing.

Per head, with a state S_t ∈ R^{dk × dv} and log-decays g_t ≤ 0,

    S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,   o_t = S_tᵀ q_t,   α_t = exp(g_t) ∈ (0, 1]^{dk}

and g broadcast to (b, h, n, dk) from one of three shapes:

* GLA (Yang et al. 2023, gated linear attention): α_t per key dimension and data-dependent,
  g (b, h, n, dk);
* Mamba-2 (Dao & Gu 2024, the SSD layer): a scalar per head and position, g = Δ_t·A_h of
  shape (b, h, n, 1), with C as q, B as k and x as v (D, the convolution and the gate are the
  layer's, not the core's);
* RetNet (Sun et al. 2023, retention): one fixed γ_h per head, g = log γ_h of shape (1, h, 1, 1).

The chunked form cuts the sequence into chunks of c positions. In a chunk, with the state S_0
carried from the chunks before and G_i = Σ_{t ≤ i} g_t summed from the chunk's first position,

    o_i = (q_i ⊙ e^{G_i})ᵀ S_0 + Σ_{j ≤ i} (Σ_d q_id k_jd e^{G_id − G_jd}) v_j
    S_next = diag(e^{G_last}) S_0 + Σ_j (k_j ⊙ e^{G_last − G_j}) v_jᵀ

Choices, and why:

* Every exponent taken is ≤ 0, so nothing overflows however strong the decay. The tempting
  factorisation (q ⊙ e^{G})(k ⊙ e^{−G})ᵀ overflows fp32 once a chunk's total decay passes
  about −88 (chunk 64 at g ≈ −1.4 per token); instead each ratio's exponent is masked to the
  causal triangle (−∞ above it) before it is exponentiated.
* Each exponent is summed over its own segment, Σ_{j < t ≤ i} g_t, not taken as G_i − G_j:
  two cumulative sums near −1000 differing by 1 keep that 1 only to 6e-5 in fp32, its own
  sum to 6e-8. With g down to −60 per token the chunked form in fp32 is 8e-7 from float64,
  the fp32 recurrence 1.3e-6, differences of cumulative sums 4e-5.
* A scalar decay (Mamba-2, RetNet): the intra-chunk term is (Q Kᵀ ⊙ D) V with
  D_ij = e^{G_i − G_j} on and below the diagonal, c × c: matmuls. A decay fixed over
  positions (RetNet's) gives every chunk of a size the same decays: built once per size.
* A decay per key dimension (GLA) makes the ratio depend on d, so the intra-chunk scores are
  no matmul of the inputs. As in GLA's secondary-level chunking, the chunk is cut into
  sub-blocks of s positions: for j in a sub-block before i's, whose first position is r,
  e^{G_i − G_j} = e^{G_i − G_r}·e^{G_r − G_j}, both exponents ≤ 0, so those scores are a
  matmul of (q ⊙ e^{G − G_r}) and (k ⊙ e^{G_r − G}); only the s × s diagonal sub-blocks are
  formed elementwise. A chunk holds c·dk·(c/s + s) numbers, least at s = √c: :data:`SUB` = 8.
* The inputs are split into chunks once and the outputs concatenated once (one cat and one
  split in the backward, as :mod:`attnbench.attention.prefix`); training keeps n/c states.
* Padding (``mask`` (b, n), True = real token): there q, k, v and g are replaced by 0 with
  ``torch.where`` (a product would keep a NaN): decay 1, no write, output 0.
* Sums run in at least fp32 (fp64 stays fp64), returned in that dtype. g ≤ 0 is assumed, not
  checked: a check would synchronise the device on every call.

The decode step is the recurrence for one token, returning the new state (where it lives is
the caller's). A prefill by :func:`gated_chunked` and then one :func:`gated_step` per token
equal one pass over the whole sequence. The state is dk·dv numbers per head whatever the
context (:func:`state_elements`); there is no normaliser to carry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.attention.decays import check_starts, segment_decays, suffix_sums
from attnbench.validators import check_int

DEFAULT_CHUNK = 64
SUB = 8  # positions per sub-block of a chunk when the decay is per key dimension


def state_elements(dk: int, dv: int) -> int:
    """One sequence's state in one head: dk·dv elements, whatever n."""
    return dk * dv


def _check(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, mask: Tensor | None, state: Tensor | None
) -> None:
    """One ``ValueError`` line naming the argument whose shape does not fit q's."""
    b, h, n, dk = q.shape
    if k.shape != q.shape or v.dim() != 4 or v.shape[:-1] != q.shape[:-1]:
        got = f"{tuple(k.shape)} and {tuple(v.shape)}"
        raise ValueError(
            f"k, v: must be (b, h, n, dk) = {(b, h, n, dk)} and (b, h, n, dv), got {got}"
        )
    full = (b, h, n, dk)
    if g.dim() != 4 or any(s not in (1, f) for s, f in zip(g.shape, full, strict=True)):
        raise ValueError(f"g: must broadcast to (b, h, n, dk) = {full}, got {tuple(g.shape)}")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (b, n)):
        raise ValueError(
            f"mask: must be bool (b, n) = {(b, n)}, got {mask.dtype} {tuple(mask.shape)}"
        )
    if state is not None and state.shape != (b, h, dk, v.shape[-1]):
        want = (b, h, dk, v.shape[-1])
        raise ValueError(
            f"initial_state: must be (b, h, dk, dv) = {want}, got {tuple(state.shape)}"
        )


def _prepare(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    mask: Tensor | None,
    state: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """q (scaled), k, v, g (over every position, its last size 1 or dk) and the state (zeros if
    None), in the accumulation dtype, padded positions replaced by 0."""
    _check(q, k, v, g, mask, state)
    dtype = torch.float32
    for t in (q, k, v, g, state):
        dtype = dtype if t is None else torch.promote_types(dtype, t.dtype)
    b, h, n, dk = q.shape
    q, k, v = (t.to(dtype) for t in (q, k, v))
    g = g.to(dtype).expand(*g.shape[:2], n, g.shape[-1])
    if mask is not None:
        real = mask[:, None, :, None]
        q, k, v, g = (torch.where(real, t, 0.0) for t in (q, k, v, g))
    if state is None:
        state = torch.zeros(b, h, dk, v.shape[-1], dtype=dtype, device=q.device)
    return (q if scale == 1 else q * scale), k, v, g, state.to(dtype)


def _update(state: Tensor, g_t: Tensor, k_t: Tensor, v_t: Tensor) -> Tensor:
    """diag(e^{g_t}) S + k_t v_tᵀ for one position: g_t (…, 1 or dk), k_t (…, dk), v_t (…, dv)."""
    return g_t.exp().unsqueeze(-1) * state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)


def gated_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    scale: float = 1.0,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The recurrence token by token, the oracle: q, k (b, h, n, dk), v (b, h, n, dv), g
    broadcastable to (b, h, n, dk), ``initial_state`` (b, h, dk, dv) or None (zeros) ->
    output (b, h, n, dv) and the state after the last token. ``starts`` (b, n): where a
    packed document begins, the state is set to zeros before the token's write."""
    check_starts(starts, q)
    q, k, v, g, state = _prepare(q, k, v, g, mask, initial_state, scale)
    outs = [v[..., :0, :]]  # so that n = 0 concatenates too
    for t in range(q.shape[-2]):
        if starts is not None:
            state = torch.where(starts[:, t, None, None, None], 0.0, state)
        state = _update(state, g[..., t, :], k[..., t, :], v[..., t, :])
        outs.append(q[..., t : t + 1, :] @ state)
    return torch.cat(outs, dim=-2), state


def gated_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    g_t: Tensor,
    state: Tensor,
    *,
    scale: float = 1.0,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One token per sequence, the decode step: q_t, k_t (b, h, dk), v_t (b, h, dv), g_t
    broadcastable to (b, h, dk), ``state`` (b, h, dk, dv), ``mask`` (b,) True = real ->
    o_t (b, h, dv) and the new state (``state`` itself is left as it was)."""
    row = None if mask is None else mask[:, None]
    q, k, v, g, state = _prepare(
        *(t.unsqueeze(-2) for t in (q_t, k_t, v_t, g_t)), row, state, scale
    )
    new = _update(state, g[..., 0, :], k[..., 0, :], v[..., 0, :])
    return (q @ new).squeeze(-2), new


def gated_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    chunk: int = DEFAULT_CHUNK,
    scale: float = 1.0,
    mask: Tensor | None = None,
    initial_state: Tensor | None = None,
    starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked form, in chunks of ``chunk`` positions (the last may be shorter; a chunk
    past n is one block of n): arguments and results as :func:`gated_reference`. Per chunk:
    the intra-chunk scores with their decay ratios (causal, the diagonal included), the
    carried state read by the decayed queries, then the state carried on.

    ``starts`` (b, n) bool, True where a packed document begins: there the decay is 0
    (g = −∞), so nothing before it reaches it or anything after it; every exponent is a
    segment's own sum, never a difference, so −∞ stays −∞ and never meets another."""
    chunk = check_int("chunk", chunk)
    check_starts(starts, q)
    q, k, v, g, state = _prepare(q, k, v, g, mask, initial_state, scale)
    if starts is not None:
        g = torch.where(starts[:, None, :, None], float("-inf"), g)
    if q.shape[-2] == 0:
        return v, state
    # a decay fixed over positions (RetNet's γ, no padding: still a stride-0 view) makes the
    # same decays in every chunk of a size: built once per size, not once per chunk
    fixed = g.stride(-2) == 0
    decays: dict[int, tuple[Tensor, Tensor, Tensor, Tensor | None]] = {}
    outs = []
    for q_c, k_c, v_c, g_c in zip(*(t.split(chunk, dim=-2) for t in (q, k, v, g)), strict=True):
        size = q_c.shape[-2]
        if size not in decays or not fixed:
            read = g_c.cumsum(-2)  # G_i = Σ_{t ≤ i} g_t, (…, c, 1 or dk)
            last = read[..., -1:, :].transpose(-2, -1).exp()  # e^{G_last}, (…, 1 or dk, 1)
            inner = segment_decays(g_c).squeeze(-1) if g.shape[-1] == 1 else None
            decays[size] = (read.exp(), suffix_sums(g_c).exp(), last, inner)  # e^{G_last − G_j}
        read, after, last, inner = decays[size]
        if inner is None:
            intra = _intra_per_dim(q_c, k_c, v_c, g_c)
        else:
            intra = ((q_c @ k_c.transpose(-2, -1)) * inner) @ v_c  # (Q Kᵀ ⊙ D) V
        outs.append(intra + (q_c * read) @ state)
        written = (k_c * after).transpose(-2, -1) @ v_c
        state = last * state + written  # not in place: the read above saved it
    return torch.cat(outs, dim=-2), state


def _intra_per_dim(q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
    """Σ_{j ≤ i} (Σ_d q_id k_jd e^{G_id − G_jd}) v_j for a decay per key dimension, g
    (…, c, dk), in sub-blocks of :data:`SUB` positions: matmuls between sub-blocks, the
    diagonal sub-blocks elementwise (see the module's docstring)."""
    c = q.shape[-2]
    s = min(SUB, c)
    pad = -c % s  # a short chunk: zero positions after it (decay 1, no write, no read)
    if pad:
        q, k, v, g = (
            torch.cat([t, t.new_zeros(*t.shape[:-2], pad, t.shape[-1])], -2) for t in (q, k, v, g)
        )
    size = c + pad

    def cut(t: Tensor) -> Tensor:  # (…, size, ·) -> (…, size / s, s, ·)
        return t.unflatten(-2, (size // s, s))

    blocks = cut(g)  # (…, size / s, s, dk)
    from_first = blocks.clone()
    from_first[..., 0, :] = 0  # so that its cumulative sum is Σ_{r < t ≤ i} g_t = G_i − G_r
    q_r = cut(q) * from_first.cumsum(-2).exp()
    # e^{G_r − G_j} for j in an earlier sub-block m than i's, p, split at m's last position e:
    # e^{Σ_{j<t≤e} g_t} (j's own, within m) times e^{Σ_{e<t≤r} g_t} (one per (p, m) and d:
    # the totals of the sub-blocks between them and g_r), every exponent a segment's own sum
    k_e = cut(k) * suffix_sums(blocks).exp()
    between = segment_decays(blocks.sum(-2))  # [p, m]: e^{Σ_{m < m' ≤ p} T_m'} for p ≥ m, else 0
    # [p, m]: e^{Σ_{m < m' < p} T_m'} for m < p (row p − 1 of between), else 0
    upto = torch.cat([torch.zeros_like(between[..., :1, :, :]), between[..., :-1, :, :]], -3)
    cross = upto * blocks[..., 0, :].exp().unsqueeze(-2)  # times e^{g_r}, r = p's first
    to_first = (cross.unsqueeze(-2) * k_e.unsqueeze(-4)).flatten(-3, -2)  # (…, p, size, dk)
    out = (q_r @ to_first.transpose(-2, -1)) @ v.unsqueeze(-3)
    scores = (cut(q).unsqueeze(-2) * cut(k).unsqueeze(-3) * segment_decays(cut(g))).sum(-1)
    out = out + scores @ cut(v)  # the diagonal sub-blocks, (…, size / s, s, dv)
    return out.flatten(-3, -2)[..., :c, :]


def chunked_flops(n: int, dk: int, dv: int, chunk: int, per_dim: bool) -> int:
    """Matmul FLOPs of :func:`gated_chunked` for one (batch, head), as FlopCounterMode counts
    them. Per chunk of s positions: reading and writing the carried state, 2·s·dk·dv each
    (every chunk, the first included); the intra-chunk term, for a scalar decay (Q Kᵀ)V at
    2·s²·(dk + dv), for a decay per key dimension the sub-block matmuls at 2·z²·(dk + dv)
    plus the diagonal sub-blocks' scores times V at 2·z·u·dv, with u = min(:data:`SUB`, s)
    and z = s rounded up to a multiple of u."""
    total = 0
    for start in range(0, n, chunk):
        s = min(chunk, n - start)
        if per_dim:
            u = min(SUB, s)
            z = -(-s // u) * u
            total += 2 * z * z * (dk + dv) + 2 * z * u * dv
        else:
            total += 2 * s * s * (dk + dv)
        total += 4 * s * dk * dv
    return total


def step_flops(dk: int, dv: int) -> int:
    """Matmul FLOPs of :func:`gated_step` for one (sequence, head): the read qᵀS, 2·dk·dv
    (the update is elementwise)."""
    return 2 * dk * dv


def skipped_backward_flops(n: int, dk: int, dv: int, chunk: int) -> int:
    """What a backward of :func:`gated_chunked` from a zero state does not compute of twice
    its forward, per (batch, head): the first chunk's read of the zero state needs no
    gradient of the state (one matmul of its two, 2·s·dk·dv), and the last chunk's write
    reaches no output (neither, 2·2·s·dk·dv)."""
    first, last = min(chunk, n), n - (n - 1) // chunk * chunk
    return 2 * first * dk * dv + 4 * last * dk * dv
