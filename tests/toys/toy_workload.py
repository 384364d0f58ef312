"""A workload with a setting of its own, added from this file alone.

The toy is "a forward, timed as two parts: the first ``split`` layers, then the rest", so
that its rows hold ``time_parts`` and a ``split`` field, which no built-in's do. Loaded as a
plugin (``ATTNBENCH_PLUGINS=tests.toys.toy_workload``), ``attnbench run mode=toy_halves
+split=1`` validates, models the memory, times, stores and reports it like a built-in
workload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from attnbench import workload
from attnbench.settings import Setting, integer

if TYPE_CHECKING:  # plugins load while attnbench.row is imported: types only
    from attnbench.cell import Cell


class HalvesWork(workload.Work):
    """The forward as its two parts; nothing is kept once the second has run."""

    def __init__(self, model: nn.Module, x: Tensor, split: int) -> None:
        super().__init__(model, x)
        self.split, self.h = split, None

    @property
    def parts(self) -> Sequence[Callable[[], Any]]:
        return (self.first, self.second)

    def first(self) -> None:
        self.h = self.x
        for layer in self.model.layers[: self.split]:
            self.h = layer(self.h)

    def second(self) -> Tensor:
        h, self.h = self.h, None
        for layer in self.model.layers[self.split :]:
            h = layer(h)
        return h

    def __call__(self) -> Tensor:
        self.first()
        return self.second()

    def release(self) -> None:
        self.h = None  # a probe stopped between the parts: its activation, not the next's


class Halves(workload.Workload):
    name = "toy_halves"  # attnbench run mode=toy_halves
    doc = "a forward, timed as the first `split` layers and the rest (a test's toy workload)"
    what = "two-part forward"  # in messages: "2 s per two-part forward"
    parts = ("first", "second")  # the row's time_parts
    # its one setting, declared here alone: from it come its key (+split=2), its check, the
    # cell's key (where not the default) and the row field `split`
    settings = (Setting("split", 1, "layers timed in the first part", int, integer()),)

    def check(self, cell: Cell, params: dict[str, Any], usable: int) -> None:
        """A rule beyond the setting's own: a layer in each part."""
        if cell.settings["split"] >= cell.model.layers:
            raise ValueError(
                f"split: must be below model.layers={cell.model.layers} (a layer in each part), "
                f"got {cell.settings['split']}"
            )

    def label(self, cell: Any) -> str:
        return f"halves(split={workload.setting(cell, 'split')})"  # a cell's or a row's

    def work(
        self, model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool
    ) -> HalvesWork:
        return HalvesWork(model, x, cell.settings["split"])


workload.register(Halves())
