"""One version's timing process for ``attnbench check``, driven over stdin/stdout.

Run as a script (``python worker.py ROOT``) with ``PYTHONPATH`` pointing into one version's
tree, so that ``import attnbench`` (and any plugin named by ``$ATTNBENCH_PLUGINS``) is that
version's code, not the code that drives the check. It therefore uses only what every
version of attnbench has — ``attnbench.create`` and ``attnbench.names`` — and imports
nothing else of the package.

Protocol, one JSON object per line. In: ``{"op": "setup", "cells": [...], "device", "threads",
"warmup"}``, then ``{"op": "time", "cell": i, "reps": m}`` any number of times; the end of
stdin ends the worker. Out: one JSON reply per request; a cell that this version cannot
build is reported with its reason at setup and never timed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# the protocol gets its own copy of stdout; fd 1 then points at stderr, so that a print()
# in the code under test (a plugin's, say) cannot corrupt a reply
_PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def _reply(obj: dict[str, Any]) -> None:
    _PROTOCOL.write(json.dumps(obj) + "\n")
    _PROTOCOL.flush()


def _timer(layer: Any, x: Any, cell: dict[str, Any], sync: Any) -> Any:
    """``timed(reps)``: seconds per repeat of what the cell times. A forward cell: the
    layer's forward under inference_mode. A training cell: its backward alone (the forward
    before each is not timed: the forward cells time that), so that a backward 15 % slower
    reads as 15 %, not diluted by an unchanged forward. Plain torch, so that it times any
    version's layer alike."""
    import torch

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


def main(root: str) -> int:
    import importlib

    import torch

    import attnbench

    # the driver says where each module must come from inside this version's tree (its
    # path relative to the tree): anything else means the wrong version would be timed
    expect = json.loads(os.environ.get("ATTNBENCH_CHECK_EXPECT", "{}"))
    for name, rel in expect.items():
        try:
            module = importlib.import_module(name)
        except Exception as e:
            _reply({"error": f"cannot import {name} from {root}: {type(e).__name__}: {e}"})
            return 1
        where = os.path.realpath(module.__file__ or "")
        want = os.path.realpath(os.path.join(root, rel))
        if where != want:
            _reply({"error": f"imported {name} from {where}, not from this version's {want}"})
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
                    torch.manual_seed(i)  # the same weights in both versions
                    layer = (
                        attnbench.create(
                            c["attention"],
                            d_model=c["d_model"],
                            n_heads=c["n_heads"],
                            max_seq_len=c["n"],
                            **c["params"],
                        )
                        .to(device)
                        .eval()
                    )
                    g = torch.Generator().manual_seed(i)
                    x = torch.randn(c["batch"], c["n"], c["d_model"], generator=g).to(device)
                    timed = _timer(layer, x, c, sync)
                    if msg["warmup"]:
                        timed(msg["warmup"])
                    runs.append(timed)
                    built.append({"ok": True, "once_s": timed(1)})
                except Exception as e:  # this version cannot run the cell: say so
                    runs.append(None)
                    built.append({"ok": False, "reason": f"{type(e).__name__}: {e}"})
            _reply({"cells": built})
        elif msg["op"] == "time":
            _reply({"s": runs[msg["cell"]](msg["reps"])})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
