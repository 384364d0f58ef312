"""Append-only results of a run: ``cells.jsonl``, one JSON row per finished cell.

Safe when parallel jobs write (an exclusive ``flock`` around check-and-append), durable
(each row flushed and fsynced before the append returns) and resumable: a row carries its
cell's ``key``, and a cell whose key is already in the file is not run again. A writer
killed in the middle of a line leaves at most that partial line, which the next append
cuts away, so a killed run loses at most the cell in flight and never corrupts the file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnbench.row import Row


def replace_file(path: Path, text: str) -> None:
    """Put ``text`` at ``path`` whole or not at all: written beside it, synced, renamed over
    it, so a crash leaves the old file (or none), never a truncated one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CorruptLine(ValueError):
    """A line of ``cells.jsonl`` that is not a JSON row, with its 1-based number."""

    def __init__(self, path: Path, line_no: int, text: str, why: str = "not a JSON row") -> None:
        super().__init__(f"{path}:{line_no}: {why}: {text[:80]!r}")
        self.line_no = line_no


def numbered_lines(path: Path, *, strict: bool = True) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, JSON object) for every line of a ``cells.jsonl``. A bad line
    (not JSON, not an object, not UTF-8) raises :class:`CorruptLine` naming its number; with
    ``strict=False`` only a final line without its newline (a writer killed mid-line) is
    tolerated and left out."""
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last_unterminated = i == len(lines) and not data.endswith(b"\n")
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


def read_rows(path: Path, *, strict: bool = True) -> list[dict[str, Any]]:
    """Every line of a ``cells.jsonl`` as a plain JSON object, as stored (see
    :func:`numbered_lines`); :func:`attnbench.row.read` checks them against the schema."""
    return [row for _, row in numbered_lines(path, strict=strict)]


class RunStore:
    """One run directory: ``cells.jsonl``, ``config.yaml`` and ``env.json``."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self.cells = self.dir / "cells.jsonl"

    @contextmanager
    def _locked(self) -> Iterator[Any]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def done(self) -> set[str]:
        return {row.get("key") for row in read_rows(self.cells, strict=False)}

    def append(self, row: Row | dict[str, Any], *, replace: bool = False) -> bool:
        """Append ``row`` (a :class:`~attnbench.row.Row`, or any JSON object with a ``key``)
        unless its key is already stored (or, with ``replace``, after dropping the stored
        one). Returns whether it was written."""
        record = row if isinstance(row, dict) else row.to_dict()
        key = record["key"]
        line = json.dumps(record, default=str) + "\n"
        with self._locked():
            self._cut_partial_line()
            rows = read_rows(self.cells, strict=False)
            if any(r.get("key") == key for r in rows):
                if not replace:
                    return False
                kept = [r for r in rows if r.get("key") != key]
                self._rewrite(kept)
            with open(self.cells, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        return True

    def _cut_partial_line(self) -> None:
        if not self.cells.exists() or self.cells.stat().st_size == 0:
            return
        with open(self.cells, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            f.truncate(data.rfind(b"\n") + 1)  # the killed writer's half line

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
        with self._locked(), open(self.dir / name, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
