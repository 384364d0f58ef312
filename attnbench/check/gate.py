"""``attnbench check``: did this change make any attention slower?

Two versions of the code — the working tree (B) and a git ref checked out in a temporary
worktree (A), or B against samples stored earlier on the same machine — are timed on the
regression suite (``conf/sweep/regression.yaml``). Each version lives in its own worker
process (:mod:`attnbench.check.worker`) importing its own tree, and the samples are taken
interleaved, A B A B ..., in a shuffled order every round, so that a machine that slows
down half-way (another job, a clock change) slows both versions alike instead of faking a
regression. A cell fails only when its slowdown is both significant (one-sided Mann–Whitney
U, p < alpha) and above its threshold (:func:`attnbench.check.stats.compare`); one failed
cell fails the check.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnbench.check.stats import Verdict, compare, min_samples

SCHEMA = 1  # of the JSON this module writes (results and stored baselines)
FAILING = ("regressed", "broken")  # verdicts that fail the check
WORKER = Path(__file__).with_name("worker.py")


class Misuse(ValueError):
    """Bad input from the user: one line, exit code 2."""


@dataclass(frozen=True)
class SuiteCell:
    """One timed cell: a mechanism with its parameters at (n, batch), as one layer."""

    attention: str
    params: dict[str, Any]
    n: int
    batch: int
    d_model: int
    n_heads: int
    threshold: float

    @property
    def name(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.attention}({inner}) n={self.n} b={self.batch}"


@dataclass(frozen=True)
class Suite:
    cells: list[SuiteCell]
    skipped: list[tuple[str, str]]  # (cell, why it cannot run here)
    settings: dict[str, Any]


def load_suite(
    name: str = "regression", config_dir: str | None = None, overrides: dict[str, Any] | None = None
) -> Suite:
    """The suite's cells, expanded and validated by the same code as ``attnbench run``'s
    sweeps; mechanisms that cannot run here (xformers without CUDA) are listed as skipped."""
    from attnbench import sweep
    from attnbench.registry import info

    try:
        jobs, _ = sweep.expand_jobs([f"+sweep={name}"], config_dir)
    except ValueError as e:
        raise Misuse(f"--suite: {e}") from None
    if not jobs or "check" not in jobs[0]:
        raise Misuse(
            f"--suite: sweep {name!r} has no 'check:' settings; see conf/sweep/regression.yaml"
        )
    from omegaconf import OmegaConf

    settings = OmegaConf.to_container(jobs[0].check, resolve=True)
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    _check_settings(settings)
    cells, skipped = [], []
    for cfg in jobs:
        try:
            cell = sweep.cell_from_cfg(cfg, in_sweep=True)
        except sweep.NotACell:
            continue
        except ValueError as e:
            raise Misuse(f"--suite {name}: {e}") from None
        if not isinstance(cell.batch, int):
            raise Misuse(
                f"--suite {name}: batch must be a number in a check suite, got {cell.batch!r}"
            )
        params = cell.mechanism_params()
        sc = SuiteCell(
            cell.attention,
            params,
            cell.n,
            cell.batch,
            cell.d_model,
            cell.n_heads,
            _threshold(settings, cell.attention, cell.n, params),
        )
        if any(c.name == sc.name for c in cells):
            continue  # e.g. vanilla in a suite that sweeps k: one cell, not several
        why = info(cell.attention).unavailable
        if why is None and settings["device"] not in info(cell.attention).devices:
            why = f"runs on {', '.join(info(cell.attention).devices)}, not {settings['device']}"
        if why is not None:
            skipped.append((sc.name, why))
        else:
            cells.append(sc)
    if not cells:
        why = "; ".join(f"{c}: {w}" for c, w in skipped) or "it has no cells"
        raise Misuse(f"--suite {name}: empty suite, no cell can run here ({why})")
    return Suite(cells, skipped, settings)


def _check_settings(s: dict[str, Any]) -> None:
    def need(key: str, ok: Callable[[Any], bool], allowed: str) -> None:
        if key not in s or not ok(s[key]) or isinstance(s[key], bool):
            raise Misuse(f"check.{key}: must be {allowed}, got {s.get(key)!r}")

    need("rounds", lambda v: isinstance(v, int) and v >= 2, "an integer >= 2")
    need("sample_s", lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0")
    need("warmup", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    need("threads", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
    need("threshold", lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0")
    need("alpha", lambda v: isinstance(v, float) and 0 < v < 1, "a number in (0, 1)")
    if s["rounds"] < min_samples(s["alpha"]):  # the rank test could never fire: a blind gate
        raise Misuse(
            f"check.rounds: must be at least {min_samples(s['alpha'])} for "
            f"alpha={s['alpha']:g}, got {s['rounds']}"
        )
    paths = s.get("pythonpath")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise Misuse(f"check.pythonpath: must be a list of paths, got {paths!r}")
    for entry in s.get("thresholds") or []:
        keys = set(entry) if isinstance(entry, dict) else set()
        t = entry.get("threshold") if isinstance(entry, dict) else None
        if (
            "threshold" not in keys
            or isinstance(t, bool)
            or not isinstance(t, (int, float))
            or t <= 0
        ):
            raise Misuse(
                f"check.thresholds: each entry needs a threshold > 0 (a fraction, "
                f"0.2 = 20 %), got {entry!r}"
            )
    if s.get("device") not in ("cpu", "cuda"):
        raise Misuse(f"check.device: must be cpu or cuda, got {s.get('device')!r}")
    if s["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise Misuse("check.device: cuda asked for, but torch sees no CUDA device here")


def _threshold(settings: dict[str, Any], attention: str, n: int, params: dict) -> float:
    """The last matching entry of ``check.thresholds`` wins; else ``check.threshold``."""
    chosen = float(settings["threshold"])
    for entry in settings.get("thresholds") or []:
        sel = {k: v for k, v in entry.items() if k != "threshold"}
        if all({"attention": attention, "n": n}.get(k, params.get(k)) == v for k, v in sel.items()):
            chosen = float(entry["threshold"])
    return chosen


# --- the two versions --------------------------------------------------------------------


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise Misuse(
            done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"git {' '.join(args)} failed"
        )
    return done.stdout.strip()


def repo_root(cwd: Path) -> Path:
    try:
        return Path(git("rev-parse", "--show-toplevel", cwd=cwd))
    except FileNotFoundError:
        raise Misuse("--against: git is not installed here") from None
    except Misuse as e:
        raise Misuse(
            f"--against: {cwd} is not usable as a git repository ({e}); use "
            "--baseline FILE to compare with stored samples instead"
        ) from None


def resolve_ref(root: Path, ref: str | None) -> tuple[str, str]:
    """(the name asked for, its commit); the default is the parent commit, ``HEAD~1``."""
    name = ref or "HEAD~1"
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=root)
    except Misuse:
        if ref is None:
            shallow = git("rev-parse", "--is-shallow-repository", cwd=root) == "true"
            raise Misuse(
                "--against: HEAD has no parent commit"
                + (
                    " in this shallow clone (fetch more history: git fetch --deepen=1, or "
                    "fetch-depth: 0 in actions/checkout)"
                    if shallow
                    else "; name a ref to compare with"
                )
            ) from None
        raise Misuse(f"--against: unknown git ref {name!r}") from None
    return name, commit


@contextmanager
def worktree(root: Path, commit: str) -> Iterator[Path]:
    """The commit checked out in a temporary worktree, removed afterwards whatever happens."""
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-check-"))
    path = tmp / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(path), commit, cwd=root)
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=root, capture_output=True
        )
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)


def expected_modules(root: Path) -> dict[str, str]:
    """Where, relative to the repository root, the driver found attnbench and the user's
    plugins: each worker must import its own copies from the same place in its own tree.
    Modules from outside the repository (an installed attnbench) are not version-specific."""
    import importlib

    names = [
        "attnbench",
        *filter(None, (m.strip() for m in os.environ.get("ATTNBENCH_PLUGINS", "").split(","))),
    ]
    out = {}
    for name in names:
        try:
            path = Path(importlib.import_module(name).__file__ or "").resolve()
        except ImportError as e:
            raise Misuse(f"ATTNBENCH_PLUGINS: cannot import {name!r}: {e}") from None
        if path.is_relative_to(root.resolve()):
            out[name] = str(path.relative_to(root.resolve()))
    return out


# glibc serves big blocks (vanilla's (12, 512, 512) scores are 12.6 MB) by mmap and gives
# freed memory back by trimming, at thresholds that adapt to each process's history, so one
# process faults its pages in on every forward and the next does not: the same code at
# n=512 ran 46-74 ms in six fresh processes, 46-49 ms with these fixed (measured, README).
# A difference between two processes would read as a difference between two versions.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


class Worker:
    """One version's worker process: importing ``tree``'s code, timing on request."""

    def __init__(self, tree: Path, settings: dict[str, Any], expect: dict[str, str]) -> None:
        paths = [str((tree / p).resolve()) for p in settings["pythonpath"]]
        env = {
            **MALLOC,
            **os.environ,
            "ATTNBENCH_CHECK_EXPECT": json.dumps(expect),
            "PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        # run by path from the version's tree as cwd: the driver's package is not imported
        code = (
            "import runpy, sys; sys.argv = ['worker', sys.argv[1]]; "
            f"runpy.run_path({str(WORKER)!r}, run_name='__main__')"
        )
        self.tree = tree
        # stderr to a file, not a pipe: a chatty version cannot fill a pipe and hang us both
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(tree)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        hello = self._read()
        if "error" in hello:
            self.close()
            raise Misuse(f"the version in {tree}: {hello['error']}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            self.log.seek(0)
            err = self.log.read().strip()
            raise RuntimeError(
                f"the worker for {self.tree} died: {err.splitlines()[-1] if err else 'no output'}"
            )
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"the worker for {self.tree} answered {line[:80]!r}") from None

    def ask(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # end of input: the worker's loop ends, it exits
        except OSError:  # it is already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# --- sampling -----------------------------------------------------------------------------


@dataclass
class Samples:
    """Per version, per cell: seconds per forward, one value per round."""

    versions: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    reps: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, dict[str, str]] = field(default_factory=dict)


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
    and used for both, so both versions' samples average the same amount of work.
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
        first = next(iter(trees))
        timed = []
        for i, c in enumerate(suite.cells):
            bad = {v: b[i]["reason"] for v, b in built.items() if not b[i]["ok"]}
            for v, why in bad.items():
                out.unavailable.setdefault(v, {})[c.name] = why
            ok = [b[i]["once_s"] for b in built.values() if b[i]["ok"]]
            if ok:
                once = built[first][i]["once_s"] if built[first][i]["ok"] else ok[0]
                out.reps[c.name] = (reps or {}).get(c.name) or max(
                    1, round(s["sample_s"] / max(once, 1e-6))
                )  # a baseline's count, if any
                timed.append(i)
        for v in trees:
            out.versions[v] = {suite.cells[i].name: [] for i in timed if built[v][i]["ok"]}
        rng = random.Random(seed)
        total = s["rounds"] * len(timed)
        done = 0
        for _ in range(s["rounds"]):
            order = list(timed)
            rng.shuffle(order)
            for i in order:
                name = suite.cells[i].name
                versions = [v for v in trees if built[v][i]["ok"]]
                rng.shuffle(versions)  # A B or B A: neither always goes first
                for v in versions:
                    out.versions[v][name].append(
                        workers[v].ask(op="time", cell=i, reps=out.reps[name])["s"]
                    )
                done += 1
                if progress:
                    progress(done, total)
    finally:
        for w in workers.values():
            w.close()
    return out


# --- verdicts, baseline files, output ------------------------------------------------------


@dataclass(frozen=True)
class CellResult:
    cell: str
    threshold: float
    verdict: str  # regressed | broken (fail) | improved | same | new | gone | skipped
    stats: Verdict | None = None
    note: str = ""


def judge(
    suite: Suite,
    a: dict[str, list[float]],
    b: dict[str, list[float]],
    why_not: dict[str, str] | None = None,
) -> list[CellResult]:
    """A verdict for every cell of the suite; a cell only one version has is not a failure."""
    s = suite.settings
    results = []
    for c in suite.cells:
        if c.name in a and c.name in b:
            v = compare(a[c.name], b[c.name], threshold=c.threshold, alpha=s["alpha"])
            results.append(CellResult(c.name, c.threshold, v.verdict, v))
        elif c.name in b:
            results.append(
                CellResult(
                    c.name, c.threshold, "new", note=(why_not or {}).get(c.name, "not in version A")
                )
            )
        elif c.name in a:  # A ran it and B cannot: the change broke it, a failure
            results.append(
                CellResult(
                    c.name,
                    c.threshold,
                    "broken",
                    note=(why_not or {}).get(c.name, "B cannot run it"),
                )
            )
        else:
            results.append(
                CellResult(
                    c.name,
                    c.threshold,
                    "gone",
                    note=(why_not or {}).get(c.name, "neither version ran it"),
                )
            )
    results += [
        CellResult(name, s["threshold"], "skipped", note=why) for name, why in suite.skipped
    ]
    return results


def fingerprint(settings: dict[str, Any]) -> dict[str, Any]:
    """What makes timings from two runs comparable: the machine and the software under it."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if settings["device"] == "cuda" else None
    return {
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "gpu": gpu,
        "system": platform.system(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": settings["threads"],
    }


def write_baseline(
    path: Path, suite: Suite, samples: dict[str, list[float]], reps: dict[str, int]
) -> None:
    data = {
        "schema": SCHEMA,
        "kind": "attnbench-check-baseline",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint(suite.settings),
        "settings": suite.settings,
        "reps": reps,
        "samples": samples,
    }
    write_json(path, data)


def read_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise Misuse(
            f"--baseline: no such file {path} (write one with --write-baseline {path})"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise Misuse(f"--baseline: {path} is not a JSON file: {e}") from None
    if not isinstance(data, dict) or data.get("kind") != "attnbench-check-baseline":
        raise Misuse(
            f"--baseline: {path} is not a baseline written by attnbench check --write-baseline"
        )
    if data.get("schema") != SCHEMA:
        raise Misuse(
            f"--baseline: {path} has schema {data.get('schema')!r}; this attnbench "
            f"reads schema {SCHEMA}: write it again with --write-baseline"
        )
    return data


def settings_mismatch(stored: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Settings that change what a sample is: a baseline taken otherwise cannot compare."""
    for key in ("device", "sample_s", "warmup", "threads"):
        if stored.get(key) != here.get(key):
            return f"check.{key} is {here.get(key)!r} here but {stored.get(key)!r} in the baseline"
    return None


def fingerprint_mismatch(stored: dict[str, Any], here: dict[str, Any]) -> list[str]:
    return [
        f"{k}: {stored.get(k)!r} there, {here.get(k)!r} here"
        for k in here
        if stored.get(k) != here.get(k)
    ]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a crash must not leave a truncated baseline for the next run."""
    from attnbench.store import replace_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(data, indent=1) + "\n")


def result_json(
    results: list[CellResult], meta: dict[str, Any], samples: dict[str, dict[str, list[float]]]
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kind": "attnbench-check-result",
        **meta,
        "failed": any(r.verdict in FAILING for r in results),
        "cells": [
            {
                "cell": r.cell,
                "threshold": r.threshold,
                "verdict": r.verdict,
                "note": r.note,
                **(asdict(r.stats) if r.stats else {}),
            }
            for r in results
        ],
        "samples": samples,
    }


def table(results: list[CellResult], a_name: str, b_name: str, confidence: float) -> Any:
    from rich.table import Table

    t = Table(
        "cell",
        f"A: {a_name} (ms)",
        f"B: {b_name} (ms)",
        "B/A",
        f"{confidence:.0%} interval",
        "p",
        "limit",
        "verdict",
        title="attnbench check: time per forward, median of the samples",
    )
    from rich.markup import escape

    colour = {"regressed": "bold red", "broken": "bold red", "improved": "green"}
    for r in results:
        v = r.stats
        if v is None:
            t.add_row(
                escape(r.cell),
                "-",
                "-",
                "-",
                "-",
                "-",
                f"+{r.threshold:.0%}",
                f"[{colour.get(r.verdict, 'default')}]{escape(r.verdict)}[/]: {escape(r.note)}",
            )
            continue
        t.add_row(
            escape(r.cell),
            f"{v.median_a * 1e3:.2f}",
            f"{v.median_b * 1e3:.2f}",
            f"{v.ratio:.3f}",
            f"{v.ci_low:.3f}-{v.ci_high:.3f}",
            f"{v.p:.2g}",
            f"+{r.threshold:.0%}",
            f"[{colour.get(r.verdict, '')}]{r.verdict}[/]" if r.verdict in colour else r.verdict,
        )
    return t
