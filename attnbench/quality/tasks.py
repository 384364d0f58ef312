"""Quality tasks as cells: the one registry of what ``attnbench run task=...`` measures.

A cost cell (``task=cost``, the default) measures time and memory. A quality cell measures the
same mechanism at the same n and budget from another side, and its row carries the figures in
``quality`` (a mapping), beside the cost rows of the same store. Each quality task is one
:class:`Task` of :data:`REGISTRY` (the built-ins' in :mod:`attnbench.quality.builtin_tasks`),
which declares

* its settings, declared once (:class:`~attnbench.settings.Setting`; the built-ins' are
  written into conf/config.yaml's ``quality.<task>`` block by ``python -m
  attnbench.sweep.declared``): a key of a cell's settings not declared is a typo, refused in
  one line;
* its figures: the keys its run puts in the row's ``quality``, each with the JSON type a
  stored row must hold there (:mod:`attnbench.row_fields` checks them on reading);
* its rules (``validate``) and its measurement (``run``, in :mod:`attnbench.quality.runs`).

:func:`names` (``cost`` and every quality task, a plugin's too: :func:`register`) is what
a cell's ``task`` may be.
This module imports no cell: :mod:`attnbench.cell` imports it to validate a quality cell.
"""

from __future__ import annotations

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
    (``docs/architecture.md``, "Add a quality task")."""
    if not task.name.isidentifier() or task.name == "cost" or task.name in BUILTINS:
        raise ValueError(f"task name must be a new identifier, not cost, got {task.name!r}")
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
    task = REGISTRY[cell.task]
    out = {**task.defaults(), **dict(cell.quality)}
    if any(s.carried for s in task.settings):
        trained = REGISTRY["listops"].defaults()
        carried = dict(out.get("listops") or ())
        out["listops"] = {**trained, **{k: v for k, v in carried.items() if k in trained}}
    return out


def validate(cell: Cell) -> None:
    """One ``ValueError`` line naming the first bad key of a quality cell."""
    task = REGISTRY[cell.task]
    names = tuple(s.name for s in task.settings)
    for key, _ in cell.quality:
        check_choice(f"quality.{task.name}", key, names, "a setting of this task")
    if any(s.carried for s in task.settings):  # the trained model's quality.listops block
        trained = tuple(REGISTRY["listops"].defaults())
        for key, _ in dict(cell.quality).get("listops") or ():
            check_choice("quality.listops", key, trained, "a setting of task=listops")
    s = quality_settings(cell)
    if "seed" in s:  # every built-in's; a plugin's task may have none
        check_int(f"quality.{task.name}.seed", s["seed"], low=0)
    task.check(cell, s)


def run(cell: Cell) -> dict[str, Any]:
    """The quality figures of a validated cell (the row's ``quality``)."""
    return REGISTRY[cell.task].run(cell, quality_settings(cell))


_FIGURES = {
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "text": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list),
    "flag": lambda v: isinstance(v, bool),
}


def check_figures(task: str, quality: dict[str, Any] | None) -> None:
    """Each figure ``task`` declares is of its kind where a stored row holds it (None: an
    undefined figure); figures it does not declare are kept as they are. The caller
    (:func:`attnbench.row.read`) shortens the message."""
    if task not in REGISTRY or not quality:
        return
    for figure in REGISTRY[task].figures:
        v = quality.get(figure.name)
        if v is not None and not _FIGURES[figure.kind](v):
            raise ValueError(f"quality.{figure.name}: must be a {figure.kind}, got {v!r}")


def markdown_table() -> str:
    """Each task's settings and figures as docs/architecture.md shows them."""
    lines = ["| task | settings (defaults) | figures in `quality` |", "| --- | --- | --- |"]
    for t in REGISTRY.values():
        settings = ", ".join(
            f"`{s.name}`" + ("" if s.carried else f" ({s.default})") for s in t.settings
        )
        figures = "; ".join(f"`{f.name}` ({f.kind}): {f.doc}" for f in t.figures)
        lines.append(f"| `{t.name}`: {t.doc} | {settings} | {figures} |")
    return "\n".join(lines)
