"""What a Hydra launcher means for a sweep's cells on this machine's GPU.

joblib runs cells in parallel by default (``n_jobs=-1``: one per CPU), and submitit_local
starts every job of the sweep at once, each a process of this machine (its local executor has
no limit like SLURM's ``array_parallelism``). Cells that share one GPU at once time each
other's kernels and measure each other's memory (one's allocations are the other's
out-of-memory, under a cap that assumes the GPU is its own), so their figures are of neither.
A sweep with two or more cells on the GPU under either is therefore refused unless it runs
them one at a time (joblib's ``hydra.launcher.n_jobs=1``), rather than serialised behind the
user's back: the user asked for parallelism, and one line says why not.
"""

from __future__ import annotations

from typing import Any


def is_joblib(target: str) -> bool:
    """Whether the launcher (its ``_target_``) is joblib's, whose loky workers run cells
    side by side and are reused from cell to cell."""
    return "joblib" in target.lower()


def is_submitit_local(target: str) -> bool:
    """Whether the launcher (its ``_target_``) is submitit_local's, which starts every job at
    once on this machine."""
    return "submitit" in target and "Local" in target


def check_one_gpu(launcher: Any, gpu_cells: int) -> None:
    """Refuse, with one ``ValueError`` line, a launcher (its composed config: ``_target_``,
    ``n_jobs``) that would run two of the sweep's ``gpu_cells`` cells on the GPU at once."""
    target = str(launcher.get("_target_", ""))
    if gpu_cells >= 2 and is_submitit_local(target):
        raise ValueError(
            f"hydra/launcher: submitit_local starts all {gpu_cells} cells on this machine's GPU "
            "at once, each timing and measuring the others; allowed: the default launcher, "
            "joblib with hydra.launcher.n_jobs=1, or submitit_slurm"
        )
    if gpu_cells < 2 or not is_joblib(target):
        return
    n_jobs = launcher.get("n_jobs")
    if n_jobs == 1:
        return
    at_once = "one per CPU" if n_jobs == -1 else f"n_jobs={n_jobs}"
    raise ValueError(
        f"hydra.launcher.n_jobs: joblib would run {gpu_cells} cells on this machine's GPU at "
        f"once ({at_once}), each timing and measuring the others; allowed: 1 "
        "(hydra.launcher.n_jobs=1, one fresh process per cell in turn)"
    )
