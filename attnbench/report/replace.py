"""Putting a report on disk: a directory replaced whole, one writer at a time.

:func:`write` is the one way a report reaches disk (``attnbench report``, a sweep's end,
``scripts/make_reports.sh``). Its promises: readers never see half a report (the new one
is written beside the old and swapped in, atomically where Linux offers it); two writers of
one output never collide (an ``flock`` beside it); a failure (a full or read-only disk, a
file in the way) changes nothing and leaves nothing (no temporary directory, no lock file,
no parent directory it made); and what a writer killed mid-write left is cleared by the
next. Errors stay ``OSError`` (:func:`os_error` makes one a line) and ``ValueError`` for an
``--out`` that is not a report.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnbench.row import printable


def _resolve(out: Path) -> Path:
    """``out`` made absolute with its symlinks followed; a symlink loop is one line."""
    try:
        return Path(out).resolve()
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError, 3.13 OSError (ELOOP)
        raise ValueError(f"--out: {printable(str(out))} is a symlink loop") from None


def check_out(out: Path) -> Path:
    """``out`` resolved, if it may be replaced: absent, empty, or an earlier report. Anything
    else (a run directory, ``results/``, a file) is refused, never deleted."""
    out = _resolve(out)
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "report.json").is_file())
    ):
        raise ValueError(
            f"--out: {printable(str(out))} exists and is not an attnbench report (no "
            "report.json); refusing to replace it: name a new directory"
        )
    for parent in out.parents:  # --out under a file: say so, not "File exists"
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--out: {printable(str(parent))} is a file, not a directory")
            break
    return out


def os_error(e: OSError) -> str:
    """An ``OSError`` as one line: the path(s), what went wrong and its errno's name
    (``/r/.rep.tmp-x/table3.md: No space left on device (ENOSPC)``)."""
    if not e.errno:  # raised without one (a test's OSError("disk full")): its own text
        return printable(str(e))
    where = " -> ".join(printable(str(f)) for f in (e.filename, e.filename2) if f is not None)
    what = f"{e.strerror or os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)})"
    return f"{where}: {what}" if where else what


def _lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """One writer at a time per output directory: an ``flock`` on ``.<out>.lock`` beside it.

    The holder deletes the lock file as it leaves, so none is left behind. A waiter that
    then gets the lock on the deleted file sees that it is no longer the file at that path
    and opens it afresh; so two writers never hold it together, and writers that crash
    leave nothing held (the kernel drops a dead process's flock)."""
    path = _lock_path(out)
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)  # while still held: a waiter then retries on a fresh file
        except OSError:
            pass
        os.close(fd)


def _temp_pattern(out: Path) -> re.Pattern[str]:
    """The names :func:`write`'s temporary directories for ``out`` get, and no other
    (``tempfile`` adds 8 characters of ``[a-z0-9_]``)."""
    return re.compile(re.escape(f".{out.name}.tmp-") + r"[a-z0-9_]{8}")


def _sweep(out: Path) -> None:
    """Remove what writers of ``out`` killed mid-write left (SIGKILL, power loss). Called
    under the lock: no live writer has a temporary directory then."""
    pattern = _temp_pattern(out)
    for entry in out.parent.iterdir():
        if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """The C library's ``renameat2`` (glibc 2.28+, musl 1.2.4+), or None."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    c = ctypes  # renameat2(olddirfd, oldpath, newdirfd, newpath, flags)
    renameat2.argtypes = [c.c_int, c.c_char_p, c.c_int, c.c_char_p, c.c_uint]
    return renameat2


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``), so that ``b`` is never missing, not even for a moment. False
    where the C library or the file system cannot (the caller then renames twice)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _make_parents(directory: Path) -> list[Path]:
    """``directory`` and its missing parents made; those made, deepest first, so that a
    write that fails can take them away again (nothing written, not even empty folders)."""
    made = []
    p = directory
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    directory.mkdir(parents=True, exist_ok=True)
    return made


def write(files: dict[str, bytes], out: Path) -> Path:
    """Replace ``out`` with ``files`` in one rename: never a half-written report.

    The files go to a temporary directory beside ``out``, which then takes ``out``'s place
    in one step (an atomic exchange where Linux offers it, else two renames). Writers of one
    ``out`` take turns (:func:`_locked`); whatever fails (a full or read-only disk) leaves
    the previous report as it was and nothing of its own: no temporary directory, no lock
    file, no parent directory it made. ``OSError`` is raised as it came."""
    out = check_out(out)
    made = _make_parents(out.parent)
    try:
        with _locked(out):
            _sweep(out)
            check_out(out)  # again, under the lock: another writer may have put a file there
            tmp: Path | None = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
            try:
                umask = os.umask(0)
                os.umask(umask)
                tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the report from others
                for rel, data in files.items():
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    try:
                        (tmp / rel).write_bytes(data)
                    except OSError as e:  # a failed write() (ENOSPC) names no file: name it
                        if e.errno and e.filename is None:
                            e.filename = str(tmp / rel)
                        raise
                if not out.exists():
                    os.rename(tmp, out)
                    tmp = None
                elif not _exchange(tmp, out):
                    # no exchange: the old report into an empty directory of our own (rename
                    # replaces an empty one), the new one in its place, or the old one back
                    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
                    try:
                        os.rename(out, old)
                    except BaseException:
                        old.rmdir()
                        raise
                    try:
                        os.rename(tmp, out)
                    except BaseException:
                        os.rename(old, out)
                        raise
                    tmp = old
                # else: tmp now holds the old report
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                break
        raise
    return out
