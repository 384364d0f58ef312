"""The row's schema, field by field: what each stored value may be.

:class:`attnbench.row.Row` says which fields a row has; this module says, for each, what a
stored value must be to be read — a type, a range, a finite number, an identifier — and
phrases the one line that refuses it. Kept apart from the record so that the rules can be
read (and extended by the training issue's fields) in one table, :data:`CHECKS`.
"""

from __future__ import annotations

import math
from typing import Any

from attnbench.checks import check_bool, check_choice, check_int, check_number
from attnbench.registry import DTYPES

STATUSES = ("ok", "oom", "skipped", "error")
# what a row measures: cost (time and memory: every row before issue #13), or a quality of
# the mechanism beside it (attnbench.quality.tasks)
TASKS = ("cost", "approx", "spectrum", "listops")
MEMORY_SOURCES = ("measured", "modeled")

# --- the schema, field by field ------------------------------------------------------------

# a message quotes the bad value; past this many characters it is cut (one readable line)
MESSAGE_CHARS = 300
# no run finished after the year 9999: datetime (the report's date) cannot show a later one
LAST_TIME = 253402300799.0


def shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one ``…``): an error line quotes
    values, and a hostile value can be a megabyte long."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _optional(check: Any) -> Any:
    def run(name: str, value: Any) -> None:
        if value is not None:
            check(name, value)

    return run


def _str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string, got {value!r}")


def _identifier(name: str, value: Any) -> None:
    """A mechanism, budget or parameter name: the registry registers only identifiers
    (``register``), so anything else cannot have been written by attnbench."""
    _str(name, value)
    if not value.isidentifier():
        raise ValueError(f"{name}: must be an identifier (a name like linformer), got {value!r}")


def _dict(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be an object, got {value!r}")


def _params(name: str, value: Any) -> None:
    """A mechanism's own parameters: names are config fields (identifiers); values are
    free (a plugin's may be anything JSON holds) and are only ever shown, escaped."""
    _dict(name, value)
    for key in value:
        if not key.isidentifier():
            raise ValueError(f"{name}: a parameter name must be an identifier, got {key!r}")


def _model(name: str, value: Any) -> None:
    """The model's shape: every entry a positive integer (``layers``, ``d_model``, ...)."""
    _dict(name, value)
    for key, v in value.items():
        if not key.isidentifier():
            raise ValueError(f"{name}: a field name must be an identifier, got {key!r}")
        _positive(f"{name}.{key}", v)


# the typed entries of ``env`` (attnbench.env.environment); other keys are kept as they are
ENV_CHECKS: dict[str, Any] = {
    "device_name": _str,
    "torch": _str,
    "cuda": _str,
    "attnbench": _str,
    "git_revision": _str,
    "python": _str,
}


def _env(name: str, value: Any) -> None:
    _dict(name, value)
    for key, v in value.items():
        if v is not None and key == "threads":
            _positive(f"{name}.{key}", v)
        elif v is not None and key in ENV_CHECKS:
            ENV_CHECKS[key](f"{name}.{key}", v)


def _count(name: str, value: Any, low: int = 0) -> None:
    check_int(name, value, low=low)
    if value >= 2**63:  # no figure is this large, and pandas' Int64 could not hold it
        raise ValueError(f"{name}: must be an integer below 2**63, got {value!r}")


def _positive(name: str, value: Any) -> None:
    _count(name, value, low=1)


def _seconds(name: str, value: Any, high: float | None = None) -> None:
    """A finite number >= 0. An integer too large for a float (10**400) is refused here:
    ``check_number``'s ``math.isfinite`` would raise ``OverflowError`` on it."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise ValueError(
                f"{name}: must be a number >= 0 that a float can hold, got {value!r}"
            ) from None
    check_number(name, value, low=0, high=high)


def _timestamp(name: str, value: Any) -> None:
    """Seconds since 1970 that a date can be made of (the report prints the day)."""
    _seconds(name, value, high=LAST_TIME)


def _samples(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{name}: must be a list of seconds, got {value!r}")
    for v in value:
        _seconds(name, v)


def _batch_asked(name: str, value: Any) -> None:
    if value != "max":
        _positive(name, value)


def _model_error(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) < value < 2**63:
        raise ValueError(f"{name}: must be an integer between -2**63 and 2**63, got {value!r}")


def _parts(name: str, value: Any) -> None:
    """``{"forward": {"median_s": .., "iqr_s": .., "samples_s": [..]}, ...}``."""
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a mapping of step parts, got {shorten(repr(value))}")
    for part, figures in value.items():
        _identifier(f"{name} part", part)
        if not isinstance(figures, dict) or set(figures) != {"median_s", "iqr_s", "samples_s"}:
            got = shorten(repr(figures))
            raise ValueError(f"{name}.{part}: must hold median_s, iqr_s and samples_s, got {got}")
        _seconds(f"{name}.{part}.median_s", figures["median_s"])
        _seconds(f"{name}.{part}.iqr_s", figures["iqr_s"])
        _samples(f"{name}.{part}.samples_s", figures["samples_s"])


def _quality(name: str, value: Any) -> None:
    """A quality task's figures: names are identifiers; values are numbers, text, lists or
    mappings of them as JSON holds them (a report shows them escaped); a number is finite."""
    _dict(name, value)
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


CHECKS: dict[str, Any] = {
    "schema": _count,
    "attention": _identifier,
    "n": _positive,
    "dtype": lambda n, v: check_choice(n, v, DTYPES),
    "device": _str,
    "params": _params,
    "k": _optional(_positive),
    "budget": _optional(_identifier),
    "mode": _str,
    "task": lambda n, v: check_choice(n, v, TASKS),
    "quality": _optional(_quality),
    "optimizer": _optional(_str),
    "checkpoint": _optional(check_bool),
    "batch_asked": _batch_asked,
    "ceiling_bytes": _optional(_positive),
    "overhead_bytes": _optional(_count),
    "model": _model,
    "status": _optional(lambda n, v: check_choice(n, v, STATUSES)),
    "reason": _optional(_str),
    "max_batch": _optional(_count),
    "batch": _optional(_count),
    "predicted_max_batch": _optional(_count),
    "probes": _optional(_count),
    "model_error": _optional(_model_error),
    "peak_bytes": _optional(_count),
    "peak_reserved_bytes": _optional(_count),
    "memory_source": _optional(lambda n, v: check_choice(n, v, MEMORY_SOURCES)),
    "time_median_s": _optional(_seconds),
    "time_iqr_s": _optional(_seconds),
    "repeats": _optional(_count),
    "time_per_seq_s": _optional(_seconds),
    "time_batch": _optional(_count),
    "time_device": _optional(_str),
    "time_dtype": _optional(_str),
    "time_method": _optional(_str),
    "time_samples_s": _optional(_samples),
    "flops": _optional(_count),
    "flops_backward": _optional(_count),
    "time_parts": _optional(_parts),
    "flops_per_s": _optional(_seconds),
    "pct_of_peak": _optional(_seconds),
    "env": _env,
    "key": _optional(_str),
    "sweep": _optional(_str),
    "wall_s": _optional(_seconds),
    "finished_at": _optional(_timestamp),
    "invocation": _optional(_str),
    "cell": _optional(_dict),
}
