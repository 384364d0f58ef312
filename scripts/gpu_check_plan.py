"""The GPU check's plan and budget: how long each cell should take, and where a call stops.

A device window is short (15 minutes, start-up included) and may not come twice, so
``scripts/gpu_check.py`` runs its cells in a fixed order of priority and can say beforehand,
without a GPU, what a window holds (``--plan``), and stop before a budget runs out
(``--budget``).

**Estimates.** A cell's seconds are its wall time in the last GPU run (``--estimates``, by
default ``results/gpu_check/rows.jsonl``: ``wall_s`` of each row with status ok that was
timed on CUDA) where that run measured the same cell (the same ``_done_key``). Otherwise the
median wall time of that run's rows of the same kind: the workload (``packed`` counted as
``inference``, ``packed_train`` as ``train``), checkpointed or not, compiled or not; for a
cell at a fixed batch, the median of those rows whose max-batch search took at most two
probes (a batch the model got right at once, as near to no search as that run has). A kind
with no rows takes its workload's median, then every row's (:data:`DEFAULT_S` without any).
A ``kernel=fla`` cell adds :data:`FLA_TUNE_S` to its kind's: its Triton kernels autotune at
each new shape (26-122 configurations an op, each compiled and timed), a guess until a fla
cell has run on a GPU, whose measured wall time then replaces it. A cell run under another
allocator setting takes the same cell's measured time under the default. A child process
(another ``PYTORCH_CUDA_ALLOC_CONF``) adds :data:`CHILD_S` for its start (Python, torch,
validation, CUDA). Before all of it, :data:`STARTUP_S`: the device machine's start, the
working tree's transfer and the rows back ("a minute or more" to start), which the plan
adds to its total and ``--budget`` does not count.

**Budget.** ``--budget S`` counts seconds from the script's start (``gpu_check.sh``'s, which
passes it). A cell starts only if the
time so far, its estimate and the tables' reserve fit in S: :data:`TABLES_S` plus
:data:`TABLE_ROW_S` for each row the tables will hold (the residual table traces the memory
model once a row: 0.7 s a row was measured on a loaded CPU core). Otherwise the call stops
there: no later cell starts, not even a shorter one (the order is the priority); every
finished row is kept (each is written as it finishes); the tables are printed and the cells
not run listed; exit 0. ``--resume`` goes on from the first cell not run. ``--plan
--budget S`` shows where a call would stop, by the same rule run on the estimates.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from attnbench.measure import presets
from attnbench.validators import check_number

STARTUP_S = 120.0  # the device machine's start, the transfers: before the script runs
CHILD_S = 15.0  # a child process's Python, torch, validation and CUDA start
FLA_TUNE_S = 15.0  # kernel=fla: autotuning at each new shape (a guess: never run on a GPU)
TABLES_S = 10.0  # the tables at the end, beside...
TABLE_ROW_S = 0.7  # ...the residual table's trace of the memory model, per row
DEFAULT_S = 10.0  # no GPU rows to go by: the first run's typical cell
FEW_PROBES = 2  # a search this short is as near as the rows come to a fixed batch
BASE_MODE = {"packed": "inference", "packed_train": "train"}


def parse_budget(text: str | None) -> float | None:
    """``--budget``: seconds, a finite number > 0 (None: no budget), or one line naming it."""
    if text is None:
        return None
    try:
        return check_number("--budget", float(text), low=0, open_low=True)
    except ValueError:
        raise ValueError(
            f"--budget: must be a number of seconds > 0 (the time this call may run), got {text!r}"
        ) from None


def _kind(mode: str, checkpoint: Any, compiled: Any) -> tuple[str, bool, bool]:
    return BASE_MODE.get(mode, mode), bool(checkpoint), bool(compiled)


@dataclass
class Estimates:
    """Seconds per cell from a GPU run's rows (the module docstring says how)."""

    measured: dict[str, float]
    medians: dict[tuple, float]
    rows: int
    source: str

    @classmethod
    def of(cls, rows: Iterable[Any], key: Callable[[Any], str], source: str) -> Estimates:
        """From stored rows: those with status ok, timed on CUDA, with a wall time."""
        gpu = [r for r in rows if r.status == "ok" and r.time_device == "cuda" and r.wall_s]
        groups: dict[tuple, list[float]] = {}
        for r in gpu:
            kind = _kind(r.mode, r.checkpoint, r.compile)
            few = (r.probes or 0) <= FEW_PROBES
            for group in ((*kind, False), *([(*kind, True)] if few else []), kind[:1], ()):
                groups.setdefault(group, []).append(r.wall_s)
        medians = {group: statistics.median(walls) for group, walls in groups.items()}
        return cls({key(r): r.wall_s for r in gpu}, medians, len(gpu), source)

    def seconds(self, cell: Any, *keys: str) -> tuple[float, str]:
        """The cell's estimate and where it came from: ``measured`` (under the first of its
        ``keys`` measured), ``kind``, ``mode``, ``all`` or ``none`` (``+15`` where
        kernel=fla)."""
        if measured := [self.measured[k] for k in keys if k in self.measured]:
            return measured[0], "measured"
        kind = _kind(cell.mode, cell.settings.get("checkpoint"), cell.compile)
        fixed = cell.batch != "max"
        tries = ((*kind, fixed), "kind"), ((*kind, False), "kind"), (kind[:1], "mode"), ((), "all")
        seconds, how = next(((self.medians[g], how) for g, how in tries if g in self.medians),
                            (DEFAULT_S, "none"))  # fmt: skip
        if dict(cell.params).get("kernel") == "fla":
            return seconds + FLA_TUNE_S, f"{how}+{FLA_TUNE_S:g}"
        return seconds, how


@dataclass(frozen=True)
class Step:
    """One step of a call: a cell (``item``), or the start of a child process (item None)
    for the cells after it whose ``PYTORCH_CUDA_ALLOC_CONF`` is ``alloc``."""

    item: Any | None
    seconds: float
    how: str
    alloc: str | None


def schedule(
    items: Sequence[Any], estimate: Callable[[Any], tuple[float, str]], mine: str | None
) -> list[Step]:
    """The steps of running ``items`` in order from a process whose allocator setting is
    ``mine``: each run of items of another setting starts one child process first."""
    steps, previous = [], mine
    for item in items:
        if item.alloc not in (mine, previous):
            steps.append(Step(None, CHILD_S, "child", item.alloc))
        previous = item.alloc
        steps.append(Step(item, *estimate(item), item.alloc))
    return steps


def fits(elapsed: float, seconds: float, rows: int, budget: float) -> bool:
    """Whether a step of ``seconds`` may start ``elapsed`` seconds into a call of ``budget``
    that will tabulate ``rows`` rows at its end."""
    return elapsed + seconds + TABLES_S + TABLE_ROW_S * rows <= budget


def run(
    steps: Sequence[Step],
    *,
    budget: float | None,
    start: float,
    clock: Callable[[], float],
    rows: int,
    run_one: Callable[[Step], None],
    run_child: Callable[[str | None, list[Step], float | None], None],
    done: Callable[[Any], bool],
) -> list[Step]:
    """Run ``steps`` in order within ``budget`` seconds of ``start`` (by ``clock``), ``rows``
    rows already kept; returns the steps not run (none: all ran). A child is handed the
    budget left and its cells; those it did not finish (its own budget, or a crash) stop
    this call too, as its first cell not fitting would have."""
    i = 0
    while i < len(steps):
        step, elapsed = steps[i], clock() - start
        group = []
        if step.item is None:
            j = i + 1
            while j < len(steps) and steps[j].item is not None and steps[j].alloc == step.alloc:
                j += 1
            group = list(steps[i + 1 : j])
        need = step.seconds + (group[0].seconds if group else 0.0)
        if budget is not None and not fits(elapsed, need, rows + 1, budget):
            return list(steps[i:])
        if step.item is not None:
            run_one(step)
            rows, i = rows + 1, i + 1
            continue
        run_child(step.alloc, group, None if budget is None else budget - elapsed)
        missing = [s for s in group if not done(s.item)]
        rows += len(group) - len(missing)
        if missing:
            return missing + list(steps[i + 1 + len(group) :])
        i += 1 + len(group)
    return []


def simulate(steps: Sequence[Step], budget: float | None, rows: int) -> tuple[list[Step], float]:
    """The steps a call would leave, and the seconds it would take, had every step taken its
    estimate: :func:`run` on a clock the steps advance (a child's cells under the budget it
    is handed)."""
    now, finished = [0.0], set()

    def one(step: Step) -> None:
        now[0] += step.seconds
        finished.add(id(step.item))

    def child(alloc: str | None, group: list[Step], left: float | None) -> None:
        begun, now[0] = now[0], now[0] + CHILD_S
        kept = rows + len(finished)
        run(group, budget=left, start=begun, clock=lambda: now[0], rows=kept,
            run_one=one, run_child=child, done=lambda item: id(item) in finished)  # fmt: skip

    left = run(steps, budget=budget, start=0.0, clock=lambda: now[0], rows=rows,
               run_one=one, run_child=child, done=lambda item: id(item) in finished)  # fmt: skip
    return left, now[0]


def plan_lines(
    steps: Sequence[Step],
    refused: Sequence[tuple[Any, str]],
    estimates: Estimates,
    budget: float | None,
    rows: int,
    describe: Callable[[Any], str],
) -> list[str]:
    """``--plan``: the steps in order with each estimate and the running sum, section by
    section; the cells validation refused; the total; where ``budget`` would stop."""
    cells = sum(s.item is not None for s in steps)
    lines = [
        f"gpu_check plan: {cells} cells in this order; estimates from {estimates.source} "
        f"({estimates.rows} rows of a GPU run; scripts/gpu_check_plan.py says how)",
        f"start-up before the script (machine start, transfers): {STARTUP_S:.0f} s, "
        "not counted by --budget",
        f"{'#':>4} {'est s':>7} {'sum s':>7}  {'from':<11} cell",
    ]
    total, number, section = 0.0, 0, None
    for step in steps:
        total += step.seconds
        if step.item is None:
            what = f"start a process with PYTORCH_CUDA_ALLOC_CONF={step.alloc}"
            lines.append(f"{'':>4} {step.seconds:7.1f} {total:7.1f}  {step.how:<11} {what}")
            continue
        if step.item.section != section:
            section = step.item.section
            lines.append(f"-- {section}")
        number += 1
        lines.append(
            f"{number:>4} {step.seconds:7.1f} {total:7.1f}  {step.how:<11} {describe(step.item)}"
        )
    if refused:
        lines.append(f"refused at validation, not run ({len(refused)}):")
        lines += [f"  {describe(item)}: {why}" for item, why in refused]
    lines.append(
        f"total: {cells} cells, {total:.0f} s ({total / 60:.1f} min); with start-up "
        f"{total + STARTUP_S:.0f} s ({(total + STARTUP_S) / 60:.1f} min)"
    )
    if budget is not None:
        left, spent = simulate(steps, budget, rows)
        left = [s for s in left if s.item is not None]
        ran = cells - len(left)
        lines.append(
            f"--budget {budget:g}: {ran} cells ({spent:.0f} s estimated), "
            + (f"stops before {describe(left[0].item)}" if left else "all of them")
        )
    return lines


@contextlib.contextmanager
def as_on_a_gpu() -> Iterator[None]:
    """Validation as a CUDA machine gives it, on one without CUDA (``--plan``): CUDA
    visible, on a GPU holding every preset. Only validation runs under it: a cell refused
    here is refused there (fla's fp32 delta rule), not for this machine's want of a GPU.
    The packages are this machine's: fla not installed here is said as such."""
    if torch.cuda.is_available():
        yield
        return
    held = max(presets.load(n).total_bytes for n in presets.names() if presets.load(n).is_gpu)
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(
            torch.cuda, "get_device_properties", return_value=SimpleNamespace(total_memory=held)
        ),
    ):
        yield
