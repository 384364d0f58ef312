"""Is a timing beside a busy loop called busy at every sample length?

One thread pinned to one CPU times a matmul chain sized for samples of about 0.1 ms, 1 ms
and 10 ms (``attnbench.measure.timing``, the sweep's CPU settings: 5 repeats wanted, 1 s of
work, re-sampling for at most 10 s), alone and beside a busy loop pinned to the same CPU for
the whole timing. For each, what the scheduler said of the samples and the verdict::

    python scripts/contention_lengths.py [--cpu N] [--seconds 1.0]

Columns: the repeats taken; those read as contended (over ``BUSY_DELAY``); the windows in
which the scheduler credited the thread nothing at all (ran = waited = 0: its accounting
is lumpy at this length); the delay share over every repeat together; the kept samples'
median against the quiet median at the same length; and whether the timing was called busy.
docs/measurement.md ("Contention at every sample length") quotes its table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

TIMING = """
import json, os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
import torch
from attnbench.measure import contention, timing
torch.set_num_threads(1)
size, seconds = int(sys.argv[2]), float(sys.argv[3])
a = torch.randn(size, size)
seen = {}
judge = contention.judge
def spy(readings, kept, whole, threads, wanted):
    seen.update(readings=readings, kept=list(kept))
    return judge(readings, kept, whole, threads, wanted)
contention.judge = spy
t = timing.time_forward(lambda: a @ a @ a @ a, torch.device("cpu"), min_repeats=5,
                        min_seconds=seconds, patience_s=10 * seconds)
rs = seen["readings"]
print(json.dumps({
    "samples": list(t.samples), "busy": t.contention.busy, "why": t.contention.why,
    "taken": len(rs), "contended": sum(r.contended for r in rs),
    "zero": sum(r.ran_ns == 0 and r.waited_ns == 0 for r in rs),
    "aggregate": contention.aggregate_delay(rs),
}))
"""

LENGTHS = {"0.1 ms": 150, "1 ms": 330, "10 ms": 640}  # matrix sizes (4 matmuls a sample)


def timed(cpu: int, size: int, seconds: float, hog: bool) -> dict:
    """One timing in a fresh process pinned to ``cpu``, beside a busy loop there or not."""
    loop = None
    if hog:
        loop = subprocess.Popen(
            [sys.executable, "-c", "print('on', flush=True)\nwhile True: pass"],
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert loop.stdout is not None and loop.stdout.readline() == "on\n"
    try:
        out = subprocess.run(
            [sys.executable, "-c", TIMING, str(cpu), str(size), str(seconds)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(
        "| sample | busy loop | median | repeats | contended | credited nothing "
        "| delay, all repeats | kept median ÷ quiet | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for length, size in LENGTHS.items():
        quiet = None
        for hog in (False, True):
            r = timed(args.cpu, size, args.seconds, hog)
            median = statistics.median(r["samples"])
            quiet = quiet or median
            agg = r["aggregate"]
            print(
                f"| ~{length} | {'yes' if hog else 'no'} | {median * 1e3:.3g} ms | {r['taken']} "
                f"| {r['contended']} | {r['zero']} ({r['zero'] / r['taken']:.0%}) "
                f"| {'-' if agg is None else f'{agg:.2f}'} | {median / quiet:.2f} "
                f"| {'yes' if r['busy'] else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
