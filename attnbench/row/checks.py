"""The checks a stored row's values are read with, one per kind of value.

:data:`attnbench.row.fields.FIELDS` names one for each field; each takes the field's name and
the value and raises ``ValueError`` with the one line that refuses it, the value quoted and
cut short (:func:`shorten`). They live apart from the table so that the schema reads as one
declaration.
"""

from __future__ import annotations

import math
from typing import Any

from attnbench.measure import contention as contention_keys
from attnbench.quality import tasks
from attnbench.settings import model_name
from attnbench.validators import check_bool, check_int, check_number

# the typed entries of ``env`` (attnbench.env.environment); other keys are kept as they are
ENV_FIELDS = {
    "device_name": str,
    "torch": str,
    "cuda": str,
    "attnbench": str,
    "git_revision": str,
    "threads": int,
    "cpus": int,
    "python": str,
    "tf32_matmul": bool,
    "tf32_cudnn": bool,
    "triton_fp32_dot": str,
}
# a message quotes the bad value; past this many characters it is cut (one readable line)
MESSAGE_CHARS = 300
# no run finished after the year 9999: datetime (the report's date) cannot show a later one
LAST_TIME = 253402300799.0


def shorten(text: str, limit: int = MESSAGE_CHARS, whole: int | None = None) -> str:
    """``text`` in at most ``limit`` characters: past it, cut and marked with how long the
    whole was (``whole``, where ``text`` is already part of it), ``LLL… (100000 characters
    in all)``. An error line or a report quotes values, and a hostile value can be a
    megabyte long: the mark tells a reader that the rest is in the data, not gone."""
    if len(text) <= limit and whole is None:
        return text
    mark = f"… ({len(text) if whole is None else whole} characters in all)"
    return text[: max(limit - len(mark), 0)] + mark


# --- the checks ------------------------------------------------------------------------------


def text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string, got {value!r}")


def identifier(name: str, value: Any) -> None:
    """A mechanism, budget or parameter name: the registry registers only identifiers
    (``register``), so anything else cannot have been written by attnbench."""
    text(name, value)
    if not value.isidentifier():
        raise ValueError(f"{name}: must be an identifier (a name like linformer), got {value!r}")


def mapping(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be an object, got {value!r}")


def params(name: str, value: Any) -> None:
    """A mechanism's own parameters: names are config fields (identifiers); values are
    free (a plugin's may be anything JSON holds) and are only ever shown, escaped."""
    mapping(name, value)
    for key in value:
        if not key.isidentifier():
            raise ValueError(f"{name}: a parameter name must be an identifier, got {key!r}")


def model(name: str, value: Any) -> None:
    """The model's shape: every entry a positive integer (``layers``, ``d_model``, ...) but
    a layer schedule's, one line of text (:func:`attnbench.schedule.canonical`), and a name."""
    mapping(name, value)
    for key, v in value.items():
        if not key.isidentifier():
            raise ValueError(f"{name}: a field name must be an identifier, got {key!r}")
        if key == "schedule":
            text(f"{name}.{key}", v)
        elif key == "name":  # the rule model.name= is held to: a word (a column label)
            model_name(f"{name}.{key}", v)
        else:
            positive(f"{name}.{key}", v)


def env(name: str, value: Any) -> None:
    mapping(name, value)
    for key, v in value.items():
        if v is not None and ENV_FIELDS.get(key) is int:
            positive(f"{name}.{key}", v)
        elif v is not None and ENV_FIELDS.get(key) is bool:
            check_bool(f"{name}.{key}", v)
        elif v is not None and key in ENV_FIELDS:
            text(f"{name}.{key}", v)


def count(name: str, value: Any, low: int = 0) -> None:
    check_int(name, value, low=low)
    if value >= 2**63:  # no figure is this large, and pandas' Int64 could not hold it
        raise ValueError(f"{name}: must be an integer below 2**63, got {value!r}")


def positive(name: str, value: Any) -> None:
    count(name, value, low=1)


def number(name: str, value: Any, low: float | None = 0, high: float | None = None) -> None:
    """A finite number in [low, high]. An integer too large for a float (10**400) is refused
    here: ``check_number``'s ``math.isfinite`` would raise ``OverflowError`` on it."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            least = "" if low is None else f" >= {low:g}"
            raise ValueError(
                f"{name}: must be a number{least} that a float can hold, got {value!r}"
            ) from None
    check_number(name, value, low=low, high=high)


def seconds(name: str, value: Any, high: float | None = None) -> None:
    """A finite number >= 0 (at most ``high``)."""
    number(name, value, high=high)


def share(name: str, value: Any) -> None:
    """A part of a whole: a number in [0, 1]."""
    number(name, value, high=1)


def timestamp(name: str, value: Any) -> None:
    """Seconds since 1970 that a date can be made of (the report prints the day)."""
    seconds(name, value, high=LAST_TIME)


def samples(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{name}: must be a list of seconds, got {value!r}")
    for v in value:
        seconds(name, v)


def batch_asked(name: str, value: Any) -> None:
    if value != "max":
        positive(name, value)


def model_error(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) < value < 2**63:
        raise ValueError(f"{name}: must be an integer between -2**63 and 2**63, got {value!r}")


def parts(name: str, value: Any) -> None:
    """``{"forward": {"median_s": .., "iqr_s": .., "samples_s": [..]}, ...}``."""
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a mapping of step parts, got {shorten(repr(value))}")
    for part, figures in value.items():
        identifier(f"{name} part", part)
        if not isinstance(figures, dict) or set(figures) != {"median_s", "iqr_s", "samples_s"}:
            got = shorten(repr(figures))
            raise ValueError(f"{name}.{part}: must hold median_s, iqr_s and samples_s, got {got}")
        seconds(f"{name}.{part}.median_s", figures["median_s"])
        seconds(f"{name}.{part}.iqr_s", figures["iqr_s"])
        samples(f"{name}.{part}.samples_s", figures["samples_s"])


def contention(name: str, value: Any) -> None:
    """How contended the CPU was while a row was timed; ``busy`` decides whether a report
    shows its time, so it must be a bool, and the shares finite numbers."""
    mapping(name, value)
    for key, v in value.items():
        where = f"{name}.{key}"
        if key not in contention_keys.FIELDS:
            raise ValueError(f"{where}: unknown; allowed: {', '.join(contention_keys.FIELDS)}")
        if key == "busy" and not isinstance(v, bool):
            raise ValueError(f"{where}: must be true or false, got {shorten(repr(v))}")
        if key == "contended" or (key == contention_keys.GPU_OTHERS and v is not None):
            count(where, v)
        elif key == "dropped_s":
            samples(where, v)
        elif key == "why":
            text(where, v)
        elif key in ("delay", "cpu_share", "load") and v is not None:
            seconds(where, v)


def json_value(name: str, value: Any) -> None:
    """Numbers, text, lists or mappings of them as JSON holds them (a report shows them
    escaped): names are identifiers, a number is finite."""
    stack = [(name, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise ValueError(f"{where}: a name must be an identifier, got {key!r}")
                stack.append((f"{where}.{key}", item))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}: must be a finite number, got {v!r}")
        elif v is not None and not isinstance(v, (str, int, float)):
            raise ValueError(f"{where}: must be a JSON value, got {shorten(repr(v))}")


def lengths(name: str, value: Any) -> None:
    """A draw's lengths: a non-empty list of positive counts."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{name}: must be a non-empty list, got {shorten(repr(value))}")
    for i, n in enumerate(value):
        count(f"{name}[{i}]", n, low=1)


def cell_spec(name: str, value: Any) -> None:
    """The cell a row stores (:class:`attnbench.cell.Cell` as JSON), read as it is but for
    what a report reads back: a quality row's settings (the seed, MQAR's pairs, the setup
    rows are grouped by), [setting, value] pairs, each of its task's declared setting's kind
    (an integer where the default is one, a list where it is a list; one this version does
    not declare a number, text or flag)."""
    mapping(name, value)
    pairs, where = value.get("quality", []), f"{name}.quality"
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs
    ):
        got = shorten(repr(pairs))
        raise ValueError(f"{where}: must be a list of [setting, value] pairs, got {got}")
    task = tasks.REGISTRY.get(value["task"]) if isinstance(value.get("task"), str) else None
    if task is None:  # cost, or a plugin's task not loaded here: no report reads them
        return
    declared = {s.name: s.default for s in task.settings}
    for key, v in pairs:
        at, default = f"{where}.{key}", declared.get(key)
        if key in declared and (default is None or isinstance(default, (list, tuple))):
            if not isinstance(v, list):  # a list (MQAR's lrs), or a carried block of pairs
                raise ValueError(f"{at}: must be a list, got {shorten(repr(v))}")
        elif isinstance(default, int) and not isinstance(default, bool):
            count(at, v)
        elif isinstance(default, float):
            number(at, v, low=None)
        elif isinstance(v, (dict, list)) or (default is not None and type(v) is not type(default)):
            kind = type(default).__name__ if default is not None else "number, text or flag"
            raise ValueError(f"{at}: must be a {kind}, got {shorten(repr(v))}")


def quality(name: str, value: Any) -> None:
    """A quality task's figures: any JSON (:func:`json_value`); those its task declares are
    checked again with the row's task (:func:`attnbench.quality.tasks.check_figures`)."""
    mapping(name, value)
    json_value(name, value)
