"""The GPU check's tables, made from its rows: the max batch and time ratios, serving's, and
the memory model against the allocator (``scripts/gpu_check.py``)."""

from __future__ import annotations

from gpu_check_cells import ALLOC_ENV, Item, _done_key
from gpu_check_plan import as_on_a_gpu

from attnbench.cell import Cell
from attnbench.plan import label, validate
from attnbench.row import Row
from attnbench.runner import MemoryModel
from attnbench.workload.base import setting


def _name(r: Row | Cell, dtype: str | None) -> str:
    """A row's mechanism as the tables name it: its budget, kernel, causal mask, a dtype
    other than the check's, and the allocator setting it ran under."""
    params = dict(r.params)
    alloc = r.env.get(ALLOC_ENV) if isinstance(r, Row) else None
    return (
        r.attention
        + (f" k={r.k}" if r.k else "")
        + (f" {params['kernel']}" if params.get("kernel") else "")
        + (" causal" if params.get("causal") else "")
        + (f" {r.dtype}" if dtype and r.dtype != dtype else "")
        + (f" {alloc}" if alloc else "")
    )


def decode_table(rows: list[Row]) -> str:
    """Serving: the real max batch beside the modeled one, the time of a step (one token of
    each sequence), and the bytes it reads over that time against the copy bandwidth."""
    lines = [
        "| mechanism | n | batch | max b | memory | modeled max b | probes | model error | "
        "state MB/seq | ms/token | tokens/s | achieved GB/s | copy GB/s | of copy | status |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        kv = (r.model or {}).get("kv_heads")
        params = dict(r.params)
        name = (
            r.attention
            + (f" {params['kernel']}" if params.get("kernel") else "")
            + (f" kv_heads={kv}" if kv else "")
            + (" drawn" if setting(r, "contexts") == "drawn" else "")
        )
        d = r.decode or {}
        step, rate = r.time_median_s, d.get("tokens_per_s")
        bw, copy = d.get("bytes_per_s"), d.get("copy_bytes_per_s")
        lines.append(
            f"| {name} | {r.n} | {r.batch_asked} | {r.max_batch} | {r.memory_source} | "
            f"{r.predicted_max_batch} | {r.probes} | {r.model_error} | "
            f"{'-' if r.state_bytes is None else f'{r.state_bytes / 1e6:.2f}'} | "
            f"{'-' if step is None else f'{step * 1e3:.3f}'} | "
            f"{'-' if rate is None else f'{rate:.0f}'} | "
            f"{'-' if bw is None else f'{bw / 1e9:.0f}'} | "
            f"{'-' if copy is None else f'{copy / 1e9:.0f}'} | "
            f"{'-' if not (bw and copy) else f'{bw / copy:.0%}'} | "
            f"{r.status if r.status == 'ok' else r.status + ': ' + str(r.reason)} |"
        )
    return "\n".join(lines)


def residual_table(rows: list[Row], todo: list[Item]) -> str:
    """The memory model against the allocator, bytes not batches: each eager row's modeled
    peak at the batch the probes found, beside ``torch.cuda.max_memory_allocated`` there
    (both with the preset's overhead), and what the allocator reserved beyond it. A max
    batch the model overstates while its bytes agree is the allocator's fragmentation."""
    cells = {_done_key(i): i.cell for i in todo}
    lines = [
        "| cell | max b | modeled GB | allocated GB | model − allocated | reserved − allocated |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cell = cells.get(_done_key(r))
        if r.status != "ok" or r.compile or not r.max_batch or cell is None or not r.peak_bytes:
            continue
        try:
            with as_on_a_gpu():  # the tables of a GPU's rows, made on a CPU: as there
                res = validate(cell)
        except ValueError:  # a cell refused now, run before
            continue
        modeled = MemoryModel(cell, res).peak(r.max_batch)
        extra = (r.peak_reserved_bytes or r.peak_bytes) - r.peak_bytes
        alloc = r.env.get(ALLOC_ENV)
        lines.append(
            f"| {label(cell)}{f' {alloc}' if alloc else ''} | {r.max_batch} | "
            f"{modeled / 1e9:.3f} | {r.peak_bytes / 1e9:.3f} | "
            f"{(modeled - r.peak_bytes) / r.peak_bytes:+.2%} | {extra / r.peak_bytes:.1%} |"
        )
    return "\n".join(lines)


def table(rows: list[Row], dtype: str | None = None) -> str:
    def work(r: Row) -> tuple:
        causal = bool(dict(r.params).get("causal"))
        return (r.mode, r.checkpoint, causal, r.compile, r.dtype, r.batch_asked)

    base = {(r.n, work(r)): r for r in rows if r.attention == "vanilla"}
    lines = [
        "| mechanism | mode | n | max b | memory | modeled max b | probes | model error | "
        "time/seq ms | time ratio vs vanilla | memory ratio vs vanilla | status |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        v = base.get((r.n, work(r)))
        mode = (
            r.mode
            + (f"({setting(r, 'layout')})" if r.mode.startswith("packed") else "")
            + (" checkpoint" if r.checkpoint else "")
            + (" compiled" if r.compile else "")
            + (f" b={r.batch_asked}" if r.batch_asked != "max" else "")
        )
        t, tv = r.time_per_seq_s, v and v.time_per_seq_s
        mb, mbv = r.max_batch, v and v.max_batch
        lines.append(
            f"| {_name(r, dtype)} | {mode} | {r.n} | {mb} | {r.memory_source} | "
            f"{r.predicted_max_batch} | {r.probes} | "
            f"{r.model_error} | {'-' if t is None else f'{t * 1e3:.3f}'} | "
            f"{'-' if not (t and tv) else f'{tv / t:.2f}'} | "
            f"{'-' if not (mb and mbv) else f'{mb / mbv:.2f}'} | "
            f"{r.status if r.status == 'ok' else r.status + ': ' + str(r.reason)} |"
        )
    return "\n".join(lines)
