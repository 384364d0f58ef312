"""The plan: a cell turned, once, into what measuring it needs.

:func:`validate` completes a :class:`~attnbench.cell.Cell`'s owned parts with their owners'
defaults (:func:`attnbench.cell_rules.complete`), checks it — one ``ValueError`` line naming
the first bad parameter, from the rules in :mod:`attnbench.cell_rules`, its workload's and
its task's own checks — and resolves it: the completed cell, its workload and task objects,
the preset, the ceiling, where it runs. The runner measures a :class:`Resolved`; the sweep
plans every cell before it starts and the gate builds its suite from planned cells;
:func:`label` names a cell in progress lines and :func:`spec` is the cell as its row stores
it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnbench import registry
from attnbench.attention.base import MultiHeadAttention
from attnbench.cell import Cell, compiled_label
from attnbench.cell import label as mechanism_label
from attnbench.cell_rules import (
    check_allocator,
    check_budget,
    check_causal,
    check_k,
    check_n_fits,
    check_settings,
    check_traceable,
    complete,
    loop_steps,
    on_gpu,
    resolve_ceiling,
    runs_causally,
)
from attnbench.cell_rules import left_out as rules_left_out
from attnbench.measure import presets
from attnbench.quality import tasks
from attnbench.quality.tasks import Task
from attnbench.schedule import OWN, Layer, layers_of
from attnbench.settings import COST, DEFAULT_MODE
from attnbench.validators import check_choice, check_int
from attnbench.workload import Workload, find
from attnbench.workload import get as get_workload
from attnbench.workload.base import TooLarge


def label(cell: Cell) -> str:
    """``linformer (sharing=layerwise) n=512 k=128``: what progress lines print (a cell
    not yet validated too: one of a workload not known here is named by its mode)."""
    cell = complete(cell)
    work = find(cell.mode)
    return " ".join(
        [mechanism_label(cell.attention, dict(cell.params)), f"n={cell.n}"]
        + ([f"k={cell.k}"] if cell.k is not None else [])
        + ([f"schedule=({cell.model.schedule})"] if cell.model.schedule is not None else [])
        + [w for w in [work.label(cell) if work is not None else cell.mode] if w]
        + ([compiled_label(cell.compile_mode)] if cell.compile else [])
        + ([f"task={cell.task.name}"] if cell.task.name != COST else [])
    )


@dataclass
class Resolved:
    """A cell planned: what validation learned about it, so measuring recomputes nothing.
    ``cell`` is the cell with its owned parts completed (what is measured and stored);
    ``workload`` and ``task`` are the objects that own those parts (``task`` None for a
    cost cell); ``on_gpu`` is decided where the plan is made, the process that runs it."""

    cell: Cell
    workload: Workload
    task: Task | None
    preset: presets.Preset
    ceiling: int
    on_gpu: bool
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> int:
        """What torch's allocator may hand out: the ceiling less the preset's overhead."""
        return self.ceiling - self.preset.overhead_bytes


_VALIDATED: dict[tuple[Cell, str], Resolved] = {}


def validate(cell: Cell, preset: presets.Preset | None = None) -> Resolved:
    """One ``ValueError`` line naming the first bad parameter; nothing is run.

    ``preset`` is the device as composed by Hydra (so a user's own preset from
    ``--config-dir`` works); by default it is read from conf/device/ by name. A cell is
    validated once per process: the sweep checks every cell before Hydra starts, and each
    job that then measures one in the same process gets that answer again.
    """
    if preset is None:
        return _validate(cell, None)
    memo = (cell, repr(preset))
    if memo not in _VALIDATED:
        _VALIDATED[memo] = _validate(cell, preset)
    return _VALIDATED[memo]


def left_out(cell: Cell, preset: presets.Preset) -> str | None:
    """Why a sweep leaves ``cell`` out, or None: :func:`attnbench.cell_rules.left_out`'s
    reasons (k >= n, no causal form, ...), and a cell too large for its ceiling at its
    smallest (:class:`~attnbench.workload.base.TooLarge`), for which a single cell is
    refused. The one answer the sweep's pre-check and each of its jobs ask."""
    if why := rules_left_out(cell):
        return why
    try:
        validate(cell, preset)
    except TooLarge as e:
        return str(e)
    return None


def _validate(given: Cell, preset: presets.Preset | None) -> Resolved:
    registry.info(given.attention)  # unknown mechanism
    check_int("n", given.n)
    if isinstance(given.batch, str) and given.batch != "max":
        raise ValueError(f"batch: must be 'max' or an integer >= 1, got {given.batch!r}")
    if given.batch != "max":
        check_int("batch", given.batch)
    work = get_workload(given.mode)  # an unknown mode: one line naming the workloads
    check_choice("task", given.task.name, tasks.names())
    cell = complete(given)  # its owners' defaults: what every rule below reads
    if why := work.refuses(registry.info(cell.attention)):  # before causal: decode sets it
        raise ValueError(f"mode: attention={cell.attention} {why}")
    check_k(cell.attention, cell.n, cell.k, dict(cell.params))
    check_budget(cell)
    check_causal(cell)
    check_settings(cell)
    task = _task(cell, work)
    preset = preset or presets.load(cell.device)
    preset.check_dtype(cell.dtype)
    ceiling = resolve_ceiling(cell.ceiling_bytes, preset)
    check_n_fits(cell, ceiling - preset.overhead_bytes)
    params = cell.mechanism_params()
    # builds the layer's config and shape checks (d_model % n_heads, kv_heads, ...) on meta
    with torch.device("meta"):
        layer = registry.create(
            cell.attention,
            d_model=cell.model.d_model,
            n_heads=cell.model.n_heads,
            max_seq_len=cell.n,
            kv_heads=cell.model.kv_heads,
            head_dim=cell.model.head_dim,
            **params,
        )
    # a schedule's other kinds, each held to the same rules (before the workload's check,
    # which builds the whole model)
    scheduled = layers_of(cell, params) if cell.model.schedule is not None else []
    kinds = {
        k: check_kind(cell, work, k, preset) for k in dict.fromkeys(scheduled) if k.kind != OWN
    }
    work.check(cell, params, ceiling - preset.overhead_bytes)
    _check_traced(cell, layer, scheduled, kinds)  # after the workload's check: a draw's there
    gpu = on_gpu(cell, preset)
    check_allocator(cell, preset, gpu)
    if not gpu and (why := work.refuses_on_cpu(registry.info(cell.attention))):
        raise ValueError(f"mode: attention={cell.attention} {why}")
    if why := layer.refuses(cell.dtype, preset.is_gpu):  # a kernel's own dtypes and devices
        raise ValueError(why)
    resolved = Resolved(cell, work, task, preset, ceiling, gpu, params)
    if gpu and resolved.usable > (here := torch.cuda.get_device_properties(0).total_memory):
        raise ValueError(
            f"ceiling: {ceiling} bytes less the {preset.overhead_bytes}-byte "
            f"overhead exceed this GPU's {here} bytes"
        )
    return resolved


def _task(cell: Cell, work: Workload) -> Task | None:
    """The cell's quality task, its rules applied, or None for a cost cell. A task trains
    heads of d_model / n_heads in the paper's workload, and a model of one mechanism unless
    it takes a schedule (``Task.schedules``: MQAR)."""
    if cell.task.name == COST:
        return None
    if cell.model.head_dim:
        raise ValueError(
            f"model.head_dim: task={cell.task.name} trains heads of d_model / n_heads; a "
            "width of its own is for cost cells: set it null"
        )
    if cell.model.schedule and not tasks.REGISTRY[cell.task.name].schedules:
        takes = ", ".join(t.name for t in tasks.REGISTRY.values() if t.schedules)
        raise ValueError(
            f"model.schedule: task={cell.task.name} trains a model of one mechanism; a "
            f"schedule is for cost cells and task={takes}: set it null"
        )
    if cell.mode != DEFAULT_MODE:
        raise ValueError(
            f"mode: task={cell.task.name} measures a quality, not a {work.what}; use {DEFAULT_MODE}"
        )
    tasks.validate(cell)
    return tasks.REGISTRY[cell.task.name]


def _check_traced(
    cell: Cell,
    layer: MultiHeadAttention,
    scheduled: list[Layer],
    kinds: dict[Layer, MultiHeadAttention],
) -> None:
    """The traced steps' bound (:func:`check_traceable`) over every layer of the cell: its
    own mechanism's and each of a schedule's kinds', all of them together, a refusal naming
    the kind that takes the most steps."""
    own = sum(k.kind == OWN for k in scheduled) if scheduled else cell.model.layers
    groups = [(layer, own, None)]
    groups += [
        (built, sum(k == kind for k in scheduled), kind.kind) for kind, built in kinds.items()
    ]
    steps = [loop_steps(cell, built)[0] * count for built, count, _ in groups]
    most = max(range(len(groups)), key=steps.__getitem__)  # the first, where none has any
    built, count, name = groups[most]
    check_traceable(cell, built, count, name, others=sum(steps) - steps[most])


def check_kind(
    cell: Cell, work: Workload, kind: Layer, preset: presets.Preset
) -> MultiHeadAttention:
    """A schedule's kind held to the rules the cell's own mechanism is held to (the workload
    runs it, it is causal where the cell is, its parameters and heads build on meta, its
    kernel takes the dtype and device), each refusal one line naming ``model.kinds.NAME``;
    its layer on meta back."""
    where = f"model.kinds.{kind.kind}"
    info = registry.info(kind.attention)
    params = dict(kind.params)
    causal = bool(dict(cell.params).get("causal", False))
    if "causal" in info.params and bool(params.get("causal", False)) != causal:
        raise ValueError(  # a decoder, or a causal model, is causal in every layer
            f"{where}.params.causal: must be the cell's causal={str(causal).lower()}, got "
            f"{params.get('causal')}"
        )
    try:
        as_cell = replace(cell, attention=kind.attention, params=kind.params)
        for why in (
            work.refuses(info),
            work.refuses_cell(as_cell),
            None if on_gpu(cell, preset) else work.refuses_on_cpu(info),
            info.unavailable and f"is unavailable here: {info.unavailable}",
        ):
            if why:
                raise ValueError(f"attention={kind.attention} {why}")
        if info.causal_only and not runs_causally(cell):  # MQAR trains it causally
            raise ValueError(
                f"attention={kind.attention} is causal only ({info.causal_only}); the cell is "
                "not causal: set causal=true"
            )
        with torch.device("meta"):
            layer = registry.create(
                kind.attention, d_model=cell.model.d_model, n_heads=kind.n_heads,
                max_seq_len=cell.n, kv_heads=kind.kv_heads, head_dim=kind.head_dim, **params,
            )  # fmt: skip
        if why := layer.refuses(cell.dtype, preset.is_gpu):
            raise ValueError(why)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return layer


def spec(cell: Cell, preset: presets.Preset) -> dict[str, Any]:
    """The cell as stored with its row: the ceiling resolved, the model shape grouped."""
    out = cell.to_dict()
    out["ceiling_bytes"] = resolve_ceiling(cell.ceiling_bytes, preset)
    out["model"] = cell.model.shape
    if cell.ceiling_bytes is not None and preset.machine_memory:
        out["ceiling_given"] = True  # not the machine's memory: keyed by its bytes
    return out
