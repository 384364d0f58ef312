"""The samples: every cell timed for each version, interleaved, in a shuffled order.

Interleaving is what makes the gate usable on a shared machine: a machine that slows down
half-way (another job, a clock change) slows both versions' samples alike. Within a round
the cells come in a fresh random order and A or B goes first at random, so that neither a
cell's place in the round nor going first can favour one version.

Interleaving cannot help a sample that another process took the CPU from: the worker is read
from the scheduler around each sample (:mod:`attnbench.measure.contention`, by its pid), and
a contended sample is taken again, up to :data:`RETRIES` times; one still contended is kept
and marked, and the verdicts leave it out (:func:`attnbench.check.verdicts.judge`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnbench.check.suite import Suite
from attnbench.check.versions import Worker
from attnbench.measure import contention

RETRIES = 3  # a contended sample is taken again up to this many times


@dataclass
class Samples:
    """Per version, per cell: seconds per forward, one value per round; and, per version
    and cell, the rounds whose sample was still contended after its retries, and what
    compiling a compiled cell cost before its first sample (``compile_s``, ``graphs``:
    information only, never in a verdict)."""

    versions: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    reps: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, dict[str, str]] = field(default_factory=dict)
    contended: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    retried: int = 0  # samples taken again because they were contended
    compiled: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


def _take(worker: Worker, cell: int, name: str, reps: int, out: Samples) -> tuple[float, bool]:
    """One sample of ``cell`` from ``worker``, taken again while the worker's process waited
    for a CPU; (seconds per forward, whether the last try was still contended). A sample the
    worker could not take (a compiled cell that recompiled) ends the check: no figure."""
    with contention.Sched(worker.proc.pid) as sched:
        for attempt in range(RETRIES + 1):
            window = contention.Window(sched)
            got = worker.ask(op="time", cell=cell, reps=reps)
            if "error" in got:
                raise RuntimeError(
                    f"the worker for {worker.tree} could not time {name}: {got['error']}"
                )
            seconds = got["s"]
            if not window.close().contended:
                return seconds, False
            if attempt < RETRIES:
                out.retried += 1
    return seconds, True


def sample(
    trees: dict[str, Path],
    suite: Suite,
    *,
    seed: int = 0,
    expect: dict[str, str] | None = None,
    reps: dict[str, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Samples:
    """Time every cell of ``suite`` for each version in ``trees``, interleaved.

    The number of forwards per sample is set once from the first version's setup timing
    (or taken from ``reps``, a stored baseline's) and used for both, so both versions'
    samples average the same amount of work.
    """
    s = suite.settings
    cells = [asdict(c) for c in suite.cells]
    workers = {}
    out = Samples()
    try:
        for v, tree in trees.items():
            workers[v] = Worker(tree, s, expect or {})
        built = {
            v: w.ask(
                op="setup",
                cells=cells,
                device=s["device"],
                threads=s["threads"],
                warmup=s["warmup"],
            )["cells"]
            for v, w in workers.items()
        }
        timed = _plan(suite, built, next(iter(trees)), reps or {}, out)
        for v in trees:
            out.versions[v] = {suite.cells[i].name: [] for i in timed if built[v][i]["ok"]}
        _rounds(suite, workers, built, timed, random.Random(seed), out, progress)
    finally:
        for w in workers.values():
            w.close()
    return out


def _plan(
    suite: Suite, built: dict[str, list[dict]], first: str, reps: dict[str, int], out: Samples
) -> list[int]:
    """The cells to time (those at least one version built), each with its forwards per
    sample in ``out.reps``: a stored baseline's count, else from ``first``'s setup timing
    (or the other version's, where ``first`` could not build it); what each version could
    not build, and what compiling a compiled cell cost, go to ``out`` as they are."""
    s, timed = suite.settings, []
    for i, c in enumerate(suite.cells):
        bad = {v: b[i]["reason"] for v, b in built.items() if not b[i]["ok"]}
        for v, b in built.items():
            if b[i]["ok"] and "compile_s" in b[i]:
                cost = {k: b[i][k] for k in ("compile_s", "graphs")}
                out.compiled.setdefault(v, {})[c.name] = cost
        for v, why in bad.items():
            out.unavailable.setdefault(v, {})[c.name] = why
        ok = [b[i]["once_s"] for b in built.values() if b[i]["ok"]]
        if ok:
            once = built[first][i]["once_s"] if built[first][i]["ok"] else ok[0]
            out.reps[c.name] = reps.get(c.name) or max(
                1, round(s["sample_s"] / max(once, 1e-6))
            )  # a baseline's count, if any
            timed.append(i)
    return timed


def _rounds(
    suite: Suite,
    workers: dict[str, Worker],
    built: dict[str, list[dict]],
    timed: list[int],
    rng: random.Random,
    out: Samples,
    progress: Callable[[int, int], None] | None,
) -> None:
    """``check.rounds`` rounds of one sample per cell and version into ``out``: the cells
    in a fresh order each round, the versions in a fresh order each cell (``rng``: the
    interleaving the module's docstring argues for), a sample still contended after its
    retries recorded as such."""
    total = suite.settings["rounds"] * len(timed)
    done = 0
    for _ in range(suite.settings["rounds"]):
        order = list(timed)
        rng.shuffle(order)
        for i in order:
            name = suite.cells[i].name
            versions = [v for v in workers if built[v][i]["ok"]]
            rng.shuffle(versions)  # A B or B A: neither always goes first
            for v in versions:
                seconds, busy = _take(workers[v], i, name, out.reps[name], out)
                got = out.versions[v][name]
                if busy:
                    out.contended.setdefault(v, {}).setdefault(name, []).append(len(got))
                got.append(seconds)
            done += 1
            if progress:
                progress(done, total)
