"""The one place attnbench touches Hydra's private API.

``attnbench run`` validates every job of a sweep before Hydra launches any, so it must
expand the sweep exactly as Hydra's BasicSweeper will. Hydra exposes no public function for
that; :func:`split_sweep` calls the sweeper's own static method. ``tests/test_hydra_api.py``
pins its behaviour, so a Hydra upgrade that moves or changes it fails loudly there rather
than silently expanding sweeps differently from Hydra.
"""

from __future__ import annotations

from typing import Any


def split_sweep(overrides: list[Any]) -> list[list[str]]:
    """Every job of a multirun as its list of overrides (``key=value`` strings), from parsed
    overrides (sweep file params first, the command line after), in Hydra's own order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
