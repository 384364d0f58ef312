"""One version's timing process for ``attnbench check``, driven over stdin/stdout.

Run as a script (``python worker.py ROOT``) with ``PYTHONPATH`` pointing into one version's
tree, so that ``import attnbench`` (and any plugin named by ``$ATTNBENCH_PLUGINS``) is that
version's code, not the code that drives the check. It therefore uses only what every
version of attnbench has — ``attnbench.create`` and ``attnbench.names`` — and imports
nothing else of the package; a decode cell also asks the layer for its incremental form
(``new_state``, ``extend``, the state's ``seek``), which a version without it does not
have: that version reports the cell as one it cannot build, never a crash. A compiled cell
is compiled by the gate's own code (:func:`_gate_compiled`), so that a version from before
compiled cells (HEAD~1 in CI) times them as well.

Protocol, one JSON object per line. In: ``{"op": "setup", "cells": [...], "device", "threads",
"warmup"}``, then ``{"op": "time", "cell": i, "reps": m}`` any number of times; the end of
stdin ends the worker. Out: one JSON reply per request; a cell that this version cannot
build is reported with its reason at setup and never timed (a compiled one's setup has its
``compile_s``, ``graphs``); a sample that raises is answered ``{"error": why}``: no figure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# the protocol's own copy of stdout, taken first thing in main(): fd 1 then points at
# stderr, so that a print() in the code under test (a plugin's, say) cannot corrupt a reply
_PROTOCOL: Any = None


# a decode sample's layer and state are placed after a hole of up to this many bytes, drawn
# per sample (_decode)
PLACE_BYTES = 1 << 20
# a compiled cell: torch.compile's default mode, static shapes (as attnbench.measure.compiled
# compiles a step of one shape); warmed by at most this many calls until one compiles nothing
COMPILE_MODE = "default"
WARM_CALLS = 4


def _reply(obj: dict[str, Any]) -> None:
    _PROTOCOL.write(json.dumps(obj) + "\n")
    _PROTOCOL.flush()


def _timer(layer: Any, x: Any, cell: dict[str, Any], sync: Any) -> Any:
    """``timed(reps)``: seconds per repeat of what the cell times. A forward cell: the
    layer's forward under inference_mode. A training cell: its backward alone (the forward
    before each is not timed: the forward cells time that), so that a backward 15 % slower
    reads as 15 %, not diluted by an unchanged forward. A decode cell: one decode step
    (:func:`_decode`). Plain torch, so that it times any version's layer alike."""
    import torch

    if cell.get("mode") == "decode":
        return _decode(layer, x, cell, sync)
    if cell.get("mode") != "train":

        def forward(reps: int) -> float:
            with torch.inference_mode():
                sync()
                t = time.perf_counter()
                for _ in range(reps):
                    layer(x)
                sync()
                return (time.perf_counter() - t) / reps

        return forward
    layer.train()
    x.requires_grad_(True)

    def backward(reps: int) -> float:
        spent = 0.0
        for _ in range(reps):
            loss = layer(x).pow(2).mean()
            sync()
            t = time.perf_counter()
            loss.backward()
            sync()
            spent += time.perf_counter() - t
            layer.zero_grad(set_to_none=True)
            x.grad = None
        return spent / reps

    return backward


def _why(e: BaseException) -> str:  # one line: a compiler's messages run to pages
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def _gate_compiled() -> Any:
    """The gate's own :mod:`attnbench.measure.compiled` (beside this file), loaded by path
    under a private name, never the version's: the version under test may predate it. It
    imports nothing of attnbench at run time, so it brings in no code of either version."""
    import importlib.util

    name = "_attnbench_gate_compiled"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(__file__), os.pardir, "measure", "compiled.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


def _compiled(layer: Any, x: Any, cell: dict[str, Any], sync: Any) -> tuple[Any, dict]:
    """A compiled forward cell: the layer under ``torch.compile`` (:data:`COMPILE_MODE`,
    static shapes) run until a call compiles nothing, before any sample; ``timed(reps)``
    under ``strict(timing=True)`` (a recompilation raises, and so does any new graph), and
    ``{"compile_s", "graphs"}``: what compiling cost (information, in no verdict)."""
    from torch._dynamo.exc import RecompileError

    gate = _gate_compiled()
    layer.compile(mode=COMPILE_MODE, dynamic=False)
    timed = _timer(layer, x, cell, sync)
    start, graphs = time.perf_counter(), 0
    with gate.strict(timing=False):
        for _ in range(WARM_CALLS):
            before = gate.graphs()
            timed(1)
            graphs += gate.graphs() - before
            if gate.graphs() == before:
                break
        else:
            raise RuntimeError(
                f"still compiling after {WARM_CALLS} calls: no steady compiled code to time"
            )
    cost = {"compile_s": time.perf_counter() - start, "graphs": graphs}

    def strict(reps: int) -> float:
        before = gate.graphs()
        try:
            with gate.strict(timing=True):
                seconds = timed(reps)
        except RecompileError as e:
            raise RuntimeError(f"recompiled while sampled ({_why(e)})") from e
        if gate.graphs() != before:
            raise RuntimeError(f"compiled {gate.graphs() - before} new graph(s) while sampled")
        return seconds

    return strict, cost


def _decode(layer: Any, x: Any, cell: dict[str, Any], sync: Any) -> Any:
    """``timed(reps)`` of a decode cell: seconds per decode step, ``layer.extend`` of one
    token (b, 1, d) — ``x`` — on a state at position n, each step timed alone.

    The state (capacity n + 1, the layer's dtype) is put at position n by ``seek(n)`` and
    filled with random values in (0, 1) from a fixed seed, as ``mode=decode`` fills a
    state it does not prefill (never zeros: a recurrent state's normaliser must be
    positive); no prefill is run, as a step's time depends on its shapes, not on the values
    it reads. Each sample starts from those very contents, and every step is rewound to n
    first (``seek`` is not timed), so that every step of every sample, in either version,
    is the same work: one token attending over n earlier ones.

    Each sample also runs on a copy of the layer and a new state placed at addresses of its
    own (:data:`PLACE_BYTES`): a step reads the weights and the state once each, about as
    much as the L3 holds, so its time depends on where they lie, and two identical layers
    in one process were timed up to 15 % apart, whichever came first, as steadily as a
    regression (p ≈ 1 the other way). One placement per process would make that a
    difference between the two versions' workers; a new one per sample makes it noise that
    both versions draw alike.

    A version whose layer or state lacks the incremental form raises here, which
    :func:`main` reports as a cell this version cannot build."""
    import random

    import torch

    missing = [m for m in ("new_state", "extend") if not callable(getattr(layer, m, None))]
    if missing:
        raise RuntimeError(
            f"this version has no incremental form (no {', '.join(missing)}): "
            "no decode step to time"
        )
    n, b = cell["n"], cell["batch"]
    contents = _state_at(layer, b, n)
    places = random.Random(0)  # the same draws in both versions

    def decode(reps: int) -> float:
        here, fresh = _placed(layer, b, n, contents, places)
        spent = 0.0
        with torch.inference_mode():
            for _ in range(reps):
                fresh.seek(n)
                sync()
                t = time.perf_counter()
                here.extend(x, fresh)
                sync()
                spent += time.perf_counter() - t
        return spent / reps

    return decode


def _state_at(layer: Any, b: int, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The contents every decode sample starts from, as (tensors, other attributes) of a
    state of ``layer`` (capacity n + 1) put at position n by ``seek(n)``, its floating
    tensors filled from a fixed seed in (0, 1); the state itself is let go, as each sample
    gets its own (:func:`_placed`). A state without ``seek`` raises: this version cannot
    rewind to a fixed context."""
    import torch

    param = next(layer.parameters())
    with torch.inference_mode():
        state = layer.new_state(b, n + 1, param.dtype, param.device)
        if not callable(getattr(state, "seek", None)):
            raise RuntimeError(
                f"this version's decode state ({type(state).__name__}) has no seek(length) "
                "to rewind it: no decode step at a fixed context to time"
            )
        state.seek(n)
        gen = torch.Generator().manual_seed(2)
        for value in vars(state).values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value.copy_(torch.rand(value.shape, generator=gen, dtype=value.dtype))
        saved = {k: v.clone() for k, v in vars(state).items() if isinstance(v, torch.Tensor)}
        plain = {k: v for k, v in vars(state).items() if not isinstance(v, torch.Tensor)}
    return saved, plain


def _placed(
    layer: Any, b: int, n: int, contents: tuple[dict, dict], places: Any
) -> tuple[Any, Any]:
    """A copy of the layer and a state with ``contents`` (:func:`_state_at`), allocated
    after a hole of a size drawn from ``places`` for this sample, then freed: at addresses
    of their own (why: :func:`_decode`)."""
    import copy

    import torch

    saved, plain = contents
    param = next(layer.parameters())
    hole = torch.empty(places.randrange(PLACE_BYTES) // 4 + 1, device=param.device)
    here = copy.deepcopy(layer)
    with torch.inference_mode():
        fresh = here.new_state(b, n + 1, param.dtype, param.device)
        for k, v in saved.items():
            getattr(fresh, k).copy_(v)
        for k, v in plain.items():
            setattr(fresh, k, v)
    del hole
    return here, fresh


def main(root: str) -> int:
    global _PROTOCOL
    _PROTOCOL = os.fdopen(os.dup(1), "w")  # before any import of the version's code
    os.dup2(2, 1)
    import torch

    import attnbench  # its __file__: which tree this worker imports
    from attnbench import registry  # noqa: F401 - the built-ins registered before any plugin

    if (wrong := _wrong_origin(root)) is not None:
        _reply({"error": wrong})
        return 1
    _reply({"ready": True, "attnbench": attnbench.__file__, "torch": torch.__version__})
    runs: list[Any] = []
    sync = lambda: None  # noqa: E731 - replaced on CUDA
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "setup":
            torch.set_num_threads(msg["threads"])
            device = torch.device(msg["device"])
            if device.type == "cuda":
                sync = torch.cuda.synchronize
            runs, built = [], []
            for i, c in enumerate(msg["cells"]):
                try:
                    timed, cost = _build(i, c, device, sync)
                    if msg["warmup"]:
                        timed(msg["warmup"])
                    runs.append(timed)
                    built.append({"ok": True, "once_s": timed(1), **cost})
                except Exception as e:  # this version cannot run the cell: say so
                    runs.append(None)
                    built.append({"ok": False, "reason": _why(e)})
            _reply({"cells": built})
        elif msg["op"] == "time":
            try:
                _reply({"s": runs[msg["cell"]](msg["reps"])})
            except Exception as e:  # no figure: the driver ends the check (exit 2)
                _reply({"error": _why(e)})
    return 0


def _wrong_origin(root: str) -> str | None:
    """Why this worker would time the wrong version, or None: the driver says where each
    module must come from inside this version's tree (``$ATTNBENCH_CHECK_EXPECT``, its path
    relative to the tree), and a module imported from anywhere else is the wrong code."""
    import importlib

    expect = json.loads(os.environ.get("ATTNBENCH_CHECK_EXPECT", "{}"))
    for name, rel in expect.items():
        try:
            module = importlib.import_module(name)
        except Exception as e:
            return f"cannot import {name} from {root}: {type(e).__name__}: {e}"
        where = os.path.realpath(module.__file__ or "")
        want = os.path.realpath(os.path.join(root, rel))
        if where != want:
            return f"imported {name} from {where}, not from this version's {want}"
    return None


def _build(i: int, c: dict[str, Any], device: Any, sync: Any) -> tuple[Any, dict[str, Any]]:
    """Cell ``i`` as this version builds it: (``timed(reps)``, what compiling it cost, for a
    compiled cell). Its layer's weights and its input come from seed ``i``, the same in
    both versions; a decode cell's layer is the causal one (only that one extends), its
    input one token of each sequence, at position n (the n + 1st token)."""
    import torch

    from attnbench import registry

    torch.manual_seed(i)  # the same weights in both versions
    decode = c.get("mode") == "decode"
    causal = {"causal": True} if decode else {}
    layer = (
        registry.create(
            c["attention"],
            d_model=c["d_model"],
            n_heads=c["n_heads"],
            max_seq_len=c["n"] + decode,
            **{**c["params"], **causal},
        )
        .to(device)
        .eval()
    )
    g = torch.Generator().manual_seed(i)
    tokens = 1 if decode else c["n"]
    x = torch.randn(c["batch"], tokens, c["d_model"], generator=g).to(device)
    if c.get("compiled"):  # compiled here, before any sample
        return _compiled(layer, x, c, sync)
    return _timer(layer, x, c, sync), {}


def _root(argv: list[str]) -> str:
    """The version's tree from the command line; a mistyped call is one line, exit code 2
    (argparse, the stdlib: this file imports nothing of attnbench)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m attnbench.check.worker",
        description="One version's timing process for attnbench check, driven over "
        "stdin/stdout (a JSON request and a JSON reply a line): the check starts one per "
        "version, by path, inside that version's tree. Not a command to type: use "
        "attnbench check.",
    )
    parser.add_argument("root", metavar="ROOT", help="the version's tree")
    root = parser.parse_args(argv).root
    if not os.path.isdir(root):
        parser.exit(2, f"{parser.prog}: error: ROOT: {root!r} is not a directory\n")
    if sys.stdin.isatty():
        parser.exit(2, f"{parser.prog}: error: stdin is a terminal: it reads the requests "
                    "of attnbench check, a JSON line each\n")  # fmt: skip
    return root


if __name__ == "__main__":
    sys.exit(main(_root(sys.argv[1:])))
