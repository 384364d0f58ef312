"""The one validator style of attnbench: ``check_*(name, value, ...)`` returns the value or
raises one ``ValueError`` line, ``NAME: must be WHAT IS ALLOWED, got VALUE``.

Mechanism configs, cells, the keys of ``attnbench run``, the gate's ``check:`` settings and
the command-line flags all validate through these, so a user's typo reads the same wherever
it is caught and every caller turns it into exit code 2 the same way.
"""

from __future__ import annotations

import argparse
import math
import operator
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def check_int(name: str, value: Any, *, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int if it is one in ``[low, high]`` (numpy's integers too; never a
    bool or a float)."""
    original = value
    try:
        value = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name}: must be {allowed}, got {original!r}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """``value`` as a float if it is a finite real number in the range (ints too; never a
    bool, a string or NaN)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok:
        if low is not None and high is not None:
            left, right = "(" if open_low else "[", ")" if open_high else "]"
            allowed = f"a number in {left}{low:g}, {high:g}{right}"
        elif low is not None:
            allowed = f"a number {'>' if open_low else '>='} {low:g}"
        elif high is not None:
            allowed = f"a number {'<' if open_high else '<='} {high:g}"
        else:
            allowed = "a number"
        raise ValueError(f"{name}: must be {allowed}, got {value!r}")
    return float(value)


def check_limit(name: str, value: Any) -> float | None:
    """A time limit in seconds, or None for no limit: ``0`` and ``null`` both say "no limit"
    (0 the config's spelling, null the reader's), so every caller reads one rule."""
    if value is None:
        return None
    try:
        seconds = check_number(name, value, low=0)
    except ValueError:
        raise ValueError(
            f"{name}: must be a number of seconds >= 0 (0 or null: no limit), got {value!r}"
        ) from None
    return seconds or None


def check_choice(name: str, value: Any, allowed: Sequence[Any], what: str | None = None) -> Any:
    """``value`` if it is one of ``allowed``; ``what`` names the kind (``a mechanism``)."""
    if value not in allowed:
        listed = ", ".join(map(str, allowed))
        if what:
            raise ValueError(f"{name}: must be {what} ({listed}), got {value!r}")
        raise ValueError(f"{name}: must be one of {listed}; got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be true or false, got {value!r}")
    return value


def check_name(name: str, value: Any) -> str:
    """``value`` as a name that is one path component (a run or a sweep directory): an int
    or a non-empty string without a separator that does not start with a dot. ``..``, a
    ``/`` or an absolute path would put the run's files outside ``out_dir`` (or nest them);
    ``.`` or a hidden name would land on the sweep directory itself or on Hydra's ``.hydra``."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(text, str)
        or not text.strip()
        or text.startswith(".")
        or any(c in text for c in ("/", "\\", "\0"))
    ):
        raise ValueError(
            f"{name}: must be a name (one path component: no '/', not starting with '.'), "
            f"got {value!r}"
        )
    return text


# Linux's limits (bytes), for a file system whose own os.pathconf cannot say
NAME_MAX, PATH_MAX = 255, 4096
# beneath a run directory attnbench writes at most this deep: report/plots/<a slug of at most
# report.files.SLUG_CHARS + 9 bytes>-<what>.png, or Hydra's .hydra/<time>/<job number>
BELOW_RUN_DIR = 160


def fs_limits(path: Path) -> tuple[int, int]:
    """(longest name, longest path), in bytes, on the file system that ``path`` lands on,
    asked of its nearest existing ancestor; :data:`NAME_MAX`, :data:`PATH_MAX` where it
    cannot say."""
    where = Path(path).absolute()
    for q in (where, *where.parents):
        try:  # a name too long for the file system raises here too: ask its parent
            return os.pathconf(q, "PC_NAME_MAX"), os.pathconf(q, "PC_PATH_MAX")
        except (OSError, ValueError):
            continue
    return NAME_MAX, PATH_MAX


def check_fits(out_dir: str, names: dict[str, str], key: str = "out_dir") -> None:
    """``out_dir``/``names``... (a run directory: each name the key that sets it) fits the
    file system it lands on, checked before anything is created: each component of
    ``out_dir`` and each name within its longest name, and the whole, with what attnbench
    writes beneath it, within its longest path. Otherwise the first file written raises
    ``File name too long`` once Hydra has made its directories."""
    name_max, path_max = fs_limits(Path(out_dir))
    parts = [(key, part) for part in Path(out_dir).parts] + list(names.items())
    for owner, part in parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > name_max:
            shown = part if len(part) <= 40 else f"{part[:40]}..."
            raise ValueError(
                f"{owner}: a name must be at most {name_max} bytes on this file system, got "
                f"{size} bytes ({shown!r})"
            )
    whole = Path(out_dir).absolute().joinpath(*names.values())
    size = len(str(whole).encode("utf-8", "surrogateescape")) + BELOW_RUN_DIR
    if size > path_max:
        raise ValueError(
            f"{key}: the files written there would have paths of up to {size} bytes, over "
            f"this file system's limit of {path_max}; choose a shorter {', '.join([key, *names])}"
        )


def parse_path(name: str, text: str) -> Path:
    """A path that a command writes to (``--out``, ``--json``): not empty (an empty one
    would silently mean the current directory), and fitting its file system
    (:func:`check_fits`)."""
    if not text.strip():
        raise ValueError(f"{name}: must be a path, got {text!r}")
    check_fits(text, {}, key=name)
    return Path(text)


def parse_fraction(name: str, text: str) -> float:
    """``0.1`` or ``10%`` as a fraction in (0, 10)."""
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise ValueError(f"{name}: must be a fraction like 0.1 or 10%, got {text!r}") from None
    if not 0 < value < 10:
        raise ValueError(f"{name}: must be a fraction like 0.1 or 10%, got {text!r}")
    return value


def parse_int(name: str, text: str, *, low: int = 1) -> int:
    """An integer flag from the command line; the message quotes what was typed."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"{name}: must be an integer >= {low}, got {text!r}")
    return value


def argtype(check: Callable[[str, str], T], name: str) -> Callable[[str], T]:
    """An argparse ``type=`` from a checker: argparse prints the checker's own line."""

    def parse(text: str) -> T:
        try:
            return check(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None

    parse.__name__ = name
    return parse


SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(value: Any) -> int | None:
    """Bytes from ``16GB`` (10⁹), ``15.5GiB`` (2³⁰) or a plain number; None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = SIZE.match(str(value))
    if not m:
        raise ValueError(
            f"ceiling: must be a number of bytes or a size like 16GB or 15.5GiB, got {value!r}"
        )
    return int(float(m.group(1)) * UNITS[(m.group(2) or "b").lower()])
