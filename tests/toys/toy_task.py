"""A toy quality task, from this file alone: ``task=toy_gain``, one setting (``scale``) and
one figure (``gain``: the mechanism's output norm over its input's, on seeded random inputs,
times ``scale``). Loaded as a plugin (``ATTNBENCH_PLUGINS=tests.toys.toy_task``)."""

from __future__ import annotations

from typing import Any

import torch

from attnbench import registry
from attnbench.quality.tasks import Figure, Task, register
from attnbench.settings import Setting, number


def _check(cell: Any, s: dict[str, Any]) -> None:
    """The task's own rule: its one setting, named by its key."""
    number(open_low=True)("quality.toy_gain.scale", s["scale"])


def _run(cell: Any, s: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    layer = registry.create(cell.attention, d_model=cell.model.d_model, n_heads=cell.model.n_heads,
                            max_seq_len=cell.n, **cell.mechanism_params())  # fmt: skip
    x = torch.randn(1, cell.n, cell.model.d_model)
    with torch.no_grad():
        gain = float(layer(x).norm() / x.norm())
    return {"gain": s["scale"] * gain}


TOY_TASK = Task(
    "toy_gain",
    "the output's norm over the input's (a test's toy task)",
    (Setting("scale", 2.0, "what the gain is multiplied by", float),),
    (Figure("gain", "number", "scale × ‖attention(x)‖ / ‖x‖"),),
    _check,
    _run,
)
register(TOY_TASK)
