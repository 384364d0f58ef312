"""Append-only results of a run: ``cells.jsonl``, one JSON row per finished cell.

Safe when parallel jobs write (an exclusive ``flock`` around check-and-append), durable
(each row flushed and fsynced before the append returns) and resumable: a row carries its
cell's ``key``, and a cell whose key is already in the file is not run again. A writer
killed in the middle of a line leaves at most that partial line, which the next append
cuts away, so a killed run loses at most the cell in flight and never corrupts the file.

The stored keys are an index kept per process (:class:`_Index`): each look-up parses only
the bytes appended since the last one, so the cost of a cell does not grow with the run
(a 5 000-row run re-read whole for every cell spent most of its time re-parsing). A write
that fails (disk full, read-only, no permission) is a :class:`StoreError`, one line naming
the path and the errno, and leaves the rows already stored as they were.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnbench.row import Row

CELLS = "cells.jsonl"  # a run directory's rows: the one place this name is written


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


class CorruptLine(ValueError):
    """A line of ``cells.jsonl`` that is not a JSON row, with its 1-based number."""

    def __init__(self, path: Path, line_no: int, text: str, why: str = "not a JSON row") -> None:
        super().__init__(f"{path}:{line_no}: {why}: {text[:80]!r}")
        self.line_no = line_no


def _rows_in(
    path: Path, data: bytes, *, first: int = 1, strict: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) for the lines of ``data``, numbered from ``first``; see
    :func:`numbered_lines` (the index parses appended bytes with the same rules)."""
    lines = data.split(b"\n")
    last = first + len(lines) - 1
    for i, raw in enumerate(lines, first):
        if not raw.strip():
            continue
        last_unterminated = i == last and not data.endswith(b"\n")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if last_unterminated and not strict:
                continue
            raise CorruptLine(
                path,
                i,
                repr(raw[max(0, e.start - 20) : e.end + 20]),
                f"not UTF-8 (byte {e.start + 1})",
            ) from None
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError
        except (ValueError, RecursionError):
            if last_unterminated and not strict:
                continue
            raise CorruptLine(path, i, line) from None
        yield i, row


def numbered_lines(path: Path, *, strict: bool = True) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, JSON object) for every line of a ``cells.jsonl``. A bad line
    (not JSON, not an object, not UTF-8) raises :class:`CorruptLine` naming its number; with
    ``strict=False`` only a final line without its newline (a writer killed mid-line) is
    tolerated and left out."""
    if not path.exists():
        return
    yield from _rows_in(path, path.read_bytes(), strict=strict)


def read_rows(path: Path, *, strict: bool = True) -> list[dict[str, Any]]:
    """Every line of a ``cells.jsonl`` as a plain JSON object, as stored (see
    :func:`numbered_lines`); :func:`attnbench.row.read` checks them against the schema."""
    return [row for _, row in numbered_lines(path, strict=strict)]


def _read_from(f: Any, offset: int) -> bytes:
    """The bytes of open file ``f`` from ``offset`` to its end (one place, so that a test
    can count what the index reads)."""
    f.seek(offset)
    return f.read()


@dataclass
class _Index:
    """The keys of a ``cells.jsonl`` up to ``offset`` (just after a newline), and how to
    tell that the file is still the one they were read from: its inode and the last full
    line before ``offset`` (a rewrite renames a new file in; an edit changes that line)."""

    inode: tuple[int, int] = (0, 0)
    offset: int = 0
    lines: int = 0
    last_line: bytes = b""
    keys: set[Any] = field(default_factory=set)


_INDEXES: dict[str, _Index] = {}
_INDEX_LOCK = threading.Lock()


def stored_keys(path: Path) -> set[Any]:
    """The ``key`` of every row of ``path`` (a final half-written line left out, as
    ``read_rows(strict=False)`` does), reading only what was appended since the last call
    in this process; the file read whole again only when it was replaced or edited."""
    with _INDEX_LOCK:
        name = os.path.abspath(path)
        index = _INDEXES.setdefault(name, _Index())
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            _INDEXES[name] = _Index()
            return set()
        with f:
            st = os.fstat(f.fileno())
            inode, known = (st.st_dev, st.st_ino), index.last_line
            data = None
            if inode == index.inode and st.st_size >= index.offset:
                chunk = _read_from(f, index.offset - len(known))
                data = chunk[len(known) :] if chunk.startswith(known) else None
            if data is None:  # a new file, or replaced, cut short or edited: read it whole
                index = _INDEXES[name] = _Index(inode=inode)
                data = _read_from(f, 0)
        cut = data.rfind(b"\n") + 1
        whole, rest = data[:cut], data[cut:]
        keys = {row.get("key") for _, row in _rows_in(path, whole, first=index.lines + 1)}
        index.keys |= keys
        if whole:
            index.offset += len(whole)
            index.lines += whole.count(b"\n")
            index.last_line = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1 :]
        tail = _rows_in(path, rest, first=index.lines + 1, strict=False)
        return index.keys | {row.get("key") for _, row in tail}


class RunStore:
    """One run directory: ``cells.jsonl``, ``config.yaml`` and ``env.json``."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self.cells = self.dir / CELLS

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
        return stored_keys(self.cells)

    def append(self, row: Row | dict[str, Any], *, replace: bool = False) -> bool:
        """Append ``row`` (a :class:`~attnbench.row.Row`, or any JSON object with a ``key``)
        unless its key is already stored (or, with ``replace``, after dropping the stored
        one). Returns whether it was written. A failed write raises :class:`StoreError` and
        leaves the file as it was."""
        record = row if isinstance(row, dict) else row.to_dict()
        key = record["key"]
        line = json.dumps(record, default=str) + "\n"
        with self._locked():
            self._cut_partial_line()
            if key in stored_keys(self.cells):
                if not replace:
                    return False
                kept = [r for r in read_rows(self.cells, strict=False) if r.get("key") != key]
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
        replace_file(self.cells, "".join(json.dumps(r, default=str) + "\n" for r in rows))

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
            _append_line(self.dir / name, json.dumps(record, default=str) + "\n", sync=False)


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
