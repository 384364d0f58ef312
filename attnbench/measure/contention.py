"""Did the timed process have its CPUs? The run-queue delay of every sample, and the verdict.

A CPU timing taken while another process held the CPU can be off by orders of magnitude
(samples of 1.1 s, 0.6 s and 0.5 ms for one cell on a loaded 2-core machine) and look like
any other figure. Linux counts, for each thread, the time it ran and the time it spent
runnable but waiting for a CPU (``/proc/<pid>/task/<tid>/schedstat``, the scheduler's
``sched_info``). Over a sample, the process's waiting time as a share of its running plus
waiting time — the **delay share** — is contention itself: about 0 for a process that had
its CPUs, 0.5 for one thread sharing its only CPU with a busy loop. Unlike CPU time over
wall time × threads (also recorded: :class:`Share`), it does not depend on how much of the
timed code runs in parallel, so one threshold serves every mechanism, thread count and
batch. A sample whose delay share is over :data:`BUSY_DELAY` is *contended*.

The same reading serves the sweep's timings (this process) and the regression gate's
(its worker processes, read from outside by pid). Where there is no schedstat (not Linux,
or a kernel without ``sched_info``), the delay is unknown, never 0: then only the spread of
the samples can say the machine was busy (:data:`WILD_SPREAD`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# A sample is contended when its threads waited for a CPU more than this share of the time
# they were runnable: a single-threaded step then took >= 1/(1 - 0.1) = 1.11x its own time,
# about the gate's threshold. Where it fires: docs/measurement.md, "Contention and threads".
BUSY_DELAY = 0.10
# A timing whose median is more than this many times its fastest sample is not one figure,
# whatever the scheduler says: noise on a quiet machine moves a cell by tens of percent, not
# 10x (docs/measurement.md, "Quieter timings"). The median against the fastest, not the
# slowest against the fastest: one slow outlier among a thousand samples is not a busy machine.
WILD_SPREAD = 10.0
# the keys of a row's ``contention`` (Share.as_dict, and gpu_others_bytes on CUDA)
GPU_OTHERS = "gpu_others_bytes"
FIELDS = ("delay", "cpu_share", "contended", "dropped_s", "load", "busy", "why", GPU_OTHERS)


# how a CPU row's reason begins where the load, not the cell's cost, decided its timing
# (attnbench.runner.timed.budget_verdict): a report flags the ratio of the one, a sweep's last line
# counts the other
TIMED_UNDER_LOAD = "timed under load"
SKIPPED_FOR_LOAD = "time skipped for load"


def is_busy(stored: dict | None) -> bool:
    """Whether a stored ``contention`` says the time is no figure (a row, as a dict)."""
    return bool((stored or {}).get("busy"))


class Sched:
    """The scheduler's counts for one process (``pid``; None: this one), summed over its
    threads. Each thread's schedstat file is opened once and read again with ``pread``:
    reading them anew by path cost ~0.19 ms per window, longer than the smallest samples
    timed; a window now costs ~0.03 ms. Close it when done (a context manager)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self.tasks = f"/proc/{pid or 'self'}/task"
        self._fds: dict[str, int] = {}

    def read(self) -> tuple[int, int] | None:
        """(ran, waited) nanoseconds over the threads alive now, or None where the kernel
        does not say. A thread that ended is missed, so only differences over a short
        window mean anything."""
        try:
            tids = os.listdir(self.tasks)
        except OSError:
            return None
        ran = waited = 0
        found = False
        for tid in tids:
            try:
                if tid not in self._fds:
                    self._fds[tid] = os.open(f"{self.tasks}/{tid}/schedstat", os.O_RDONLY)
                fields = os.pread(self._fds[tid], 128, 0).split()
                ran, waited, found = ran + int(fields[0]), waited + int(fields[1]), True
            except (OSError, IndexError, ValueError):  # ended while we listed them
                if (fd := self._fds.pop(tid, None)) is not None:
                    os.close(fd)
        return (ran, waited) if found else None

    def cpu_s(self) -> float:
        """The process's CPU time (user + system) in seconds; NaN where it cannot be read."""
        if self.pid is None:
            return time.process_time()
        try:  # utime + stime, in clock ticks (fields 14 and 15 of /proc/PID/stat)
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Sched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Reading:
    """What one sample's window looked like from the scheduler: the process's run-queue
    delay (None: unknown) and its CPU time against the wall time of the window."""

    wall_s: float
    cpu_s: float
    delay: float | None  # waited / (ran + waited) over the window
    # the nanoseconds the scheduler credited over the window (None: unknown), which a
    # timing's verdict sums over its repeats (:func:`aggregate_delay`)
    ran_ns: int | None = None
    waited_ns: int | None = None

    @property
    def contended(self) -> bool:
        return self.delay is not None and self.delay > BUSY_DELAY


class Window:
    """Opened before a sample and closed after it, outside the timed bracket, so that
    reading the counts costs the sample nothing."""

    def __init__(self, sched: Sched) -> None:
        self.sched = sched
        self._start = self._read()

    def _read(self) -> tuple[float, float, tuple[int, int] | None]:
        return time.perf_counter(), self.sched.cpu_s(), self.sched.read()

    def close(self) -> Reading:
        (w0, c0, s0), (w1, c1, s1) = self._start, self._read()
        if s0 is None or s1 is None or s1[0] < s0[0] or s1[1] < s0[1]:
            return Reading(w1 - w0, c1 - c0, None)
        ran, waited = s1[0] - s0[0], s1[1] - s0[1]
        delay = waited / (ran + waited) if ran + waited > 0 else None
        return Reading(w1 - w0, c1 - c0, delay, ran, waited)


def aggregate_delay(readings: Sequence[Reading]) -> float | None:
    """The delay share over every reading together: what the scheduler credited, summed,
    so that its lumps (time credited at ticks and context switches, not as it passes) fall
    inside the sum whichever window they landed in. None where nothing was credited."""
    ran = sum(r.ran_ns or 0 for r in readings)
    waited = sum(r.waited_ns or 0 for r in readings)
    return waited / (ran + waited) if ran + waited > 0 else None


def load() -> float | None:
    """The machine's 1-minute load average (runnable and waiting processes), where the OS
    gives it: beside the CPUs a run was given, it says how crowded the machine was."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def gpu_others_bytes(device: object) -> int | None:
    """GPU memory in use by anything but this process's allocator: other processes sharing
    the GPU (and the CUDA context), the one sign of them torch reads without NVML
    (``cudaMemGetInfo``). None off CUDA."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return max(total - free - torch.cuda.memory_reserved(device), 0)


def spread(samples: Sequence[float]) -> float | None:
    """The median sample over the fastest: above :data:`WILD_SPREAD` the median is not the
    time of the work but of whatever held the CPU."""
    positive = sorted(s for s in samples if s > 0)
    if len(positive) < 2:
        return None
    return positive[(len(positive) - 1) // 2] / positive[0]


@dataclass(frozen=True)
class Share:
    """A timing's contention, as a row stores it (``contention``) and a report reads it.

    ``delay``: the median delay share of the samples kept (None: unknown here);
    ``cpu_share``: CPU time ÷ (wall time × threads) over every sample taken (near 1 where
    the code keeps every thread busy; lower for serial code, and under contention);
    ``contended``: repeats taken over :data:`BUSY_DELAY`, and ``dropped_s`` the seconds of
    those not kept (re-sampled: every sample is kept, in the figure or here); ``busy``:
    whether the figure is not to be trusted, with ``why``."""

    delay: float | None
    cpu_share: float | None
    contended: int
    load: float | None
    busy: bool
    why: str = ""
    dropped_s: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "delay": None if self.delay is None else round(self.delay, 4),
            "cpu_share": None if self.cpu_share is None else round(self.cpu_share, 3),
            "contended": self.contended,
            "dropped_s": list(self.dropped_s),
            "load": self.load,
            "busy": self.busy,
        }
        if self.why:
            out["why"] = self.why
        return out


def judge(
    readings: Sequence[Reading],
    kept: Sequence[int],
    whole: Sequence[float],
    threads: int,
    wanted: int,
) -> Share:
    """The verdict on a timing: ``readings`` and ``whole`` (seconds) for every repeat taken,
    ``kept`` the indices of the repeats the figure is made of. Busy when fewer than
    ``wanted`` repeats ran uncontended (re-sampling ran out of patience), when the repeats
    together waited over :data:`BUSY_DELAY` of their time (:func:`aggregate_delay`: a
    process sharing its CPU for the whole timing, whose short samples the scheduler's lumpy
    accounting may read one by one as uncontended, and whose kept samples are still slowed
    by the other's use of the caches), or when the kept samples spread over
    :data:`WILD_SPREAD`."""
    contended = sum(r.contended for r in readings)
    wall = sum(r.wall_s for r in readings)
    cpu = sum(r.cpu_s for r in readings)
    cpu_share = cpu / (wall * threads) if wall > 0 and cpu == cpu else None  # NaN: unread
    why = ""
    if len(readings) - contended < wanted:
        why = (
            f"{contended} of {len(readings)} samples waited over {BUSY_DELAY:.0%} of their "
            "time for a CPU"
        )
    elif (total := aggregate_delay(readings)) is not None and total > BUSY_DELAY:
        why = f"its {len(readings)} samples together waited {total:.0%} of their time for a CPU"
    elif (s := spread([whole[i] for i in kept])) is not None and s > WILD_SPREAD:
        why = f"the median sample is {s:.0f}x the fastest"
    delays = sorted(d for i in kept if (d := readings[i].delay) is not None)
    median = delays[len(delays) // 2] if delays else None
    dropped = tuple(whole[i] for i in sorted(set(range(len(whole))) - set(kept)))
    return Share(median, cpu_share, contended, load(), bool(why), why, dropped)
