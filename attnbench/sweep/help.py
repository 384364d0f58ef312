"""The keys ``attnbench run --help`` lists, with the values each takes, from their owners.

The help's template (``hydra.help.footer`` in conf/config.yaml) calls the resolver
:data:`RESOLVER` where the keys go, so that every choice it lists is the one that owns it:
the workloads registered (``mode``, plugins' too), the quality tasks (``task``), the dtypes,
each workload's settings and compiling's, with their choices as their checks declare them.
A list typed into the YAML left out ``mode=packed`` and ``packed_train`` when they came.
"""

from __future__ import annotations

import functools

from omegaconf import OmegaConf

from attnbench import settings, workload
from attnbench.measure.presets import DTYPE_NAMES
from attnbench.quality import tasks
from attnbench.settings import Setting
from attnbench.validators import check_bool, check_choice

RESOLVER = "attnbench_keys"  # ${attnbench_keys:} in the help's footer
WIDTH = 88  # the help's lines, as its header's
# a value's type as the help says it
SHOWN = {"int": "N", "float": "X", "str": "TEXT", "tuple": "[N, ...]", "null": "null"}


def values(s: Setting) -> str:
    """What ``s`` takes: its choices (``adamw|sgd|none``) where its check declares them,
    ``true|false`` for a flag, else its type (``N``, ``[N, ...] or null``)."""
    check = s.check
    if isinstance(check, functools.partial) and check.func is check_choice:
        return "|".join(map(str, check.keywords["allowed"]))
    if check is check_bool or s.type is bool:
        return "true|false"
    return " or ".join(SHOWN.get(t, t) for t in s.type_text().split(" or "))


def keys_text() -> str:
    """The help's ``Keys:`` lines: the cell's own keys, then every registered workload's
    settings and compiling's, each with :func:`values`."""
    declared = workload.workload_settings([workload.get(n) for n in workload.names()])
    keys = [
        "n",
        "k",
        "batch (max|N)",
        f"dtype ({'|'.join(DTYPE_NAMES)})",
        "causal (true|false)",
        f"task ({'|'.join(tasks.names())})",
        "quality.*",
        f"mode ({'|'.join(workload.names())})",
        *(
            f"{s.key or s.name} ({values(s)})"
            for s in (*declared, *settings.COMPILE, *settings.ALLOCATOR)
        ),
        "ceiling (bytes or 16GB)",
        "out_dir,",
    ]
    return wrap(["Keys:", *(f"{k}," for k in keys[:-1]), keys[-1]])


def wrap(words: list[str]) -> str:
    """``words`` on lines of at most :data:`WIDTH` characters, none split (a key and its
    values stay on one line), joined by spaces."""
    lines = [words[0]]
    for w in words[1:]:
        if len(lines[-1]) + 1 + len(w) > WIDTH:
            lines.append(w)
        else:
            lines[-1] += " " + w
    return "\n".join(lines)


def register() -> None:
    """Make :data:`RESOLVER` known to OmegaConf (again: a plugin loaded since may have added
    a workload or a task, and the text is made when the help asks for it)."""
    OmegaConf.register_new_resolver(RESOLVER, keys_text, replace=True, use_cache=False)
