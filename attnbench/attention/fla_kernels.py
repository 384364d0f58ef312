"""``kernel=fla``: the recurrent mixers' cores on flash-linear-attention's Triton kernels
(``pip install 'attnbench[fla]'``), CUDA only. Not a mechanism; registers nothing.

The layer stays ours (projections, gates, convolution, norms); only the core is theirs, on the
same inputs: the gated recurrence as ``chunk_gla`` (a decay per key dimension) or
``chunk_simple_gla`` (a scalar per head: RetNet, Mamba-2), the delta rule as
``chunk_delta_rule`` / ``chunk_gated_delta_rule``, and a decode step as their
``fused_recurrent_*``. Their layout is (batch, time, heads, dim), ours (batch, heads, time,
dim) transposed; their state (batch, heads, dk, dv) is ours. Their kernels fix the chunk at
64 and take no padding mask, so padded positions are zeroed here first (q, k, v, β and the
log-decay: the state carried unchanged, as our cores do). q, k and v go in the layer's dtype
(a layer's gates and normalised keys are fp32, its values fp16 in an fp16 cell: their kernels
want one), the decays, β and the state in at least fp32 (cast back by the caller's copy).
fla is imported only when a kernel is called, so that asking whether it can run
(:func:`why_unavailable`) imports nothing.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch
from torch import Tensor

NOT_INSTALLED = "flash-linear-attention is not installed (pip install 'attnbench[fla]')"
NO_TRITON = "flash-linear-attention needs triton, which is not installed"
NO_GPU = "flash-linear-attention's kernels are Triton, CUDA only, and no CUDA GPU is visible"
CHUNK = 64  # the chunk their kernels are compiled for


def why_unavailable() -> str | None:
    """One line saying why ``kernel=fla`` cannot run here, or None (nothing imported)."""
    if importlib.util.find_spec("fla") is None:
        return NOT_INSTALLED
    if importlib.util.find_spec("triton") is None:
        return NO_TRITON
    if not torch.cuda.is_available():
        return NO_GPU
    return None


def _op(package: str, name: str):
    return getattr(importlib.import_module(f"fla.ops.{package}"), name)


def _theirs(
    real: Tensor | None, dtypes: tuple[torch.dtype, ...], *ts: Tensor | None
) -> list[Tensor | None]:
    """(b, h, n, ·) or (b, h, n) as their (b, n, h, ·) / (b, n, h), contiguous, 0 where
    ``real`` (b, n) is False, each in its dtype of ``dtypes``."""
    out = []
    for t, dtype in zip(ts, dtypes, strict=True):
        if t is not None:
            t = t.to(dtype)
            if real is not None:
                keep = real[:, None, :, None] if t.dim() == 4 else real[:, None, :]
                t = torch.where(keep, t, 0.0)
            t = t.transpose(1, 2).contiguous()
        out.append(t)
    return out


def _device(q: Tensor) -> None:
    if q.device.type != "cuda":
        raise RuntimeError(why_unavailable() or f"kernel=fla has no kernels for {q.device.type}")


def gated(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, real: Tensor | None,
    state: Tensor | None, dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The gated recurrence of :func:`attnbench.attention.gated_scan.gated_chunked` (or its
    step, for one token with a state): q, k (b, h, n, dk), v (b, h, n, dv), g broadcastable
    to (b, h, n, dk) -> (o (b, h, n, dv), the final state (b, h, dk, dv))."""
    _device(q)
    b, h, n, dk = q.shape
    per_dim = g.shape[-1] > 1
    g = g.expand(b, h, n, dk if per_dim else 1)
    g = g if per_dim else g[..., 0]
    wide = torch.promote_types(dtype, torch.float32)
    q, k, v, g = _theirs(real, (dtype, dtype, dtype, wide), q, k, v, g)
    step = state is not None and n == 1
    state = None if state is None else state.to(wide)
    kw = {"scale": scale, "initial_state": state, "output_final_state": True}
    if per_dim:
        if step:
            o, s = _op("gla", "fused_recurrent_gla")(q, k, v, gk=g, **kw)
        else:
            o, s = _op("gla", "chunk_gla")(q, k, v, g=g, **kw)
    else:
        name = "fused_recurrent_simple_gla" if step else "chunk_simple_gla"
        o, s = _op("simple_gla", name)(q, k, v, g=g, **kw)
    return o.transpose(1, 2), s


def delta(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, real: Tensor | None,
    state: Tensor | None, dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The delta rule of :func:`attnbench.attention.delta_scan.delta_chunked` (or its step):
    q (already scaled), k (L2-normalised), v (b, h, n, ·), beta and g (b, h, n), g None for
    DeltaNet -> (o (b, h, n, dv), the final state)."""
    _device(q)
    step = state is not None and q.shape[2] == 1
    wide = torch.promote_types(dtype, torch.float32)
    q, k, v, beta, g = _theirs(real, (dtype, dtype, dtype, wide, wide), q, k, v, beta, g)
    state = None if state is None else state.to(wide)
    kw = {"scale": 1.0, "initial_state": state, "output_final_state": True}
    if g is None:
        name = "fused_recurrent_delta_rule" if step else "chunk_delta_rule"
        o, s = _op("delta_rule", name)(q, k, v, beta=beta, **kw)
    else:
        name = "fused_recurrent_gated_delta_rule" if step else "chunk_gated_delta_rule"
        o, s = _op("gated_delta_rule", name)(q, k, v, g=g, beta=beta, **kw)
    return o.transpose(1, 2), s
