"""Whether a run directory can be written, asked before a command runs anything.

A read-only, full or misplaced ``out_dir`` is then one line and exit code 2, not a traceback
once cells ran; :mod:`attnbench.store` makes and writes the directory afterwards.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from attnbench.store import CELLS

MIN_FREE_BYTES = 1 << 20  # below this a sweep cannot store its config, let alone its rows


def check_writable(
    name: str, directory: Path, *, run_dir: bool = True, shown: Path | None = None
) -> None:
    """One ``ValueError`` line (``NAME: cannot write DIR: why``) unless a directory can be
    made at ``directory`` and written in: its nearest existing parent is a directory where a
    directory can really be made (probed, then removed: ``os.access`` is blind to root's
    writes under /proc and says yes to root on a 0o555 directory), on a disk that is not
    full, and, for a run directory, a stored ``cells.jsonl`` is writable. Checked before a
    command runs anything, so that a read-only, full or misplaced ``out_dir`` is a line and
    exit code 2, not a traceback once cells ran. ``shown``: the path the message names (a
    file in ``directory``), by default ``directory``."""
    shown = directory if shown is None else shown
    where = Path(directory)
    while True:
        try:
            os.stat(where)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(where):  # dangling: making the directory would fail on it
                raise ValueError(
                    f"{name}: cannot write {shown}: {str(where)!r} is a symlink to "
                    f"{os.readlink(where)!r}, which does not exist"
                ) from None
            if where.parent == where:
                break
            where = where.parent
        except OSError as e:
            raise ValueError(
                f"{name}: cannot write {shown}: [Errno {e.errno}] {e.strerror}"
            ) from None
    if not where.is_dir():
        raise ValueError(f"{name}: cannot write {shown}: {str(where)!r} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnbench-probe-", dir=where))
        fs = os.statvfs(where)
    except OSError as e:
        raise ValueError(f"{name}: cannot write {shown}: [Errno {e.errno}] {e.strerror}") from None
    free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
    if free < MIN_FREE_BYTES:  # a full disk: refused now, not after the first cell ran
        raise ValueError(
            f"{name}: cannot write {shown}: [Errno {errno.ENOSPC}] "
            f"{os.strerror(errno.ENOSPC)} ({free} bytes free)"
        )
    cells = where / CELLS
    if run_dir and where == Path(directory) and os.path.lexists(cells) and not cells.is_file():
        # a directory, a FIFO, a symlink loop or to nothing: no row could be read or added
        raise ValueError(f"{name}: cannot write {cells}: not a regular file of rows")
    if run_dir and where == Path(directory) and cells.exists() and not os.access(cells, os.W_OK):
        raise ValueError(f"{name}: cannot write {cells}: permission denied")


def check_file(name: str, path: Path) -> None:
    """One ``ValueError`` line unless a file can be written at ``path``, as a file is
    written whole (a temporary beside it, then a rename: ``store.replace_file``): not a
    directory, in a directory that can be made and written in (:func:`check_writable`).
    For a command's output file (``check --json``, ``--write-baseline``), asked before the
    minutes of work whose results it would hold."""
    if Path(path).is_dir():
        raise ValueError(f"{name}: cannot write {path}: it is a directory")
    check_writable(name, Path(path).parent, run_dir=False, shown=path)
