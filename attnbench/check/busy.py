"""What the gate does on a busy machine (docs/gate.md, "A busy machine").

A cell whose samples ran on a contended CPU, even each taken again
(:mod:`attnbench.check.sampling`), is ``busy``: no verdict. The pause and the bounded
retries here give a neighbour's burst time to pass before the cell is timed again; what a
cell still busy after them means for the exit status is ``check.on_busy``'s to say, so that
CI on a shared runner can pass with the no-verdict line printed instead of failing a correct
change, while a regression judged on clean samples still fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from attnbench.check import sampling

BUSY = 3  # exit status: no verdict, the machine was busy (neither a pass nor a regression)


def again_while_busy(
    settings: dict[str, Any],
    got: sampling.Samples,
    still_busy: Callable[[set[str]], set[str]],
    sample_again: Callable[[set[str], int], sampling.Samples],
    err: Console,
) -> None:
    """Time the busy cells again, into ``got``: after a pause of ``check.busy_pause_s``, up
    to ``check.busy_retries`` times, while ``still_busy`` (given the cells just timed again,
    to judge) names any. A busy cell's samples are replaced as a whole, in both versions,
    so that A and B stay interleaved samples of one stretch of time. The pause lets a
    neighbour's burst (another CI job, a build) pass; a machine that stays loaded gets the
    no-verdict line after a bounded wait."""
    cells = still_busy(set())
    for attempt in range(1, settings["busy_retries"] + 1):
        if not cells:
            return
        err.print(
            f"attnbench check: {len(cells)} cells timed on a contended CPU; timing them again "
            f"in {settings['busy_pause_s']:g} s (try {attempt} of {settings['busy_retries']})",
            markup=False,
            highlight=False,
        )
        time.sleep(settings["busy_pause_s"])
        replace_cells(got, sample_again(cells, attempt), cells)
        cells = still_busy(cells)


def replace_cells(got: sampling.Samples, again: sampling.Samples, cells: set[str]) -> None:
    """``cells``' samples, forwards per sample and contended rounds in ``got``, replaced by
    those of ``again`` (their new timing); everything else in ``got`` as it was."""
    for v, timed in again.versions.items():
        for name in cells & timed.keys():
            got.versions.setdefault(v, {})[name] = timed[name]
    for v in set(got.contended) | set(again.contended):
        kept = {c: r for c, r in got.contended.get(v, {}).items() if c not in cells}
        kept.update({c: r for c, r in again.contended.get(v, {}).items() if c in cells})
        got.contended[v] = kept
    got.reps.update({c: r for c, r in again.reps.items() if c in cells})
    got.retried += again.retried
