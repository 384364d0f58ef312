"""Reading a run's ``cells.jsonl``: its lines as JSON rows, each bad line one
:class:`CorruptLine` naming its number, and the index of its keys.

A line of schema 3 stores its cell's spec once (``cell``): the row fields the spec gives
are left out of the line and put back on reading (:func:`flat`), so every reader — the
row's schema check, the key index, the progress table — sees the same flat row whichever
schema wrote it. :meth:`attnbench.row.Row.stored` leaves out exactly what
:func:`spec_fields` gives back.

The stored keys are an index kept per process (:class:`_Index`): each look-up parses only
the bytes appended since the last one, so the cost of a cell does not grow with the run
(a 5 000-row run re-read whole for every cell spent most of its time re-parsing).
:mod:`attnbench.store` writes the file; this module only reads it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_SCHEMA = 3  # the first schema whose lines store the spec's fields once, in ``cell``


def spec_fields(spec: Any) -> dict[str, Any]:
    """The row fields a stored cell's spec gives: the mechanism, its parameters and ``k``,
    n, dtype, device, workload and task, compiling, the batch asked for, the resolved
    ceiling, the model's shape, and the workload's settings (its ``mode_settings``). A spec
    not as this version writes it gives none (the line's own fields are then read alone)."""
    if not isinstance(spec, dict):
        return {}
    try:
        settings = {k: v for k, v in dict(spec["mode_settings"]).items() if isinstance(k, str)}
        own = {name: spec[name] for name in ("attention", "n", "dtype", "device", "k", "mode")}
        return {
            **settings,
            **own,
            "params": dict(spec["params"]),
            "task": spec["task"],
            "compile": spec["compile"],
            "compile_mode": spec["compile_mode"] if spec["compile"] is True else None,
            "batch_asked": spec["batch"],
            "ceiling_bytes": spec["ceiling_bytes"],
            "model": spec["model"],
        }
    except (KeyError, TypeError, ValueError):
        return {}


def flat(line: dict[str, Any]) -> dict[str, Any]:
    """A stored line as a flat row: a schema-3 line's fields from its spec put back (the
    line's own win); a line of an older schema as it is."""
    if line.get("schema") != SPEC_SCHEMA:
        return line
    return {**spec_fields(line.get("cell")), **line}


class CorruptLine(ValueError):
    """A line of ``cells.jsonl`` that is not a JSON row, with its 1-based number."""

    def __init__(self, path: Path, line_no: int, text: str, why: str = "not a JSON row") -> None:
        super().__init__(f"{path}:{line_no}: {why}: {text[:80]!r}")
        self.line_no = line_no


def _rows_in(
    path: Path, data: bytes, *, first: int = 1, strict: bool = True, as_stored: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) for the lines of ``data``, numbered from ``first``, each a
    flat row (:func:`flat`; ``as_stored``: the line as it is); see :func:`numbered_lines`
    (the index parses appended bytes with the same rules)."""
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
        yield i, row if as_stored else flat(row)


def numbered_lines(
    path: Path | str, *, strict: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, JSON object) for every line of a ``cells.jsonl`` (a path, or
    one given as text). A bad line (not JSON, not an object, not UTF-8) raises
    :class:`CorruptLine` naming its number; with ``strict=False`` only a final line without
    its newline (a writer killed mid-line) is tolerated and left out."""
    path = Path(path)
    if not path.exists():
        return
    yield from _rows_in(path, path.read_bytes(), strict=strict)


def read_rows(path: Path | str, *, strict: bool = True) -> list[dict[str, Any]]:
    """Every line of a ``cells.jsonl`` as a plain JSON object, a flat row (see
    :func:`numbered_lines`); :func:`attnbench.row.read` checks them against the schema."""
    return [row for _, row in numbered_lines(path, strict=strict)]


def stored_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a ``cells.jsonl`` as it is stored (schema 3's spec fields left
    out): what a rewrite of the file writes back unchanged."""
    if not path.exists():
        return []
    return [row for _, row in _rows_in(path, path.read_bytes(), strict=False, as_stored=True)]


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


_INDEXES: dict[tuple[str, Any], _Index] = {}
_INDEX_LOCK = threading.Lock()


Rekey = Callable[[dict[str, Any]], Any]  # a stored row -> the key it answers to today


def _own_key(row: dict[str, Any]) -> Any:
    return row.get("key")


def stored_keys(path: Path, rekey: Rekey = _own_key) -> set[Any]:
    """The key of every row of ``path`` (``rekey``: the one it answers to today; by default
    its stored ``key``), a final half-written line left out, as ``read_rows(strict=False)``
    does; reads only what was appended since the last call in this process, and the file
    whole again only when it was replaced or edited."""
    with _INDEX_LOCK:
        name = (os.path.abspath(path), rekey)
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
        keys = {rekey(row) for _, row in _rows_in(path, whole, first=index.lines + 1)}
        index.keys |= keys
        if whole:
            index.offset += len(whole)
            index.lines += whole.count(b"\n")
            index.last_line = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1 :]
        tail = _rows_in(path, rest, first=index.lines + 1, strict=False)
        return index.keys | {rekey(row) for _, row in tail}
