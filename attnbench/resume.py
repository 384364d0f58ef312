"""Which stored rows a cell finds: the key a stored row answers to today.

A key is a hash of what a cell measures (:func:`attnbench.cell.key`). When the rule that
makes it changes, rows stored under the old rule must still be found, or a run does not
resume: :func:`stored_key` keys such a row again from the spec stored with it. The store
(:class:`attnbench.store.RunStore`, given ``rekey=stored_key``) and a command's rows
(:func:`attnbench.sweep.claims.rows_of`) ask it.
"""

from __future__ import annotations

import functools
from typing import Any

from attnbench.cell import Cell, key
from attnbench.measure import presets


def stored_key(row: dict[str, Any]) -> Any:
    """The key a stored row answers to today: its own, except a row of a machine's-memory
    preset stored while such keys held the machine's RAM to the byte (a run did not resume
    on another machine of its kind, or after a reboot). Such a row is keyed again from its
    stored spec at the default ceiling. A row stored since then says where its ceiling was
    given (``ceiling_given``); before, a ceiling given is told by being a whole number of MB
    or MiB, as one a user types is (``ceiling=8GB``), where a kernel's MemTotal is not."""
    stored, spec = row.get("key"), row.get("cell")
    ceiling = spec.get("ceiling_bytes") if isinstance(spec, dict) else None
    if not isinstance(stored, str) or not isinstance(ceiling, int) or spec.get("ceiling_given"):
        return stored
    if ceiling % 10**6 == 0 or ceiling % 2**20 == 0:
        return stored
    if (stored, ceiling) not in _REKEYED:  # a row's answer is its own: the watcher asks often
        _REKEYED[stored, ceiling] = _rekeyed(stored, spec)
    return _REKEYED[stored, ceiling]


_REKEYED: dict[tuple[Any, int], Any] = {}


def _rekeyed(stored: Any, spec: dict[str, Any]) -> Any:
    try:
        preset = _preset(str(spec.get("device")))
        if not preset.machine_memory:
            return stored
        return key(Cell.from_dict({**spec, "ceiling_bytes": None}), preset)
    except (ValueError, TypeError, KeyError):  # a plugin's preset or mechanism, a hand edit
        return stored


@functools.cache
def _preset(name: str) -> presets.Preset:
    return presets.load(name)
