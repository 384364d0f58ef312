"""The caching allocator's replay held to the H200's measured rows (issue #45, item 4).

For every inference, training and serving (decode) row of ``results/gpu_check/rows.jsonl``
asked for the max batch, the cell's step is traced on meta **as the code of the GPU run ran
it** (commit 431ec60: :func:`as_at_431ec60`) and replayed through
:mod:`attnbench.measure.allocator` under the row's cap (``ceiling_bytes`` −
``overhead_bytes``: what ``set_per_process_memory_fraction`` let torch's allocator reserve).
The max batch is searched as the GPU run searched it: from the row's
``predicted_max_batch`` with :func:`attnbench.measure.search.largest_fitting` (fitting is
not monotone in b once fragmentation decides it, so the start matters). Inference and
serving: each probe on one allocator that carries what the last left (:class:`AsRun`: the
previous cell's cache, the weights it pins, a failed serving probe's states:
``replayed_as_run_max_batch``); training: a fresh allocator per probe
(``replayed_clean_max_batch``), as its history is not all emulated. Beside them: the
allocation-only max batch of the plain meta trace (what the model predicted: the row's
``predicted_max_batch`` re-derived), and the replay's reserved peak at the real batch
against the row's ``peak_reserved_bytes`` (with no cap where the replay does
not fit the real batch under it).

The trace carries what CUDA allocates and meta does not
(:mod:`attnbench.measure.cuda_layouts`: the fused attention kernels' layouts and
temporaries, cuBLAS's workspaces); ``--meta`` replays the plain meta trace instead. A row
this check cannot replay (compiled; no real max batch) is printed with the reason.

    python scripts/allocator_check.py                      # the table
    python scripts/allocator_check.py --json --only attention=sdpa,n=512

Progress on stderr: a row takes seconds (inference) to minutes (training, linear decode).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnbench import model as model_module
from attnbench.cell import Cell, Part, Shape
from attnbench.measure.allocator import _Allocator, replay
from attnbench.measure.allocator_rules import AllocatorConfig
from attnbench.measure.fit import live_peak
from attnbench.measure.memory import rounded, traced
from attnbench.measure.search import largest_fitting, solve_affine
from attnbench.plan import validate
from attnbench.runner import MemoryModel
from attnbench.store import read_rows

ROWS = Path("results/gpu_check/rows.jsonl")
MODES = ("inference", "train", "decode")
H200 = (9, 0)  # the compute capability of the card the rows ran on
FIELDS = ("attention", "n", "k", "mode", "checkpoint", "device", "kv_heads", "causal")


@contextlib.contextmanager
def as_at_431ec60() -> Iterator[None]:
    """The encoder layer as the GPU run's code (431ec60) ran it: the attention's output
    bound to a name, so it stays alive through the FFN. That commit's
    ``attnbench/model.py``, ``EncoderLayer.forward``::

        if state is None:
            a = self.attn(x, key_padding_mask)
        else:
            a = self.attn.extend(x, state, key_padding_mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))  # (b, n, d)

    Today's layer frees it once added (a9cf2ee). Patched on the class for the duration,
    restored after, whatever happens; the rows were measured on this liveness."""
    layer = model_module.EncoderLayer
    today = layer.forward

    def forward(
        self: Any, x: Any, key_padding_mask: Any = None, state: Any = None, packing: Any = None
    ) -> Any:
        a = self._attend(x, key_padding_mask, state, packing)
        x = self.norm1(x + a)
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))

    layer.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        layer.forward = today  # type: ignore[method-assign]


def why_not(row: dict[str, Any]) -> str | None:
    """None where the row has a real max batch this check can replay; else why not."""
    if row.get("mode") not in MODES or row.get("task", "cost") != "cost":
        return f"mode {row.get('mode')}: not a step this check traces"
    if row.get("status") != "ok" or row.get("batch_asked") != "max":
        return f"status {row.get('status')}, batch {row.get('batch_asked')}: no real max batch"
    if row.get("memory_source") != "measured":
        return "memory not measured"
    if row.get("compile"):
        return (
            "compiled: the meta trace follows the eager graph; Inductor's fused buffers are "
            "not in it"
        )
    return None


def cell_of(row: dict[str, Any]) -> Cell:
    """The row's cell: its mechanism, shape, workload settings and preset."""
    settings: dict[str, Any] = {}
    if row["mode"] == "train":
        settings = {"optimizer": row["optimizer"], "checkpoint": bool(row["checkpoint"])}
    elif row["mode"] == "decode":
        settings = {
            key: row[key]
            for key in ("decode_tokens", "prefill_chunk", "state_dtype")
            if row.get(key) is not None
        }
    shape = row["model"]
    return Cell(
        row["attention"],
        n=row["n"],
        k=row["k"],
        dtype=row["dtype"],
        device=row["device"],
        params=tuple(sorted(row["params"].items())),
        workload=Part(row["mode"], settings),
        model=Shape(
            layers=shape["layers"],
            d_model=shape["d_model"],
            n_heads=shape["n_heads"],
            d_ff=shape["d_ff"],
            kv_heads=shape.get("kv_heads"),
            head_dim=shape.get("head_dim"),
        ),
    )


@dataclass
class Result:
    """One row's figures (``--json``'s object)."""

    attention: str
    params: dict[str, Any]
    k: int | None
    n: int
    mode: str
    checkpoint: bool | None
    real_max_batch: int | None
    replayed_max_batch: int | None
    allocated_max_batch: int | None
    real_reserved_bytes: int | None
    replayed_reserved_bytes: int | None
    replayed_fits_real: bool | None = None
    predicted_max_batch: int | None = None
    kv_heads: int | None = None
    reason: str | None = None  # why a row is out of reach
    replayed_clean_max_batch: int | None = None  # each probe from a fresh allocator
    replayed_as_run_max_batch: int | None = None  # the probes on one allocator (AsRun)
    after: str | None = None  # the cell whose cache the first probe found (None: fresh)

    @property
    def batch_error(self) -> float | None:
        """Replayed over real max batch, less one."""
        if self.replayed_max_batch is None or not self.real_max_batch:
            return None
        return self.replayed_max_batch / self.real_max_batch - 1

    @property
    def reserved_error(self) -> float | None:
        if self.replayed_reserved_bytes is None or not self.real_reserved_bytes:
            return None
        return self.replayed_reserved_bytes / self.real_reserved_bytes - 1


class Tracer:
    """One row's step traced at any batch, as :class:`attnbench.runner.MemoryModel` models
    it: the workload's step on meta after what is live before it (each weight's storage, a
    primed step's state, cuBLAS's workspaces where ``cuda``, then the input)."""

    def __init__(self, row: dict[str, Any], *, cuda: bool = True) -> None:
        self.row = row
        self.cell = cell_of(row)
        self.res = validate(self.cell)
        self.cap = row["ceiling_bytes"] - row["overhead_bytes"]
        # the card of the rows: an H200 (sm90) under torch 2.11, whose cuBLASLt workspace is
        # its own, apart from cuBLAS's (cuda_layouts.cublaslt_unified)
        with as_at_431ec60():
            capability = H200 if cuda else None
            self.mm = MemoryModel(self.cell, self.res, capability=capability, unified=False)
        self.base = self.mm.held  # the weights, a primed step's state, cuBLAS's workspaces
        self.workspaces = list(self.mm.workspaces)
        self.weights = self.base[: len(self.base) - len(self.workspaces)]

    def trace(self, b: int) -> list:
        """The allocator's calls of one step at batch b (the input allocated before it)."""
        with as_at_431ec60():
            try:
                return self.mm.trace_at(b)
            finally:
                self.mm.work.release()

    def fits(self, b: int) -> bool:
        return replay(self.trace(b), self.cap).fits

    def replayed_max_batch(self, guess: int) -> int:
        """The largest b whose replay fits, searched as the GPU run searched (from ``guess``)."""
        return largest_fitting(self.fits, max(guess, 1))[0]

    def allocated_peak(self, b: int) -> int:
        """The trace's live-bytes peak at b (each request rounded to 512 bytes)."""
        return live_peak(self.trace(b))

    def allocated_max_batch(self) -> int:
        """The allocation-only max batch of this trace: the runner's affine search over its
        live-bytes peak against the same cap."""
        fixed = sum(rounded(n) for n in self.base)
        return solve_affine(self.allocated_peak, self.cap, fixed)[0]


class AsRun:
    """One cell's probes as the GPU run made them, on one allocator that carries what each
    leaves (``_cuda_fits`` at 431ec60): the cell's weights are placed among the blocks the
    previous cell of the same process left cached (its last act, timing at its max batch,
    ran uncapped and nothing emptied the cache after it); each probe allocates its input,
    runs its step under the cap, frees what the step held (an out-of-memory error drops the
    rest) and the input, then empties the cache (``torch.cuda.empty_cache``): what the
    weights pin stays. cuBLAS's workspaces are the process's from its first cell on.
    Serving: a probe that ran out of memory after making its states left them set on the
    work (431ec60's ``_cuda_fits`` freed the input only), so they stay allocated until the
    next probe's step drops them first thing (``_new_states``: ``self.states = None``)."""

    def __init__(self, tracer: Tracer, previous: Tracer | None) -> None:
        self.t = tracer
        self.alloc = _Allocator(AllocatorConfig(), None)
        self.live: dict[tuple[str, int], Any] = {}
        self.states = 0  # serving: how many allocations open its step with the states
        if tracer.cell.mode == "decode":
            work = tracer.mm.work
            made = traced(lambda: work.model.new_state(1, work.capacity, work.state_dtype, "meta"))
            self.states = sum(e[0] == "alloc" for e in made)
        for i, size in enumerate(tracer.workspaces):
            self._malloc(("ws", i), size)
        if previous is not None:  # its weights, its input, one timed step; then all freed
            prev_b = previous.row["max_batch"]
            events = previous.trace(prev_b)
            skip = {len(previous.weights) + i for i in range(len(previous.workspaces))}
            self._run([e for e in events if e[1] not in skip], "prev")
            for key in [k for k in self.live if k[0] == "prev"]:
                self.alloc.free(self.live.pop(key))
        for i, size in enumerate(tracer.weights):
            self._malloc(("w", i), size)

    def _malloc(self, key: tuple[str, int], size: int) -> bool:
        if not size:
            return True
        block = self.alloc.malloc(size)
        if block is None:
            return False
        self.live[key] = block
        return True

    def _run(self, events: list, tag: str) -> bool:
        for e in events:
            if e[0] == "alloc":
                if not self._malloc((tag, e[1]), e[2]):
                    return False
            elif (tag, e[1]) in self.live:
                self.alloc.free(self.live.pop((tag, e[1])))
        return True

    def fits(self, b: int) -> bool:
        """One probe at b, what it leaves behind carried to the next."""
        events = self.t.trace(b)
        first = len(self.t.base)  # the input's id; the weights and workspaces are live
        self._run([events[first]], "x")  # fed before the cap is set
        self.alloc.cap = self.t.cap
        for key in [k for k in self.live if k[0] == "left"]:  # the last probe's states go
            self.alloc.free(self.live.pop(key))
        ok = self._run(events[first + 1 :], "step")
        self.alloc.cap = None
        made = [e[1] for e in events[first + 1 :] if e[0] == "alloc"][: self.states]
        if not ok and len(made) == self.states and all(("step", i) in self.live for i in made):
            for i in made:  # left on the work by the error, until the next probe
                self.live[("left", i)] = self.live.pop(("step", i))
        for key in [k for k in self.live if k[0] in ("step", "x")]:
            self.alloc.free(self.live.pop(key))
        self.alloc._release_cached()  # torch.cuda.empty_cache: every whole free segment
        return ok


def previous_row(rows: list[dict[str, Any]], i: int, starts: tuple[int, ...]) -> dict | None:
    """The cell the GPU run measured just before row i in the same process (the rows are
    stored in the order they ran); None for a process's first cell, and where that cell's
    step cannot be traced (compiled, or it stopped before a max batch): its cache is then
    unknown, and the replay starts from a fresh allocator."""
    if i in starts or i == 0:
        return None
    prev = rows[i - 1]
    return prev if why_not(prev) is None else None


def process_starts(rows_path: Path) -> tuple[int, ...]:
    """Where each process of the GPU run began, in row indices: its ``log.txt`` beside the
    rows says ``gpu_check: N rows kept`` where a call resumed (a new process, a fresh
    allocator)."""
    log = rows_path.parent / "log.txt"
    starts = [0]
    if log.is_file():
        for line in log.read_text().splitlines():
            if line.startswith("gpu_check: ") and " rows kept " in line:
                starts.append(int(line.split()[1]))
    return tuple(starts)


def label_row(row: dict[str, Any]) -> str:
    """A stored row's cell, as the table names it."""
    r = Result(row["attention"], row["params"], row["k"], row["n"], row["mode"],
               row.get("checkpoint"), None, None, None, None, None,
               kv_heads=(row.get("model") or {}).get("kv_heads"))  # fmt: skip
    return label(r)


def check(
    row: dict[str, Any],
    *,
    cuda: bool = True,
    allocated: bool = True,
    previous: dict[str, Any] | None = None,
) -> Result:
    """One row replayed: its max batch from the row's prediction, its reserved peak at the
    real batch (plus the preset's overhead, as the row's ``peak_reserved_bytes``)."""
    real = row.get("max_batch")
    out = Result(
        row["attention"],
        row["params"],
        row["k"],
        row["n"],
        row["mode"],
        row.get("checkpoint"),
        real,
        None,
        None,
        row.get("peak_reserved_bytes"),
        None,
        predicted_max_batch=row.get("predicted_max_batch"),
        kv_heads=(row.get("model") or {}).get("kv_heads"),
    )
    reason = why_not(row)
    if reason is not None:
        out.reason = reason
        return out
    tracer = Tracer(row, cuda=cuda)
    events = tracer.trace(real)
    at_real = replay(events, tracer.cap)
    out.replayed_fits_real = at_real.fits
    if not at_real.fits:  # what it would reserve with no cap: how far over the cap it goes
        at_real = replay(events, None)
    out.replayed_reserved_bytes = at_real.peak_reserved + row["overhead_bytes"]
    guess = row["predicted_max_batch"] or real
    out.replayed_clean_max_batch = tracer.replayed_max_batch(guess)
    as_run = AsRun(tracer, None if previous is None else Tracer(previous, cuda=cuda))
    out.replayed_as_run_max_batch = largest_fitting(as_run.fits, max(guess, 1))[0]
    out.after = None if previous is None else label_row(previous)
    # a training cell's history is not all emulated (431ec60 primed its optimizer state in
    # a b = 1 probe among the previous cell's blocks, and a failed step left its gradients
    # on the parameters): its figure is the fresh allocator's
    out.replayed_max_batch = (
        out.replayed_clean_max_batch if row["mode"] == "train" else out.replayed_as_run_max_batch
    )
    if allocated:  # the model's own figure: the plain meta trace, nothing of CUDA's added
        plain = tracer if not cuda else Tracer(row, cuda=False)
        out.allocated_max_batch = plain.allocated_max_batch()
    return out


def matches(row: dict[str, Any], only: dict[str, str]) -> bool:
    """Whether the row has every ``key=value`` of ``--only`` (``causal`` from its params,
    ``kv_heads`` from its model, ``kernel`` from its params)."""
    for key, want in only.items():
        if key in ("causal", "kernel"):
            got = row["params"].get(key, False if key == "causal" else None)
        elif key == "kv_heads":
            got = (row.get("model") or {}).get("kv_heads")
        else:
            got = row.get(key)
        if str(got).lower() != want.lower():
            return False
    return True


def parse_only(text: str | None) -> dict[str, str]:
    """``--only attention=sdpa,n=512``: a ValueError line naming what is wrong."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in (*FIELDS, "kernel") or not value:
            raise ValueError(
                f"--only: key=value pairs joined by commas, keys among "
                f"{', '.join((*FIELDS, 'kernel'))}; got {item!r}"
            )
        out[key] = value
    return out


def load(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` flat (a schema-3 line's fields from its spec put back)."""
    return read_rows(path)


def label(r: Result) -> str:
    extra = [f"{k}={v}" for k, v in sorted(r.params.items())]
    if r.k is not None:
        extra.insert(0, f"k={r.k}")
    if r.kv_heads is not None:
        extra.append(f"kv_heads={r.kv_heads}")
    mode = r.mode + (" ckpt" if r.checkpoint else "")
    return f"{r.attention}{'(' + ', '.join(extra) + ')' if extra else ''} n={r.n} {mode}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def table(results: list[Result]) -> str:
    """Markdown: the allocation-only (modeled) max batch, the replayed one (inference and
    serving as the run probed, a fresh allocator's in brackets where it differs; training
    from a fresh allocator, as run in brackets), the real one, and the replay's reserved
    peak at the real batch against the row's."""
    lines = [
        "| cell | allocation-only | replayed | real | replayed − real | reserved at the real b |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.reason is not None:
            lines.append(f"| {label(r)} | | | {r.real_max_batch or ''} | | {r.reason} |")
            continue
        other = r.replayed_as_run_max_batch if r.mode == "train" else r.replayed_clean_max_batch
        replayed = f"{r.replayed_max_batch}" + (
            f" ({other})" if other not in (None, r.replayed_max_batch) else ""
        )
        reserved = _pct(r.reserved_error) if r.replayed_fits_real else "over the cap"
        allocated = "" if r.allocated_max_batch is None else str(r.allocated_max_batch)
        lines.append(
            f"| {label(r)} | {allocated} | {replayed} | {r.real_max_batch} "
            f"| {_pct(r.batch_error)} | {reserved} |"
        )
    return "\n".join(lines)


def selected(rows: list[dict[str, Any]], only: dict[str, str]) -> list[dict[str, Any]]:
    """The rows this check reports: every row of the three modes asked for the max batch,
    those it cannot replay included (reported with the reason)."""
    return [rows[i] for i in selected_indices(rows, only)]


def selected_indices(rows: list[dict[str, Any]], only: dict[str, str]) -> list[int]:
    return [
        i
        for i, r in enumerate(rows)
        if r.get("mode") in MODES and r.get("batch_asked") == "max" and matches(r, only)
    ]


def run(
    rows: list[dict[str, Any]],
    indices: list[int],
    starts: tuple[int, ...] = (0,),
    *,
    cuda: bool = True,
    allocated: bool = True,
    progress: Callable[[str], None] = lambda s: None,
) -> list[Result]:
    """Each of ``rows[indices]`` checked, the cell before it in ``rows`` as its history."""
    results = []
    for i, index in enumerate(indices, 1):
        started = time.monotonic()
        row, previous = rows[index], previous_row(rows, index, starts)
        r = check(row, cuda=cuda, allocated=allocated, previous=previous)
        results.append(r)
        took = time.monotonic() - started
        figures = r.reason or (
            f"replayed {r.replayed_max_batch} (fresh {r.replayed_clean_max_batch}, as run "
            f"{r.replayed_as_run_max_batch}), real {r.real_max_batch}"
        )
        progress(f"[{i}/{len(indices)}] {label(r)}: {figures} ({took:.0f} s)")
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, default=ROWS, help="default: %(default)s")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--only", help="key=value,... (keys: " + ", ".join((*FIELDS, "kernel")) + ")")
    p.add_argument(
        "--meta", action="store_true", help="the plain meta trace: no CUDA layouts, workspaces"
    )
    p.add_argument(
        "--no-allocated",
        action="store_true",
        help="skip the allocation-only search (faster)",
    )
    p.error = _error  # type: ignore[method-assign]
    return p


class _BadArgs(Exception):
    pass


def _error(message: str) -> None:
    raise _BadArgs(message)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        only = parse_only(args.only)
        if not args.rows.is_file():
            raise ValueError(f"--rows: no such file: {args.rows}")
    except (_BadArgs, ValueError) as e:
        print(f"allocator_check: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # meta tensors: nothing to parallelise
    rows = load(args.rows)
    indices = selected_indices(rows, only)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = run(
        rows,
        indices,
        process_starts(args.rows),
        cuda=not args.meta,
        allocated=not args.no_allocated,
        progress=progress,
    )
    if args.json:
        for r in results:
            print(json.dumps(asdict(r)))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
