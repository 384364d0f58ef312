"""Our two recurrence cores against flash-linear-attention's own plain PyTorch references (the
``naive.py`` modules of fla-core 0.6.0, loaded by path without triton: tests/fla_naive.py), on
identical inputs: delta_reference and delta_chunked (ours, g given / None) against their gated
delta rule / delta rule, gated_reference and gated_chunked against their GLA (a decay per key
dimension), simple GLA (a scalar per head and position: Mamba-2) and retention (a fixed decay
per head: RetNet). Outputs, and final states where they return one. Each test skips, with the
reason, where fla-core is not installed.

Identical inputs, as their signatures want them: their (B, T, H, ·) or (B, H, T, ·) from our
(b, h, n, ·), states (B, H, K, V) as ours; their default scale K^-1/2 (several fix it) given
to ours (``scale=`` for the gated core, q pre-scaled for the delta rule, which takes none);
the same random initial state where they take one; keys L2-normalised for the delta rule, as
the layers do, and once raw (norm near 1, not 1) to show that neither side normalises.
Sizes b = 2, h = 2, n = 37, dk = dv = 16, our chunk 16 (two full chunks and a short one);
fla's chunked references that pad T run with chunk_size 16 too; delta_rule_chunkwise and
delta_rule_parallel want T a multiple of their chunk and take no initial state: n = 32,
chunk 8 (parallel: blocks of 16 and 8), from a zero state.

Their code casts to float32 inside except delta_rule_chunkwise and delta_rule_parallel, which
keep float64. So: inputs are drawn in float32, given to them in float32 and to ours as the same
numbers in float64; ours is then exact to ~1e-15 (tests/test_delta_scan.py,
tests/test_gated_scan.py) and the residual is their float32 rounding. Measured here, the
largest over our reference and chunked forms, output / final state (|values| ≤ 4.2):

* gated delta rule, recurrent 2.0e-7 / 1.1e-7 (raw keys 1.7e-7 / 1.3e-7), chunked
  (chunk_size 16) 1.8e-7 / 1.3e-7 (raw keys 1.8e-7 / 9.3e-8);
* delta rule, recurrent 3.3e-7 / 3.8e-7 (raw keys 4.2e-7 / 3.3e-7); in float64, chunkwise
  1.4e-15 / 1.6e-15 (raw keys 1.2e-15 / 1.3e-15), parallel 1.3e-15 (1.1e-15), output only;
* GLA recurrent 3.0e-7 / 2.6e-7; simple GLA recurrent 2.6e-7 / 2.6e-7, chunked 4.2e-7 /
  1.4e-7, parallel 5.7e-7 (output only); retention 6.1e-7 (output only).

Tolerances: float32, 1e-5 of max(1, the largest |value|). fp32's unit roundoff is 6e-8; one
output sums n·dk ≈ 600 products, a worst-case bound of ~600·6e-8 ≈ 4e-5 of the terms'
magnitude and ~√600·6e-8 ≈ 1.5e-6 as rounding errors add in practice; the residuals above
are at most 2.6e-7 of the largest value, so 1e-5 leaves a margin of forty, while the
disagreements tried on these inputs (scale 1 for K^-1/2, the initial state transposed, the
decay applied to the write too, g or β one position off, the gate dropped) were 0.5 to 7.
Float64: 1e-12, a thousand times the 1.6e-15 measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torch.nn.functional import logsigmoid, normalize

from attnbench.attention.delta_scan import delta_chunked, delta_reference
from attnbench.attention.gated_scan import gated_chunked, gated_reference
from tests import fla_naive

B, H, N, DK, DV = 2, 2, 37, 16, 16
CHUNK = 16  # ours, and fla's chunked references that pad T to a multiple of it
N_EXACT, CHUNK_EXACT = 32, 8  # delta_rule_chunkwise / _parallel: T a multiple of the chunk
SCALE = DK**-0.5  # their default (or fixed) scale
F32_TOL = 1e-5  # of max(1, largest |value|): module docstring
F64_TOL = 1e-12

Pairs = list[tuple[str, Tensor, Tensor]]  # (what, ours, theirs), in our layout


def _draw(n: int, *, unit_keys: bool = True, seed: int = 0) -> dict[str, Tensor]:
    """Our layout, float32: q, k, v (b, h, n, ·), beta ∈ (0, 1) and g ≤ 0 (b, h, n), gk ≤ 0
    per key dimension (b, h, n, dk), a random initial state (b, h, dk, dv)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen)

    k = randn(B, H, n, DK)
    return {
        "q": randn(B, H, n, DK),
        "k": normalize(k, dim=-1) if unit_keys else k * DK**-0.5,
        "v": randn(B, H, n, DV),
        "beta": torch.sigmoid(randn(B, H, n)),
        "g": logsigmoid(randn(B, H, n) + 2),  # decays near 0.85, some far below
        "gk": logsigmoid(randn(B, H, n, DK) + 2),
        "state": randn(B, H, DK, DV) * 0.5,
    }


def _f64(x: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.double() for name, t in x.items()}


def _bthd(*ts: Tensor) -> list[Tensor]:
    """Ours (b, h, n, ·) or (b, h, n) as their (B, T, H, ·) or (B, T, H)."""
    return [t.transpose(1, 2).contiguous() for t in ts]


def _ours_delta(x: dict[str, Tensor], gated: bool, state: bool = True) -> dict[str, tuple]:
    """delta_reference and delta_chunked on x (float64), q scaled as theirs."""
    g = x["g"] if gated else None
    kw = {"initial_state": x["state"] if state else None}
    args = (x["q"] * SCALE, x["k"], x["v"], x["beta"], g)
    return {
        "reference": delta_reference(*args, **kw),
        "chunked": delta_chunked(*args, chunk=CHUNK, **kw),
    }


def _ours_gated(x: dict[str, Tensor], g: Tensor, state: bool = True) -> dict[str, tuple]:
    """gated_reference and gated_chunked on x (float64) with the log-decays g, scale K^-1/2."""
    kw = {"scale": SCALE, "initial_state": x["state"] if state else None}
    args = (x["q"], x["k"], x["v"], g)
    return {
        "reference": gated_reference(*args, **kw),
        "chunked": gated_chunked(*args, chunk=CHUNK, **kw),
    }


def _pairs(ours: dict[str, tuple], o: Tensor, s: Tensor | None) -> Pairs:
    """Each of our forms' output (and final state, if they return one) beside theirs."""
    out = []
    for form, (o_ours, s_ours) in ours.items():
        out.append((f"{form} output", o_ours, o))
        if s is not None:
            out.append((f"{form} final state", s_ours, s))
    return out


# One function per reference of theirs: (its naive.py, its name) -> the pairs to compare, the
# reference given as ``fn``. Each returns (pairs, tolerance factor).


def _gated_delta_recurrent(fn: Callable, unit_keys: bool) -> tuple[Pairs, float]:
    x = _draw(N, unit_keys=unit_keys)
    q, k, v, beta, g = _bthd(x["q"], x["k"], x["v"], x["beta"], x["g"])
    o, s = fn(q, k, v, beta, g, initial_state=x["state"], output_final_state=True)
    return _pairs(_ours_delta(_f64(x), gated=True), o.transpose(1, 2), s), F32_TOL


def _gated_delta_chunk(fn: Callable, unit_keys: bool) -> tuple[Pairs, float]:
    x = _draw(N, unit_keys=unit_keys)
    q, k, v, beta, g = _bthd(x["q"], x["k"], x["v"], x["beta"], x["g"])
    o, s = fn(  # g before beta here
        q, k, v, g, beta, chunk_size=CHUNK, initial_state=x["state"], output_final_state=True
    )
    return _pairs(_ours_delta(_f64(x), gated=True), o.transpose(1, 2), s), F32_TOL


def _delta_recurrence(fn: Callable, unit_keys: bool) -> tuple[Pairs, float]:
    x = _draw(N, unit_keys=unit_keys)  # (B, H, T, ·) as ours; scale fixed at K^-1/2
    o, s = fn(x["q"], x["k"], x["v"], x["beta"], initial_state=x["state"])
    return _pairs(_ours_delta(_f64(x), gated=False), o, s), F32_TOL


def _delta_chunkwise(fn: Callable, unit_keys: bool) -> tuple[Pairs, float]:
    x = _f64(_draw(N_EXACT, unit_keys=unit_keys))  # float64 kept; zero initial state
    o, s = fn(x["q"], x["k"], x["v"], x["beta"], chunk_size=CHUNK_EXACT)
    assert o.dtype == s.dtype == torch.float64
    return _pairs(_ours_delta(x, gated=False, state=False), o, s), F64_TOL


def _delta_parallel(fn: Callable, unit_keys: bool) -> tuple[Pairs, float]:
    x = _f64(_draw(N_EXACT, unit_keys=unit_keys))
    o, _ = fn(x["q"], x["k"], x["v"], x["beta"], BM=2 * CHUNK_EXACT, BN=CHUNK_EXACT)
    assert o.dtype == torch.float64
    return _pairs(_ours_delta(x, gated=False, state=False), o, None), F64_TOL


def _gla_recurrent(fn: Callable) -> tuple[Pairs, float]:
    x = _draw(N)  # scale fixed at K^-1/2
    q, k, v, gk = _bthd(x["q"], x["k"], x["v"], x["gk"])
    o, s = fn(q, k, v, gk, initial_state=x["state"], output_final_state=True)
    x = _f64(x)
    return _pairs(_ours_gated(x, x["gk"]), o.transpose(1, 2), s), F32_TOL


def _simple_gla(fn: Callable, state: bool = True, **kw: object) -> tuple[Pairs, float]:
    x = _draw(N)
    q, k, v, g = _bthd(x["q"], x["k"], x["v"], x["g"])
    if state:
        kw |= {"initial_state": x["state"], "output_final_state": True}
    o, s = fn(q, k, v, g, **kw)
    x = _f64(x)
    ours = _ours_gated(x, x["g"][..., None], state=state)
    return _pairs(ours, o.transpose(1, 2), s if state else None), F32_TOL


def _retention(fn: Callable) -> tuple[Pairs, float]:
    x = _draw(N)  # (B, H, T, ·); decay 1 − 2^(−5−h) per head, scale K^-1/2, no state
    o = fn(x["q"], x["k"], x["v"])
    x = _f64(x)
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64))
    g = gamma.log()[None, :, None, None]  # (1, h, 1, 1): RetNet
    return _pairs(_ours_gated(x, g, state=False), o, None), F32_TOL


CASES: dict[str, tuple[str, str, Callable[[Callable], tuple[Pairs, float]]]] = {
    # id: (fla/ops/<op>/naive.py, its function, the comparison)
    **{
        f"{name}[{keys} keys]": (op, name, lambda fn, c=case, u=unit: c(fn, u))
        for keys, unit in (("unit", True), ("raw", False))
        for op, name, case in (
            ("gated_delta_rule", "naive_recurrent_gated_delta_rule", _gated_delta_recurrent),
            ("gated_delta_rule", "naive_chunk_gated_delta_rule", _gated_delta_chunk),
            ("delta_rule", "delta_rule_recurrence", _delta_recurrence),
            ("delta_rule", "delta_rule_chunkwise", _delta_chunkwise),
            ("delta_rule", "delta_rule_parallel", _delta_parallel),
        )
    },
    "naive_recurrent_gla": ("gla", "naive_recurrent_gla", _gla_recurrent),
    "naive_recurrent_simple_gla": ("simple_gla", "naive_recurrent_simple_gla", _simple_gla),
    "naive_chunk_simple_gla": (
        "simple_gla",
        "naive_chunk_simple_gla",
        lambda fn: _simple_gla(fn, chunk_size=CHUNK),
    ),
    "naive_parallel_simple_gla": (
        "simple_gla",
        "naive_parallel_simple_gla",
        lambda fn: _simple_gla(fn, state=False),
    ),
    "naive_retention": ("retention", "naive_retention", _retention),
}


def residuals(case: str) -> tuple[list[tuple[str, float, float]], float] | str:
    """(what, max |ours − theirs|, max |ours|) per pair and the tolerance factor, or the
    reason the reference cannot run here."""
    op, name, compare = CASES[case]
    fn, why = fla_naive.function(op, name)
    if fn is None:
        return why
    pairs, tol = compare(fn)
    rows = []
    for what, ours, theirs in pairs:
        assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
        err = (ours - theirs.to(ours.dtype)).abs().max().item()
        rows.append((what, err, ours.abs().max().item()))
    return rows, tol


@pytest.mark.parametrize("case", list(CASES))
def test_ours_equals_flas_naive_reference(case: str) -> None:
    """Both of our forms (reference and chunked) within the tolerance of fla's reference, on
    the output and, where theirs returns it, the final state."""
    result = residuals(case)
    if isinstance(result, str):
        pytest.skip(result)
    rows, tol = result
    for what, err, largest in rows:
        assert math.isfinite(err) and err <= tol * max(1.0, largest), (case, what, err, largest)
