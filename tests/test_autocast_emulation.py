"""The emulated autocast (attnbench.measure.autocast) against the real one.

On CPU tensors the real ``torch.autocast("cpu", dtype=torch.bfloat16)`` is the oracle: under
both, every aten op of a forward and backward (recorded below autograd, after any cast) must
be the same op with outputs of the same dtypes and shapes, the results bit-identical, and the
peak memory the same. The CUDA lists cannot run here: they are checked against the installed
header they come from, the dispatcher's registrations, and a table of expected dtypes on meta.
"""

from __future__ import annotations

import gc
import re
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attnbench
from attnbench.measure.autocast import LISTS, POLICIES, Policy, emulated_autocast
from attnbench.measure.memory import MemoryTracker

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

Op = tuple[str, tuple[tuple[torch.dtype, tuple[int, ...]], ...]]


class Recorder(TorchDispatchMode):
    """Every aten op as (name, ((dtype, shape) of each tensor output, ...))."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        self.ops.append((str(func), tuple((t.dtype, tuple(t.shape)) for t in outs)))
        return out


def real() -> AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=BF16)


def emulated() -> AbstractContextManager[Any]:
    return emulated_autocast("cpu", BF16)


CONTEXTS = {"real": real, "emulated": emulated}


# ---------------------------------------------------------------------------------------------
# Whole encoder layers: forward + backward, real vs emulated CPU autocast


MECHANISMS = [
    ("vanilla", {}),
    ("sdpa", {}),
    ("linformer", {"k": 16, "sharing": "none", "kernel": "sdpa"}),
    ("linformer", {"k": 16, "sharing": "headwise", "kernel": "sdpa"}),
    ("linformer", {"k": 16, "sharing": "kv", "kernel": "sdpa"}),
    ("linformer", {"k": 16, "kernel": "eager"}),
    ("performer", {}),
    ("performer", {"causal": True}),
    ("performer", {"kernel": "relu"}),
    ("xformers", {}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in p.items()) for name, p in MECHANISMS]


def _layer(name: str, params: dict) -> nn.Module:
    if attnbench.info(name).unavailable:
        pytest.skip(attnbench.info(name).unavailable)
    torch.manual_seed(0)
    model = attnbench.build_model(
        name, layers=1, d_model=64, n_heads=4, d_ff=128, max_seq_len=64, **params
    )
    return model.train()


def _inputs() -> tuple[Tensor, Tensor]:
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 64, dtype=torch.bool)
    mask[1, -8:] = True  # the second sequence is padded
    return x, mask


def _step(
    model: nn.Module, ctx: AbstractContextManager[Any], inputs: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """A training step's forward under ``ctx``, its loss and backward outside (as advised)."""
    x, mask = inputs or _inputs()
    for p in model.parameters():
        p.grad = None
    with ctx:
        out = model(x, key_padding_mask=mask)
    out.float().pow(2).mean().backward()
    return out


@pytest.mark.parametrize(("name", "params"), MECHANISMS, ids=IDS)
def test_layer_runs_the_same_ops_in_the_same_dtypes(name: str, params: dict) -> None:
    model = _layer(name, params)
    runs = {}
    for kind, ctx in CONTEXTS.items():
        with Recorder() as rec:
            out = _step(model, ctx())
        runs[kind] = rec.ops, out, [p.grad for p in model.parameters()]
    (ops_r, out_r, grads_r), (ops_e, out_e, grads_e) = runs["real"], runs["emulated"]
    assert any(dtypes and dtypes[0][0] == BF16 for _, dtypes in ops_r)  # autocast did cast
    pairs = zip(ops_r, ops_e, strict=False)
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    where = "" if first is None else f"; first difference at op {first}: {ops_r[first]} vs "
    assert first is None and len(ops_r) == len(ops_e), (
        f"{len(ops_r)} vs {len(ops_e)} ops{where}{'' if first is None else ops_e[first]}"
    )
    assert out_r.dtype == out_e.dtype and torch.equal(out_r, out_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_r, grads_e, strict=True))


def _tracked_peak(model: nn.Module, ctx: AbstractContextManager[Any]) -> int:
    tracker = MemoryTracker()
    with tracker:
        _step(model, ctx)
    return tracker.peak


def _profiled_peak(model: nn.Module, ctx: AbstractContextManager[Any]) -> int:
    """High-water mark of the CPU allocator's live bytes, from the profiler's memory events."""
    for p in model.parameters():  # the last step's gradients, freed before the count starts
        p.grad = None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _step(model, ctx)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("name", "params"), MECHANISMS, ids=IDS)
@pytest.mark.parametrize("measure", [_tracked_peak, _profiled_peak], ids=["tracker", "profiler"])
def test_layer_peak_memory_matches(
    name: str, params: dict, measure: Callable[[nn.Module, Any], int]
) -> None:
    model = _layer(name, params)
    _step(model, emulated())  # traces the composites the emulation replays, outside the count
    peak_real, peak_emulated = measure(model, real()), measure(model, emulated())
    peak_fp32 = measure(model, torch.autocast("cpu", enabled=False))
    assert peak_real != peak_fp32  # autocast changes the peak, so the check can tell
    assert abs(peak_emulated - peak_real) <= 0.01 * peak_real, (peak_real, peak_emulated)


# sdpa on meta falls back to its math kernel (fp32 inside), not the CPU's flash kernel: what
# runs inside sdpa is the memory model's business, not autocast's
NO_SDPA = [(n, p) for n, p in MECHANISMS if n != "sdpa" and p.get("kernel") != "sdpa"]


@pytest.mark.parametrize(
    ("name", "params"), NO_SDPA, ids=[IDS[MECHANISMS.index(m)] for m in NO_SDPA]
)
def test_meta_run_is_the_real_cpu_run(name: str, params: dict) -> None:
    """The memory model's use: emulated on meta, the same ops and peak as real on CPU."""
    model, on_meta = _layer(name, params), _layer(name, params).to("meta")
    cpu_inputs = _inputs()
    meta_inputs = (cpu_inputs[0].to("meta"), cpu_inputs[1].to("meta"))
    runs = []
    for m, ctx, inputs in ((model, real(), cpu_inputs), (on_meta, emulated(), meta_inputs)):
        with MemoryTracker() as tracker, Recorder() as rec:
            _step(m, ctx, inputs)
        runs.append((rec.ops, tracker.peak))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------------
# Single calls on CPU: every policy, real vs emulated


def _tensors() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(2)

    def r(*shape: int, dtype: torch.dtype = FP32) -> Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    t = {
        "x": r(4, 8),
        "xb": r(4, 8, dtype=BF16),
        "yb": r(4, 8, dtype=BF16),
        "w": nn.Parameter(r(6, 8)),
        "b": nn.Parameter(r(6)),
        "a3": r(2, 4, 8),
        "b3": r(2, 8, 5),
        "q": r(2, 3, 5, 4),
        "mask": r(5, 5),
        "c": r(2, 3, 10),
        "cw": r(4, 3, 3),
        "sq": r(4, 4, dtype=BF16) + 4 * torch.eye(4, dtype=BF16),
        "x64": r(4, 8, dtype=torch.float64),
        "w64": r(6, 8, dtype=torch.float64),
        "labels": torch.randint(0, 8, (4,), generator=g),
        "idx": torch.tensor([0, 2]),
    }
    return t


CPU_CALLS: dict[str, Callable[[dict[str, Tensor]], Any]] = {
    # lower precision
    "F.linear": lambda t: F.linear(t["x"], t["w"], t["b"]),
    "weight used twice (one cached cast)": lambda t: F.linear(
        F.linear(t["x"], t["w"]) @ t["w"], t["w"]
    ),
    "torch.matmul": lambda t: torch.matmul(t["x"], t["w"].T),
    "@": lambda t: t["x"] @ t["w"].T,
    "__rmatmul__": lambda t: t["w"].T.__rmatmul__(t["x"]),
    "Tensor.mm": lambda t: t["x"].mm(t["w"].T),
    "torch.bmm": lambda t: torch.bmm(t["a3"], t["b3"]),
    "torch.addmm": lambda t: torch.addmm(t["b"], t["x"], t["w"].T),
    "torch.baddbmm": lambda t: torch.baddbmm(t["a3"] @ t["b3"], t["a3"], t["b3"]),
    "_addmm_activation": lambda t: torch._addmm_activation(t["b"], t["x"], t["w"].T),
    "F.conv1d": lambda t: F.conv1d(t["c"], t["cw"]),
    "F.prelu": lambda t: F.prelu(t["x"], torch.tensor([0.25])),
    "F.sdpa": lambda t: F.scaled_dot_product_attention(t["q"], t["q"] * 2, t["q"] * 3),
    "F.sdpa float mask": lambda t: F.scaled_dot_product_attention(
        t["q"], t["q"], t["q"], attn_mask=t["mask"]
    ),
    "linalg.vecdot": lambda t: torch.linalg.vecdot(t["x"], t["x"]),
    # promote
    "cat mixed": lambda t: torch.cat([t["xb"], t["x"], t["yb"]]),
    "cat low": lambda t: torch.cat([t["xb"], t["yb"]]),
    "stack mixed": lambda t: torch.stack([t["x"], t["xb"]]),
    "index_copy": lambda t: t["x"].index_copy(0, t["idx"], t["xb"][:2]),
    # fp32
    "F.mse_loss": lambda t: F.mse_loss(t["xb"], t["yb"]),
    "F.l1_loss": lambda t: F.l1_loss(t["xb"], t["yb"]),
    "F.kl_div": lambda t: F.kl_div(t["xb"], t["yb"].softmax(-1), reduction="batchmean"),
    "F.bce_with_logits": lambda t: F.binary_cross_entropy_with_logits(t["xb"], t["yb"].sigmoid()),
    "F.cross_entropy": lambda t: F.cross_entropy(t["xb"], t["labels"]),
    "torch.cdist": lambda t: torch.cdist(t["xb"], t["yb"]),
    "Tensor.prod": lambda t: t["xb"].prod(),
    "torch.prod dim": lambda t: torch.prod(t["xb"], 0),
    "fft.rfft": lambda t: torch.fft.rfft(t["xb"]),
    "linalg.inv": lambda t: torch.linalg.inv(t["sq"]),
    "torch.trace": lambda t: torch.trace(t["sq"]),
    # not listed on CPU: run as they come
    "softmax": lambda t: t["xb"].softmax(-1),
    "F.layer_norm": lambda t: F.layer_norm(t["xb"], (8,)),
    "exp": lambda t: torch.exp(t["xb"]),
    "1 / x": lambda t: 1.0 / t["xb"],
    "2 ** x": lambda t: 2 ** t["xb"],
    "x ** 2": lambda t: t["xb"] ** 2,
    "sum": lambda t: t["xb"].sum(),
    "F.gelu": lambda t: F.gelu(t["x"]),
    # composites whose ATen decomposition calls a listed op
    "einsum 2": lambda t: torch.einsum("ij,kj->ik", t["x"], t["w"]),
    "einsum 3": lambda t: torch.einsum("bij,bjk,k->bik", t["a3"], t["b3"], t["b"][:5]),
    "einsum same operand twice": lambda t: torch.einsum("ij,ij->i", t["x"], t["x"]),
    "tensordot": lambda t: torch.tensordot(t["a3"], t["b3"], dims=([0, 2], [0, 1])),
    "linalg.multi_dot": lambda t: torch.linalg.multi_dot([t["x"], t["w"].T, t["w"]]),
    # never cast: float64, integers
    "float64 linear": lambda t: F.linear(t["x64"], t["w64"]),
    "int cat": lambda t: torch.cat([t["labels"], t["idx"]]),
    # a nested disabling region
    "autocast(enabled=False) inside": lambda t: _disabled(lambda: F.linear(t["x"], t["w"])),
}


def _disabled(f: Callable[[], Tensor]) -> tuple[Tensor, Tensor]:
    with torch.autocast("cpu", enabled=False):
        inside = f()
    return inside, f()


@pytest.mark.parametrize("call", list(CPU_CALLS))
def test_call_casts_as_the_real_cpu_autocast(call: str) -> None:
    results = {}
    for kind, ctx in CONTEXTS.items():
        t = _tensors()
        with Recorder() as rec, ctx():
            out = CPU_CALLS[call](t)
        results[kind] = rec.ops, [o for o in tree_flatten(out)[0] if isinstance(o, Tensor)]
    (ops_r, outs_r), (ops_e, outs_e) = results["real"], results["emulated"]
    assert ops_e == ops_r
    assert [o.dtype for o in outs_e] == [o.dtype for o in outs_r]
    for a, b in zip(outs_r, outs_e, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_lists_hold_what_this_torch_registers_for_autocast() -> None:
    """Same op set as the dispatcher's AutocastCPU/AutocastCUDA kernels, no op in two lists."""
    for device, key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")):
        registered = torch._C._dispatch_get_registrations_for_dispatch_key(key)
        ours = [op for ops in LISTS[device].values() for op in ops]
        assert len(ours) == len(set(ours))
        assert set(ours) == {op.removeprefix("aten::") for op in registered}, device
        names = {op.split(".")[0]: p for p, ops in LISTS[device].items() for op in ops}
        assert names == POLICIES[device]
        assert len({(op.split(".")[0], p) for p, ops in LISTS[device].items() for op in ops}) == (
            len(names)
        ), f"{device}: an op's overloads in two lists"


HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
MACROS = {
    "AT_FORALL_LOWER_PRECISION_FP": Policy.LOWER,
    "AT_FORALL_FP32": Policy.FP32,
    "AT_FORALL_FP32_SET_OPT_DTYPE": Policy.FP32_SET_OPT_DTYPE,
    "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE": Policy.FP32_APPEND_DTYPE,
    "AT_FORALL_PROMOTE": Policy.PROMOTE,
}


@pytest.mark.skipif(not HEADER.exists(), reason="this torch ships no ATen headers")
def test_cuda_lists_are_the_headers() -> None:
    """Each CUDA list is its AT_FORALL_* macro in the installed autocast_mode.h."""
    text = HEADER.read_text()
    for macro, policy in MACROS.items():
        body = re.search(rf"#define {macro}\(_\)((?:[^\n]*\\\n)*[^\n]*)", text)
        assert body is not None, macro
        if policy is Policy.FP32_APPEND_DTYPE:
            ops = re.findall(r'"([\w.]+)"', body.group(1))
        else:
            ops = [
                f"{op}.{overload}" if overload else op
                for op, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body.group(1))
            ]
        ours = LISTS["cuda"][policy]
        if policy is Policy.LOWER:  # registered beside the macro in autocast_mode.cpp
            ours = tuple(op for op in ours if not op.startswith("cudnn_"))
        assert list(ours) == ops, macro


# ---------------------------------------------------------------------------------------------
# CUDA policy: a table of expected dtypes, on meta


def _meta(*shape: int, dtype: torch.dtype = FP32) -> Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


M = {
    "x": _meta(4, 8),
    "h": _meta(4, 8, dtype=FP16),
    "w": nn.Parameter(_meta(6, 8)),
    "a3": _meta(2, 4, 8),
    "b3": _meta(2, 8, 5),
    "q": _meta(2, 3, 5, 4),
    "x64": _meta(4, 8, dtype=torch.float64),
}

CUDA_EXPECTED: list[tuple[str, Callable[[], Tensor], torch.dtype]] = [
    ("F.linear", lambda: F.linear(M["x"], M["w"]), FP16),
    ("torch.matmul", lambda: torch.matmul(M["x"], M["w"].T), FP16),
    ("@", lambda: M["x"] @ M["w"].T, FP16),
    ("torch.bmm", lambda: torch.bmm(M["a3"], M["b3"]), FP16),
    ("torch.einsum", lambda: torch.einsum("bij,bjk->bik", M["a3"], M["b3"]), FP16),
    ("F.sdpa", lambda: F.scaled_dot_product_attention(M["q"], M["q"], M["q"]), FP16),
    ("Tensor.softmax", lambda: M["h"].softmax(-1), FP32),
    ("F.softmax", lambda: F.softmax(M["h"], dim=-1), FP32),
    ("F.log_softmax", lambda: F.log_softmax(M["h"], dim=-1), FP32),
    ("softmax, dtype given", lambda: M["h"].softmax(-1, dtype=FP16), FP16),
    ("F.layer_norm", lambda: F.layer_norm(M["h"], (8,)), FP32),
    ("torch.exp", lambda: torch.exp(M["h"]), FP32),
    ("Tensor.exp", lambda: M["h"].exp(), FP32),
    ("x ** 2", lambda: M["h"] ** 2, FP32),
    ("2 ** x", lambda: 2 ** M["h"], FP32),
    ("Tensor.pow", lambda: M["h"].pow(2), FP32),
    ("1 / x (reciprocal)", lambda: 1.0 / M["h"], FP32),
    ("Tensor.sum", lambda: M["h"].sum(), FP32),
    ("torch.sum dim", lambda: torch.sum(M["h"], dim=0), FP32),
    ("cumsum", lambda: M["h"].cumsum(0), FP32),
    ("F.mse_loss", lambda: F.mse_loss(M["h"], M["h"]), FP32),
    ("Tensor.norm", lambda: M["h"].norm(), FP32),
    ("addcmul mixed (promote)", lambda: torch.addcmul(M["x"], M["h"], M["h"]), FP32),
    ("addcmul fp16 (promote)", lambda: torch.addcmul(M["h"], M["h"], M["h"]), FP16),
    ("F.gelu (not listed)", lambda: F.gelu(M["h"]), FP16),
    ("cat (not listed on CUDA)", lambda: torch.cat([M["h"], M["h"]]), FP16),
    ("float64 linear", lambda: F.linear(M["x64"], M["x64"]), torch.float64),
]


@pytest.mark.parametrize(("call", "expected"), [(c, d) for c, _, d in CUDA_EXPECTED])
def test_cuda_policy_table(call: str, expected: torch.dtype) -> None:
    f = next(f for c, f, _ in CUDA_EXPECTED if c == call)
    with emulated_autocast("cuda", FP16):
        assert f().dtype == expected


def test_cuda_policy_refuses_binary_cross_entropy() -> None:
    with emulated_autocast("cuda", FP16), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(M["h"], M["h"])


def test_cuda_softmax_of_fp16_makes_no_fp32_copy_of_its_input() -> None:
    """As on CUDA (half_to_float): fp16 in, fp32 out, and an fp16 gradient back."""
    h = _meta(4, 8, dtype=FP16).requires_grad_()
    with Recorder() as rec:
        with emulated_autocast("cuda", FP16):
            out = h.softmax(-1)
        out.sum().backward()
    assert out.dtype == FP32 and h.grad is not None and h.grad.dtype == FP16
    assert not any("_to_copy" in op for op, _ in rec.ops), rec.ops


def test_cuda_policy_leaves_cpu_tensors_alone() -> None:
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with emulated_autocast("cuda", FP16):
        assert F.linear(x, w).dtype == FP32
        assert F.linear(x.to("meta"), w.to("meta")).dtype == FP16


@pytest.mark.parametrize(("name", "params"), MECHANISMS, ids=IDS)
def test_layer_on_meta_under_the_cuda_policy(name: str, params: dict) -> None:
    """The memory model's use: fp16 matmuls, fp32 norms, fp32 gradients for fp32 weights."""
    model = _layer(name, params).to("meta")
    x = torch.empty(2, 64, 64, device="meta")
    with Recorder() as rec:
        with emulated_autocast("cuda", FP16) as amp:
            out = model(x)
            assert amp.cache  # the weights' fp16 copies, held for the region
        assert not amp.cache
        out.float().pow(2).mean().backward()
    # on meta, sdpa falls back to its math kernel, which computes in fp32 inside: which kernel
    # runs is the memory model's business, so there only the projections are checked
    fused = name == "sdpa" or (name == "linformer" and params.get("kernel") == "sdpa")
    kinds = ("mm", "addmm") if fused else ("mm", "addmm", "bmm")
    matmuls = [dt for op, dt in rec.ops if op.split(".")[1] in kinds]
    assert matmuls and all(dt[0][0] == FP16 for dt in matmuls)
    norms = [dt for op, dt in rec.ops if op == "aten.native_layer_norm.default"]
    assert norms and all(dt[0][0] == FP32 for dt in norms)
    assert all(p.grad is not None and p.grad.dtype == FP32 for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# The region: weight cache, what it leaves behind, nesting


@contextmanager
def _live_bytes() -> Iterator[Callable[[], int]]:
    tracker = MemoryTracker()
    with tracker:
        yield lambda: tracker.live


@pytest.mark.parametrize("kind", list(CONTEXTS))
def test_weights_are_cast_once_and_released_at_exit(kind: str) -> None:
    """Each weight cast once per region, its copy held to the end of it, then freed: the live
    bytes inside and after the region are the same under the real and the emulated autocast."""
    lin = nn.Linear(32, 32)
    x = torch.randn(4, 32)
    with _live_bytes() as live, Recorder() as rec, torch.no_grad():
        with CONTEXTS[kind]():
            start = live()
            y = lin(lin(x))
            del y
            inside = live()
        after = live()
    assert sum(op == "aten._to_copy.default" and dt[0][1] == (32, 32) for op, dt in rec.ops) == 1
    assert inside - start == 32 * 32 * 2 + 512  # the bf16 weight, and bias (rounded to 512 B)
    assert after == start


def test_cache_is_released_at_exit() -> None:
    lin = nn.Linear(8, 8)
    with torch.no_grad(), emulated_autocast("cpu", BF16) as amp:
        lin(torch.randn(2, 8))
        copies = [weakref.ref(copy) for _, copy in amp.cache.values()]
        assert len(copies) == 2 and all(c() is not None for c in copies)
    gc.collect()
    assert not amp.cache and all(c() is None for c in copies)


def test_tensors_outside_the_region_are_untouched() -> None:
    lin = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with emulated_autocast("cpu", BF16):
        assert lin(x).dtype == BF16
    assert lin.weight.dtype == FP32 and x.dtype == FP32
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == BF16  # torch's default, restored
    with Recorder() as rec:
        assert lin(x).dtype == FP32
    assert not any("_to_copy" in op for op, _ in rec.ops)


def test_nested_regions_follow_torch_autocast_switches() -> None:
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    with emulated_autocast("cpu", BF16):
        assert torch.is_autocast_enabled("cpu")
        with torch.autocast("cpu", enabled=False):
            assert F.linear(x, w).dtype == FP32
        assert F.linear(x, w).dtype == BF16
        with emulated_autocast("cpu", BF16, enabled=False):
            assert F.linear(x, w).dtype == FP32
            with emulated_autocast("cpu", FP16):
                assert F.linear(x, w).dtype == FP16
        assert F.linear(x, w).dtype == BF16
        with pytest.raises(ValueError, match="cannot nest"):
            with emulated_autocast("cuda", FP16):
                pass
    with emulated_autocast("cuda", FP16):  # what performer-pytorch checks, and how it opts out
        assert torch.is_autocast_enabled()
        h = torch.empty(2, 8, device="meta")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with torch.cuda.amp.autocast(enabled=False):
                assert F.linear(h, h).dtype == FP32
        assert F.linear(h, h).dtype == FP16
    assert not torch.is_autocast_enabled()


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="device_type"), emulated_autocast("xla", FP16):
        pass
    with pytest.raises(ValueError, match="dtype"), emulated_autocast("cpu", FP32):
        pass
