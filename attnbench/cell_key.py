"""A cell's key: what a stored row is found by, made by one rule with a version, and the key
a stored row answers to today.

:func:`key` hashes what a cell measures by the rule of :data:`KEY_VERSION`. A row records
the rule its key was made by (``key_version``; a row without it: 1). A row of today's rule
answers to its own key (:func:`stored_key`); an older row is keyed again from the cell
stored with it, brought forward through :data:`MIGRATIONS`, so a run stored under any
earlier rule still resumes, and its rows are found by the cells that measure the same thing
today. The store (:class:`attnbench.store.RunStore`, given ``rekey=stored_key``), a
command's rows (:func:`attnbench.sweep.claims.rows_of`) and the sweep ask it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from attnbench import settings
from attnbench.cell import Cell, as_tuples
from attnbench.cell_rules import complete
from attnbench.measure import presets
from attnbench.plan import spec
from attnbench.quality import tasks
from attnbench.settings import defaults
from attnbench.workload import DEFAULT as DEFAULT_MODE
from attnbench.workload import find as find_workload
from attnbench.workload.draw import DRAW

# every cell's own part, always in its key
KEY_FIELDS = ("attention", "params", "n", "k", "batch", "dtype", "device", "ceiling_bytes", "model")
MACHINE = "machine"  # a key's ceiling where it is the machine's whole memory


def key(cell: Cell, preset: presets.Preset) -> str:
    """A stable id of what a cell measures (not of how long it is timed), by the rule of
    :data:`KEY_VERSION`: every cell's own part whole (:data:`KEY_FIELDS`), and beyond it only
    what differs from its declared default — a thread count, compiling, the allocator, a
    workload other than the paper's and each of its settings in use
    (:meth:`attnbench.workload.Workload.in_use`), a quality task and its settings. So a
    setting added with a default leaves every key as it was; a default changed is a new
    :data:`KEY_VERSION` (rows keyed before are keyed again from their stored cell:
    :func:`stored_key`). Nothing this machine decides alone enters it: a preset whose memory
    is the machine's own (``cpu``) is keyed, at its default ceiling, as ``machine``, and the
    row records the bytes beside the key."""
    cell = complete(cell)  # a setting named at its default and one left out: one key
    return _digest({**_own_part(cell, preset), **beyond_defaults(cell)})


def _own_part(cell: Cell, preset: presets.Preset) -> dict[str, Any]:
    """:data:`KEY_FIELDS` of the stored spec, the machine's memory keyed as :data:`MACHINE`:
    the part every key version holds whole."""
    s = spec(cell, preset)
    fields: dict[str, Any] = {f: s[f] for f in KEY_FIELDS}
    if cell.ceiling_bytes is None and preset.machine_memory:
        fields["ceiling_bytes"] = MACHINE
    return fields


def _digest(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha1(canonical.encode()).hexdigest()[:16]


def beyond_defaults(cell: Cell) -> dict[str, Any]:
    """What a cell asks for beyond every cell's part, each entry only where it is not its
    default: the part of its key that grows as settings are declared, and never moves
    when one is added."""
    out: dict[str, Any] = {}
    for s in OPTIONS:
        value = cell.value(s.name)
        if s.name == "compile_mode" and not cell.compile:
            continue  # an eager cell uses no compile mode
        if as_tuples(value) != as_tuples(s.default):
            out[s.name] = value
    if cell.mode != DEFAULT_MODE:
        out["mode"] = cell.mode
    work = find_workload(cell.mode)
    used = work.in_use(cell.settings) if work is not None else cell.settings
    declared = defaults(work.settings) if work is not None else {}
    if own := _changed(used, declared):
        out["mode_settings"] = own
    if cell.task.name != "cost":
        out["task"] = cell.task.name
        task = tasks.REGISTRY.get(cell.task.name)
        if own := _changed(dict(cell.task.settings), task.defaults() if task else {}):
            out["quality"] = own
    return out


def _changed(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``values`` that differ from ``defaults`` (one without a default always differs)."""
    absent = object()
    return {k: v for k, v in values.items() if as_tuples(v) != as_tuples(defaults.get(k, absent))}


# Cell fields beyond :data:`KEY_FIELDS` that say what a cell measures, each keyed where it is
# not its default: a thread count asked for (a sweep over timing.threads is one cell per
# count; following the allocation, the default, is not), compiling, the allocator
OPTIONS = tuple(s for s in settings.OPTIONS if s.in_key)
# the rule :func:`key` keys by; rows stored under an older one are keyed again from their
# stored cell when a resume looks for them (:data:`MIGRATIONS`)
KEY_VERSION = 2


def _machine_ceiling(
    row: dict[str, Any], spec: dict[str, Any], preset: presets.Preset
) -> dict[str, Any]:
    """A machine's-memory preset's ceiling, as the row's cell had it. A row stored since the
    ceiling is keyed as ``machine`` says where it was given (``ceiling_given``), and one that
    does not, keyed by version 1's rule at the default ceiling, was not given. Before that,
    keys held the machine's RAM to the byte (a run did not resume on another machine of its
    kind, or after a reboot): a ceiling given is told by being a whole number of MB or MiB,
    as one a user types is (``ceiling=8GB``), where a kernel's MemTotal is not."""
    ceiling = spec.get("ceiling_bytes")
    if not preset.machine_memory or spec.get("ceiling_given") or not isinstance(ceiling, int):
        return spec
    default = {**spec, "ceiling_bytes": None}
    if _key_v1(cell_of(default), preset) == row.get("key"):
        return default
    if ceiling % 10**6 == 0 or ceiling % 2**20 == 0:
        return spec
    return default


def _key_v1(cell: Cell, preset: presets.Preset) -> str:
    """Version 1's rule, kept to read version-1 keys: every setting of a workload other than
    the paper's keyed, defaults too (decode's draw left out with every prompt n), a quality
    task's whole set, compiling with its mode."""
    fields = _own_part(cell, preset)
    if cell.timing.threads is not None:
        fields["threads"] = cell.timing.threads
    if cell.mode != DEFAULT_MODE:
        fields["mode"] = cell.mode
        unused = set()
        if cell.settings.get("contexts") == "n":  # decode's every prompt n
            unused = {"contexts", *(w.name for w in DRAW)}
        fields.update({k: v for k, v in cell.settings.items() if k not in unused})
    if cell.task.name != "cost":
        fields.update(task=cell.task.name, quality=spec(cell, preset)["quality"])
    if cell.compile:
        fields.update(compile=True, compile_mode=cell.compile_mode)
    return _digest(fields)


def _before_replay(
    row: dict[str, Any], spec: dict[str, Any], preset: presets.Preset
) -> dict[str, Any]:
    """A row stored before the caching allocator's replay (its ``allocator`` null)
    whose max batch a GPU preset's model gave from live bytes alone measured what no cell
    asks for today: it is keyed apart (``allocator`` :data:`ALLOCATION_ONLY`), so a resume
    measures it again rather than mixing its batch with replayed ones. A row whose figures
    the allocator does not enter (measured on the GPU, the cpu preset, decode, a quality
    task) is today's cell at the default allocator."""
    if row.get("allocator") is not None or row.get("memory_source") != "modeled":
        return spec
    if not preset.is_gpu:
        return spec
    work = find_workload(spec.get("mode", DEFAULT_MODE))
    if work is None or not work.replays or spec.get("task", "cost") != "cost":
        return spec
    return {**spec, "allocator": ALLOCATION_ONLY}


ALLOCATION_ONLY = "allocation-only"  # no setting takes it: no cell of today keys as one

# (the last key version a step applies to, what changed since, the step): a stored cell of
# key version v passes through every step whose version is >= v, in order, then is keyed by
# today's rule. Version 2 (KEY_VERSION): settings at their default left out of the key (a
# workload's settings were all keyed, defaults too); no spec step is needed for it, the
# stored cell is simply keyed again. The allocator's replay came within version 2: a row
# without the field passes its step whatever its version
Step = Callable[[dict[str, Any], dict[str, Any], presets.Preset], dict[str, Any]]
MIGRATIONS: tuple[tuple[int, str, Step], ...] = (
    (1, "a machine's-memory ceiling keyed as the machine's RAM", _machine_ceiling),
    (2, "a GPU preset's modeled max batch from live bytes, before the replay", _before_replay),
)


def stored_key(row: dict[str, Any]) -> Any:
    """The key a stored row answers to today: its own under today's rule, else its stored
    cell's key by today's rule, the cell brought forward through :data:`MIGRATIONS` (its own,
    where that cell cannot be read here: a plugin not loaded, a hand edit)."""
    stored, spec = row.get("key"), row.get("cell")
    version = row.get("key_version") or 1
    if not isinstance(stored, str) or not isinstance(spec, dict):
        return stored
    if version == KEY_VERSION and row.get("allocator") is not None:
        return stored
    source = (row.get("memory_source"), row.get("allocator"))
    memo = (stored, version, source, json.dumps(spec, sort_keys=True, default=str))
    if memo not in _REKEYED:  # a row's answer is its own: the watcher asks often
        _REKEYED[memo] = _rekeyed(row, version)
    return _REKEYED[memo]


_REKEYED: dict[tuple[Any, ...], Any] = {}


def _rekeyed(row: dict[str, Any], version: int) -> Any:
    try:
        return key(*stored_cell(row, version))
    except (ValueError, TypeError, KeyError):  # a plugin's preset or workload, a hand edit
        return row["key"]


def stored_cell(row: dict[str, Any], version: int = 1) -> tuple[Cell, presets.Preset]:
    """The cell a stored row (its ``cell``, stored under key ``version``) measured, as today's
    cells are, with its preset: what a sweep asking for the same measurement makes now. A
    row whose workload or quality task is not registered here (a plugin not loaded) raises
    ``KeyError``: its cell's defaults are unknown, so it answers to its own key."""
    spec = row["cell"]
    preset = _preset(str(spec.get("device")))
    if find_workload(spec.get("mode", DEFAULT_MODE)) is None:
        raise KeyError(spec.get("mode"))
    if spec.get("task", "cost") not in ("cost", *tasks.REGISTRY):
        raise KeyError(spec.get("task"))
    for last, _, step in MIGRATIONS:  # none reads a workload's settings: cell_of gathers them
        if version <= last:
            spec = step(row, spec, preset)
    cell = cell_of(spec)
    if preset.machine_memory and cell.ceiling_bytes is not None:  # stored resolved: was it
        machine = dataclasses.replace(cell, ceiling_bytes=None)  # the machine's? its key says
        if row.get("key") == key(machine, preset):
            cell = machine
    return cell, preset


def cell_of(spec: dict[str, Any]) -> Cell:
    """The cell a row's stored spec describes, as it was run: its form brought forward, its
    parts completed by their owners' defaults (what a setting declared since measured)."""
    return complete(Cell.from_dict(_settings_as_set(spec)))


def _settings_as_set(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec stored while a workload's settings were fields of the cell (no
    ``mode_settings``), as today's: those settings gathered into the workload's set. The
    form of a stored cell, not of its key: every key version reads it."""
    work = find_workload(spec.get("mode", DEFAULT_MODE))
    if "mode_settings" in spec or work is None:
        return spec
    own = {s.name: spec[s.name] for s in work.settings if s.name in spec}
    return {**spec, "mode_settings": own}


@functools.cache
def _preset(name: str) -> presets.Preset:
    return presets.load(name)
