"""``attnbench check`` from its options to its exit status, every step in order.

Everything that can be misuse — the repository, the suite and its settings, the ref, the
stored baseline — is checked before the first sample, so a mistake costs one line and exit
code 2, never the minutes of a check. The CLI (:func:`attnbench.commands.cmd_check`) only
parses flags and turns exceptions into exit codes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from attnbench.check import Misuse, busy, sampling, suite, verdicts, versions
from attnbench.check import baseline as baseline_mode
from attnbench.env import fingerprint
from attnbench.writable import check_file

DEFAULT_JSON = Path("results/check/latest.json")
BUSY = busy.BUSY


def run(
    *,
    against: str | None = None,
    baseline: Path | None = None,
    write_baseline: Path | None = None,
    suite_name: str = "regression",
    config_dir: str | None = None,
    threshold: float | None = None,
    rounds: int | None = None,
    compile: bool | None = None,
    on_busy: str | None = None,
    json_path: Path = DEFAULT_JSON,
    seed: int = 0,
    quiet: bool = False,
    out: Console | None = None,
    cwd: Path | None = None,
) -> int:
    """Run the gate: 1 if a cell regressed or broke, else 3 (:data:`BUSY`, or 0 with
    ``check.on_busy=pass``) if a cell ran on too contended a CPU to be judged, else 0 (or a
    baseline was written). Misuse raises
    :class:`Misuse`; the caller decides how to report it.

    Modes: ``against`` (a git ref, default the parent commit) times that ref and the working
    tree interleaved; ``baseline`` compares the working tree with stored samples;
    ``write_baseline`` stores the working tree's samples. ``threshold``, ``rounds``,
    ``compile`` and ``on_busy`` (None: the suite's) override the suite's ``check:``
    settings; ``out`` gets the table, stderr the progress bar and warnings.
    Busy cells are timed again, then ``check.on_busy`` decides (:mod:`attnbench.check.busy`).
    """
    _check_flags(against, baseline, write_baseline, json_path)
    out = out or Console()
    err = Console(stderr=True)
    started = time.time()
    stored_mode = baseline is not None or write_baseline is not None
    root = _root(cwd or Path.cwd(), stored_mode)
    asked = {"threshold": threshold, "rounds": rounds, "compile": compile, "on_busy": on_busy}
    the_suite = suite.load_suite(suite_name, config_dir, asked)
    settings = the_suite.settings
    stored = verdicts.read_baseline(baseline) if baseline is not None else None
    a_name = a_commit = None
    if not stored_mode:
        a_name, a_commit = versions.resolve_ref(root, against)
    here = fingerprint(settings["device"], settings["threads"])  # for the warning and files
    if stored is not None:
        baseline_mode.check_stored(stored, settings, here, err)
    expect = versions.expected_modules(root)
    for cell, why in the_suite.skipped:
        err.print(f"attnbench check: skipped {cell}: {why}", markup=False, highlight=False)
    again = _sampler(the_suite, root, a_name, a_commit, stored, seed, expect, quiet, err)
    got = again(None, 0)
    if write_baseline is not None:
        busy.again_while_busy(settings, got, lambda _: set(got.contended.get("B", {})), again, err)
        return baseline_mode.write_baseline(write_baseline, the_suite, got, here)
    a, a_name, a_compiled = _version_a(stored, baseline, got, a_name)
    results = _judged(the_suite, a, got, again, err)
    out.print(verdicts.table(results, str(a_name), "working tree", 0.99))
    meta = _meta(a_name, a_commit, suite_name, settings, here, started, got, a_compiled)
    samples = {"A": a, "B": got.versions["B"]}
    return _conclude(results, meta, samples, got.contended, json_path, settings["on_busy"])


def _check_flags(
    against: str | None, baseline: Path | None, write_baseline: Path | None, json_path: Path
) -> None:
    """The flags alone, before anything else: one mode at most, and the file this check's
    results go to (``--write-baseline``'s, else ``--json``'s) writable, before the minutes
    of timing that make them."""
    if sum(x is not None for x in (against, baseline, write_baseline)) > 1:
        raise Misuse("--against, --baseline and --write-baseline exclude each other")
    written = ("--write-baseline", write_baseline) if write_baseline else ("--json", json_path)
    try:
        check_file(*written)
    except ValueError as e:
        raise Misuse(str(e)) from None


def _judged(
    the_suite: suite.Suite,
    a: dict[str, list[float]],
    got: sampling.Samples,
    again: Callable[[set[str], int], sampling.Samples],
    err: Console,
) -> list[verdicts.CellResult]:
    """Every cell's verdict, the busy ones timed again and judged on their new samples as
    ``check.busy_retries`` and ``check.busy_pause_s`` say (:mod:`attnbench.check.busy`)."""
    results = _judge(the_suite, a, got)

    def still_busy(cells: set[str]) -> set[str]:
        # none once a cell failed: exit 1 whatever the busy ones would say, no point waiting
        nonlocal results
        if cells:
            new = {r.cell: r for r in _judge(the_suite, a, got, cells)}
            results = [new.get(r.cell, r) for r in results]
        if any(r.verdict in verdicts.FAILING for r in results):
            return set()
        return {r.cell for r in results if r.verdict == "busy"}

    busy.again_while_busy(the_suite.settings, got, still_busy, again, err)
    return results


def _version_a(
    stored: dict[str, Any] | None, baseline: Path | None, got: sampling.Samples, a_name: str | None
) -> tuple[dict[str, list[float]], str | None, dict[str, Any]]:
    """Version A as the verdicts compare with it: (its samples, its name, its compile costs),
    a stored baseline's (``--baseline``) or the ref's, timed beside the working tree."""
    if stored is not None:
        return stored["samples"], f"baseline {baseline}", stored.get("compiled", {})
    return got.versions["A"], a_name, got.compiled.get("A", {})


def _meta(
    a_name: str | None,
    a_commit: str | None,
    suite_name: str,
    settings: dict[str, Any],
    here: dict[str, Any],
    started: float,
    got: sampling.Samples,
    a_compiled: dict[str, Any],
) -> dict[str, Any]:
    """What the result JSON says beside the samples and verdicts: which versions and suite
    were compared, the settings, this machine, the wall time, the retries and each version's
    compile costs. Information only: none of it is in a sample or a verdict."""
    return {
        "against": a_name,
        "against_commit": a_commit,
        "suite": suite_name,
        "settings": settings,
        "fingerprint": here,
        "wall_s": round(time.time() - started, 1),
        "retried": got.retried,  # samples taken again because the worker waited for a CPU
        # per version, per compiled cell: compile_s and graphs, before its first sample;
        # information only, in no sample and no verdict
        "compiled": {"A": a_compiled, "B": got.compiled.get("B", {})},
    }


def _root(cwd: Path, stored_mode: bool) -> Path:
    """The repository (any directory, when no git ref is timed), put on ``sys.path``: a
    user's own mechanisms ($ATTNBENCH_PLUGINS) live in their repo, importable here too."""
    root = versions.root_or_cwd(cwd) if stored_mode else versions.repo_root(cwd)
    sys.path.insert(0, str(root))
    return root


def _judge(
    the_suite: suite.Suite,
    a: dict[str, list[float]],
    got: sampling.Samples,
    cells: set[str] | None = None,
) -> list[verdicts.CellResult]:
    """Each cell's verdict (of ``cells`` only, if given: those timed again); misuse when no
    cell could be compared, as a pass would lie."""
    why_not = {**got.unavailable.get("A", {}), **got.unavailable.get("B", {})}
    results = verdicts.judge(_only(the_suite, cells), a, got.versions["B"], why_not, got.contended)
    failed = [r for r in results if r.verdict in verdicts.FAILING]
    if not failed and not any(r.stats or r.verdict == "busy" for r in results):
        raise Misuse(
            "nothing to compare: no cell ran in both versions ("
            + "; ".join(f"{r.cell}: {r.verdict} {r.note}" for r in results)
            + ")"
        )
    return results


def _conclude(
    results: list[verdicts.CellResult],
    meta: dict[str, Any],
    samples: dict,
    contended: dict,
    json_path: Path,
    on_busy: str = "fail",
) -> int:
    """Every sample and verdict to ``json_path``, one summary line; 1 if a cell failed,
    else, if a cell could not be judged on a contended CPU (neither a pass nor a
    regression), :data:`BUSY` or, with ``on_busy="pass"``, 0 with the no-verdict line
    printed all the same; else 0."""
    verdicts.write_json(json_path, verdicts.result_json(results, meta, samples, contended))
    failed = [r for r in results if r.verdict in verdicts.FAILING]
    busy_cells = [r for r in results if r.verdict == "busy"]
    counts = {v: sum(r.verdict == v for r in results) for v in verdicts.VERDICTS}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if failed:
        verdict = "FAILED: " + ", ".join(f"{r.cell} {r.verdict}" for r in failed)
    elif busy_cells:
        verdict = (
            f"no verdict: machine busy ({len(busy_cells)} cells timed on a contended CPU); run it "
            "again on a quiet machine"
        )
        if on_busy == "pass":
            verdict += " (exit 0: check.on_busy=pass)"
    else:
        verdict = "passed"
    print(f"attnbench check: {verdict} ({tally}; {meta['wall_s']:.0f} s; details in {json_path})")
    if failed:
        return 1
    return (0 if on_busy == "pass" else BUSY) if busy_cells else 0


def _only(the_suite: suite.Suite, cells: set[str] | None) -> suite.Suite:
    """The suite with ``cells`` only; None: every cell."""
    if cells is None:
        return the_suite
    return replace(the_suite, cells=[c for c in the_suite.cells if c.name in cells])


def _sampler(
    the_suite: suite.Suite,
    root: Path,
    a_name: str | None,
    a_commit: str | None,
    stored: dict | None,
    seed: int,
    expect: dict[str, str],
    quiet: bool,
    err: Console,
) -> Callable[[set[str] | None, int], sampling.Samples]:
    """What times the suite's cells under a progress bar: ``(None, 0)`` every cell, the
    check's samples; ``(cells, k)`` those again for the busy policy, a fresh interleaving
    (seed + k). The working tree alone (stored-baseline modes, with the baseline's forwards
    per sample), or ``a_commit`` in a temporary worktree interleaved with it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    def sample(cells: set[str] | None, attempt: int) -> sampling.Samples:
        some = _only(the_suite, cells)
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=quiet,
        ) as bar:
            task = bar.add_task("samples", total=None)

            def tick(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            if a_commit is None:
                return sampling.sample(
                    {"B": root},
                    some,
                    seed=seed + attempt,
                    expect=expect,
                    reps=stored["reps"] if stored else None,
                    progress=tick,
                )
            bar.update(task, description=f"A = {a_name}, B = working tree")
            with versions.worktree(root, a_commit) as tree:
                return sampling.sample(
                    {"A": tree, "B": root}, some, seed=seed + attempt, expect=expect, progress=tick
                )

    return sample
