"""``mode=train``: one training step as people train, its parts timed apart.

The step is :class:`attnbench.train.TrainStep`: forward (under autocast with fp32 master
weights on a GPU), loss, backward, optimizer, ``zero_grad``. What makes it a workload of its
own: the model is kept in fp32 and in train mode, with activation checkpointing when the
cell asks; the input is fp32 and requires grad (an embedding's output); a first step makes
the optimizer's state, which every later step keeps (``primes``); the backward adds FLOPs;
the three parts are timed apart; and a mechanism may refuse to train (``cannot_train``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnbench.measure.autocast import emulated_autocast
from attnbench.measure.cuda_layouts import CudaBackwardTemporaries
from attnbench.measure.fused import device_kernels
from attnbench.registry import Info
from attnbench.settings import Setting, choice, flag
from attnbench.train import OPTIMIZERS, PARTS, TrainStep
from attnbench.workload.base import DTYPES, Work, Workload, encoder, setting

if TYPE_CHECKING:
    from attnbench.cell import Cell


def train_step(model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool) -> TrainStep:
    """The cell's training step on ``device`` (``meta``, ``cpu`` or the GPU).

    Mixed precision on the GPU: ``torch.autocast`` (and a GradScaler for fp16); on meta,
    the emulation of the GPU's autocast. The CPU times fp32, no autocast. ``gpu``: the step
    is (or models) one on a GPU, where PyTorch's optimizers default to ``foreach``.
    """
    low = DTYPES[cell.dtype]
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    scaler = None
    if low != torch.float32 and device == "meta":
        autocast = functools.partial(emulated_autocast, "cuda", low)
    elif low != torch.float32 and device != "cpu":
        autocast = functools.partial(torch.autocast, "cuda", dtype=low)
        scaler = torch.amp.GradScaler("cuda") if low == torch.float16 else None
    optimizer = setting(cell, "optimizer")
    return TrainStep(model, x, optimizer, foreach=gpu, autocast=autocast, scaler=scaler)


@contextlib.contextmanager
def _entered(*contexts: AbstractContextManager[Any]) -> Any:
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


class StepWork(Work):
    """A :class:`TrainStep` as the runner drives it. On meta it runs under the device's
    attention kernels (their saved tensors are what the backward keeps), and a checkpointed
    layer's second run, in the backward, gets the same kernels and casts; modeling a GPU,
    its backward kernels' own temporaries are counted too
    (:class:`~attnbench.measure.cuda_layouts.CudaBackwardTemporaries`)."""

    def __init__(self, step: TrainStep, device: str, *, gpu: bool) -> None:
        self.step, self.model = step, step.model
        self.meta = device == "meta"
        self.kernels = "cuda" if gpu else "cpu"
        self.gpu = gpu
        if self.meta:
            step.model.recompute_context = lambda: _entered(
                device_kernels(self.kernels), step.autocast()
            )

    @property
    def x(self) -> Tensor:
        return self.step.x

    @x.setter
    def x(self, value: Tensor) -> None:
        self.step.x = value

    @property
    def parts(self) -> tuple[Callable[[], None], ...]:
        return self.step.parts

    def __call__(self) -> None:
        if not self.meta:
            self.step()
            return
        # a GPU's backward kernels allocate temporaries inside one op (CUDA's softmax
        # backward a gradient-sized product) that their meta kernels do not: counted here
        temporaries = CudaBackwardTemporaries() if self.gpu else contextlib.nullcontext()
        with device_kernels(self.kernels), temporaries:
            self.step()

    def state_tensors(self) -> list[Tensor]:
        # on a GPU, Adam's step counters live on the host (capturable=False, the default)
        return self.step.state_tensors(host_steps=self.gpu)

    def release(self) -> None:
        self.step.release()


class Train(Workload):
    name = "train"
    doc = "one training step: forward, loss, backward, optimizer (mixed precision on a GPU)"
    what = "training step"
    grad = True
    primes = True
    settings = (
        Setting("optimizer", "adamw", "`adamw`, `sgd` (momentum 0.9) or `none`", str,
                choice(OPTIMIZERS)),
        Setting("checkpoint", False, "activation checkpointing per layer (fits more, costs a"
                " forward)", bool, flag),
    )  # fmt: skip
    parts = PARTS

    def refuses(self, info: Info) -> str | None:
        return f"cannot train: {info.cannot_train}" if info.cannot_train else None

    def refuses_on_cpu(self, info: Info) -> str | None:
        why = getattr(info, "no_cpu_backward", None)
        return f"cannot train on a CPU: {why}" if why else None

    def label(self, cell: Cell) -> str:
        return train_label(setting(cell, "optimizer"), setting(cell, "checkpoint"))

    def caption(self, row: Any) -> str:
        return f"one training step, {self.label(row)} (the paper has no training table)"

    def input_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32  # autocast casts an embedding's fp32 output where an op asks

    def build(
        self, cell: Cell, params: dict[str, Any], device: str, dtype: torch.dtype
    ) -> nn.Module:
        model = encoder(cell, params, device)
        model.checkpoint = setting(cell, "checkpoint")
        return model.to(device=device, dtype=torch.float32).train()  # fp32 master weights

    def work(self, model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool) -> Work:
        return StepWork(train_step(model, cell, x, device, gpu=gpu), device, gpu=gpu)

    def flops(self, model: nn.Module, cell: Cell) -> tuple[int, int | None]:
        return model.flops(1, cell.n), model.flops_backward(1, cell.n)


def train_label(optimizer: str | None, checkpoint: bool | None) -> str:
    """``train(adamw)``, ``train(sgd, checkpoint)``: how a training cell or row is named."""
    return f"train({optimizer}{', checkpoint' if checkpoint else ''})"


TRAIN = Train()
