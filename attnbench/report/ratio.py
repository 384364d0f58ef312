"""The one ratio rule: a mechanism's row against its baseline's, for every table, efficiency
length and plot of a report.

Which rows are compared is :func:`group`: the same n, dtype, preset, ceiling, model, batch
setting, machine and work, eager or compiled alike (a compiled mechanism against the
baseline compiled the same way, never against the eager one: :func:`compiled`); which row
of a group is the baseline is :func:`is_baseline`: the baseline mechanism with its full
cache of keys and values in the cell's dtype (no ``kv_heads``, ``state_dtype`` auto: a row
with grouped-query heads or a state kept in another dtype is compared against it, never its
own baseline). What is compared is :func:`ratio`, the paper's section 5.3:

* time ratio   = baseline time per sequence ÷ mechanism time per sequence (speed-up)
* memory ratio = mechanism max batch ÷ baseline max batch (memory saved)

A ratio is a number only where both rows measured the figure. Anywhere else it is
undefined: its value is None and what a table shows is the status that made it so (``OOM``,
``n/m``, or ``busy`` for a time taken on a contended CPU) with a footnote saying whose and why,
never a number, and never an infinity that could be read as a measured speed-up.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from attnbench import cell
from attnbench.measure.contention import SKIPPED_FOR_LOAD, TIMED_UNDER_LOAD
from attnbench.measure.timing import NOISY
from attnbench.report.marks import BUSY, OOM, SKIPPED
from attnbench.row import Row, printable
from attnbench.workload import find as find_workload
from attnbench.workload.draw import DRAW


def kv_heads(row: Row) -> int | None:
    """The row's grouped-query heads (``model.kv_heads``), None for a full cache."""
    return (row.model or {}).get("kv_heads")


def compiled(row: Row) -> str | None:
    """What a compiled row's label adds (:func:`attnbench.cell.compiled_label`:
    ``compiled``, ``compiled(max-autotune)``); None for an eager row, and for a row from
    before ``compile`` existed. A mechanism that compiles its own kernel in an eager model
    (flex: ``row.compiled == "kernel"``) is an eager row here: it runs in the eager model."""
    if not getattr(row, "compile", False):
        return None
    return cell.compiled_label(getattr(row, "compile_mode", None) or "default")


def name(row: Row) -> str:
    """A row's mechanism with its own parameters (:func:`attnbench.cell.label`), its
    grouped-query heads (``sdpa (causal=True, kv_heads=3)``), a hybrid's schedule
    (:mod:`attnbench.schedule`) and, compiled, what
    :func:`compiled` says (``linear compiled``), as stored: two rows of one name are one
    mechanism. :func:`label` is what a report prints of it."""
    shape = row.model or {}
    extra = {k: shape[k] for k in ("kv_heads", "schedule") if shape.get(k)}  # a hybrid's too
    got = cell.label(row.attention, {**(row.params or {}), **extra})
    return got + (f" {c}" if (c := compiled(row)) else "")


def label(row: Row) -> str:
    """:func:`name` on one line whatever its parameters' values hold
    (:func:`attnbench.row.printable`)."""
    return printable(name(row))


def group(row: Row) -> tuple:
    """What must match between a mechanism's row and its baseline's: the same n, dtype,
    preset, ceiling, model (its grouped-query heads aside: they are the mechanism's, the
    baseline keeps every head's keys and values), batch setting (``max`` or a fixed b), the
    same machine and the same work: inference, a training step with the same optimizer and
    checkpointing, or serving with the same tokens, prefill chunk and prompts (every one n,
    or the same draw of lengths: :func:`draw`; the state's dtype, like
    grouped-query heads, is the mechanism's: the baseline keeps the cell's); compiled rows
    against the baseline compiled in the same mode, eager rows against the eager one
    (:func:`compiled`); causal rows against a causal baseline (``causal`` is a mechanism
    parameter). The last two entries are what a row's :func:`name` says already
    (:data:`NAMED`)."""
    model = {k: v for k, v in (row.model or {}).items() if k != "kv_heads"}
    return (
        row.n,
        row.dtype,
        row.device,
        row.ceiling_bytes,
        tuple(sorted(model.items())),
        str(row.batch_asked),
        (row.env or {}).get("device_name"),
        row.mode,
        row.optimizer,
        row.checkpoint,
        row.decode_tokens,
        row.prefill_chunk,
        draw(row),
        # last: a row's name says them already (a plot's legend needs no more)
        compiled(row),
        bool((row.params or {}).get("causal")),
    )


def draw(row: Row) -> tuple:
    """The draw of lengths a row uses (decode's ``contexts=drawn``, packed's documents):
    rows of two draws serve different sequences. Only the settings in use, as its workload
    says for a cell's key too (:meth:`attnbench.workload.Workload.in_use`): none with every
    prompt n, the list where it is explicit."""
    given = {n: getattr(row, n, None) for n in DRAW_NAMES}
    given = {n: tuple(v) if isinstance(v, list) else v for n, v in given.items() if v is not None}
    work = find_workload(row.mode)
    return tuple((work.in_use(given) if work is not None else given).values())


# the settings a draw of lengths is made of, and decode's choice of one
DRAW_NAMES = ("contexts", *(s.name for s in DRAW))


NAMED = 2  # the entries at the end of :func:`group` that :func:`name` says


def eager(row: Row) -> Row:
    """``row`` as its eager twin would be stored (``compile`` false): its :func:`group`
    is the eager rows' it is set beside when a report asks what compiling did."""
    if not compiled(row):
        return row
    return dataclasses.replace(row, compile=False, compile_mode=None)


def is_baseline(row: Row, baseline: str) -> bool:
    """Whether ``row`` is a baseline row: the ``baseline`` mechanism with its full cache in
    the cell's dtype. A row with grouped-query heads or another state dtype is a
    configuration of its own, compared against it."""
    return (
        row.attention == baseline
        and not kv_heads(row)
        and getattr(row, "state_dtype", None) in (None, "auto")
    )


def baselines(rows: list[Row], baseline: str) -> dict[tuple, Row]:
    """The baseline row of each :func:`group` the rows hold."""
    return {group(r): r for r in rows if is_baseline(r, baseline)}


def setting(row: Row) -> tuple:
    """Everything of :func:`group` but n: rows of one setting form one table (or line)."""
    return group(row)[1:]


def unnamed(row: Row) -> tuple:
    """:func:`setting` less what the row's :func:`name` says (compiled, causal): rows
    that differ only there are told apart by their names."""
    return setting(row)[:-NAMED]


def compared(rows: list[Row], baseline: str) -> list[Row]:
    """The rows compared against the baseline: every row that is not a baseline row."""
    return [r for r in rows if not is_baseline(r, baseline)]


@dataclass(frozen=True)
class Ratio:
    """A mechanism's ratio against its baseline at one n, for one kind.

    ``value`` is the ratio (> 1: the mechanism is ahead), finite, or None where it is
    undefined. ``text`` is what a table shows: ``1.25x``, or the status that left it
    undefined (``OOM``, ``n/m``). ``notes`` are its footnotes, in order. ``outgrown`` is set
    where the ratio is undefined because the baseline does not fit one sequence under the
    ceiling while the mechanism's max batch search found room: for memory, the mechanism is
    ahead there without any ratio to show."""

    value: float | None
    text: str
    notes: tuple[str, ...] = ()
    outgrown: bool = False


def _why(reason: str | None) -> str:
    """A footnote for a skipped figure: one per kind of reason, not one per cell."""
    if reason and "exceed time_budget_s" in reason:
        return "time not measured: a CPU run was estimated over timing.time_budget_s"
    if reason and reason.startswith(SKIPPED_FOR_LOAD):
        return (
            "time not measured: skipped for the load, not for its cost (the CPU was contended); "
            "measure it again on a quieter machine"
        )
    return (reason or "not timed").split(";")[0]


def _at(row: Row) -> str:
    """The batch an out-of-memory row did not fit: its fixed batch, else one sequence."""
    return f"b = {row.batch_asked if isinstance(row.batch_asked, int) else 1}"


def _undefined(text: str, note: str, outgrown: bool = False) -> Ratio:
    return Ratio(None, text, (note,), outgrown)


def ratio(kind: str, r: Row, b: Row) -> Ratio:
    """Row ``r``'s ``kind`` ratio (``time`` or ``memory``) against its baseline row ``b``
    (of the same :func:`group`).

    An out-of-memory baseline is the baseline's status, not a figure: the ratio is
    undefined and shown as ``OOM`` with the footnote that the baseline does not fit at
    b = 1, or at the fixed batch its cell asked (``outgrown`` where the mechanism fits).
    So is an out-of-memory mechanism; any other row that is not ``ok`` (skipped, error)
    and a figure either row lacks give ``n/m`` with the reason; a time either row took on a
    contended CPU gives ``busy``; a quotient beyond a float's range is no ratio either. A
    defined ratio carries its caveats: memory modeled (or profiled) rather than measured,
    time taken off the device or not at max batch, a noisy time, a time taken under load."""
    if b.status == "oom":
        source = b.memory_source or "measured"
        note = f"the baseline does not fit at {_at(b)} under the ceiling ({source})"
        return _undefined(OOM, note, outgrown=r.status == "ok" and bool(r.max_batch))
    if r.status == "oom":
        return _undefined(OOM, f"this mechanism does not fit at {_at(r)} under the ceiling")
    if r.status != "ok" or b.status != "ok":
        bad = r if r.status != "ok" else b
        return _undefined(SKIPPED, f"{bad.attention}: {bad.status}: {bad.reason}")
    if kind == "memory":
        if "profiled" in (r.memory_source, b.memory_source):
            return _undefined(
                SKIPPED,
                "compiled on a CPU: no max batch (the memory model traces the eager graph; "
                "the compiled step's peak was profiled at the timed batch)",
            )
        if not r.max_batch or not b.max_batch:
            return _undefined(SKIPPED, "fixed batch: no max batch was searched")
        v = r.max_batch / b.max_batch
        notes = tuple(dict.fromkeys(n for x in (r, b) if (n := memory_note(x))))
        return Ratio(v, f"{v:.1f}x", notes)
    t, tb = r.time_per_seq_s, b.time_per_seq_s
    if busy := next((x for x in (r, b) if x.busy and x.time_per_seq_s), None):
        why = (busy.contention or {}).get("why") or "contended"
        return _undefined(
            BUSY,
            f"machine busy: {busy.attention}'s time was taken on a "
            f"contended CPU ({why}); measure it again on a quiet machine",
        )
    if not t or not tb:
        return _undefined(SKIPPED, _why((r if not t else b).reason))
    v = tb / t
    if not math.isfinite(v):  # 1 s over 1e-320 s: no ratio a table can show
        return _undefined(SKIPPED, f"time ratio beyond a float's range: {tb!r} s / {t!r} s")
    return Ratio(v, f"{v:.2f}x", _time_notes(r, b))


ALLOCATION_ONLY = "memory modeled (allocated bytes; no caching allocator replayed), not measured"


def memory_note(row: Row) -> str | None:
    """What a row's max batch is, where it is not the plain measure of the card: the caching
    allocator replayed over the modeled allocations, under which setting; the modeled
    allocated bytes alone (a cpu preset, which has no caching allocator; a decode step; a
    row stored before the replay); measured under an allocator setting of its own."""
    allocator = row.allocator or "default"
    if row.memory_source == "measured":
        return None if allocator == "default" else f"max batch measured with allocator={allocator}"
    if row.memory_source != "modeled":
        return None
    if row.fragmentation is None:
        return ALLOCATION_ONLY
    return (
        f"memory modeled (the caching allocator replayed, allocator={allocator}, over the "
        "modeled allocations), not measured"
    )


def _time_notes(r: Row, b: Row) -> tuple[str, ...]:
    """The caveats of a time ratio both rows gave: a time taken off the device or not at
    max batch, a noisy one, one taken while the CPU was contended."""
    where = {(x.time_device, x.time_dtype, x.time_batch) for x in (r, b)}
    elsewhere = sorted((w for w in where if w[0] != "cuda"), key=str)
    notes = [
        f"time measured on {device} in {dtype} at b = {batch}, not at max batch on the device"
        for device, dtype, batch in elsewhere
    ]
    notes += [
        f"noisy: {x.attention}'s time has an IQR over {NOISY:.0%} of its median"
        for x in (r, b)
        if (x.spread() or 0) > NOISY
    ]
    notes += [
        f"{TIMED_UNDER_LOAD}: {x.attention}'s time was taken while the CPU was contended "
        "(from its uncontended samples)"
        for x in (r, b)
        if (x.reason or "").startswith(TIMED_UNDER_LOAD)
    ]
    return tuple(notes)
