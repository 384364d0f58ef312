"""A setting is declared once, by its owner, as a :class:`Setting`.

The owners are the model (``model.*``), timing (``timing.*``), compiling, the allocator,
each workload (``mode=train``'s optimizer) and each quality task (``quality.<task>.*``). From
one declaration come:

* the Hydra default: :func:`yaml_block` writes the generated part of conf/config.yaml
  (``python -m attnbench.settings`` prints it) and a test holds the file equal to it; the
  model's come from the ``model: base`` group, which a test holds equal too;
* its check, one ``ValueError`` line naming the key (:meth:`Setting.validate`);
* whether it enters the cell's key (``in_key``);
* a workload's setting's row field (:func:`attnbench.row.fields.setting_field`);
* the docs table of settings (:func:`markdown_table`, in docs/settings.md, test-held).

A cell carries the settings of the model and timing in parts of their own (``Cell.model``,
``Cell.timing``), compiling's as its own fields, and a workload's or a task's as that
owner's part (``Cell.workload``, ``Cell.task``), so a new workload setting is a line in that
workload's module.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from attnbench.validators import check_bool, check_choice, check_int, check_number

# torch.compile's modes (torch.compile's docstring); reduce-overhead adds CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Setting:
    """One setting. ``key`` is what a user writes (``timing.min_repeats``; a workload's and
    a task's are named from their owner when registered); ``check(key, value)`` raises one
    ``ValueError`` line (None: the owner's rules check it, as a task's cross-setting ones);
    ``in_key``: two values are two cells (timing's are not: they say how long, not what);
    ``carried``: not a config key, filled in by the sweep (a task's trained model's block)."""

    name: str
    default: Any
    doc: str
    type: Any = None
    check: Callable[[str, Any], Any] | None = None
    unit: str = ""
    key: str = ""
    owner: str = ""
    in_key: bool = True
    carried: bool = False

    def validate(self, value: Any, key: str | None = None) -> Any:
        """``value`` checked under its key: one ``ValueError`` line, ``KEY: must be ...``."""
        return self.check(key or self.key or self.name, value) if self.check else value

    def owned(self, owner: str, prefix: str = "") -> Setting:
        """This declaration as ``owner``'s, its key under ``prefix`` (``quality.mqar.``)."""
        return replace(self, owner=owner, key=f"{prefix}{self.name}")

    def type_text(self) -> str:
        """The type as the docs say it: ``int or null``."""
        t = self.type if self.type is not None else type(self.default)
        args = typing.get_args(t) if isinstance(t, types.UnionType) else (t,)
        return " or ".join(
            "null" if a is type(None) else getattr(a, "__name__", "any") for a in args
        )


# -- checks in the validator style, as closures a declaration holds -----------------------------


def integer(low: int = 1) -> Callable[[str, Any], int]:
    return functools.partial(check_int, low=low)


def optional_integer(name: str, value: Any) -> int | None:
    return None if value is None else check_int(name, value)


def number(low: float = 0, open_low: bool = False) -> Callable[[str, Any], float]:
    return functools.partial(check_number, low=low, open_low=open_low)


def choice(allowed: Sequence[Any]) -> Callable[[str, Any], Any]:
    return functools.partial(check_choice, allowed=tuple(allowed))


flag = check_bool


# -- the model's, timing's and compiling's: fields of every cell -------------------------------


def _optional_text(name: str, value: Any) -> str | None:
    """Text or null (a schedule's pattern is parsed where it is used: attnbench.schedule)."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name}: must be text or null, got {value!r}")
    return value


def model_name(name: str, value: Any) -> str | None:
    """A word of letters, digits, ``_``, ``-`` and ``.`` (a report's column label; ``X_twin``
    names X's twin), or null."""
    if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
        raise ValueError(
            f"{name}: must be a word of letters, digits, _, - and . (at most 64), got {value!r}"
        )
    return value


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

MODEL: tuple[Setting, ...] = tuple(
    s.owned("model", "model.")
    for s in (
        Setting("layers", 12, "encoder layers", int, integer()),
        Setting("d_model", 768, "model width", int, integer()),
        Setting("n_heads", 12, "attention heads", int, integer()),
        Setting("d_ff", 3072, "feed-forward width", int, integer()),
        Setting("kv_heads", None, "grouped-query key/value heads; null: n_heads", int | None,
                optional_integer),
        Setting("head_dim", None, "each attention head's width; null: d_model / n_heads",
                int | None, optional_integer),
        Setting("schedule", None, "which mechanism each layer runs: a pattern of kinds, as"
                " `(3*linear, attention)` (docs/models.md); null: every layer attention=",
                str | None, _optional_text),
        Setting("name", None, "the model's name, the label a report gives its column (an"
                " `arch=` preset sets it; docs/models.md); null: none", str | None,
                model_name),
    )
)  # fmt: skip

TIMING: tuple[Setting, ...] = tuple(
    s.owned("timing", "timing.")
    for s in (
        Setting("min_repeats", 5, "samples at least", int, integer(), in_key=False),
        Setting("min_seconds", 1.0, "seconds of samples at least", float, number(), "s",
                in_key=False),
        Setting("cpu_batch", 1, "without the preset's GPU: the batch timed on this CPU", int,
                integer(), in_key=False),
        Setting("time_budget_s", 30.0, "without the preset's GPU: a cell whose estimated"
                " timing exceeds this is stored with its time skipped", float,
                number(open_low=True), "s", in_key=False),
        Setting("flush_l2", False, "flush the GPU's L2 cache before each sample", bool, flag,
                in_key=False),
        Setting("threads", None, "CPU timing threads; null: the CPUs this process was given"
                " (affinity, SLURM_CPUS_PER_TASK); more than those is refused; a count asked"
                " for enters the key", int | None, optional_integer),
    )
)  # fmt: skip

COMPILE: tuple[Setting, ...] = tuple(
    s.owned("compile")
    for s in (
        Setting("compile", False, "torch.compile each encoder layer, compiled before anything"
                " is timed", bool, flag),
        Setting("compile_mode", "default", "torch.compile's mode (compile=true only)", str,
                choice(COMPILE_MODES)),
    )
)  # fmt: skip


def _allocator_text(name: str, value: Any) -> str:
    """A word or a ``PYTORCH_CUDA_ALLOC_CONF`` string; what it may say is checked with the
    cell (:func:`attnbench.cell_rules.check_settings`), by the replay's own parser."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: must be default, expandable or a PYTORCH_CUDA_ALLOC_CONF"
                         f" string (max_split_size_mb:256), got {value!r}")  # fmt: skip
    return value


ALLOCATOR: tuple[Setting, ...] = tuple(
    s.owned("allocator")
    for s in (
        Setting("allocator", "default", "PyTorch's CUDA caching allocator, as the max batch is"
                " found under it (replayed where no GPU runs the cell, set for its process"
                " where one does): `default`, `expandable` (`expandable_segments:True`) or a"
                " `PYTORCH_CUDA_ALLOC_CONF` string (`max_split_size_mb:256`)", str,
                _allocator_text),
    )
)  # fmt: skip
# cell fields beyond its own part that say what it measures, in the key where not default
OPTIONS: tuple[Setting, ...] = (*TIMING, *COMPILE, *ALLOCATOR)

CELL_FIELDS: tuple[Setting, ...] = (*MODEL, *OPTIONS)


def defaults(settings: Iterable[Setting]) -> dict[str, Any]:
    """Each declared setting's default by name (a carried one has none)."""
    return {s.name: s.default for s in settings if not s.carried}


DEFAULTS = defaults(CELL_FIELDS)
# the paper's workload (a forward) and "no quality task": what a cell measures where it names
# neither. Declared here, below the workloads and tasks, so that a cell carries the names
# without knowing any workload or task (attnbench.workload and attnbench.quality own them)
DEFAULT_MODE = "inference"
COST = "cost"


def resolve(
    owner: str, declared: Sequence[Setting], given: Iterable[tuple[str, Any]]
) -> dict[str, Any]:
    """``given`` over the declared defaults; a name not declared is one line naming those
    that are (a typo never passes silently)."""
    names = [s.name for s in declared]
    out = defaults(declared)
    for name, value in given:
        if name not in names:
            allowed = ", ".join(names) or "none"
            raise ValueError(f"{name}: not a setting of {owner} (its settings: {allowed})")
        out[name] = value
    return out


# -- what comes from the declarations ------------------------------------------------------------


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and "e" in repr(value) and "." not in repr(value):
        mantissa, exponent = repr(value).split("e")  # YAML 1.1 reads 1e-05 as a string
        return f"{mantissa}.0e{exponent}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def yaml_block(settings: Sequence[Setting], notes: dict[str, str] | None = None) -> str:
    """The settings as conf/config.yaml holds them: ``key: default  # doc``, nested by the
    key's dots, in declaration order (a carried setting is no key); ``notes`` comment the
    blocks that hold them (``quality.mqar``: the task's doc)."""
    notes = notes or {}
    lines: list[str] = []
    opened: list[str] = []
    for s in settings:
        if s.carried:
            continue
        *path, leaf = s.key.split(".")
        common = 0
        while common < min(len(path), len(opened)) and path[common] == opened[common]:
            common += 1
        opened = opened[:common]
        for part in path[common:]:
            note = notes.get(".".join([*opened, part]))
            lines.append(f"{'  ' * len(opened)}{part}:" + (f"  # {note}" if note else ""))
            opened.append(part)
        doc = f"{s.owner}: {s.doc}" if s.owner.startswith("mode=") else s.doc
        lines.append(f"{'  ' * len(opened)}{leaf}: {_yaml(s.default)}  # {doc}")
    return "\n".join(lines) + "\n"


def markdown_table(settings: Sequence[Setting]) -> str:
    """The settings as docs/settings.md shows them."""
    lines = [
        "| key | owner | type | default | unit | in the key | meaning |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in settings:
        default = "(its trained model's)" if s.carried else f"`{_yaml(s.default)}`"
        lines.append(
            f"| `{s.key}` | {s.owner} | {s.type_text()} | {default} | "
            f"{s.unit} | {'yes' if s.in_key else 'no'} | {s.doc} |"
        )
    return "\n".join(lines)
