"""How contended must a CPU be before attnbench calls a timing busy?

One thread pinned to one CPU times a ~20 ms matmul chain (``attnbench.measure.timing``,
3 repeats wanted, 0.1 s of work, re-sampling for at most 1.5 s) beside a busy loop pinned to
the same CPU that spins for a share (its *duty*) of every 10 ms and sleeps the rest. For
each duty, the timing's median delay share, its contended repeats, whether it was called
busy, and its median against the one taken with no loop::

    python scripts/contention_threshold.py [--cpu N] [--size 640]

docs/measurement.md ("Contention") quotes its table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LOOP = """
import sys, time
duty, period = float(sys.argv[1]), 0.010
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < duty * period:
        pass
    time.sleep(max(period * (1 - duty), 0))
"""

TIMING = """
import json, os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
import torch
from attnbench.measure.timing import time_forward
torch.set_num_threads(1)
a = torch.randn(int(sys.argv[2]), int(sys.argv[2]))
t = time_forward(lambda: a @ a @ a @ a, torch.device("cpu"), min_repeats=3, min_seconds=0.1,
                 patience_s=1.5)
print(json.dumps({**t.contention.as_dict(), "repeats": t.repeats, "median": t.median}))
"""


def timed(cpu: int, size: int, duty: float) -> dict:
    loop = None
    if duty > 0:
        loop = subprocess.Popen(
            [sys.executable, "-c", LOOP, str(duty)],
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
    try:
        out = subprocess.run(
            [sys.executable, "-c", TIMING, str(cpu), str(size)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--size", type=int, default=640)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}; CPU {args.cpu}; size {args.size}")
    quiet = timed(args.cpu, args.size, 0.0)
    print(
        "| busy loop's duty | delay share (median kept) | contended repeats | busy "
        "| median ÷ quiet |"
    )
    print("|---:|---:|---:|---|---:|")
    for duty in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0):
        got = quiet if duty == 0 else timed(args.cpu, args.size, duty)
        taken = got["repeats"] + (0 if got["busy"] else got["contended"])  # busy: all kept
        print(
            f"| {duty:.0%} | {got['delay']} | {got['contended']} of {taken} | "
            f"{'yes' if got['busy'] else 'no'} | {got['median'] / quiet['median']:.2f} |"
        )


if __name__ == "__main__":
    main()
