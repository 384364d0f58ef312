"""``mode=packed`` and ``mode=packed_train``: one set of documents of real, different lengths,
measured in the layout the cell names, forward or training step.

The documents are the cell's draw (:mod:`attnbench.lengths`): an explicit list, or lengths
drawn from a seeded distribution until the next would pass ``total_tokens``; none longer than
the cell's n, the longest sequence the model takes. A batch of b is b copies of that draw, so
that the max batch counts real tokens, b × the draw's, and every layout does the same work
for its real tokens. The layouts:

* ``padded``: every document padded to the longest, with the key padding mask, as attnbench
  runs any batch of sequences: b × D rows of the longest length;
* ``packed``: each copy one row of its documents end to end, attention kept inside each
  (:meth:`~attnbench.attention.base.MultiHeadAttention.attend_packed`, as the mechanism can:
  in one pass, or document by document); a mechanism that cannot keep them apart is refused
  with its reason;
* ``bucketed``: what a data loader that sorts by length does: the documents in batches of
  similar lengths, each padded to its own longest and holding at most ``bucket_tokens``
  padded tokens (:func:`attnbench.lengths.buckets`), one forward per batch.

A step reads every real token's output: the padded positions' outputs are dropped before the
loss (their gradient is 0, as a masked loss's), so a training step trains on what a real one
would. The row's ``packed`` field holds the draw (its lengths, real and padded tokens) and the
FLOPs of the documents alone beside the layout's, from the formulas: the share the layout
spends on padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

import attnbench.lengths as draws
from attnbench.attention.packing import Packing
from attnbench.registry import Info, info
from attnbench.settings import Setting, choice, integer
from attnbench.train import PARTS
from attnbench.workload import draw
from attnbench.workload.base import Work, Workload, encoder, setting
from attnbench.workload.draw import DRAW, draw_of, draw_words
from attnbench.workload.train import TRAIN, StepWork, Train, train_label, train_step

if TYPE_CHECKING:
    from attnbench.cell import Cell

# the ``layout`` setting's values in the order its docs name them, spelled here only: reports
# ask these too (PACKED_LAYOUT, as PACKED is the workload)
PADDED, PACKED_LAYOUT, BUCKETED = "padded", "packed", "bucketed"
LAYOUTS = (PADDED, PACKED_LAYOUT, BUCKETED)


SETTINGS = (
    Setting("layout", PACKED_LAYOUT, "`padded` (to the longest, with the key padding mask), "
            "`packed` (end to end in one row, attention kept inside each document) or "
            "`bucketed` (sorted by length, batches of at most `bucket_tokens` padded tokens)",
            str, choice(LAYOUTS)),
    *DRAW,
    Setting("bucket_tokens", 4096, "bucketed: the padded tokens one batch may hold (a "
            "loader's max_tokens)", int, integer()),
)  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """One copy of the draw in a layout: what a batch of b copies is laid out as."""

    layout: str
    lengths: tuple[int, ...]
    bucket_tokens: int

    @cached_property
    def batches(self) -> list[tuple[int, ...]]:
        """Padded: every document in one batch; bucketed: the loader's batches."""
        if self.layout == BUCKETED:
            return draws.buckets(self.lengths, self.bucket_tokens)
        return [self.lengths]

    @property
    def tokens(self) -> int:
        """The input's positions for one copy: real tokens packed, else the padded batches'."""
        if self.layout == PACKED_LAYOUT:
            return sum(self.lengths)
        return sum(len(batch) * max(batch) for batch in self.batches)

    def input_shape(self, b: int, d: int) -> tuple[int, ...]:
        """Packed: b rows of the draw's tokens; padded: b × D rows of the longest; bucketed:
        the batches of b copies laid end to end in one (1, positions, d) tensor (each batch
        a view of it)."""
        if self.layout == PACKED_LAYOUT:
            return (b, sum(self.lengths), d)
        if self.layout == PADDED:
            return (b * len(self.lengths), max(self.lengths), d)
        return (1, b * self.tokens, d)

    def flops(self, model: nn.Module) -> int:
        """Forward FLOPs of one copy in this layout, from the formulas."""
        if self.layout == PACKED_LAYOUT:
            return model.packed_flops(Packing.of([self.lengths]))
        return sum(model.flops(len(batch), max(batch)) for batch in self.batches)

    def loop_steps(self, layer: nn.Module) -> int:
        """One copy's Python-level steps in one layer: the packed row's, else each batch's."""
        if self.layout == PACKED_LAYOUT:
            return layer.packed_loop_steps(self.lengths)
        return sum(layer.loop_steps(max(batch)) for batch in self.batches)

    def flops_backward(self, model: nn.Module) -> int:
        """Backward FLOPs of one copy in this layout, from the formulas."""
        if self.layout == PACKED_LAYOUT:
            return model.packed_flops_backward(Packing.of([self.lengths]))
        return sum(model.flops_backward(len(batch), max(batch)) for batch in self.batches)


class Layout(nn.Module):
    """The encoder run over b copies of a plan, returning every real token's output (b·R, d):
    the padded positions' outputs dropped, so that nothing reads them."""

    def __init__(self, model: nn.Module, plan: Plan) -> None:
        super().__init__()
        self.model, self.plan = model, plan

    def forward(self, x: Tensor) -> Tensor:
        plan, d = self.plan, x.shape[-1]
        if plan.layout == PACKED_LAYOUT:
            packing = Packing.of([plan.lengths] * x.shape[0])
            return self.model(x, packing=packing).reshape(-1, d)
        copies = x.shape[0] // len(plan.lengths) if plan.layout == PADDED else None
        flat, start, outs = x.reshape(-1, d), 0, []
        for batch in plan.batches:
            rows = len(batch) * (copies or x.shape[1] // plan.tokens)
            width = max(batch)
            part = flat[start : start + rows * width].view(rows, width, d)
            start += rows * width
            sizes = torch.tensor(batch, device=x.device).repeat(rows // len(batch))
            padded = torch.arange(width, device=x.device) >= sizes[:, None]  # True = padding
            out = self.model(part, padded).reshape(-1, d)
            real = rows // len(batch) * sum(batch)
            outs.append(out.index_select(0, real_positions(sizes, width, real)))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def real_positions(sizes: Tensor, width: int, real: int) -> Tensor:
    """The flat positions of the real tokens of rows of ``width`` holding ``sizes`` tokens
    each from their start: row r's r·width … r·width + sizes[r] − 1, in order. No boolean
    indexing (its result's size depends on values, which meta tensors do not have): the
    count, ``real``, is known from the lengths."""
    device = sizes.device
    first = torch.arange(len(sizes), device=device) * width - (sizes.cumsum(0) - sizes)
    return torch.arange(real, device=device) + first.repeat_interleave(sizes, output_size=real)


class Packed(Workload):
    """The forward (``packed``) or the training step (``packed_train``, with ``mode=train``'s
    optimizer setting) of the cell's draw in its layout; everything a training step needs is
    :mod:`attnbench.workload.train`'s."""

    def __init__(self, name: str, *, train: bool) -> None:
        self.name, self.train = name, train
        self.settings = (*SETTINGS, Train.settings[0]) if train else SETTINGS
        self.grad = self.primes = train
        self.parts = PARTS if train else ()
        self.what = "training step" if train else "forward"
        self.doc = (
            f"{'one training step' if train else 'one forward'} of documents of different "
            "lengths, padded, packed or bucketed (`layout`)"
        )

    def plan(self, cell: Cell) -> Plan:
        return Plan(setting(cell, "layout"), draw_of(cell), setting(cell, "bucket_tokens"))

    def in_use(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The draw's settings in use; ``bucket_tokens`` only where the layout buckets."""
        used = draw.in_use(settings)
        if used.get("layout", PACKED_LAYOUT) != BUCKETED:
            used = {k: v for k, v in used.items() if k != "bucket_tokens"}
        return used

    def refuses(self, info: Info) -> str | None:  # a training step's refusals are mode=train's
        return TRAIN.refuses(info) if self.train else super().refuses(info)

    def refuses_on_cpu(self, info: Info) -> str | None:
        return TRAIN.refuses_on_cpu(info) if self.train else super().refuses_on_cpu(info)

    def refuses_cell(self, cell: Cell) -> str | None:
        why = info(cell.attention).cannot_pack
        return f"cannot pack: {why}" if why and setting(cell, "layout") == PACKED_LAYOUT else None

    def check(self, cell: Cell, params: dict[str, Any], usable: int) -> None:
        """The draw (one line naming the setting) and, packed, a mechanism that can pack."""
        self.plan(cell)
        if why := self.refuses_cell(cell):
            raise ValueError(f"layout: {cell.attention} {why}; use padded or bucketed")

    def loop_steps(self, cell: Cell, layer: nn.Module) -> tuple[int, str]:
        """The draw's: its documents' steps in the cell's layout."""
        key = "lengths" if setting(cell, "lengths") is not None else "total_tokens"
        return self.plan(cell).loop_steps(layer), key

    def label(self, cell: Cell) -> str:
        what = train_label(setting(cell, "optimizer"), False) if self.train else ""
        return f"{setting(cell, 'layout')}{f' {what}' if what else ''}"

    def caption(self, row: Any) -> str:
        return f"{self.name}: documents {draw_words(row)}, {setting(row, 'layout')}"

    def input_shape(self, cell: Cell, b: int) -> tuple[int, ...]:
        return self.plan(cell).input_shape(b, cell.model.d_model)

    def input_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return TRAIN.input_dtype(dtype) if self.train else super().input_dtype(dtype)

    def build(
        self, cell: Cell, params: dict[str, Any], device: str, dtype: torch.dtype
    ) -> nn.Module:
        if not self.train:
            return super().build(cell, params, device, dtype)
        # mode=train's fp32 master weights in train mode (its checkpoint setting is not ours)
        return encoder(cell, params, device).to(device=device, dtype=torch.float32).train()

    def work(self, model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool) -> Work:
        layout = Layout(model, self.plan(cell))
        if self.train:
            return StepWork(train_step(layout, cell, x, device, gpu=gpu), device, gpu=gpu)
        return Work(layout, x)

    def flops(self, model: nn.Module, cell: Cell) -> tuple[int, int | None]:
        """Per copy of the draw, from the formulas: the layout's forward and, for a training
        step, its backward."""
        plan = self.plan(cell)
        return plan.flops(model), plan.flops_backward(model) if self.train else None

    def describe(self, model: nn.Module, cell: Cell) -> dict[str, Any]:
        """The draw and its FLOPs: each document alone (the real work) beside the layout's."""
        plan = self.plan(cell)
        real = sum(model.flops(1, n) for n in plan.lengths)
        layout = plan.flops(model)
        return {
            "packed": {
                **draws.summary(plan.lengths),
                "layout_tokens": plan.tokens,
                "batches": len(plan.batches),
                "flops_real": real,
                "flops_layout": layout,
                "flops_wasted_share": 1 - real / layout,
            }
        }


PACKED = Packed("packed", train=False)
PACKED_TRAIN = Packed("packed_train", train=True)
MODES = (PACKED.name, PACKED_TRAIN.name)


def is_packed(row: Any) -> bool:
    """Whether a stored row is this workload's and holds its draw (the ``packed`` record
    :meth:`Packed.describe` writes): the rows a report of the layouts reads."""
    return getattr(row, "mode", None) in MODES and isinstance(getattr(row, "packed", None), dict)
