"""Time of one forward: median and IQR over repeats, by device events on CUDA.

Rules (docs/measurement.md): a forward under ``torch.inference_mode()``, or a training step's parts
with autograd (:func:`time_parts`); warm-up not counted;
repeat until at least ``min_repeats`` runs and ``min_seconds`` of timed work; raw samples kept
so statistics can be recomputed. On CUDA each repeat is bracketed by CUDA events (device
time, never a host clock without synchronizing), optionally after flushing L2 as
``triton.testing.do_bench`` does. On CPU a forward has returned when it is done, so
``time.perf_counter`` is exact; the thread count goes with the figure.

Every repeat is also read from the scheduler (:mod:`attnbench.measure.contention`, outside
the timed bracket): a repeat whose threads waited for a CPU is *contended* and is taken
again, within ``patience_s``, so that the figure is made of ``min_repeats`` uncontended
ones; where re-sampling runs out of time, the figure keeps every sample and says it is busy.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.measure import contention

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100: 50 MB)


# a timing whose interquartile range exceeds this fraction of its median is footnoted in a
# report as noisy: the machine was busy, or the process was unlucky (README, "Quieter timings")
NOISY = 0.10


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]  # seconds per forward, in the order taken (the ones kept)
    method: str  # "cuda-events" or "perf_counter"
    threads: int  # torch's intra-op threads (what a CPU figure depends on)
    contention: contention.Share | None = None  # how contended the CPU was; None: not read

    @property
    def busy(self) -> bool:
        """Taken on a contended CPU (or wildly spread): no figure to compare."""
        return self.contention is not None and self.contention.busy

    @property
    def repeats(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q3 - q1

    def flops_per_s(self, flops: float) -> float:
        """The rate of ``flops`` done once per sample (a step's work) at the median."""
        return flops / self.median

    def pct_of_peak(self, flops: float, peak_flops: float | None) -> float | None:
        """That rate as a percentage of a datasheet's peak; None without one."""
        return None if peak_flops is None else 100 * self.flops_per_s(flops) / peak_flops

    def __repr__(self) -> str:
        return (
            f"Timing(median={self.median * 1e3:.3f} ms, iqr={self.iqr * 1e3:.3f} ms, "
            f"repeats={self.repeats}, {self.method}, threads={self.threads}"
            + (", busy" if self.busy else "")
            + ")"
        )


@dataclass(frozen=True)
class StepTiming:
    """A cell's step as timed: the whole step's :class:`Timing` and its named parts', the
    batch, where and in what dtype, with the figures a row derives from them."""

    whole: Timing
    parts: dict[str, Timing]  # a workload's named parts (train: forward, backward, optimizer)
    batch: int
    device: str  # "cuda" or "cpu"
    dtype: str
    flops: int  # matmul FLOPs of one step at ``batch``
    peak_flops: float | None  # the datasheet's, only where the step ran on the preset's own GPU

    @property
    def per_seq_s(self) -> float:
        return self.whole.median / self.batch

    @property
    def flops_per_s(self) -> float:
        return self.whole.flops_per_s(self.flops)

    @property
    def pct_of_peak(self) -> float | None:
        return self.whole.pct_of_peak(self.flops, self.peak_flops)


def time_forward(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    min_repeats: int = 5,
    min_seconds: float = 1.0,
    warmup: int = 2,
    max_repeats: int = 1000,
    flush_l2: bool = False,
    patience_s: float | None = None,
) -> Timing:
    """Time ``fn()`` (one forward) on ``device``; see the module docstring for the rules."""
    return time_parts(
        [fn],
        device,
        min_repeats=min_repeats,
        min_seconds=min_seconds,
        warmup=warmup,
        max_repeats=max_repeats,
        flush_l2=flush_l2,
        patience_s=patience_s,
    )[0]


def time_parts(
    parts: Sequence[Callable[[], Any]],
    device: torch.device,
    *,
    grad: bool = False,
    min_repeats: int = 5,
    min_seconds: float = 1.0,
    warmup: int = 2,
    max_repeats: int = 1000,
    flush_l2: bool = False,
    patience_s: float | None = None,
) -> list[Timing]:
    """One :class:`Timing` per part of a step whose parts run in order each repeat (a
    training step: forward, backward, optimizer), plus, last, the whole step's: each
    repeat's parts summed. On CUDA, one event between parts, all read after one
    synchronize, so the parts add up to the step with no gap. ``grad=False`` runs under
    ``inference_mode`` (a forward); a training step needs autograd.

    Repeats go on until ``min_repeats`` uncontended ones and ``min_seconds`` of uncontended
    timing, or until ``patience_s`` (default: 3 × ``min_seconds``) has passed: then, with
    too few uncontended ones, the figure is busy (:func:`attnbench.measure.contention.judge`)."""
    cuda = device.type == "cuda"
    flush = (
        torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if cuda and flush_l2 else None
    )
    # min_seconds=0 still leaves a second to take contended repeats again
    patience = max(3 * min_seconds, 1.0) if patience_s is None else max(patience_s, min_seconds)
    samples: list[list[float]] = [[] for _ in parts]
    readings: list[contention.Reading] = []
    timed = 0.0  # seconds of uncontended timed work so far (reading the scheduler is not)
    with (
        contention.Sched() as sched,
        contextlib.nullcontext() if grad else torch.inference_mode(),
    ):
        for _ in range(warmup):
            for part in parts:
                part()
        if cuda:
            torch.cuda.synchronize(device)
        begun = time.perf_counter()
        while len(readings) < max_repeats:
            taken, elapsed = len(readings), time.perf_counter() - begun
            clean = taken - sum(r.contended for r in readings)
            if clean >= min_repeats and timed >= min_seconds:
                break
            if taken >= min_repeats and elapsed >= patience:  # re-sampling gives up: busy
                break
            window = contention.Window(sched)
            if cuda:
                seconds, reading = _repeat_on_cuda(parts, window, flush)
            else:
                seconds, reading = _repeat_on_cpu(parts, window)
            for sample, s in zip(samples, seconds, strict=True):
                sample.append(s)
            readings.append(reading)
            if not readings[-1].contended:
                timed += sum(s[-1] for s in samples)
    return _timings(samples, readings, "cuda-events" if cuda else "perf_counter", min_repeats)


def _repeat_on_cuda(
    parts: Sequence[Callable[[], Any]], window: contention.Window, flush: torch.Tensor | None
) -> tuple[list[float], contention.Reading]:
    """One repeat of ``parts`` on CUDA: (each part's seconds by the events between them, the
    scheduler's reading of the repeat), L2 flushed first with ``flush``. The host's delay
    counts while it launches the work (a late launch leaves the GPU idle between events);
    waiting for the GPU is not the host's, so ``window`` closes before the synchronize."""
    if flush is not None:
        flush.zero_()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(parts) + 1)]
    events[0].record()
    for part, end in zip(parts, events[1:], strict=True):
        part()
        end.record()
    reading = window.close()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(len(parts))], reading


def _repeat_on_cpu(
    parts: Sequence[Callable[[], Any]], window: contention.Window
) -> tuple[list[float], contention.Reading]:
    """One repeat of ``parts`` on the CPU: (each part's seconds by ``time.perf_counter``,
    which is exact there: a part has returned when it is done, the scheduler's reading of
    the repeat)."""
    seconds = []
    for part in parts:
        t0 = time.perf_counter()
        part()
        seconds.append(time.perf_counter() - t0)
    return seconds, window.close()


def _timings(
    samples: list[list[float]],
    readings: list[contention.Reading],
    method: str,
    min_repeats: int,
) -> list[Timing]:
    """The figures of :func:`time_parts` from every repeat's ``samples`` (one list per part)
    and ``readings``: the uncontended repeats alone, or all of them and the figure busy when
    re-sampling ran out of patience before ``min_repeats`` uncontended ones; one
    :class:`Timing` per part and, for more than one part, the whole step's last."""
    threads = torch.get_num_threads()
    whole = [sum(s) for s in zip(*samples, strict=True)]
    keep = [i for i, r in enumerate(readings) if not r.contended]
    if len(keep) < min_repeats:  # re-sampling ran out of patience: the figure is busy
        keep = list(range(len(readings)))
    share = contention.judge(readings, keep, whole, threads, min_repeats)
    timings = [Timing(tuple(s[i] for i in keep), method, threads, share) for s in samples]
    if len(samples) > 1:
        timings.append(Timing(tuple(whole[i] for i in keep), method, threads, share))
    return timings
