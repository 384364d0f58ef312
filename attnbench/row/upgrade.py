"""Rows stored before: what reading one adds so that it reads as the row this version
would write of the same cell (:func:`attnbench.row.record._checked` calls these, before the fields
are checked).

* Schema 1 → 2 (:func:`upgrade_1`): ``batch_asked`` from the stored cell, ``mode``
  inference, ``budget`` from the registry.
* A workload's settings declared after its rows were first stored (:func:`later_settings`,
  :attr:`attnbench.workload.Workload.later`): at their defaults, what those rows measured.
"""

from __future__ import annotations

from typing import Any

from attnbench.workload import find as find_workload


def upgrade_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: ``batch_asked`` from the stored cell, ``budget`` from the registry
    (the one time a row's reading asks it: rows of schema 2 carry the name)."""
    cell = data.get("cell")
    out: dict[str, Any] = {"mode": "inference", "budget": None}
    out["batch_asked"] = cell.get("batch", "max") if isinstance(cell, dict) else "max"
    if data.get("k") is not None and isinstance(data.get("attention"), str):
        from attnbench import registry

        try:
            out["budget"] = registry.info(data["attention"]).budget
        except ValueError:  # a plugin's rows, the plugin not loaded here: unknown
            out["budget"] = None
    return out


def later_settings(values: dict[str, Any]) -> dict[str, Any]:
    """The settings its workload declared after the row was stored (absent, or null as a
    row made without them writes them), at their defaults: what the row measured
    (:attr:`attnbench.workload.Workload.later`)."""
    work = find_workload(values.get("mode", "inference"))
    if work is None or not work.later:
        return {}
    defaults = {s.name: s.default for s in work.settings}
    return {name: defaults[name] for name in work.later if values.get(name) is None}
