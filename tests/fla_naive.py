"""flash-linear-attention's plain PyTorch references (its ``fla/ops/<op>/naive.py`` files), loaded
without triton, for tests/test_fla_references.py and for benchmarks that time them.

``import fla.ops`` imports every Triton kernel, so it needs triton (about 1 GB, and CUDA to run).
The naive modules import only torch and einops, so each is loaded here by its file path with
``importlib.util.spec_from_file_location``: neither ``fla`` nor ``fla.ops`` is executed.
``importlib.util.find_spec("fla")`` only locates the top-level package (its ``__init__`` is not
run: ``fla`` is not in ``sys.modules`` afterwards).

Every loader returns ``(thing, "")`` or ``(None, reason)``, the reason a line a test can hand to
``pytest.skip``: fla-core not installed, the file absent in the installed version, or the file
importing something that is not here (triton, or the rest of ``fla``, which needs triton).

Written against fla-core 0.6.0 (``pip install 'attnbench[test]'`` pins it). There the naive
references used below are, with their layouts (B batch, T positions, H heads; states are
(B, H, K, V) throughout, as ours are (b, h, dk, dv)):

* ``gated_delta_rule``: ``naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale, ...)`` and
  ``naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size, scale, ...)`` (note the order of
  g and beta), (B, T, H, ·), computed in float32;
* ``delta_rule``: ``delta_rule_recurrence``, ``delta_rule_chunkwise`` (T a multiple of the
  chunk, no initial state) and ``delta_rule_parallel``, (B, H, T, ·), the scale fixed at K^-1/2;
* ``gla``: ``naive_recurrent_gla(q, k, v, gk, ...)``, (B, T, H, ·), scale fixed at K^-1/2;
* ``simple_gla``: ``naive_recurrent_simple_gla``, ``naive_chunk_simple_gla`` and
  ``naive_parallel_simple_gla``, (B, T, H, ·), g (B, T, H);
* ``retention``: ``naive_retention(q, k, v)``, (B, H, T, ·), the decays fixed at
  1 − 2^(−5−h) per head, no state in or out.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

DISTRIBUTION = "fla-core"
INSTALL = "pip install 'attnbench[test]' (fla-core==0.6.0; no triton needed)"


def fla_root() -> tuple[Path | None, str]:
    """The installed ``fla`` package's directory, found without importing it, or (None, why)."""
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError) as exc:  # a broken or half-installed package
        return None, f"fla cannot be located: {exc}"
    if spec is None or not spec.submodule_search_locations:
        return None, f"flash-linear-attention (fla-core) is not installed: {INSTALL}"
    return Path(next(iter(spec.submodule_search_locations))), ""


def version() -> str | None:
    """The installed fla-core's version (from its metadata, not by importing it), or None."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def load(op: str, file: str = "naive.py") -> tuple[ModuleType | None, str]:
    """``fla/ops/<op>/<file>`` executed as a module of its own (not registered as part of
    ``fla``), or (None, why): fla absent, the file absent, or an import it makes failing."""
    root, why = fla_root()
    if root is None:
        return None, why
    path = root / "ops" / op / file
    if not path.is_file():
        return None, f"fla-core {version()} has no fla/ops/{op}/{file}"
    spec = importlib.util.spec_from_file_location(f"_fla_naive_{op}_{path.stem}", path)
    if spec is None or spec.loader is None:
        return None, f"fla/ops/{op}/{file} cannot be loaded by path"
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # by path there is no parent package: a relative import fails
        if exc.name is None:
            return None, f"fla/ops/{op}/{file} cannot be loaded by path: {exc}"
        why = f"fla/ops/{op}/{file} needs {exc.name}, which is not importable here"
        if exc.name.split(".")[0] == "triton":
            why += " (it imports fla.ops or triton; this project does not install triton)"
        return None, why
    return module, ""


def function(op: str, name: str, file: str = "naive.py") -> tuple[Callable | None, str]:
    """The function ``name`` of ``fla/ops/<op>/<file>``, or (None, why)."""
    module, why = load(op, file)
    if module is None:
        return None, why
    fn = getattr(module, name, None)
    if not callable(fn):
        return None, f"fla-core {version()}: fla/ops/{op}/{file} has no function {name}"
    return fn, ""


def naive_chunk_gated_delta_rule() -> tuple[Callable | None, str]:
    """fla's plain PyTorch chunked gated delta rule, for a benchmark to time against ours, or
    (None, why). Called as ``fn(q, k, v, g, beta, chunk_size=64, scale=None,
    initial_state=None, output_final_state=False) -> (o, final_state or None)`` with q, k
    (B, T, H, K), v (B, T, H, V), g = log α and beta (B, T, H), initial_state (B, H, K, V);
    scale None is K^-1/2; keys are not normalised inside. It computes in float32 whatever
    the input dtype, pads T to a multiple of chunk_size, and inverts each chunk's
    (I + A) by a Python loop over the chunk's rows (chunk_size − 1 small steps per call):
    a naive reference, not a kernel, so time it as such."""
    return function("gated_delta_rule", "naive_chunk_gated_delta_rule")
