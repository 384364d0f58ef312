"""``attnbench check`` from its options to its exit status, every step in order.

Everything that can be misuse — the repository, the suite and its settings, the ref, the
stored baseline — is checked before the first sample, so a mistake costs one line and exit
code 2, never the minutes of a check. The CLI (:func:`attnbench.commands.cmd_check`) only
parses flags and turns exceptions into exit codes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from attnbench.check import Misuse, sampling, suite, verdicts, versions
from attnbench.env import fingerprint

DEFAULT_JSON = Path("results/check/latest.json")
BUSY = 3  # exit status: no verdict, the machine was busy (neither a pass nor a regression)


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
    json_path: Path = DEFAULT_JSON,
    seed: int = 0,
    quiet: bool = False,
    out: Console | None = None,
    cwd: Path | None = None,
) -> int:
    """Run the gate: 1 if a cell regressed or broke, else 3 (:data:`BUSY`) if a cell ran on
    too contended a CPU to be judged, else 0 (or a baseline was written). Misuse raises
    :class:`Misuse`; the caller decides how to report it.

    Modes: ``against`` (a git ref, default the parent commit) times that ref and the working
    tree interleaved; ``baseline`` compares the working tree with stored samples;
    ``write_baseline`` stores the working tree's samples. ``threshold``, ``rounds`` and
    ``compile`` (None: the suite's) override the suite's ``check:`` settings; ``out`` gets
    the table, stderr the progress bar and warnings.
    """
    if sum(x is not None for x in (against, baseline, write_baseline)) > 1:
        raise Misuse("--against, --baseline and --write-baseline exclude each other")
    out = out or Console()
    err = Console(stderr=True)
    started = time.time()
    stored_mode = baseline is not None or write_baseline is not None
    root = _root(cwd or Path.cwd(), stored_mode)
    the_suite = suite.load_suite(
        suite_name, config_dir, {"threshold": threshold, "rounds": rounds, "compile": compile}
    )
    settings = the_suite.settings
    stored = verdicts.read_baseline(baseline) if baseline is not None else None
    a_name = a_commit = None
    if not stored_mode:
        a_name, a_commit = versions.resolve_ref(root, against)
    here = fingerprint(settings["device"], settings["threads"])  # for the warning and files
    if stored is not None:
        _check_stored(stored, settings, here, err)
    expect = versions.expected_modules(root)
    for cell, why in the_suite.skipped:
        err.print(f"attnbench check: skipped {cell}: {why}", markup=False, highlight=False)
    got = _sample(the_suite, root, a_name, a_commit, stored, seed, expect, quiet, err)

    if write_baseline is not None:
        return _write_baseline(write_baseline, the_suite, got, here)
    a, a_name, a_compiled = _version_a(stored, baseline, got, a_name)
    results = _judge(the_suite, a, got)
    out.print(verdicts.table(results, str(a_name), "working tree", 0.99))
    meta = _meta(a_name, a_commit, suite_name, settings, here, started, got, a_compiled)
    samples = {"A": a, "B": got.versions["B"]}
    return _conclude(results, meta, samples, got.contended, json_path)


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


def _check_stored(
    stored: dict[str, Any], settings: dict[str, Any], here: dict[str, Any], err: Console
) -> None:
    """A stored baseline timed with other settings is misuse; one from another machine, a
    warning per difference (its times may still be what the user wants)."""
    why = verdicts.settings_mismatch(stored["settings"], settings)
    if why:
        raise Misuse(f"--baseline: {why}; write it again with --write-baseline")
    for line in verdicts.fingerprint_mismatch(stored["fingerprint"], here):
        err.print(
            f"[yellow]attnbench check: warning: the baseline was recorded on "
            f"another machine or setup ({line}); its times may not compare[/]",
            markup=True,
            highlight=False,
        )


def _write_baseline(
    path: Path, the_suite: suite.Suite, got: sampling.Samples, here: dict[str, Any]
) -> int:
    """Store the working tree's samples; a cell that cannot run here is misuse, as a
    baseline missing it could never be compared with."""
    if got.unavailable.get("B"):
        raise Misuse(
            "--write-baseline: these cells cannot run here: "
            + "; ".join(f"{c}: {w}" for c, w in got.unavailable["B"].items())
        )
    if busy := got.contended.get("B"):
        print(
            f"attnbench check: machine busy: {sum(map(len, busy.values()))} samples of "
            f"{len(busy)} cells ran on a contended CPU, even taken again; no baseline written "
            "(write it on a quiet machine)"
        )
        return BUSY
    verdicts.write_baseline(
        path, the_suite, got.versions["B"], got.reps, here, got.compiled.get("B", {})
    )
    print(
        f"attnbench check: baseline of {len(got.versions['B'])} cells x "
        f"{the_suite.settings['rounds']} samples written to {path}"
    )
    return 0


def _judge(
    the_suite: suite.Suite, a: dict[str, list[float]], got: sampling.Samples
) -> list[verdicts.CellResult]:
    """Each cell's verdict; misuse when no cell could be compared, as a pass would lie."""
    why_not = {**got.unavailable.get("A", {}), **got.unavailable.get("B", {})}
    results = verdicts.judge(the_suite, a, got.versions["B"], why_not, got.contended)
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
) -> int:
    """Every sample and verdict to ``json_path``, one summary line; 1 if a cell failed,
    else :data:`BUSY` if a cell could not be judged on a contended CPU (neither a pass
    nor a regression), else 0."""
    verdicts.write_json(json_path, verdicts.result_json(results, meta, samples, contended))
    failed = [r for r in results if r.verdict in verdicts.FAILING]
    busy = [r for r in results if r.verdict == "busy"]
    counts = {v: sum(r.verdict == v for r in results) for v in verdicts.VERDICTS}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if failed:
        verdict = "FAILED: " + ", ".join(f"{r.cell} {r.verdict}" for r in failed)
    elif busy:
        verdict = (
            f"no verdict: machine busy ({len(busy)} cells timed on a contended CPU); run it "
            "again on a quiet machine"
        )
    else:
        verdict = "passed"
    print(f"attnbench check: {verdict} ({tally}; {meta['wall_s']:.0f} s; details in {json_path})")
    return 1 if failed else BUSY if busy else 0


def _sample(
    the_suite: suite.Suite,
    root: Path,
    a_name: str | None,
    a_commit: str | None,
    stored: dict | None,
    seed: int,
    expect: dict[str, str],
    quiet: bool,
    err: Console,
) -> sampling.Samples:
    """The samples under a progress bar: the working tree alone (stored-baseline modes,
    with the baseline's forwards per sample), or ``a_commit`` in a temporary worktree
    interleaved with it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

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
                the_suite,
                seed=seed,
                expect=expect,
                reps=stored["reps"] if stored else None,
                progress=tick,
            )
        bar.update(task, description=f"A = {a_name}, B = working tree")
        with versions.worktree(root, a_commit) as tree:
            return sampling.sample(
                {"A": tree, "B": root}, the_suite, seed=seed, expect=expect, progress=tick
            )
