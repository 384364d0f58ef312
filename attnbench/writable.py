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


def check_writable(name: str, directory: Path) -> None:
    """One ``ValueError`` line (``NAME: cannot write DIR: why``) unless a directory can be
    made at ``directory`` and written in: its nearest existing parent is a directory where a
    directory can really be made (probed, then removed: ``os.access`` is blind to root's
    writes under /proc and says yes to root on a 0o555 directory), on a disk that is not
    full, and a stored ``cells.jsonl`` is writable. Checked before a command runs anything,
    so that a read-only, full or misplaced ``out_dir`` is a line and exit code 2, not a
    traceback once cells ran."""
    where = Path(directory)
    while True:
        try:
            os.stat(where)
            break
        except (FileNotFoundError, NotADirectoryError):
            if where.parent == where:
                break
            where = where.parent
        except OSError as e:
            raise ValueError(
                f"{name}: cannot write {directory}: [Errno {e.errno}] {e.strerror}"
            ) from None
    if not where.is_dir():
        raise ValueError(f"{name}: cannot write {directory}: {str(where)!r} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnbench-probe-", dir=where))
        fs = os.statvfs(where)
    except OSError as e:
        raise ValueError(
            f"{name}: cannot write {directory}: [Errno {e.errno}] {e.strerror}"
        ) from None
    free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
    if free < MIN_FREE_BYTES:  # a full disk: refused now, not after the first cell ran
        raise ValueError(
            f"{name}: cannot write {directory}: [Errno {errno.ENOSPC}] "
            f"{os.strerror(errno.ENOSPC)} ({free} bytes free)"
        )
    cells = where / CELLS
    if where == Path(directory) and cells.exists() and not os.access(cells, os.W_OK):
        raise ValueError(f"{name}: cannot write {cells}: permission denied")
