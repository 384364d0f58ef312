"""Workloads: what a cost cell measures, one module each, found by name (``mode=``).

A workload owns everything that differs between, say, timing a forward and timing a
training step: the model it builds (precision, train or eval), its inputs, the callables it
times (:class:`Work`), the bytes a first step leaves behind (an optimizer's state), its
FLOPs, which of the cell's settings belong to it (they enter the cell's key, its label and
the row), and which mechanisms it refuses. :mod:`attnbench.runner` orchestrates any
workload alike — resolve, search the max batch, probe, time, fill the row — and asks it,
never a ``mode`` string, what to do.

A new workload is one module: subclass :class:`Workload`, give it a ``name`` and call
:func:`register` (from a plugin named by ``$ATTNBENCH_PLUGINS`` too, as mechanisms are).
``docs/architecture.md`` ("Add a workload") has a worked example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from attnbench.registry import info, load_plugins
from attnbench.settings import Setting
from attnbench.validators import check_choice
from attnbench.workload.base import (
    DEFAULT,
    DTYPES,
    Work,
    Workload,
    encoder,
    random_input,
    setting,
)
from attnbench.workload.decode import DECODE
from attnbench.workload.inference import INFERENCE
from attnbench.workload.packed import PACKED, PACKED_TRAIN
from attnbench.workload.train import TRAIN

__all__ = [
    "BUILTINS",
    "BUILTIN_WORKLOADS",
    "DEFAULT",
    "DTYPES",
    "Work",
    "Workload",
    "caption_of",
    "encoder",
    "find",
    "get",
    "label_of",
    "names",
    "random_input",
    "refuses",
    "register",
    "setting",
    "workload_settings",
]

_WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Make ``workload`` a ``mode=`` choice, its declared settings owned by it (``mode=NAME``;
    each a top-level config key, ``docs/architecture.md``, "Add a workload"). A name already
    taken is refused, as the mechanisms' registry refuses one: a plugin's ``packed`` would
    otherwise time its own step in rows that say ``mode=packed``."""
    if not workload.name.isidentifier():
        raise ValueError(f"workload name must be an identifier, got {workload.name!r}")
    if workload.name in _WORKLOADS:
        raise ValueError(f"register: workload {workload.name!r} is already registered")
    workload.settings = tuple(s.owned(f"mode={workload.name}") for s in workload.settings)
    _WORKLOADS[workload.name] = workload
    return workload


# the built-ins, registered here in the order they are listed in
BUILTINS = tuple(register(w).name for w in (INFERENCE, TRAIN, DECODE, PACKED, PACKED_TRAIN))
# the same, as objects: what the row's schema is made from at import, before any plugin loads
BUILTIN_WORKLOADS = tuple(_WORKLOADS[name] for name in BUILTINS)


def workload_settings(workloads: Iterable[Workload]) -> list[Setting]:
    """Each setting the workloads declare, once, owned by every workload that declares it
    (``mode=packed, packed_train``): ``packed`` and ``packed_train`` share theirs, and
    ``packed_train`` takes ``mode=train``'s optimizer."""
    seen: dict[str, Setting] = {}
    for w in workloads:
        for s in w.settings:
            first = seen.setdefault(s.name, s)
            if first is not s:
                seen[s.name] = dataclasses.replace(first, owner=f"{first.owner}, {w.name}")
    return list(seen.values())


def names() -> list[str]:
    """Every workload's name, built-ins first, then plugins' in the order they registered."""
    load_plugins()
    rank = {name: i for i, name in enumerate(BUILTINS)}
    return sorted(_WORKLOADS, key=lambda name: rank.get(name, len(rank)))


def find(name: Any) -> Workload | None:
    """The workload called ``name``, or None (a cell is made before it is validated)."""
    if not isinstance(name, str):
        return None
    load_plugins()
    return _WORKLOADS.get(name)


def get(name: str) -> Workload:
    """The workload called ``name``; an unknown one is one line naming those there are."""
    return _WORKLOADS[check_choice("mode", name, names())]


def refuses(name: str, attention: str) -> str | None:
    """Why ``attention`` cannot run workload ``name``, or None: the one place a
    mechanism's capabilities are asked about a workload (a cell, a sweep, the gate)."""
    return get(name).refuses(info(attention))


def label_of(item: Any) -> str:
    """The workload part of a cell's or a row's name: its label (``train(adamw)``), else its
    mode; a row of a workload not registered here (a plugin's) is named by its mode."""
    work = _WORKLOADS.get(item.mode)
    return (work.label(item) if work is not None else None) or item.mode


def caption_of(row: Any) -> str | None:
    """A ratio table's first words about its rows' workload (see :meth:`Workload.caption`)."""
    work = _WORKLOADS.get(row.mode)
    if work is None:
        return f"mode={row.mode}"
    return work.caption(row)
