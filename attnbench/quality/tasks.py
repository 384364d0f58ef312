"""Quality tasks as cells: the one registry of what ``attnbench run task=...`` measures.

A cost cell (``task=cost``, the default) measures time and memory. A quality cell measures the
same mechanism at the same n and budget from another side, and its row carries the figures in
``quality`` (a mapping), beside the cost rows of the same store. Each quality task is one
:class:`Task` of :data:`REGISTRY` (the built-ins' in :mod:`attnbench.quality.builtin_tasks`),
which declares

* its settings, declared once (:class:`~attnbench.settings.Setting`; the built-ins' are
  written into conf/config.yaml's ``quality.<task>`` block by ``python -m
  attnbench.mirrors``): a key of a cell's settings not declared is a typo, refused in
  one line;
* its figures: the keys its run puts in the row's ``quality``, each with the JSON type a
  stored row must hold there (:mod:`attnbench.row.fields` checks them on reading);
* its rules (``validate``) and its measurement (``run``, in :mod:`attnbench.quality.runs`).

:func:`names` (``cost`` and every quality task, a plugin's too: :func:`register`) is what
a cell's ``task`` may be.
A cell names its task; :mod:`attnbench.plan` completes and validates a quality cell with it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from attnbench.quality.builtin_tasks import BUILTIN_TASKS, INPUTS, Figure, Task
from attnbench.registry import load_plugins
from attnbench.validators import check_choice, check_int

if TYPE_CHECKING:
    from attnbench.cell import Cell

__all__ = ["INPUTS", "REGISTRY", "TASKS", "Figure", "Task", "names", "register", "validate"]

REGISTRY: dict[str, Task] = dict(BUILTIN_TASKS)

BUILTINS = tuple(REGISTRY)  # the built-in tasks, in the order reports list them
TASKS = ("cost", *BUILTINS)  # what a stored row's task may be without a plugin


def register(task: Task) -> Task:
    """Make ``task`` a ``task=`` choice (from a plugin named by ``$ATTNBENCH_PLUGINS`` too):
    its settings become ``quality.<name>.*`` keys, its figures the row's ``quality``
    (``docs/architecture.md``, "Add a quality task"). A name already taken, a built-in's
    or another plugin's, is refused: rows would carry one task's figures under the other's."""
    if not task.name.isidentifier() or task.name == "cost":
        raise ValueError(f"task name must be a new identifier, not cost, got {task.name!r}")
    if task.name in REGISTRY:
        raise ValueError(f"register: task {task.name!r} is already registered")
    REGISTRY[task.name] = task
    return task


def names() -> tuple[str, ...]:
    """What a cell's ``task`` may be: ``cost``, the built-ins, then plugins' tasks."""
    load_plugins()
    return ("cost", *REGISTRY)


def quality_settings(cell: Cell) -> dict[str, Any]:
    """The cell's quality settings (``Cell.settings`` are its workload's) over its task's
    defaults; a carried ``listops`` block over the listops task's defaults (what the trained
    model was trained with)."""
    task = REGISTRY[cell.task.name]
    out = {**task.defaults(), **dict(cell.task.settings)}
    if any(s.carried for s in task.settings):
        trained = REGISTRY["listops"].defaults()
        carried = dict(out.get("listops") or ())
        out["listops"] = {**trained, **{k: v for k, v in carried.items() if k in trained}}
    return out


def validate(cell: Cell) -> None:
    """One ``ValueError`` line naming the first bad key of a quality cell."""
    task = REGISTRY[cell.task.name]
    names = tuple(s.name for s in task.settings)
    for key, _ in cell.task.settings:
        check_choice(f"quality.{task.name}", key, names, "a setting of this task")
    if any(s.carried for s in task.settings):  # the trained model's quality.listops block
        trained = tuple(REGISTRY["listops"].defaults())
        for key, _ in dict(cell.task.settings).get("listops") or ():
            check_choice("quality.listops", key, trained, "a setting of task=listops")
    s = quality_settings(cell)
    if "seed" in s:  # every built-in's; a plugin's task may have none
        check_int(f"quality.{task.name}.seed", s["seed"], low=0)
    task.check(cell, s)


def run(cell: Cell) -> dict[str, Any]:
    """The quality figures of a validated cell (the row's ``quality``)."""
    return REGISTRY[cell.task.name].run(cell, quality_settings(cell))


def _finite(v: Any) -> bool:
    """A real number a float holds, finite (10**400 is no figure: formatting it raises)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


_FIGURES = {
    "number": _finite,
    "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63,
    "text": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list),
    "flag": lambda v: isinstance(v, bool),
    "curves": lambda v: (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(c, list) and c and all(map(_finite, c)) for c in v)
    ),
}
_KINDS = {"curves": "non-empty list of lists of numbers"}


def check_figures(task: str, quality: dict[str, Any] | None) -> None:
    """Each figure ``task`` declares is of its kind in a stored row (a number finite), then
    there (an optional one may be absent or null), then as its task's ``figure_rules`` read
    them together; figures it does not declare are kept as they are. What a report reads of
    a row is so there: a hand-edited row is one line naming the figure, never a traceback
    in a report. The caller (:func:`attnbench.row.read`) shortens the message."""
    if task not in REGISTRY or not quality:
        return
    declared = REGISTRY[task]
    for figure in declared.figures:
        v = quality.get(figure.name)
        if v is not None and not _FIGURES[figure.kind](v):
            kind = _KINDS.get(figure.kind, figure.kind)
            raise ValueError(f"quality.{figure.name}: must be a {kind}, got {v!r}")
        if v is not None and figure.choices:
            check_choice(f"quality.{figure.name}", v, figure.choices)
    for figure in declared.figures:
        if figure.optional or quality.get(figure.name) is not None:
            continue
        what = "must not be null" if figure.name in quality else "missing"
        raise ValueError(f"quality.{figure.name}: {what} (every task={task} row holds it)")
    if declared.figure_rules is not None:
        declared.figure_rules(quality)


def markdown_table() -> str:
    """Each task's settings and figures as docs/architecture.md shows them."""
    lines = ["| task | settings (defaults) | figures in `quality` |", "| --- | --- | --- |"]
    for t in REGISTRY.values():
        settings = ", ".join(
            f"`{s.name}`" + ("" if s.carried else f" ({s.default})") for s in t.settings
        )
        figures = "; ".join(
            f"`{f.name}` ({f.kind}{', optional' if f.optional else ''}): {f.doc}" for f in t.figures
        )
        lines.append(f"| `{t.name}`: {t.doc} | {settings} | {figures} |")
    return "\n".join(lines)
