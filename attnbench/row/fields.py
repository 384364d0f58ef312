"""The row's schema, declared once: :data:`FIELDS`, a table of :class:`Field` entries.

From the table come the :class:`attnbench.row.Row` record's fields (name, type, default),
the check reading applies to each stored value (:func:`attnbench.row.read`; the checks are in
:mod:`attnbench.row.checks`: a type, a range, a finite number, an identifier, one of a few
choices; the one line that refuses it), what a field not stored reads as, the pandas column
of :func:`attnbench.load`, and the schema table of docs/architecture.md
(:func:`markdown_table`; a test keeps the page in step). A quality task's figures are
declared by the task (:mod:`attnbench.quality.tasks`) and checked here too.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.quality.tasks import TASKS
from attnbench.registry import DTYPES
from attnbench.row.checks import (
    batch_asked,
    cell_spec,
    contention,
    count,
    env,
    identifier,
    model,
    model_error,
    number,
    params,
    parts,
    positive,
    quality,
    samples,
    seconds,
    text,
    timestamp,
)
from attnbench.row.nested import decode, modeled_step, packed, prompts
from attnbench.settings import Setting
from attnbench.validators import check_bool, check_choice
from attnbench.workload import BUILTIN_WORKLOADS, workload_settings
from attnbench.workload import get as get_workload
from attnbench.workload import names as workload_names

__all__ = ["FIELDS", "MEMORY_SOURCES", "SCHEMA", "STATUSES", "TASKS", "Field"]

SCHEMA = 3  # attnbench.store_read.SPEC_SCHEMA: its lines store the spec once
STATUSES = ("ok", "oom", "skipped", "error")
MEMORY_SOURCES = ("measured", "modeled", "profiled")
REQUIRED = object()  # the default of a field every stored row must have


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One stored field. ``check`` refuses a bad stored value (None is allowed where the
    type allows it; ``choices`` add a check_choice); ``missing`` is what a row that does not
    store it reads as (None: unknown, never a made-up 0 or ``ok``); ``column`` overrides the
    pandas column the type gives (``seen``: a categorical of the values found, ``category``:
    one of ``choices``, ``nested``: a column per key)."""

    name: str
    type: Any
    check: Callable[[str, Any], None] | None
    unit: str
    group: str
    doc: str
    default: Any = None
    missing: Any = None
    choices: tuple[str, ...] = ()
    column: str | None = None

    def read_check(self, name: str, value: Any) -> None:
        if value is None and type(None) in typing.get_args(self.type):
            return
        if self.choices:
            check_choice(name, value, self.choices)
        if self.check is not None:
            self.check(name, value)

    def type_text(self) -> str:
        """The type as the docs say it: ``int or null``, ``object``, ``list of float``."""
        union = isinstance(self.type, types.UnionType)
        return " or ".join(
            _type_text(t) for t in (typing.get_args(self.type) if union else (self.type,))
        )


def _type_text(t: Any) -> str:
    origin = typing.get_origin(t)
    if t is type(None):
        return "null"
    if origin is dict or t is dict:
        return "object"
    if origin is list:
        return f"list of {typing.get_args(t)[0].__name__}"
    return t.__name__


def _f(name: str, type_: Any, check: Any, unit: str, group: str, doc: str, **kw: Any) -> Field:
    return Field(name, type_, check, unit, group, doc, **kw)


def setting_field(s: Setting) -> Field:
    """A workload's declared setting as the row field it is stored in: null in the rows of
    other workloads, checked on reading by the setting's own check."""
    doc = f"{s.owner.removeprefix('mode=')} rows: {s.doc}"
    return Field(s.name, s.type | None, s.check, s.unit, "cell", doc)


# the schema: every field a row has, in the order a row stores it (``schema`` is moved first)
FIELDS: tuple[Field, ...] = (
    _f("attention", str, identifier, "", "cell", "the mechanism", default=REQUIRED, column="seen"),
    _f("n", int, positive, "", "cell", "sequence length", default=REQUIRED),
    _f("dtype", str, None, "", "cell", "the cell's dtype", default=REQUIRED, choices=DTYPES,
       column="seen"),
    _f("device", str, text, "", "cell", "the cell's device preset", default=REQUIRED,
       column="seen"),
    _f("params", dict[str, Any], params, "", "cell", "the mechanism's own parameters",
       default={}, missing={}, column="nested"),
    _f("k", int | None, positive, "", "cell", "the budget's value"),
    _f("budget", str | None, identifier, "", "cell",
       "the name of the parameter k sets (`k`, `nb_features`)"),
    _f("mode", str, text, "", "cell", "the workload: `inference`, `train`, `decode`, `packed` or"
       " `packed_train`", default="inference",
       missing="inference", column="seen"),
    _f("task", str, identifier, "", "cell", "`cost`, or the quality task whose figures `quality`"
       " holds (a plugin's too)", default="cost", missing="cost"),
    *(setting_field(s) for s in workload_settings(BUILTIN_WORKLOADS)),
    _f("compile", bool, check_bool, "", "cell", "the cell's layers were compiled"
       " (`torch.compile`, each encoder layer)", default=False, missing=False),
    _f("compile_mode", str | None, text, "", "cell", "compiled rows: torch.compile's mode"),
    _f("allocator", str | None, text, "", "cell", "the CUDA caching allocator's settings the max"
       " batch was found under (`default`, `expandable` or a `PYTORCH_CUDA_ALLOC_CONF` string);"
       " null: stored before the replay, its modeled max batch allocation-only"),
    _f("batch_asked", int | str, batch_asked, "", "cell", "the batch the cell asked: `max` or a"
       " number", default="max", missing="max", column="string"),
    _f("ceiling_bytes", int | None, positive, "bytes", "cell", "the resolved memory ceiling"),
    _f("overhead_bytes", int | None, count, "bytes", "cell", "the preset's fixed overhead"),
    _f("model", dict[str, int | str], model, "", "cell", "layers, d_model, n_heads, d_ff;"
       " kv_heads, head_dim and a layer schedule (one line) where asked", default={},
       missing={}, column="nested"),
    _f("status", str | None, None, "", "outcome", "`ok`, `oom`, `skipped` or `error`",
       default="ok", choices=STATUSES, column="category"),
    _f("reason", str | None, text, "", "outcome", "why it is not ok, or a note on it"),
    _f("max_batch", int | None, count, "", "memory", "the largest batch under the ceiling"),
    _f("batch", int | None, count, "", "memory", "the batch the memory figures were taken at"),
    _f("predicted_max_batch", int | None, count, "", "memory", "the modeled max batch: the"
       " largest whose allocations the caching allocator, replayed, serves under the ceiling"
       " (decode: allocation-only)"),
    _f("allocated_max_batch", int | None, count, "", "memory", "the largest batch whose live"
       " bytes fit under the ceiling, fragmentation aside (allocation-only)"),
    _f("probes", int | None, count, "", "memory", "real probes (CUDA) confirming it", default=0),
    _f("model_error", int | None, model_error, "", "memory", "prediction less the max batch"),
    _f("peak_bytes", int | None, count, "bytes", "memory", "peak allocated memory at `batch`"),
    _f("peak_reserved_bytes", int | None, count, "bytes", "memory", "peak reserved memory at"
       " `batch`: measured on CUDA, replayed where memory is modeled"),
    _f("fragmentation", float | None, number, "", "memory", "modeled rows: reserved over"
       " allocated, less 1, at the replay's reserved peak"),
    _f("state_bytes", int | None, count, "bytes", "memory", "decode rows: the cache or state"
       " one sequence keeps at n + decode_tokens, every layer (the mechanisms' one formula)"),
    _f("eager_peak_bytes", int | None, count, "bytes", "memory", "compiled rows on a CPU: the"
       " eager step's peak at `batch`, by the same instrument as `peak_bytes` (the profiler)"),
    _f("memory_source", str | None, None, "", "memory", "`measured` (CUDA), `modeled` (the"
       " eager graph on meta) or `profiled` (a compiled step on a CPU, the profiler's peak)",
       choices=MEMORY_SOURCES, column="category"),
    _f("time_median_s", float | None, seconds, "s", "time", "median time of a forward (step)"),
    _f("time_iqr_s", float | None, seconds, "s", "time", "its interquartile range"),
    _f("repeats", int | None, count, "", "time", "samples taken", default=0),
    _f("time_per_seq_s", float | None, seconds, "s", "time", "time per sequence"),
    _f("time_batch", int | None, count, "", "time", "the batch it was timed at"),
    _f("time_device", str | None, text, "", "time", "where it was timed", column="seen"),
    _f("time_dtype", str | None, text, "", "time", "the dtype it was timed in"),
    _f("time_method", str | None, text, "", "time", "how it was timed"),
    _f("time_samples_s", list[float] | None, samples, "s", "time", "the samples the figure is"
       " made of (contended ones not kept are in `contention.dropped_s`)"),
    _f("flops", int | None, count, "FLOP", "time", "forward matmul FLOPs per sequence (decode"
       " rows: per generated token)"),
    _f("flops_backward", int | None, count, "FLOP", "time", "train rows: backward FLOPs per"
       " sequence"),
    _f("flops_dense", int | None, count, "FLOP", "time", "where the kernel skips blocks (flex):"
       " the forward's FLOPs per sequence as dense attention computes them; `flops` is what"
       " the block-sparse kernel computes"),
    _f("attention_params", int | None, count, "", "time", "the model's attention weights,"
       " every layer (projections and the mechanism's own: gates, decays, convolutions,"
       " norms; a weight shared by layers counted once)"),
    _f("compiled", str | None, text, "", "time", "what ran compiled: `layers` (compile=true),"
       " `kernel` (a mechanism that compiles its own kernel whatever compile says: flex), or"
       " null (eager)"),
    _f("compile_s", float | None, seconds, "s", "time", "compiled rows: the first call at the"
       " timed batch, compilation included, before anything was timed"),
    _f("compilations", int | None, count, "", "time", "compiled rows: graphs compiled for the"
       " cell (a recompilation while timing is an error row, never a figure)"),
    _f("warmup_s", float | None, seconds, "s", "time", "GPU rows whose kernels autotune or"
       " compile at each new batch (`kernel=fla`, compiled code): the seconds of the one"
       " unmeasured step run at each batch before its probe and before the measurement,"
       " outside the memory cap and the timing, summed (a compiled cell's compile at the"
       " timed batch is `compile_s`)"),
    _f("mask_build_s", float | None, seconds, "s", "time", "flex rows: this cell's building of"
       " the block mask, before compiling (masks are cached per (n, pattern) in a process: 0"
       " where an earlier cell built it)"),
    _f("time_parts", dict[str, dict[str, Any]] | None, parts, "s", "time", "train rows:"
       " `forward`, `backward`, `optimizer`, each `median_s`, `iqr_s`, `samples_s`; their"
       " per-repeat sum is `time_samples_s`"),
    _f("contention", dict[str, Any] | None, contention, "", "time", "the CPU while timing:"
       " `delay` (median run-queue delay share of the samples kept), `cpu_share` (CPU time ÷"
       " wall × threads), `contended` (repeats over 10 % delay), `dropped_s` (those not kept),"
       " `load`, `busy` (true: the"
       " time is no figure: kept out of ratios, efficiency lengths and plots), `why`; CUDA"
       " rows: `gpu_others_bytes` (GPU memory not held by torch's allocator: other processes"
       " and the CUDA context)", column="nested"),
    _f("decode", dict[str, Any] | None, decode, "", "time", "decode rows: `prefill_s`,"
       " `prefill_iqr_s`, `prefill_samples_s` (one sequence's prompt; null where `filled_by`"
       " is `random`: a CPU could not prefill within time_budget_s and timed the steps over"
       " random states),"
       " `prefill_chunk`, `steps`"
       " timed, `context` (mean positions a timed step reads, left padding included),"
       " `own_context`, `own_state_read_bytes` (contexts=drawn: the sequences' own),"
       " `tokens_per_s`, `read_bytes` (what a"
       " step must read: caches or states and weights), `state_read_bytes`, `bytes_per_s`"
       " (achieved), `copy_bytes_per_s` (the device's copy bandwidth, same process),"
       " `timed_state_dtype`; the row's time is a decode step's (per sequence: per token)",
       column="nested"),
    _f("modeled_step", dict[str, Any] | None, modeled_step, "", "time", "decode rows on a"
       " preset with a bandwidth: a step of `batch` sequences (the max batch, or the asked one)"
       " at the timed steps' mean `context`, modeled over the preset's datasheet: `read_bytes`"
       " (`state_read_bytes` plus `weight_bytes`), `flops`, `bandwidth_bytes_per_s`,"
       " `peak_flops_per_s`, `memory_s`, `compute_s`, `step_s` (the larger), `bound`,"
       " `per_token_s`, `how`, `state_by_kind` (one sequence's bytes by layer kind: its"
       " `mechanism`, `layers`, `bytes`): a lower bound, no kernel efficiency"
       " (attnbench/measure/roofline.py)", column="nested"),
    _f("packed", dict[str, Any] | None, packed, "", "cell", "packed rows: the draw, its FLOPs"
       " per copy (attnbench/workload/packed.py)", column="nested"),
    _f("prompts", dict[str, Any] | None, prompts, "", "memory", "decode rows with"
       " `contexts=drawn`: the draw of prompt lengths, `own_state_bytes` (a sequence's cache or"
       " state at its own prompt plus decode_tokens, the draw's mean) and `state_padding_share`"
       " (1 − that over `state_bytes`, allocated for the longest)", column="nested"),
    _f("quality", dict[str, Any] | None, quality, "", "quality", "a quality task's figures"
       " (declared by the task: attnbench/quality/tasks.py)"),
    _f("flops_per_s", float | None, seconds, "FLOP/s", "time", "achieved rate over forward and"
       " backward"),
    _f("pct_of_peak", float | None, seconds, "%", "time", "of the preset's peak (on its own GPU"
       " only)"),
    _f("env", dict[str, Any], env, "", "stored", "device name, torch, CUDA, attnbench, git"
       " revision, threads, python; with CUDA, fp32's arithmetic: `tf32_matmul`, `tf32_cudnn`"
       " (torch lets cuBLAS, cuDNN use TF32), `triton_fp32_dot` (Triton's `tl.dot`, which"
       " `kernel=fla` runs: `tf32` from Ampere on)", default={}, missing={}, column="nested"),
    _f("key", str | None, text, "", "stored", "the cell's key"),
    _f("key_version", int | None, count, "", "stored", "the rule the key was made by"
       " (`attnbench.cell_key.KEY_VERSION`; a row without it: 1, keyed again from its `cell` when"
       " a resume looks for it)", missing=1),
    _f("sweep", str | None, text, "", "stored", "the sweep's name"),
    _f("wall_s", float | None, seconds, "s", "stored", "the cell's wall time"),
    _f("finished_at", float | None, timestamp, "s", "stored", "when it was stored (Unix time)"),
    _f("invocation", str | None, text, "", "stored", "the command that stored it"),
    _f("cell", dict[str, Any] | None, cell_spec, "", "stored", "the full cell spec: from "
       "schema 3 the one place a line stores the fields of group `cell` it gives",
       column="nested"),
    _f("schema", int, count, "", "stored", f"{SCHEMA} (a row without it is schema 1; rows of "
       "schemas 1 and 2 are upgraded on reading)", default=SCHEMA),
)  # fmt: skip
BY_NAME = {f.name: f for f in FIELDS}
# a plugin's own fields (register), after the table's in a stored row and a DataFrame, each
# with what derives it from the figures measured
EXTRA: dict[str, Field] = {}
DERIVE: dict[str, Callable[[dict[str, Any]], Any]] = {}


def extra_fields() -> dict[str, Field]:
    """A plugin's fields: those registered, then the settings of a plugin's workload (the
    built-ins' are in the table), each a field of every row from the plugin's loading on."""
    out = dict(EXTRA)
    for name in workload_names():  # loads the plugins
        for s in get_workload(name).settings:
            if s.name not in BY_NAME:
                out.setdefault(s.name, setting_field(s))
    return out


def register(field: Field, derive: Callable[[dict[str, Any]], Any]) -> Field:
    """Add ``field`` to every row from here on (a plugin's, from its own file:
    ``docs/architecture.md``, "Add a row field"). ``derive`` makes its value from the fields
    :func:`attnbench.runner.found.assemble` fills (None: not known for this row); stored rows
    without it read as ``field.missing``, and a stored value is checked on reading."""
    if not field.name.isidentifier():
        raise ValueError(f"row field: must be an identifier, got {field.name!r}")
    if field.name in BY_NAME or field.name in EXTRA:
        raise ValueError(f"register: row field {field.name!r} is already registered")
    EXTRA[field.name], DERIVE[field.name] = field, derive
    return field


def markdown_table() -> str:
    """The schema as docs/architecture.md shows it, ``schema`` first as a row stores it."""
    order = [BY_NAME["schema"], *(f for f in FIELDS if f.name != "schema")]
    lines = ["| field | type | unit | group | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in order:
        lines.append(f"| `{f.name}` | {f.type_text()} | {f.unit} | {f.group} | {f.doc} |")
    return "\n".join(lines)


def _source(t: Any) -> str:
    """A field's type as Python source: ``dict[str, Any] | None``."""
    if isinstance(t, types.UnionType):
        return " | ".join(_source(a) for a in typing.get_args(t))
    if t is type(None):
        return "None"
    if t is Any:
        return "Any"
    if (origin := typing.get_origin(t)) is not None:
        return f"{origin.__name__}[{', '.join(_source(a) for a in typing.get_args(t))}]"
    return t.__name__


def static_source() -> str:
    """attnbench/row/static.py: the row's fields as a type checker sees them (the runtime
    class is made from :data:`FIELDS`, which no checker can read), written by
    ``python -m attnbench.mirrors``."""
    lines = [
        '"""The row\'s fields as a type checker sees them, generated from',
        "attnbench.row.fields.FIELDS by fields.static_source(); never imported at run time",
        '(attnbench.row.Row is made from the table)."""',
        "",
        "from typing import Any",
        "",
        "from attnbench.row.record import _Record",
        "",
        "",
        "class Row(_Record):",
        "    def __init__(self, **fields: Any) -> None: ...",
        "",
        *(f"    {f.name}: {_source(f.type)}" for f in FIELDS),
    ]
    return "\n".join(lines) + "\n"
