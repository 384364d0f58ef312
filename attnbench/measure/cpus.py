"""How many threads a CPU timing uses: as many as the CPUs this process was given.

torch starts as many intra-op threads as the machine has cores, whatever the process was
allotted: under SLURM with one CPU per task it still ran two threads on a 2-core node, and
per-cell times doubled or worse from the oversubscription. A benchmark times on exactly the
CPUs it was given, and says how many: the CPU affinity the process runs under (which a
SLURM task, ``taskset`` or a container's cpuset sets), narrowed by ``SLURM_CPUS_PER_TASK``
where a scheduler says less than the affinity shows (a node without SLURM's affinity
plugin), unless ``timing.threads`` asks for fewer.
"""

from __future__ import annotations

import os

from attnbench.validators import check_int

SLURM_CPUS = "SLURM_CPUS_PER_TASK"


def allocated() -> tuple[int, str]:
    """(CPUs this process may run on, where that number comes from)."""
    try:
        cpus, source = len(os.sched_getaffinity(0)), "its CPU affinity"
    except AttributeError:  # no sched_getaffinity (macOS): every CPU
        cpus, source = os.cpu_count() or 1, "the CPU count"
    slurm = os.environ.get(SLURM_CPUS, "")
    if slurm.isdigit() and 0 < int(slurm) < cpus:
        cpus, source = int(slurm), SLURM_CPUS
    return cpus, source


def resolve(requested: int | None) -> int:
    """The thread count for ``timing.threads`` (None: follow the allocation). More threads
    than CPUs would time the threads' contention with each other, not the mechanism: one
    line naming the key, what was asked and what is allowed."""
    cpus, source = allocated()
    if requested is None:
        return cpus
    check_int("timing.threads", requested)
    if requested > cpus:
        raise ValueError(
            f"timing.threads: {requested} threads asked, but this process may run on {cpus} "
            f"CPUs ({source}); allowed: 1 to {cpus}, or null to use them all"
        )
    return requested


def use(requested: int | None) -> int:
    """Set torch's intra-op threads for ``timing.threads`` (see :func:`resolve`); returns
    the count now in use."""
    import torch

    threads = resolve(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
