"""``torch.autocast``'s casting, emulated where autocast cannot act: on ``meta`` tensors.

Why: the memory model runs a training step on ``meta`` tensors (:mod:`attnbench.measure.memory`),
and a mixed-precision step (fp32 master weights, forward under ``torch.autocast``) must cast
there exactly as autocast would on the GPU: which tensors get a low-precision copy, when, and for
how long decides the peak. But autocast acts through the Autocast* dispatch keys, which only
tensors of its own backends carry: on ``meta`` it silently does nothing.

How: :func:`emulated_autocast` sets torch's own autocast state, exactly as ``torch.autocast``
does (so ``torch.is_autocast_enabled()``, ``torch.get_autocast_dtype()`` and a nested
``torch.autocast(..., enabled=False)`` inside the model read and write the same switches), and
pushes :class:`AutocastEmulation`, a ``TorchFunctionMode``. It sits above autograd, as the
Autocast keys do, so autograd records its casts and the backward runs in the forward's dtypes.
For each torch call it looks the op up in the policy lists below and casts the call's tensor
arguments as autocast's kernel for that op would (``cached_cast`` in
``aten/src/ATen/autocast_mode.h``), then runs the op with the real autocast switched off
underneath, so nothing is cast twice (on CPU tensors, which the real autocast would reach too).

Which tensors: floating ones, never float64, on ``device_type`` or on ``meta``; others pass
untouched, as autocast leaves a CPU tensor alone under ``torch.autocast("cuda")``.

The weight cache: autocast casts an fp32 leaf that requires grad (a parameter) to the low
precision once per region and keeps the copy until the outermost region exits; so does the
emulation (:attr:`AutocastEmulation.cache`), under the same conditions (not a view, cache
enabled, casting to the region's dtype).

Sources of the lists (torch 2.13):

* CUDA: the ``AT_FORALL_LOWER_PRECISION_FP`` / ``AT_FORALL_FP32`` /
  ``AT_FORALL_FP32_SET_OPT_DTYPE`` / ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` /
  ``AT_FORALL_PROMOTE`` macros of ``aten/src/ATen/autocast_mode.h`` (shipped as
  ``torch/include/ATen/autocast_mode.h``), which ``aten/src/ATen/autocast_mode.cpp`` registers
  for ``AutocastCUDA``, plus the two cudnn convolutions and the banned ``binary_cross_entropy``
  it registers beside them; the AMP docs' "Autocast Op Reference" lists the same. They are
  transcribed, and tested here only against that header and the dispatcher's registrations:
  no CUDA autocast run checks them (``scripts/gpu_check.sh`` does not exercise autocast yet).
* CPU: ``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`` in ``aten/src/ATen/autocast_mode.cpp``;
  the tests check its set of ops against the dispatcher and the policies against a real CPU
  autocast.

One kernel detail is taken from CUDA as well: an fp16 ``softmax``/``log_softmax`` that
autocast sends to fp32 runs as one half-to-float kernel there, not as a copy and a softmax as
it would on ``meta`` (:meth:`AutocastEmulation._half_to_float`).

Torch-level calls are matched to aten ops by ``__name__`` (``F.linear``, ``torch.matmul``,
``Tensor.softmax`` …: named as their op), plus :data:`ALIASES`; Tensor's Python operators
(``__rdiv__``, ``__rpow__``, ``__rmatmul__`` …) run their body under the mode, so the ops they
call are the ones matched.

What it cannot match (keep such code out of the region, or accept the difference):

* a composite op autocast does not list but whose ATen decomposition calls a listed one (on
  CPU: ``einsum``, ``tensordot``, ``chain_matmul``, ``linalg.multi_dot`` call ``bmm``/``mm``).
  Those in :data:`EXPAND` are traced into their aten ops and replayed under the mode, so the
  cast lands where autocast puts it; any other, e.g. ``F.cross_entropy`` on CUDA (an
  ``nll_loss`` of fp16 log-probabilities, cast inside ATen) or ``F.interpolate``/``F.pad``
  into the upsample/pad ops listed for fp32, runs whole and uncast;
* a Python function of torch that dispatches on itself, e.g.
  ``F.multi_head_attention_forward``: the mode sees it whole, so the ops inside it are not
  cast unless its own name is listed;
* ops of a backward run inside the region (autocast casts those too; run it outside, as
  PyTorch advises);
* a nested ``torch.autocast(device_type)`` that *enables* autocast on a build without that
  device disables itself (torch's own check), so the emulation follows it; disabling regions
  are followed exactly.
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten


class Policy(enum.Enum):
    """autocast's ``CastPolicy`` (``aten/src/ATen/autocast_mode.h``)."""

    LOWER = "lower_precision_fp"  # floating inputs cast to the region's dtype
    FP32 = "fp32"  # floating inputs cast to float32
    FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # dtype=float32 unless the caller gave one
    FP32_APPEND_DTYPE = "fp32_append_dtype"  # norm: the overload with dtype=float32
    PROMOTE = "promote"  # inputs cast to the widest floating input type
    BANNED = "banned"  # raises (binary_cross_entropy on CUDA)


# Op names as the dispatcher registers them ("op" or "op.overload"), per policy.
# CUDA: torch/include/ATen/autocast_mode.h, the AT_FORALL_* macros, in their order.
_CUDA_LOWER = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    # not in the macro: registered beside it in autocast_mode.cpp
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip
_CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)  # fmt: skip
_CUDA_FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip
_CUDA_FP32_APPEND_DTYPE = ("norm.Scalar", "norm.ScalarOpt_dim")
_CUDA_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip
_CUDA_BANNED = ("binary_cross_entropy",)  # autocast_mode.cpp: binary_cross_entropy_banned

# CPU: aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m).
_CPU_LOWER = (
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "bmm",
    "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm", "linear", "_convolution.deprecated",
    "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "prelu", "scaled_dot_product_attention",
    "_native_multi_head_attention", "_addmm_activation",
)  # fmt: skip
_CPU_FP32 = (
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "prod.dim_int",
    "quantile", "quantile.scalar", "nanquantile", "nanquantile.scalar", "stft", "stft.center",
    "cdist", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d", "trace",
    "view_as_complex", "cholesky", "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve",
    "orgqr", "ormqr", "pinverse", "max_pool3d", "max_unpool2d", "max_unpool3d",
    "adaptive_avg_pool3d", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "mse_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss", "smooth_l1_loss",
    "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "ctc_loss.IntList", "ctc_loss.Tensor", "kl_div",
    "multilabel_margin_loss", "binary_cross_entropy_with_logits", "fft_fft", "fft_ifft",
    "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2",
    "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft", "linalg_cond",
    "linalg_cond.p_str", "linalg_matrix_rank", "linalg_matrix_rank.tol_tensor",
    "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.atol_rtol_float", "linalg_solve",
    "linalg_cholesky", "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
    "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve",
    "fake_quantize_per_tensor_affine", "geqrf", "_lu_with_info", "qr", "svd", "triangular_solve",
    "fractional_max_pool2d", "fractional_max_pool3d", "adaptive_max_pool3d",
    "multilabel_margin_loss_forward", "linalg_qr", "linalg_cholesky_ex", "linalg_svd",
    "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex",
)  # fmt: skip
_CPU_PROMOTE = ("stack", "cat", "index_copy")

#: device type -> policy -> op names as registered ("op" or "op.overload")
LISTS: dict[str, dict[Policy, tuple[str, ...]]] = {
    "cuda": {
        Policy.LOWER: _CUDA_LOWER,
        Policy.FP32: _CUDA_FP32,
        Policy.FP32_SET_OPT_DTYPE: _CUDA_FP32_SET_OPT_DTYPE,
        Policy.FP32_APPEND_DTYPE: _CUDA_FP32_APPEND_DTYPE,
        Policy.PROMOTE: _CUDA_PROMOTE,
        Policy.BANNED: _CUDA_BANNED,
    },
    "cpu": {Policy.LOWER: _CPU_LOWER, Policy.FP32: _CPU_FP32, Policy.PROMOTE: _CPU_PROMOTE},
}


def _by_name(lists: dict[Policy, tuple[str, ...]]) -> dict[str, Policy]:
    """Op name (overload dropped: a torch-level call does not name one) -> policy."""
    return {op.split(".")[0]: policy for policy, ops in lists.items() for op in ops}


#: device type -> op name -> policy, as the mode looks calls up
POLICIES: dict[str, dict[str, Policy]] = {dev: _by_name(lists) for dev, lists in LISTS.items()}

#: torch-level names that differ from their aten op's
ALIASES = {
    "__matmul__": "matmul",
    "grid_sample": "grid_sampler",  # F.grid_sample
    "cross_entropy": "cross_entropy_loss",  # F.cross_entropy
}

#: ops not listed for the device whose ATen decomposition calls a listed op: traced into aten
#: ops and replayed under the mode (see :meth:`AutocastEmulation._replay`)
EXPAND: dict[str, frozenset[str]] = {
    "cpu": frozenset({"einsum", "tensordot", "chain_matmul", "linalg_multi_dot"}),
    "cuda": frozenset(),
}

LOW_DTYPES = (torch.float16, torch.bfloat16)

_local = threading.local()  # .mode: this thread's active AutocastEmulation, if any


def op_name(func: Callable[..., Any]) -> str:
    """The aten op a torch-level callable stands for, by name."""
    if isinstance(func, torch._ops.OpOverload):  # replayed aten ops, torch.ops.aten.* calls
        func = func.overloadpacket
    if isinstance(func, torch._ops.OpOverloadPacket):
        namespace, _, name = func._qualified_op_name.partition("::")
        return name if namespace == "aten" else func._qualified_op_name
    name = getattr(func, "__name__", "")
    return ALIASES.get(name, name)


@contextmanager
def _real_autocast_off(device_type: str) -> Iterator[None]:
    """The real autocast's switch off while an op runs, as inside autocast's own kernels
    (their ExcludeDispatchKeyGuard), so a CPU tensor is not cast a second time."""
    torch.set_autocast_enabled(device_type, False)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, True)


class AutocastEmulation(TorchFunctionMode):
    """Casts each call's tensor arguments by autocast's policy for ``device_type``.

    Reads the region's state (enabled, dtype, cache enabled) from torch's autocast switches on
    every call, so regions nested inside set them as they would for the real autocast.
    """

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.policies = POLICIES[device_type]
        self.expand = EXPAND[device_type]
        #: id(weight) -> (weakref to it, its low-precision copy), until the region exits
        self.cache: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        device_type = self.device_type
        if not torch.is_autocast_enabled(device_type):  # e.g. torch.autocast(enabled=False)
            return func(*args, **kwargs)
        body = getattr(func, "__wrapped__", None)
        if body is not None and getattr(func, "__module__", None) == "torch._tensor":
            with self:  # Tensor.__rdiv__ & co.: their body's ops are the ones autocast sees
                return body(*args, **kwargs)
        name = op_name(func)
        policy = self.policies.get(name)
        if policy is None and name in self.expand and self._casts_inside(args, kwargs):
            return self._replay(func, args, kwargs)
        with _real_autocast_off(device_type):
            if policy is None:
                return func(*args, **kwargs)
            fused = self._half_to_float(name, args, kwargs)
            if fused is not None:
                return fused
            args, kwargs = self._apply(policy, name, args, kwargs)
            return func(*args, **kwargs)

    def eligible(self, t: Any) -> bool:
        """autocast's ``is_eligible``: floating, not float64, on the device (or meta)."""
        return (
            isinstance(t, Tensor)
            and t.is_floating_point()
            and t.dtype != torch.float64
            and t.device.type in (self.device_type, "meta")
        )

    def _half_to_float(self, name: str, args: tuple, kwargs: dict) -> Tensor | None:
        """CUDA's softmax of fp16 with dtype=float32, as one kernel: fp16 in, fp32 out.

        autocast asks for ``softmax(x, dim, dtype=float32)``; for an fp16 CUDA tensor ATen
        then runs ``_softmax(x, dim, half_to_float=True)`` (``softmax``/``log_softmax`` in
        aten/src/ATen/native/SoftMax.cpp), with no fp32 copy of x, and its backward returns
        fp16 directly. On ``meta`` the same call would take the copying branch (an fp32 copy
        of x, and of its gradient), so the CUDA branch is taken here. None where it does not
        apply.
        """
        if self.device_type != "cuda" or name not in ("softmax", "log_softmax"):
            return None
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
        if given or not isinstance(dim, int) or not self.eligible(x) or x.dtype != torch.float16:
            return None
        op = torch._softmax if name == "softmax" else torch._log_softmax
        return op(x, dim, True)

    def _apply(
        self, policy: Policy, name: str, args: tuple, kwargs: dict
    ) -> tuple[tuple, dict[str, Any]]:
        """The call's arguments as autocast's kernel for ``policy`` passes them on."""
        lower = torch.get_autocast_dtype(self.device_type)
        if policy in (Policy.FP32_SET_OPT_DTYPE, Policy.FP32_APPEND_DTYPE):
            first = args[0] if args else kwargs.get("input", kwargs.get("self"))
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            if not self.eligible(first) or given:
                return args, kwargs
            return args, {**kwargs, "dtype": torch.float32}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if self.eligible(t)]
        if policy is Policy.BANNED:
            if tensors:
                raise RuntimeError(
                    f"torch.nn.functional.{name} and torch.nn.BCELoss are unsafe to autocast "
                    "(emulated autocast, as the real one refuses it); use "
                    "binary_cross_entropy_with_logits"
                )
            return args, kwargs
        to = torch.float32
        if policy is Policy.LOWER or (
            policy is Policy.PROMOTE and all(t.dtype == lower for t in tensors)
        ):
            to = lower
        # autocast casts the arguments right to left (the C++ pack expansion of cached_cast,
        # as GCC evaluates it), the tensors of one list left to right; keyword arguments are
        # the later parameters
        new_kwargs = {k: self._cast(kwargs[k], to) for k in reversed(kwargs)}
        new_args = [self._cast(a, to) for a in reversed(args)][::-1]
        return tuple(new_args), {k: new_kwargs[k] for k in kwargs}

    def _cast(self, x: Any, to: torch.dtype) -> Any:
        if type(x) in (list, tuple):
            return type(x)(self._cast(t, to) for t in x)
        if not self.eligible(x) or x.dtype == to:
            return x
        cacheable = (
            to == torch.get_autocast_dtype(self.device_type)
            and x.dtype == torch.float32
            and x.requires_grad
            and x.is_leaf
            and not x._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return x.to(to)
        hit = self.cache.get(id(x))
        if hit is not None and hit[0]() is x:
            return hit[1]
        copy = x.to(to)
        self.cache[id(x)] = (weakref.ref(x), copy)
        return copy

    def _casts_inside(self, args: tuple, kwargs: dict) -> bool:
        """Whether a listed op inside a composite could cast anything (else run it whole)."""
        lower = torch.get_autocast_dtype(self.device_type)
        flat = tree_flatten((args, kwargs))[0]
        return any(self.eligible(t) and t.dtype != lower for t in flat)

    def _replay(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run a composite op as its aten ops, each through this mode.

        ATen decomposes e.g. CPU ``einsum`` into permutes, views and a ``bmm`` that autocast
        casts; the mode sees only ``einsum``. So trace it into those aten ops once per
        signature (on fake tensors, the real autocast off) and replay them here.
        """
        flat, spec = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, Tensor)]
        key = (func, spec, *(_signature(x) for x in flat))
        graph = _GRAPHS.get(key)
        if graph is None:
            graph = _trace(func, flat, spec, tensors, self.device_type)
            if len(_GRAPHS) >= 256:
                _GRAPHS.clear()
            _GRAPHS[key] = graph
        with self:
            return graph(*tensors)


_GRAPHS: dict[Hashable, Callable[..., Any]] = {}


def _signature(x: Any) -> Hashable:
    if isinstance(x, Tensor):
        return ("tensor", tuple(x.shape), x.stride(), x.dtype, x.device)
    return x


def _trace(
    func: Any, flat: list[Any], spec: Any, tensors: list[Tensor], device_type: str
) -> Callable[..., Any]:
    """``func``'s aten ops as an FX graph taking the call's tensors."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    def call(*ts: Tensor) -> Any:
        it = iter(ts)
        leaves = [next(it) if isinstance(x, Tensor) else x for x in flat]
        args, kwargs = tree_unflatten(leaves, spec)
        return func(*args, **kwargs)

    # off the dispatch modes in use (a memory tracker must not count the trace); detached,
    # so each argument traces as its own input even where one tensor is passed twice
    with _disable_current_modes(), _real_autocast_off(device_type):
        return make_fx(call, tracing_mode="fake")(*(t.detach() for t in tensors))


@contextmanager
def emulated_autocast(
    device_type: str, dtype: torch.dtype, *, enabled: bool = True, cache_enabled: bool = True
) -> Iterator[AutocastEmulation]:
    """Like ``torch.autocast(device_type, dtype)``, also on ``meta`` tensors.

    ``device_type`` is ``"cuda"`` or ``"cpu"`` (whose policy to follow); ``dtype`` float16 or
    bfloat16. Run the forward inside and the loss's backward outside, as with the real one::

        with emulated_autocast("cuda", torch.float16):
            out = model(x)
        out.float().sum().backward()

    Yields the active :class:`AutocastEmulation` (its ``cache`` holds the weights' copies until
    the outermost region exits). Regions nest; one device type per thread at a time.
    """
    if device_type not in POLICIES:
        raise ValueError(f"device_type: must be one of {sorted(POLICIES)}, got {device_type!r}")
    if dtype not in LOW_DTYPES:
        raise ValueError(f"dtype: must be torch.float16 or torch.bfloat16, got {dtype}")
    outer: AutocastEmulation | None = getattr(_local, "mode", None)
    if outer is not None and outer.device_type != device_type:
        raise ValueError(
            f"device_type: an emulated {outer.device_type} region is active; "
            f"cannot nest {device_type!r} in it"
        )
    # what torch.autocast.__enter__ sets (torch/amp/autocast_mode.py), restored on exit
    prev = (
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
        torch.is_autocast_cache_enabled(),
    )
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)
    torch.autocast_increment_nesting()
    try:
        if outer is not None:
            yield outer
            return
        mode = AutocastEmulation(device_type)
        _local.mode = mode
        try:
            with mode:
                yield mode
        finally:
            _local.mode = None
            mode.cache.clear()  # the weights' copies die with the region, as autocast's do
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, prev[0])
        torch.set_autocast_dtype(device_type, prev[1])
        torch.set_autocast_cache_enabled(prev[2])
