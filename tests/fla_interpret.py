"""flash-linear-attention's real Triton kernels on a CPU, through Triton's interpreter: the
bridge the tests of ``kernel=fla`` load before fla is imported. Test support, not the
package: no user runs the interpreter, and these patches change Triton for the whole process.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` kernels run as Python over numpy views of CPU
tensors: each program of the grid in turn, every ``tl`` op a numpy op. Written against
triton 3.9.0 and fla-core 0.6.0 (the extra ``fla-interpret`` pins both); with them it runs
every op our mixers call once three gaps are bridged:

* **the autotuner** times its configurations through the active GPU driver, and there is
  none ("0 active drivers"): it times nothing here and takes the first configuration its
  pruning leaves (any configuration computes the same result; only its speed differs);
* **loop indices**: compiled Triton gives a ``for i in range(...)`` index as a tensor, the
  interpreter as a Python int, and fla calls ``.to(tl.int64)`` on it
  (``fla/ops/common/chunk_h.py``): each fla module's ``range`` yields ints that take ``.to``;
* **bf16 in ``tl.dot``**: the interpreter keeps bf16 as its raw uint16 storage and multiplies
  that (results near 1e10): bf16 operands are widened to fp32 first, as a GPU's bf16 dot
  accumulates in fp32.

One more for a test process, where something else may have imported triton first (torch
does, to compile): ``TRITON_INTERPRET`` is read when a function is decorated, so Triton's own
``@jit`` library (``tl.cumsum``, ``tl.sigmoid``, ...) was compiled-mode and refuses to run
inside an interpreted kernel; those are decorated again for the interpreter.

The kernels then compute what they compute on a GPU, at a GPU's precision per op, slowly:
the interpreter loops over the grid in Python, and ``fused_recurrent`` kernels over every
position, so the tests keep shapes tiny and call ``fused_recurrent`` for one-token steps
only.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterator

PINNED = {"triton": "3.9.0", "fla-core": "0.6.0"}  # the versions these patches are written for
# the fla.ops packages our mixers call (attnbench.attention.fla_kernels)
PACKAGES = ("gla", "simple_gla", "delta_rule", "gated_delta_rule", "kda")


class _Index(int):
    """A loop index as compiled Triton has it: ``.to(dtype)`` works (and keeps the int,
    which is exact at any width)."""

    def to(self, *args: object, **kwargs: object) -> _Index:
        return self


def _range(*args: int) -> Iterator[_Index]:
    for i in builtins.range(*args):
        yield _Index(i)


def _interpret_triton_library() -> None:
    """Triton's own ``@jit`` functions, decorated for the interpreter where triton was
    imported before ``TRITON_INTERPRET`` was set (each function once, in every module that
    holds it)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    done: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if name != "triton.language" and not name.startswith("triton.language."):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in done:
                    done[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, done[id(value)])


def why_not() -> str | None:
    """Why the interpreter cannot run fla's kernels here (a line for ``pytest.skip``), or
    None: triton or fla-core missing, or at versions other than those patched."""
    for dist, pinned in PINNED.items():
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"{dist} is not installed (pip install -e '.[fla-interpret]')"
        if version != pinned:
            return f"{dist} {version} is installed; the interpreter bridge is for {pinned}"
    if "fla.ops" in sys.modules and not os.environ.get("TRITON_INTERPRET"):
        return "fla.ops was imported before the interpreter bridge, compiled for a GPU"
    return None


def load() -> None:
    """Set the interpreter on, bridge the three gaps, and import the fla ops our mixers call.
    Idempotent; raises RuntimeError with :func:`why_not`'s line where it cannot."""
    if why := why_not():
        raise RuntimeError(why)
    os.environ["TRITON_INTERPRET"] = "1"  # read when each kernel is decorated: before fla
    import triton.language as tl
    from triton.runtime import autotuner, interpreter

    if not getattr(autotuner.Autotuner, "_attnbench_bridged", False):
        prune = autotuner.Autotuner.prune_configs
        autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
        autotuner.Autotuner._attnbench_bridged = True

        builder = interpreter.InterpreterBuilder
        dot = builder.create_dot

        def create_dot(self, a, b, d, *rest):  # type: ignore[no-untyped-def]
            def widened(t):  # type: ignore[no-untyped-def]
                return self.cast_impl(t, tl.float32) if t.dtype.scalar == tl.bfloat16 else t

            return dot(self, widened(a), widened(b), d, *rest)

        builder.create_dot = create_dot
    _interpret_triton_library()
    for package in PACKAGES:
        importlib.import_module(f"fla.ops.{package}")
    for name, module in list(sys.modules.items()):
        if name == "fla" or name.startswith("fla."):
            module.range = _range  # type: ignore[attr-defined]
