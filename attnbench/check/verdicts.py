"""A verdict per cell, and everything the gate writes: baseline files, the result JSON, the
table. The statistics themselves are :mod:`attnbench.check.stats`; this module applies them
to a suite and decides what a cell that only one version could run means.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnbench.check import Misuse
from attnbench.check.stats import Verdict, compare, min_samples
from attnbench.check.suite import Suite

# of the JSON this package writes (results and stored baselines). 2: cells are named by
# attnbench.cell.label (``mine n=64 b=2``; schema 1 said ``mine() n=64 b=2``), and stored
# samples are keyed by that name, so a schema-1 baseline must be written again.
SCHEMA = 2
FAILING = ("regressed", "broken")  # verdicts that fail the check
VERDICTS = ("regressed", "broken", "busy", "improved", "same", "new", "gone", "skipped")
# a cell is judged on its uncontended samples only, and only while contended ones are at
# most this share of either version's and enough of each are left for the rank test to reach
# alpha (stats.min_samples)
BUSY_SHARE = 0.25


@dataclass(frozen=True)
class CellResult:
    """One line of the table: a cell's verdict, its statistics when both versions ran it,
    and otherwise why not."""

    cell: str
    threshold: float
    verdict: str  # one of VERDICTS: regressed | broken (fail) | improved | same | new | ...
    stats: Verdict | None = None
    note: str = ""


def judge(
    suite: Suite,
    a: dict[str, list[float]],
    b: dict[str, list[float]],
    why_not: dict[str, str] | None = None,
    contended: dict[str, dict[str, list[int]]] | None = None,
) -> list[CellResult]:
    """A verdict for every cell of the suite. A cell only B has is ``new`` and one neither
    has is ``gone`` — not failures, a suite may grow — but one that A ran and B cannot is
    ``broken``: the change broke it, which fails the check as a regression does. A cell
    whose samples ran on a contended CPU (``contended``: per version "A", "B", the rounds
    still contended after their retries) is judged without them, or, where they are too
    many, is ``busy``: no verdict, neither a pass nor a regression."""
    s = suite.settings
    why_not = why_not or {}
    contended = contended or {}
    results = []
    for c in suite.cells:
        if c.name in a and c.name in b:
            xs, ys, busy = _uncontended(
                a[c.name],
                b[c.name],
                *(contended.get(v, {}).get(c.name, []) for v in "AB"),
                least=min_samples(s["alpha"]),
            )
            if busy:
                results.append(CellResult(c.name, c.threshold, "busy", note=busy))
                continue
            v = compare(xs, ys, threshold=c.threshold, alpha=s["alpha"])
            results.append(CellResult(c.name, c.threshold, v.verdict, v))
        elif c.name in b:
            note = why_not.get(c.name, "not in version A")
            results.append(CellResult(c.name, c.threshold, "new", note=note))
        elif c.name in a:
            note = why_not.get(c.name, "B cannot run it")
            results.append(CellResult(c.name, c.threshold, "broken", note=note))
        else:
            note = why_not.get(c.name, "neither version ran it")
            results.append(CellResult(c.name, c.threshold, "gone", note=note))
    results += [
        CellResult(name, s["threshold"], "skipped", note=why) for name, why in suite.skipped
    ]
    return results


def _uncontended(
    a: list[float], b: list[float], busy_a: list[int], busy_b: list[int], least: int
) -> tuple[list[float], list[float], str]:
    """Both versions' samples without their contended rounds, and why the cell is busy
    ("" where it can be judged: contended rounds at most :data:`BUSY_SHARE` of either
    version's, and ``least`` samples of each left)."""
    if not busy_a and not busy_b:
        return a, b, ""
    skip_a, skip_b = set(busy_a), set(busy_b)
    xs = [x for i, x in enumerate(a) if i not in skip_a]
    ys = [y for i, y in enumerate(b) if i not in skip_b]
    too_many = len(busy_a) > BUSY_SHARE * len(a) or len(busy_b) > BUSY_SHARE * len(b)
    if too_many or min(len(xs), len(ys)) < least:
        left = "" if too_many else f", leaving fewer than the {least} the test needs"
        why = (
            f"machine busy: {len(busy_a)} of A's {len(a)} and {len(busy_b)} of B's {len(b)} "
            f"samples ran on a contended CPU, even taken again{left}"
        )
        return xs, ys, why
    return xs, ys, ""


def write_baseline(
    path: Path,
    suite: Suite,
    samples: dict[str, list[float]],
    reps: dict[str, int],
    fingerprint: dict[str, Any],
    compiled: dict[str, dict[str, float]] | None = None,
) -> None:
    """Store the working tree's samples, with the forwards per sample (a later comparison
    must average the same work), the machine's fingerprint (to warn when it differs) and,
    as information, what compiling each compiled cell cost."""
    data = {
        "schema": SCHEMA,
        "kind": "attnbench-check-baseline",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint,
        "settings": suite.settings,
        "reps": reps,
        "samples": samples,
        "compiled": compiled or {},
    }
    write_json(path, data)


def read_baseline(path: Path) -> dict[str, Any]:
    """A stored baseline, or a :class:`Misuse` saying why it cannot be used."""
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
    """What differs between the baseline's machine and this one, one line per key: a
    warning, not an error, as a new torch may be the very change being checked."""
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
    results: list[CellResult],
    meta: dict[str, Any],
    samples: dict[str, dict[str, list[float]]],
    contended: dict[str, dict[str, list[int]]] | None = None,
) -> dict[str, Any]:
    """The result file: every verdict with its statistics and every sample, with the rounds
    whose sample ran on a contended CPU, so that a verdict can be re-derived
    (scripts/gate_power.py replays them)."""
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
        "contended": contended or {},
    }


def table(results: list[CellResult], a_name: str, b_name: str, confidence: float) -> Any:
    """The rich table the check prints: medians in ms, the ratio and its interval."""
    from rich.markup import escape
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
        title="attnbench check: time per forward (backward, decode step), median of the samples",
    )
    colour = {"regressed": "bold red", "broken": "bold red", "improved": "green", "busy": "yellow"}
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
