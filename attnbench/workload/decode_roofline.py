"""A decode step of b sequences modeled where it is not timed: a roofline over the preset's
datasheet (:mod:`attnbench.measure.roofline`), at the timed steps' mean context, with the
cache or state it reads by layer kind. What a CPU can say of a GPU's time per token, and
beside a GPU's own timing its residual."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from attnbench.measure.memory import module_bytes
from attnbench.measure.roofline import HOW, roofline
from attnbench.schedule import layers_of
from attnbench.workload.decode_memory import state_dtype
from attnbench.workload.decode_mix import context

if TYPE_CHECKING:
    from attnbench.cell import Cell
    from attnbench.measure.presets import Preset


def modeled_fields(model: nn.Module, cell: Cell, b: int | None, preset: Preset) -> dict[str, Any]:
    """The row's ``modeled_step``: the bytes a step of b sequences reads (every sequence's
    cache or state at the mean context, and the weights), its FLOPs, and its seconds over
    the preset's bandwidth and peak; nothing where the preset gives no bandwidth or no
    sequence fits (:meth:`attnbench.workload.Workload.modeled`)."""
    if not b or preset.bandwidth is None:
        return {}
    itemsize = state_dtype(cell, next(model.parameters()).dtype).itemsize
    at = context(cell)
    kinds = by_kind(model, cell, at, itemsize)  # every layer's once: the state is their sum
    state, weights = b * sum(k["bytes"] for k in kinds.values()), module_bytes(model)
    flops, peak = model.step_flops(b, at), preset.peak_flops.get(cell.dtype)
    step = roofline(state + weights, flops, preset.bandwidth, peak)
    return {
        "modeled_step": {
            "batch": b,
            "context": at,
            "read_bytes": state + weights,
            "state_read_bytes": state,
            "weight_bytes": weights,
            "flops": flops,
            "bandwidth_bytes_per_s": preset.bandwidth,
            "peak_flops_per_s": peak,
            **step,
            "per_token_s": step["step_s"] / b,
            "how": HOW,
            "state_by_kind": kinds,
        }
    }


def by_kind(model: nn.Module, cell: Cell, at: int, itemsize: int) -> dict[str, dict[str, Any]]:
    """One sequence's cache or state at context ``at`` by layer kind (a schedule's kinds,
    ``attention`` the cell's own mechanism): its mechanism, layers and bytes, whose sum is
    the row's state: what a schedule saves, and in which layers it is kept."""
    out: dict[str, dict[str, Any]] = {}
    for kind, layer in zip(layers_of(cell), model.layers, strict=True):
        entry = out.setdefault(kind.kind, {"mechanism": kind.attention, "layers": 0, "bytes": 0})
        entry["layers"] += 1
        entry["bytes"] += layer.attn.state_bytes(at, itemsize)
    return out
