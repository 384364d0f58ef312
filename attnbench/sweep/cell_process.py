"""One cell in a process of its own: ``python -m attnbench.sweep.cell_process --cell JSON``
prints the cell's row as JSON. :func:`attnbench.sweep.job.measure` starts it where cells
must not share a process (joblib's reused workers); it dies with the job that started it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from attnbench import plan
from attnbench.cell import Cell
from attnbench.measure import presets
from attnbench.runner import run_cell


def die_with_parent(parent: int) -> None:
    """An isolated cell dies with the job that started it: the kernel sends it SIGKILL when
    its parent goes (``prctl(PR_SET_PDEATHSIG)``, Linux). A parent already gone by the time
    this runs is caught by the pid check; before it runs (imports), the command's reaper
    covers the cell, as it covers every process of the command."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:
        os._exit(1)


def _main_cell(payload: str) -> int:
    """One isolated cell (``--cell JSON``), its row on stdout."""
    data = json.loads(payload)
    if "parent" in data:
        die_with_parent(int(data["parent"]))
    cell = Cell.from_dict(data["cell"])
    row = run_cell(cell, plan.validate(cell, presets.Preset(**data["preset"])))
    print(row.to_json())
    return 0


def _cli(argv: list[str]) -> int:
    """The module's command line: a ``--cell`` that is not one attnbench run wrote is one
    line and exit code 2, read (and validated) before anything is measured."""
    import argparse

    from attnbench.row import shown

    parser = argparse.ArgumentParser(
        prog="python -m attnbench.sweep.cell_process",
        description="Measure one cell in a process of its own and print its row as JSON: "
        "the process attnbench run starts per cell where cells must not share one (joblib's "
        "reused workers). Not a command to type: use attnbench run.",
    )
    parser.add_argument(
        "--cell", required=True, metavar="JSON", help="the cell, its device preset and the "
        "parent's pid, as attnbench run writes them",
    )  # fmt: skip
    payload = parser.parse_args(argv).cell
    try:
        data = json.loads(payload)
        if not isinstance(data.get("parent", 0), int):
            raise TypeError(f"parent: must be a pid, got {data['parent']!r}")
        plan.validate(Cell.from_dict(data["cell"]), presets.Preset(**data["preset"]))
    except json.JSONDecodeError as e:
        parser.exit(2, f"{parser.prog}: error: --cell: not JSON: {e}\n")
    except ValueError as e:  # a cell's parameter, named as attnbench run names it
        parser.exit(2, f"{parser.prog}: error: --cell: {shown(str(e))}\n")
    except (TypeError, KeyError, AttributeError) as e:
        why = shown(f"{type(e).__name__}: {e}")
        parser.exit(2, f"{parser.prog}: error: --cell: not as attnbench run writes it ({why})\n")
    return _main_cell(payload)


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
