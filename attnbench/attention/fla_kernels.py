"""``kernel=fla``: the recurrent mixers' cores on flash-linear-attention's Triton kernels
(``pip install 'attnbench[fla]'``), CUDA only. Not a mechanism; registers nothing.

The layer stays ours (projections, gates, convolution, norms); only the core is theirs, on the
same inputs: the gated recurrence as ``chunk_gla`` (a decay per key dimension) or
``chunk_simple_gla`` (a scalar per head: RetNet, Mamba-2; RetNet's fixed decays as their
``g_gamma``), the delta rule as ``chunk_delta_rule`` / ``chunk_gated_delta_rule`` (with a
decay per key channel, KDA's, as ``chunk_kda``), a decode step as their
``fused_recurrent_*``, a packed batch as one call over every document with their
``cu_seqlens``. Their layout is (batch, time, heads, dim), ours (batch, heads, time,
dim) transposed; their state (batch, heads, dk, dv) is ours.

Dtypes are what a GPU step gives them and what our core gives back, so that the two kernels'
rows differ by the core alone: q, k and v in the autocast dtype inside autocast (a mixed
precision training step), else in the layer's; the decays, β and the state in fp32; the
output back in what our core returns (the autocast dtype inside autocast, else fp32 at
least). Their kernels take no padding mask, so padded positions are zeroed first (q, k, v, β
and the log-decay: the state carried unchanged, as our cores carry it).

What their ops refuse is refused here at validation, in one line, before anything runs: each
op's chunk sizes, fp32 inputs to ``chunk_delta_rule``, a cell not on a CUDA GPU, and a torch
or triton older than fla-core 0.6 needs. fla is imported only when a kernel is called, so
asking whether it can run (:func:`why_unavailable`) imports nothing.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable
from itertools import accumulate

import torch
from torch import Tensor

NOT_INSTALLED = "flash-linear-attention is not installed (pip install 'attnbench[fla]')"
NO_TRITON = "flash-linear-attention needs triton, which is not installed"
NO_GPU = "flash-linear-attention's kernels are Triton, CUDA only, and no CUDA GPU is visible"
# what fla-core 0.6 needs (its setup's torch pin, and the Triton its kernels are written for)
NEEDS = {"torch": (2, 7), "triton": (3, 3)}
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton")  # a release, a nightly

# each mixer's fla.ops package (its chunked op ``chunk_<package>``, its step
# ``fused_recurrent_<package>``), and the chunks each op takes: chunk_gla is fixed at 64,
# the delta rules check for 16, 32 or 64, chunk_simple_gla for a power of two (from 16,
# tl.dot's smallest block)
OPS = {
    "retnet": "simple_gla",
    "mamba2": "simple_gla",
    "gla": "gla",
    "deltanet": "delta_rule",
    "gated_deltanet": "gated_delta_rule",
    "kda": "kda",
}
CHUNKS: dict[str, tuple[Callable[[int], bool], str]] = {  # the rule, and it in words
    "gla": (lambda c: c == 64, "64"),
    "simple_gla": (lambda c: c >= 16 and c & (c - 1) == 0, "a power of two >= 16"),
    "delta_rule": (lambda c: c in (16, 32, 64), "16, 32 or 64"),
}
CHUNKS["gated_delta_rule"] = CHUNKS["delta_rule"]
CHUNKS["kda"] = (lambda c: c in (32, 64), "32 or 64")  # chunk_kda raises on any other
NO_FP32 = {"delta_rule": "fla-core 0.6's chunk_delta_rule asserts its inputs are not fp32"}


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '2.7.1+cu126' -> (2, 7, 1)."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def versions() -> dict[str, str | None]:
    """torch's and triton's versions as installed (None: triton's cannot be read), read
    without importing triton."""
    triton = None
    for dist in TRITON_DISTRIBUTIONS:
        try:
            triton = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"torch": torch.__version__, "triton": triton}


def why_unavailable() -> str | None:
    """One line saying why ``kernel=fla`` cannot run here, or None (nothing imported)."""
    if not _installed("fla"):
        return NOT_INSTALLED
    if not _installed("triton"):
        return NO_TRITON
    found_versions = versions()
    for package, least in NEEDS.items():
        found = found_versions[package]
        if found is not None and _version(found) < least:
            need = ".".join(map(str, least))
            return f"flash-linear-attention 0.6 needs {package} >= {need}, found {found}"
    if not torch.cuda.is_available():
        return NO_GPU
    return None


def check_chunk(name: str, chunk: int) -> None:
    """A ``chunk`` the op of mechanism ``name`` takes (:data:`CHUNKS`), or one line."""
    package = OPS[name]
    takes, words = CHUNKS[package]
    if not takes(chunk):
        raise ValueError(
            f"chunk: kernel=fla runs {name} on chunk_{package}, whose chunk is {words}; got {chunk}"
        )


def refuses(name: str, dtype: str, gpu: bool) -> str | None:
    """Why a cell of mechanism ``name`` in ``dtype`` cannot run ``kernel=fla`` (a line
    naming the key), or None; ``gpu``: whether the cell's device is a GPU."""
    if not gpu:
        return (
            "kernel: fla runs flash-linear-attention's Triton kernels on a CUDA GPU, and this "
            "cell's device is the CPU; use a GPU preset or kernel=torch"
        )
    if dtype == "fp32" and (why := NO_FP32.get(OPS[name])):
        return (
            f"dtype: kernel=fla cannot run {name} in fp32 ({why}); use fp16 or bf16, or "
            "kernel=torch"
        )
    return None


def _op(package: str, name: str):
    return getattr(importlib.import_module(f"fla.ops.{package}"), name)


def _device(q: Tensor) -> None:
    if q.device.type != "cuda":
        raise RuntimeError(why_unavailable() or f"kernel=fla has no kernels for {q.device.type}")


def dtypes(q: Tensor, layer: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(what their kernel takes q, k, v in, what the core returns): the autocast dtype
    inside autocast on q's device, as a GPU step's matmuls would run; else the layer's, and
    back in fp32 at least, as our cores accumulate."""
    device = q.device.type
    if torch.is_autocast_enabled(device):
        low = torch.get_autocast_dtype(device)
        return low, low
    return layer, torch.promote_types(layer, torch.float32)


class _Layout:
    """Ours (b, h, n, ·) to theirs (b, n, h, ·), padded positions zeroed, and, for a packed
    batch, every row's documents end to end as one sequence with ``cu_seqlens``."""

    def __init__(self, q: Tensor, real: Tensor | None, lengths: tuple[int, ...] | None):
        self.b, self.n = q.shape[0], q.shape[2]
        self.real, self.kw = real, {}
        if lengths is not None:  # their CPU copy too: no device synchronisation to read it
            cu = list(accumulate(lengths, initial=0))
            self.kw = {
                "cu_seqlens": torch.tensor(cu, dtype=torch.long, device=q.device),
                "cu_seqlens_cpu": torch.tensor(cu, dtype=torch.long),
            }

    def theirs(self, t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        if t is None:
            return None
        t = t.to(dtype)
        if self.real is not None:
            keep = self.real[:, None, :, None] if t.dim() == 4 else self.real[:, None, :]
            t = torch.where(keep, t, 0.0)
        t = t.transpose(1, 2).contiguous()
        return t.flatten(0, 1)[None] if self.kw else t

    def ours(self, o: Tensor, dtype: torch.dtype) -> Tensor:
        if self.kw:
            o = o.view(self.b, self.n, *o.shape[2:])
        return o.transpose(1, 2).to(dtype)


def gated(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, real: Tensor | None,
    state: Tensor | None, layer: torch.dtype, chunk: int, lengths: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The gated recurrence of :func:`attnbench.attention.gated_scan.gated_chunked` (or its
    step, for one token with a state): q, k (b, h, n, dk), v (b, h, n, dv), g broadcastable
    to (b, h, n, dk) -> (o (b, h, n, dv), the final state (b, h, dk, dv); None when packed).
    ``lengths``: a packed batch's documents, row after row."""
    _device(q)
    b, h, n, dk = q.shape
    into, out = dtypes(q, layer)
    at = _Layout(q, real, lengths)
    step = state is not None and n == 1
    kw = {
        "scale": scale,
        "initial_state": None if state is None else state.float(),
        "output_final_state": lengths is None,
        **at.kw,
    }
    q, k, v = (at.theirs(t, into) for t in (q, k, v))
    if g.shape[-1] > 1:  # a decay per key dimension: GLA
        g = at.theirs(g.expand(b, h, n, dk), torch.float32)
        op = _op("gla", "fused_recurrent_gla" if step else "chunk_gla")
        o, s = op(q, k, v, **{"gk" if step else "g": g}, **kw)
    else:
        if g.shape[0] == g.shape[2] == 1 and real is None:  # one fixed decay per head
            kw["g_gamma"] = g.reshape(h).float()
        else:
            kw["g"] = at.theirs(g.expand(b, h, n, 1)[..., 0], torch.float32)
        if not step:
            kw["chunk_size"] = chunk
        op = _op("simple_gla", "fused_recurrent_simple_gla" if step else "chunk_simple_gla")
        o, s = op(q, k, v, **kw)
    return at.ours(o, out), s


def delta(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, real: Tensor | None,
    state: Tensor | None, layer: torch.dtype, chunk: int, lengths: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The delta rule of :func:`attnbench.attention.delta_scan.delta_chunked` (or its step):
    q (already scaled), k (L2-normalised), v (b, h, n, ·), beta and g (b, h, n), g None for
    DeltaNet -> (o (b, h, n, dv), the final state; None when packed)."""
    package = "delta_rule" if g is None else "gated_delta_rule"
    return _delta_op(package, q, k, v, beta, g, real, state, layer, chunk, lengths)


def kda(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, real: Tensor | None,
    state: Tensor | None, layer: torch.dtype, chunk: int, lengths: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The delta rule with a decay per key channel of
    :func:`attnbench.attention.kda_scan.kda_chunked` (or its step) as ``chunk_kda`` /
    ``fused_recurrent_kda``, the decay given precomputed (their ``use_gate_in_kernel`` off:
    the gate is the layer's): q (already scaled), k (L2-normalised), v, g (b, h, n, ·), beta
    (b, h, n) -> (o (b, h, n, dv), the final state; None when packed)."""
    return _delta_op("kda", q, k, v, beta, g, real, state, layer, chunk, lengths)


def _delta_op(
    package: str, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
    real: Tensor | None, state: Tensor | None, layer: torch.dtype, chunk: int,
    lengths: tuple[int, ...] | None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """fla's ``chunk_<package>`` (or ``fused_recurrent_<package>`` for one token) in their
    layout, and its output back in ours: the one call of the delta-rule kernels (DeltaNet's,
    Gated DeltaNet's, KDA's), which differ only by the package and by the decay ``g``."""
    _device(q)
    into, out = dtypes(q, layer)
    at = _Layout(q, real, lengths)
    step = state is not None and q.shape[2] == 1
    q, k, v = (at.theirs(t, into) for t in (q, k, v))
    beta, g = (at.theirs(t, torch.float32) for t in (beta, g))
    kw = {
        "scale": 1.0,
        "initial_state": None if state is None else state.float(),
        "output_final_state": lengths is None,
        **at.kw,
    }
    if not step:
        kw["chunk_size"] = chunk
    op = _op(package, f"fused_recurrent_{package}" if step else f"chunk_{package}")
    o, s = op(q, k, v, beta=beta, **kw) if g is None else op(q, k, v, g=g, beta=beta, **kw)
    return at.ours(o, out), s
