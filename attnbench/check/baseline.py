"""The stored-baseline modes of ``attnbench check``: ``--write-baseline`` stores the working
tree's samples on a dedicated runner, ``--baseline`` compares with them later. Apart from
:mod:`attnbench.check.run` because what a stored baseline must agree on (the settings that
change what a sample is) and what it may differ in (the machine, with a warning) are rules
of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from attnbench.check import Misuse, busy, sampling, suite, verdicts


def check_stored(
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


def write_baseline(
    path: Path, the_suite: suite.Suite, got: sampling.Samples, here: dict[str, Any]
) -> int:
    """Store the working tree's samples; a cell that cannot run here is misuse, as a
    baseline missing it could never be compared with."""
    if got.unavailable.get("B"):
        raise Misuse(
            "--write-baseline: these cells cannot run here: "
            + "; ".join(f"{c}: {w}" for c, w in got.unavailable["B"].items())
        )
    if contended := got.contended.get("B"):
        print(
            f"attnbench check: machine busy: {sum(map(len, contended.values()))} samples of "
            f"{len(contended)} cells ran on a contended CPU, even taken again; no baseline written "
            "(write it on a quiet machine)"
        )
        return busy.BUSY
    verdicts.write_baseline(
        path, the_suite, got.versions["B"], got.reps, here, got.compiled.get("B", {})
    )
    print(
        f"attnbench check: baseline of {len(got.versions['B'])} cells x "
        f"{the_suite.settings['rounds']} samples written to {path}"
    )
    return 0
