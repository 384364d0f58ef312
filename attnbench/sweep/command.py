"""``attnbench run ARGS`` from start to exit code, around Hydra.

Validate every cell first (:func:`config.prevalidate`: one line, exit 2, nothing written),
publish the plan and this command's id to its jobs (:mod:`.claims`), then hand the same
arguments to Hydra (:func:`job.hydra_main`). Ctrl-C or SIGTERM unwind from wherever they land:
one line saying what is stored and how to resume, exit 130 (143), this command's workers
killed first and, under SLURM, its queued and running tasks cancelled (:mod:`.slurm`): none
stores a row after that line; its temp files removed. A SLURM task that ends without its
cell (cancelled, failed) ends the command the same way, its line naming the cell and the
job. A SIGKILLed command's workers are killed by its reaper (:func:`claims.start_reaper`).
A cell stuck in one native call that holds the handler back (a training step) is cut short
after :data:`interrupts.GRACE_S` with the same line and exit code (:mod:`.interrupts`).
Every process that times a cell starts with glibc's malloc thresholds fixed
(:func:`attnbench.env.fix_malloc`), this one and, through the environment, its workers.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TextIO

from attnbench.env import fix_malloc
from attnbench.sweep import claims, config, interrupts, job, slurm, slurm_watch


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that it unwinds like Ctrl-C: the stored
    rows stand, this command's temp files go."""


_signalled: list[int] = []  # the signals that asked this command to stop
_ending = threading.Lock()  # held by whichever says the last line: the main thread or _stuck


def _terminate(signum: int, frame: object) -> None:
    _signalled.append(signum)
    raise Terminated


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C, remembered: a KeyboardInterrupt that lands inside a library's cleanup (a
    ``__del__`` while Hydra composes the next job) is swallowed there and leaves an error
    of the library's own, with which Hydra exits 1; the command still knows it was asked
    to stop, and says so as for any Ctrl-C."""
    _signalled.append(signum)
    raise KeyboardInterrupt


class _Hushed:
    """``sys.stderr`` while Hydra runs: it passes every line through until a signal has
    asked the command to stop, and drops what follows. An interrupt that lands inside a
    library can come out as another error (Hydra's config reader turns one into an
    ``UnboundLocalError`` in its ``finally``), which Hydra prints as a traceback before it
    exits 1; after a Ctrl-C that is noise, and the command's own line says how it ended."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return len(text) if _signalled else self.stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def main(args: list[str]) -> int:
    """``attnbench run ARGS``: validate every cell first (one line, exit 2, nothing written),
    then hand the same arguments to Hydra. Ctrl-C or SIGTERM: one line saying what is stored
    and how to resume, exit 130 (143), no temp files left."""
    fix_malloc()  # steadier CPU timings, here and in every worker this command starts
    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not if ignored
        signal.signal(signal.SIGINT, _interrupt)
    _signalled.clear()
    plan: list[tuple[str, str]] = []  # filled once validated: _stuck's line counts it too
    stderr = sys.stderr
    sys.stderr = _Hushed(stderr)  # type: ignore[assignment]
    try:
        with interrupts.watched(lambda signum: _stuck(signum, plan, stderr)):
            return _run(args, plan, stderr)
    finally:
        sys.stderr = stderr


def _run(args: list[str], plan: list[tuple[str, str]], stderr: TextIO) -> int:
    """:func:`main` once its handlers are set: validate (``plan`` filled in place), run,
    and say how it ended (on ``stderr``, the stream that is never hushed)."""
    try:
        if not any(
            a in ("--help", "-h", "--hydra-help", "--info", "-i")
            or a.startswith("--cfg")
            or a in ("-c",)
            for a in args
        ):
            try:
                plan[:] = config.prevalidate(args)
            except ValueError as e:
                print(f"attnbench run: error: {e}", file=sys.stderr)
                return 2
            claims.begin(plan)  # shared with the Hydra callback and every job
        sys.argv = ["attnbench run", *args]
        job.hydra_main()
    except job.StoreFailed as e:  # disk full or read-only mid-sweep: the stored rows stand
        _stop()
        print(f"attnbench run: error: {e}", file=sys.stderr)
        return 2
    except slurm_watch.Failed as e:
        # sbatch refused the sweep (2), or a task ended without its cell
        left = _stop()
        resume = f"; {_stored(plan)}" if e.code == 1 else ""
        print(f"attnbench run: error: {e}{resume}{left}", file=sys.stderr)
        return e.code
    except (KeyboardInterrupt, Terminated, SystemExit) as e:
        if isinstance(e, SystemExit) and not _signalled:
            raise  # Hydra's own exit (an error it reported), not an interrupt
        with _ending:
            left = _stop()  # no worker or SLURM task may store a row after the line below
            print(f"\nattnbench run: {_interrupted(plan)}{left}", file=stderr)
        terminated = isinstance(e, Terminated) or signal.SIGTERM in _signalled
        return 143 if terminated else 130
    finally:  # the plan and the claims of this command are of no use after it
        claims.end()
    return 0


def _stuck(signum: int, plan: list[tuple[str, str]], stderr: TextIO) -> None:
    """The main thread is inside one native call that holds its handler back: end the
    command from the watching thread, as the handler would have ended it (this command's
    processes killed, the same line, exit 130 or 143). The cell it measures is not stored;
    what its claims left is tidied by the command's reaper, as after any end."""
    if not _ending.acquire(blocking=False):
        return  # the main thread got out and is saying it
    left = _stop()
    print(f"\nattnbench run: {_interrupted(plan)}{left}", file=stderr, flush=True)
    sys.stdout.flush()
    os._exit(143 if signum == signal.SIGTERM else 130)


def _stop() -> str:
    """Stop this command's SLURM tasks (queued and running), then its processes here;
    returns what the command's last line must add about tasks SLURM has not ended yet."""
    left = slurm.cancel()
    claims.stop_processes()
    return left


def _interrupted(plan: list[tuple[str, str]]) -> str:
    """What an interrupted command leaves: its stored cells, and how to go on."""
    if not plan:
        return "interrupted before any cell ran; nothing was written"
    return f"interrupted; {_stored(plan)}"


def _stored(plan: list[tuple[str, str]]) -> str:
    """What is stored of ``plan``, and how to go on."""
    try:
        stored = len(claims.rows_of(plan))
    except (OSError, ValueError):
        stored = "?"
    dirs = ", ".join(sorted({d for d, _ in plan}))
    return (
        f"{stored} of {len(plan)} cells are stored in {dirs}; run the same "
        "command again to resume (stored cells are not measured again)"
    )
