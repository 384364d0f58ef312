"""``mode=inference``: one forward of the encoder, as the Linformer paper's Table 3 times it.

The model is in the cell's dtype and in eval mode; a step is one forward under
``inference_mode`` (no autograd), so its memory is the activations' high-water mark and its
time the forward's. Everything here is :class:`~attnbench.workload.Workload`'s default.
"""

from __future__ import annotations

from typing import Any

from attnbench.workload.base import Workload


class Inference(Workload):
    name = "inference"
    doc = "one forward (eval mode, inference_mode), as the paper's Table 3"

    def caption(self, row: Any) -> None:
        return None  # the paper's own workload: its tables need no words about it


INFERENCE = Inference()
