"""Append-only results of a run: ``cells.jsonl``, one JSON row per finished cell.

Safe when parallel jobs write (an exclusive ``flock`` around check-and-append), durable
(each row flushed and fsynced before the append returns) and resumable: a row carries its
cell's ``key``, and a cell whose key is already in the file is not run again. A writer
killed in the middle of a line leaves at most that partial line, which the next append
cuts away, so a killed run loses at most the cell in flight and never corrupts the file.

Reading the file, and the index of its keys, is :mod:`attnbench.store_read`'s. A write
that fails (disk full, read-only, no permission) is a :class:`StoreError`, one line naming
the path and the errno, and leaves the rows already stored as they were.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from attnbench.store_read import (  # noqa: F401 (CorruptLine, numbered_lines: read from here)
    CorruptLine,
    Rekey,
    _own_key,
    flat,
    numbered_lines,
    read_rows,
    stored_keys,
    stored_lines,
)

CELLS = "cells.jsonl"  # a run directory's rows: the one place this name is written


class Stored(Protocol):
    """What :meth:`RunStore.append` stores beside a plain dict: a record that gives its
    stored form (:class:`attnbench.row.Row`). Named by what it does, not imported: the row
    is read with :func:`numbered_lines` and written with :func:`json_line`, so the store
    sits below it and knows no row class."""

    def stored(self) -> dict[str, Any]: ...


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one JSON line: the one encoder of everything a run directory stores.
    A value JSON cannot hold is a ``TypeError`` naming its type, not its ``str``: a config
    list once reached a row as ``"[10, 20, 30]"``, which no reader takes back as a list."""
    return json.dumps(record, default=_plain_json) + "\n"


def _plain_json(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and callable(value.item):  # a numpy or torch scalar
        return value.item()
    raise TypeError(f"a stored row cannot hold a {type(value).__name__}: {value!r:.80}")


class StoreError(OSError):
    """A write into a run directory failed: ``cannot write PATH: [Errno 28] No space left on
    device``. An OSError (callers that handle OSError still do), built as
    ``StoreError(errno, strerror, path)`` so that it pickles across launcher processes."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: [Errno {self.errno}] {self.strerror}"


def _failed(path: Path, e: OSError) -> StoreError:
    if isinstance(e, StoreError):
        return e
    return StoreError(e.errno, e.strerror or str(e), str(path))


def replace_file(path: Path, text: str) -> None:
    """Put ``text`` at ``path`` whole or not at all: written beside it, synced, renamed over
    it, so a crash leaves the old file (or none), never a truncated one. A failed write
    removes its temporary file and raises :class:`StoreError`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)  # unlinking needs no space, only the directory
        raise _failed(path, e) from None


class RunStore:
    """One run directory: ``cells.jsonl``, ``config.yaml`` and ``env.json``. ``rekey`` gives
    the key a stored row answers to today (:func:`attnbench.cell_key.stored_key`: rows keyed by
    an older rule still resume); by default, its stored ``key``."""

    def __init__(self, run_dir: Path, rekey: Rekey = _own_key) -> None:
        self.dir = Path(run_dir)
        self.cells = self.dir / CELLS
        self.rekey = rekey

    @contextmanager
    def _locked(self) -> Iterator[Any]:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.dir / ".lock", "a")
        except OSError as e:
            raise _failed(self.dir, e) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def done(self) -> set[str]:
        """The keys stored so far (an index: only newly appended rows are parsed)."""
        return stored_keys(self.cells, self.rekey)

    def rows(self) -> list[dict[str, Any]]:
        """The stored rows, each with its ``key`` as it answers today (a half-written last
        line left out)."""
        return [{**r, "key": self.rekey(r)} for r in read_rows(self.cells, strict=False)]

    def append(self, row: Stored | dict[str, Any], *, replace: bool = False) -> bool:
        """Append ``row`` (a :class:`~attnbench.row.Row`, or any JSON object with a ``key``)
        unless its key is already stored (or, with ``replace``, after dropping the stored
        one). Returns whether it was written. A failed write raises :class:`StoreError` and
        leaves the file as it was."""
        record = row if isinstance(row, dict) else row.stored()
        key = record["key"]
        line = json_line(record)
        with self._locked():
            self._cut_partial_line()
            if key in stored_keys(self.cells, self.rekey):
                if not replace:
                    return False
                kept = [r for r in stored_lines(self.cells) if self.rekey(flat(r)) != key]
                self._rewrite(kept)
            _append_line(self.cells, line, sync=True)
        return True

    def _cut_partial_line(self) -> None:
        """Truncate a killed writer's half line, reading back from the end only as far as
        the last newline (the file is not read whole)."""
        try:
            f = open(self.cells, "rb+")
        except FileNotFoundError:
            return
        except OSError as e:
            raise _failed(self.cells, e) from None
        with f:
            end = pos = f.seek(0, os.SEEK_END)
            while pos > 0:
                step = min(pos, 1 << 16)
                pos -= step
                f.seek(pos)
                block = f.read(step)
                if pos + step == end and block.endswith(b"\n"):
                    return
                if (nl := block.rfind(b"\n")) >= 0:
                    pos += nl + 1
                    break
            if pos < end:
                try:
                    f.truncate(pos)  # the killed writer's half line
                except OSError as e:
                    raise _failed(self.cells, e) from None

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        replace_file(self.cells, "".join(json_line(r) for r in rows))

    def write_once(self, name: str, text: str) -> None:
        """Write a run-level file (resolved config, environment) atomically, unless it
        exists: it describes the run as first made, later commands only resume it."""
        with self._locked():
            if (self.dir / name).exists():
                return
            replace_file(self.dir / name, text)

    def add_line(self, name: str, record: dict[str, Any]) -> None:
        """Append one JSON line to a run-level log (e.g. the commands that wrote here)."""
        with self._locked():
            _append_line(self.dir / name, json_line(record), sync=False)


def _append_line(path: Path, line: str, *, sync: bool) -> None:
    """Append ``line`` in one write; on failure (a full disk may take part of it) cut the
    file back to its old size, so that no half line follows the rows already stored."""
    data = line.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise _failed(path, e) from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if sync:
                os.fsync(fd)
        except OSError as e:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # the next append cuts a half line away in any case
            raise _failed(path, e) from None
    finally:
        os.close(fd)
