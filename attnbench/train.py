"""One training step of the encoder, as people train: the three parts attnbench times apart.

``mode=train`` measures this step instead of the inference forward: a forward (under
``torch.autocast`` for fp16/bf16, the weights staying fp32 master weights, as mixed
precision trains; a ``GradScaler`` for fp16), the loss (the mean square of the output),
the backward, the optimizer's step and ``zero_grad(set_to_none=True)``. The input requires
grad, as an embedding's output does, so the first layer's input gradient is computed as in
a real model.

The same :class:`TrainStep` runs on real tensors (timing, GPU probes) and on meta tensors
(the memory model), where ``torch.autocast`` does nothing and
:func:`attnbench.measure.autocast.emulated_autocast` casts as it would.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

OPTIMIZERS = ("adamw", "sgd", "none")
PARTS = ("forward", "backward", "optimizer")
LR = 1e-4


def make_optimizer(name: str, params: Any, *, foreach: bool) -> torch.optim.Optimizer | None:
    """AdamW (two state tensors per parameter), SGD with momentum 0.9 (one), or none.

    ``foreach`` is what PyTorch picks by default on CUDA (multi-tensor kernels, which
    allocate whole-model temporaries); the memory model of a GPU preset uses it so.
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=foreach)
    return None


class TrainStep:
    """forward → loss → backward → optimizer step → zero_grad, as three callable parts.

    ``autocast`` makes the forward's mixed-precision context (``nullcontext`` in fp32).
    Parts run in order; :meth:`__call__` runs all three.
    """

    def __init__(
        self,
        model: nn.Module,
        x: Tensor,
        optimizer: str,
        *,
        foreach: bool,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.model = model.train()
        self.x = x.requires_grad_(True)
        self.opt = make_optimizer(optimizer, model.parameters(), foreach=foreach)
        self.autocast = autocast
        self.scaler = scaler
        self.loss: Tensor | None = None

    def forward(self) -> None:
        with self.autocast():
            out = self.model(self.x)
        self.loss = out.float().pow(2).mean()

    def backward(self) -> None:
        loss, self.loss = self.loss, None
        assert loss is not None, "backward before forward"
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def optimizer(self) -> None:
        if self.opt is not None and self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        elif self.opt is not None:
            self.opt.step()
        self.model.zero_grad(set_to_none=True)
        self.x.grad = None

    @property
    def parts(self) -> tuple[Callable[[], None], ...]:
        return (self.forward, self.backward, self.optimizer)

    def __call__(self) -> None:
        for part in self.parts:
            part()

    def release(self) -> None:
        """Drop what a step that stopped midway (out of memory) left: the loss with its graph,
        the gradients made so far. A finished step leaves neither; the optimizer's state,
        which every step after the first keeps, stays."""
        self.loss = None
        self.model.zero_grad(set_to_none=True)
        if self.x is not None:
            self.x.grad = None

    def state_tensors(self, *, host_steps: bool) -> list[Tensor]:
        """The optimizer's state (after a first step has made it). ``host_steps=True``
        leaves out Adam's ``step`` counters, which live on the host beside a GPU model
        (``capturable=False``, PyTorch's default)."""
        if self.opt is None:
            return []
        return [
            t
            for state in self.opt.state.values()
            for name, t in state.items()
            if isinstance(t, Tensor) and not (host_steps and name == "step")
        ]
