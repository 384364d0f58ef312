"""Ctrl-C and SIGTERM acted on within a bounded time, even inside one long native call.

Python runs a signal's handler in the main thread, between two bytecodes: a native call that
does not return (a training step's one huge convolution, a matmul at a large n, a library
waiting on a child) holds the handler back for as long as it runs, minutes if need be, and
only SIGKILL ends the command meanwhile. Checking a flag per step or per batch cannot help: the
step is the one call. What still runs at once is the signal's C-level handler, which writes
the signal's number to the wakeup fd (:func:`signal.set_wakeup_fd`). A thread reading it
(:func:`watched`) gives the main thread :data:`GRACE_S` to leave the cell it measures
(:func:`measuring`), which its handler makes it do at its next bytecode; one still inside
then is stuck, and the thread ends the command itself (``on_stuck(signum)``). Only a cell's
measurement is watched so: elsewhere the main thread runs Python and handles the signal
itself, or holds it on purpose (:mod:`attnbench.sweep.slurm`, while sbatch submits).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# seconds the main thread has to begin unwinding: its handler runs within milliseconds of a
# native call's return, so only a call that outlasts this is cut short (a normal op on a
# loaded CPU ends well within it)
GRACE_S = 3.0
_inside = threading.Event()  # the main thread is measuring a cell


@contextmanager
def measuring() -> Iterator[None]:
    """Mark the main thread's measurement of a cell, where one native call may outlast a
    signal (elsewhere, in another thread, a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _inside.set()
    try:
        yield
    finally:
        _inside.clear()


@contextmanager
def watched(on_stuck: Callable[[int], None]) -> Iterator[None]:
    """While the block runs (in the main thread), a SIGINT or SIGTERM that finds the main
    thread measuring a cell, and it still there :data:`GRACE_S` later, calls
    ``on_stuck(signum)`` from a watching thread; ``on_stuck`` ends the process."""
    read, write = os.pipe()  # not inherited by the processes the command starts
    os.set_blocking(write, False)  # a full pipe drops a byte, never blocks a handler
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read, on_stuck), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write)  # the watcher reads the end of the pipe and returns
        watcher.join()
        os.close(read)


def _watch(read: int, on_stuck: Callable[[int], None]) -> None:
    while data := os.read(read, 512):
        for signum in data:
            if signum in (signal.SIGINT, signal.SIGTERM) and _stuck(GRACE_S):
                on_stuck(signum)


def _stuck(grace_s: float) -> bool:
    """Whether the main thread is still measuring a cell ``grace_s`` from now."""
    deadline = time.monotonic() + grace_s
    while _inside.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    return _inside.is_set()
