"""The rules a cell is held to beyond its own fields' checks: the ceiling against the
preset, ``k`` against ``n`` and the mechanism's budget, which ``k`` a sweep keeps, causal
masking, grouped-query heads, the declared settings, an ``n`` whose input fits, and which
cells a sweep leaves out. :func:`attnbench.plan.validate` applies them in order; the sweep
and the gate ask :func:`left_out` and :func:`kept_k` before a cell exists to validate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench import registry
from attnbench.attention.base import check_kv_heads
from attnbench.cell import Cell, Part, budget_of, setting_of
from attnbench.measure import allocator_rules, presets
from attnbench.quality import tasks
from attnbench.settings import CELL_FIELDS, COST, DEFAULT_MODE, defaults, resolve
from attnbench.validators import check_bool, check_int
from attnbench.workload import find as find_workload
from attnbench.workload import get as get_workload
from attnbench.workload.base import MAX_LOOP_STEPS


def complete(cell: Cell) -> Cell:
    """The cell with each owned part's settings completed by its owner's defaults: its
    workload's and its quality task's. A cell that names a
    default and one that leaves it out are then one cell (one hash, one stored spec). An
    owner not known here (a typo, a plugin not loaded) leaves its part as given: validation
    names it."""
    work = find_workload(cell.mode)
    settings = {**defaults(work.settings), **cell.settings} if work is not None else cell.settings
    task = tasks.REGISTRY.get(cell.task.name) if cell.task.name != COST else None
    quality = {**task.defaults(), **dict(cell.task.settings)} if task is not None else None
    done = replace(cell, workload=Part(cell.mode, settings))
    done = replace(done, task=Part(cell.task.name, quality)) if quality is not None else done
    return cell if done == cell else done


def resolve_ceiling(ceiling_bytes: int | None, preset: presets.Preset) -> int:
    """The bytes a cell may use: its own ceiling, or the preset's whole memory; refused
    when it is above the device's memory or leaves nothing after the fixed overhead."""
    ceiling = preset.total_bytes if ceiling_bytes is None else preset.check_ceiling(ceiling_bytes)
    if ceiling <= preset.overhead_bytes:
        raise ValueError(
            f"ceiling: {ceiling} bytes leave nothing after {preset.name}'s fixed "
            f"overhead of {preset.overhead_bytes} bytes"
        )
    return ceiling


def kept_k(
    attention: str, k: int | None, *, in_sweep: bool, params: Mapping[str, Any] = ()
) -> int | None:
    """The ``k`` a cell keeps, for every task alike: a mechanism's budget where it has one in
    use (:func:`budget_of`). In a sweep, any other drops ``k`` (None: the same cell at every
    k, so a sweep over mechanisms and k measures it once, as the baseline of each k); a
    single cell keeps it, so that :func:`check_k` refuses it: a row labelled with a k that
    changed nothing would mislead."""
    if budget_of(attention, params) or not in_sweep:
        return k
    return None


def check_k(attention: str, n: int, k: int | None, params: Mapping[str, Any] = ()) -> None:
    """``k`` is a positive integer (k=0 is a typo), given only to a mechanism with a budget
    in use (a sweep drops it for the others: :func:`kept_k`), and a fixed-length mechanism
    cannot project n positions onto more than n."""
    if k is None:
        return
    check_int("k", k)
    info = registry.info(attention)
    if info.budget is None:
        budgeted = [m for m in registry.names() if registry.info(m).budget]
        raise ValueError(
            f"k: attention={attention} has no budget: k must be null (k sets the budget of "
            f"{', '.join(budgeted)}), got {k}"
        )
    if budget_of(attention, params) is None and info.budget_when is not None:
        field, value = info.budget_when
        now = setting_of(info, field, params)
        raise ValueError(
            f"k: attention={attention} uses k (its {info.budget}) only with {field}={value}, "
            f"got {field}={now}: k must be null, or set attention.params.{field}={value}"
        )
    if info.fixed_max_len and k > n:
        raise ValueError(f"k: must be at most n={n}, got {k}")


def left_out(cell: Cell) -> str | None:
    """Why a sweep leaves this cell out, or None: a fixed-length mechanism at ``k >= n`` (``k``
    or its budget set among its parameters) projects nothing away (Linformer's k < n, as in
    the paper's Table 3), a mechanism with no causal form has no ``causal=true`` cell, a
    causal-only one (the recurrent mixers) no ``causal=false`` cell, one
    without grouped-query heads no ``kv_heads`` cell, one without a width of its own no
    ``head_dim`` cell, and one the workload refuses (decode:
    no incremental form) no cell of that mode.
    Performer's number of features is free. A single cell at k = n is still measured; a
    single causal cell of such a mechanism is refused by :func:`validate`."""
    cell = complete(cell)
    info = registry.info(cell.attention)
    k, n = cell.mechanism_params().get(info.budget) if info.budget else None, cell.n
    if info.fixed_max_len and isinstance(k, int) and isinstance(n, int) and k >= n:
        return f"k={k} >= n={n}"
    if dict(cell.params).get("causal") and not info.causal:
        return "has no causal form"
    if info.causal_only and not runs_causally(cell):
        return "is causal only"
    if cell.model.kv_heads not in (None, cell.model.n_heads) and not info.gqa:
        return "has no grouped-query form"
    if cell.model.head_dim is not None and not info.head_dim:
        return "has no width of its own (head_dim)"
    work = get_workload(cell.mode)
    if cell.mode != DEFAULT_MODE and (why := work.refuses(info)):
        return why
    if why := work.refuses_cell(cell):
        return why
    if (why := work.refuses_on_cpu(info)) and not on_gpu(cell, presets.load(cell.device)):
        return why
    return None


def on_gpu(cell: Cell, preset: presets.Preset) -> bool:
    """Whether the cell runs on the preset's GPU here (else: memory modeled, time on a CPU)."""
    return preset.is_gpu and torch.cuda.is_available() and not cell.model_only


def check_settings(cell: Cell) -> None:
    """Every declared setting the cell carries, by its declaration's check (one line naming
    its key): the model's, timing's (threads against the allocation where the cell runs:
    env.use_threads) and compiling's fields, then its workload's set, where a name the
    workload does not declare is refused."""
    for s in CELL_FIELDS:
        s.validate(cell.value(s.name))
    if cell.model.kv_heads is not None:
        check_kv_heads(cell.model.kv_heads, cell.model.n_heads)
    allocator_rules.from_setting(cell.allocator)  # what PYTORCH_CUDA_ALLOC_CONF would take
    owned = get_workload(cell.mode).settings
    declared = {s.name: s for s in owned}
    for name, value in resolve(f"mode={cell.mode}", owned, cell.workload.settings).items():
        declared[name].validate(value)


def check_allocator(cell: Cell, preset: presets.Preset, gpu: bool) -> None:
    """The ``allocator`` setting where the cell runs: a preset without a GPU has no caching
    allocator to set; where this process runs a GPU cell, a ``PYTORCH_CUDA_ALLOC_CONF`` of
    its environment that says otherwise would measure another allocator than the row names
    (``attnbench run`` starts such a cell in a process of its own with the setting)."""
    if cell.allocator != "default" and not preset.is_gpu:
        raise ValueError(
            f"allocator: device={cell.device} has no CUDA caching allocator; allowed: default"
        )
    if not gpu:
        return
    wanted = allocator_rules.from_setting(cell.allocator)
    for name in ALLOC_CONFS:  # torch reads either (c10's AllocatorConfig); compared as parsed
        conf = os.environ.get(name, "")
        try:
            same = not conf or allocator_rules.AllocatorConfig.parse(conf) == wanted
        except ValueError:
            same = False
        if not same:
            raise ValueError(
                f"allocator: {name}={conf} is set in this environment, so a GPU cell would run"
                f" under it, not under allocator={cell.allocator}; set allocator to the same"
                f" settings or unset {name}"
            )


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"  # what a cell's own process is started with
ALLOC_CONFS = (ALLOC_CONF, "PYTORCH_ALLOC_CONF")  # torch >= 2.9 reads the second too


def runs_causally(cell: Cell) -> bool:
    """Whether the cell's mechanism runs causally: ``causal=true``, or a quality task that
    trains every mechanism with a causal form causally (MQAR)."""
    if dict(cell.params).get("causal"):
        return True
    return cell.task.name != COST and tasks.REGISTRY[cell.task.name].trains_causally


def check_causal(cell: Cell) -> None:
    """``causal=true`` for a mechanism that cannot mask the future is one line naming the
    ones that can, not the mechanism's own error (or an unknown-parameter one);
    ``causal=false`` for a causal-only mechanism is one line with the reason."""
    causal = dict(cell.params).get("causal", False)
    check_bool("causal", causal)
    if (why := registry.info(cell.attention).causal_only) and not runs_causally(cell):
        raise ValueError(
            f"causal: attention={cell.attention} is causal only ({why}); set causal=true"
        )
    if causal and not registry.info(cell.attention).causal:
        can = [m for m in registry.names() if registry.info(m).causal]
        raise ValueError(
            f"causal: attention={cell.attention} has no causal form; causal=true works with "
            f"{', '.join(can)}"
        )


def check_budget(cell: Cell) -> None:
    """A fixed-length mechanism (Linformer) needs its budget: without ``k`` it would fall
    back on its config's default (k=256), silently at n >= 256 and as a misleading ``k``
    range error below. ``k=null`` is refused unless the budget is set through the
    mechanism's own parameters (``+attention.params.k=32``). Both, with different values,
    are refused: the row's ``k`` would say what the run did not use."""
    info = registry.info(cell.attention)
    given = dict(cell.params).get(info.budget) if info.budget else None
    if cell.k is not None and given is not None and given != cell.k:
        raise ValueError(
            f"k: sets attention={cell.attention}'s {info.budget}, which "
            f"attention.params.{info.budget}={given} sets too; give one of them, got k={cell.k}"
        )
    if info.budget and info.fixed_max_len and cell.k is None:
        if info.budget not in dict(cell.params):
            what = "its budget" if info.budget == "k" else f"its budget, {info.budget}"
            raise ValueError(f"k: attention={cell.attention} needs k ({what}), got null")


def check_traceable(
    cell: Cell, layer: nn.Module, layers: int, kind: str | None, others: int
) -> None:
    """A cost cell whose memory model would trace more than :data:`MAX_LOOP_STEPS` Python
    steps is refused before it traces (``layer``: one of its layers, on meta, of which it
    has ``layers``; ``kind``: a schedule's kind it is, named in the refusal). Beyond it,
    modeling alone runs for many minutes before the time budget is consulted (retnet at
    n = 10⁶ traced for over 590 s and stored nothing): the key named is the one that sets
    the steps' number (``n``, the draw's ``total_tokens``, decode's ``prefill_chunk``).
    ``others``: the steps a schedule's other kinds take in the same traced step
    (:func:`loop_steps`), which count against the same bound."""
    per_layer, key = loop_steps(cell, layer)
    if not per_layer or (steps := per_layer * layers) + others <= MAX_LOOP_STEPS:
        return
    size = next((f for f in ("chunk", "chunk_size") if hasattr(layer.cfg, f)), None)
    params = "attention.params" if kind is None else f"model.kinds.{kind}.params"
    other = (f", a larger {params}.{size}" if size else "") + " or fewer layers"
    allowed = f"a smaller {key}{other}"
    hint = key in ("n", "prefill_chunk") and not others  # the largest, for this kind alone
    if hint and (most := _largest(cell, layer, key, layers)):
        allowed = f"{key} <= {most} here{other}"
    name = cell.attention if kind is None else f"model.kinds.{kind}"
    besides = f" + {others} of the schedule's other layers" if others else ""
    raise ValueError(
        f"{key}: the memory model traces {name} on meta one Python step at a time "
        f"(a chunk of a recurrence, a packed document): {per_layer} steps per layer × "
        f"{layers} layers = {steps}{besides} per traced step, above the {MAX_LOOP_STEPS} "
        f"allowed (each traced step would take minutes); allowed: {allowed}"
    )


def loop_steps(cell: Cell, layer: nn.Module) -> tuple[int, str]:
    """The Python steps one layer of ``layer``'s kind takes in one traced step of a cost
    cell and the key that sets them (0: a quality task trains real tensors and traces
    nothing; a plugin's layer may not count its steps)."""
    if cell.task.name != COST or not hasattr(layer, "loop_steps"):
        return 0, ""
    return get_workload(cell.mode).loop_steps(cell, layer)


def _largest(cell: Cell, layer: nn.Module, key: str, layers: int) -> int | None:
    """The largest value of ``key`` (``n`` or decode's ``prefill_chunk``, cheap to try: no
    draw) within :data:`MAX_LOOP_STEPS`, by bisection (the steps grow with it); None if even
    1 is over it."""

    def steps(value: int) -> int:
        changed = (
            replace(cell, n=value)
            if key == "n"
            else replace(cell, workload=Part(cell.mode, {**cell.settings, key: value}))
        )
        return get_workload(cell.mode).loop_steps(changed, layer)[0] * layers

    low, high = 1, cell.n
    if steps(low) > MAX_LOOP_STEPS:
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if steps(mid) <= MAX_LOOP_STEPS else (low, mid - 1)
    return low


def check_n_fits(cell: Cell, usable: int) -> None:
    """The rule for too large an n: the input of one sequence alone (n × d_model values of
    the dtype) must fit in the memory the cell may use. A cell beyond it could only ever be
    an ``oom`` row, and far beyond it the memory model's tensors overflow torch's size
    arithmetic (n = 10¹² was an ``error`` row, "Storage size calculation overflowed", exit
    0): a typo, refused as one."""
    size = presets.DTYPE_BYTES.get(cell.dtype, 4)
    one = cell.n * cell.model.d_model * size
    if one > usable:
        raise ValueError(
            f"n: must fit one sequence's input in the ceiling: {cell.n} × d_model "
            f"{cell.model.d_model} × {size} bytes ({cell.dtype}) = {one} bytes, above the "
            f"{usable} bytes usable; got n={cell.n}"
        )
