"""The measuring pipeline: one cell in, one row out.

One module per step, each importing only those after it:

* :mod:`.run` — :func:`run_cell`: the cell validated, its max batch searched (modeled, then
  probed on a GPU), its peak memory read and its step timed; always a row.
* :mod:`.timed` — the step timed at the batch :mod:`.run` chose, on the preset's GPU or this CPU.
* :mod:`.prepare` — the step made ready to time: per-length structures, the compile.
* :mod:`.memory_model` — the cell's memory modeled on meta tensors, on any device.
* :mod:`.found` — what the steps return, kept in a frozen :class:`~.found.Found` that each
  step's caller replaces and hands back, and the row assembled from it once.
"""

from attnbench.cell import Cell
from attnbench.plan import validate
from attnbench.runner.memory_model import MemoryModel, build, make_input, modeled_peak
from attnbench.runner.run import run_cell

__all__ = ["Cell", "MemoryModel", "build", "make_input", "modeled_peak", "run_cell", "validate"]
