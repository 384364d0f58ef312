"""GPU check: real against modeled max batch, probes, and time ratios, under a 16 GB ceiling.

For vanilla, sdpa and Linformer (layerwise; k = 128, 256) at n = 512 ... 16384 on the
``v100_16gb`` preset in fp16, each cell runs through :func:`attnbench.runner.run_cell`: the
model predicts the max batch, real probes under ``set_per_process_memory_fraction`` confirm
or correct it, and the forward is timed at that batch with CUDA events. Then the same for
``mode=train`` (n = 512 ... 4096, AdamW, fp16 autocast, and with ``checkpoint=true`` at
n = 1024): real training steps probe the training max batch, which checks the training
memory model — its emulated CUDA autocast and fused-kernel choice included — against the
allocator. Then serving (``mode=decode``, ``batch=max``, fp16, 64 tokens after a prompt of
n = 2048): vanilla, vanilla with grouped-query heads (kv_heads = 3), sdpa, linear and
local. The model predicts the serving max batch (every sequence's cache or state beside the
weights and one prefill), real probes confirm or correct it, and each decode step is timed
at that batch: the time per token, and the bytes a step reads over its time (the achieved
bandwidth) against the copy bandwidth of the same GPU. Full rows go to ``--out`` as JSON
lines (written as each cell finishes); two short tables are printed at the end.

The decode cells use the ``h100_80gb`` preset (the serving batch of the card this check is
meant for: tens of thousands of sequences for linear, each slot past the first a copy of the
one prefilled state, not a prefill of its own); ``--decode-device v100_16gb`` puts them under
the 16 GB ceiling of the other cells, for a GPU with less than 80 GB. A preset this GPU
cannot hold ends the script before anything runs.

Then compiled cells (``compile=true``, every layer under ``torch.compile``, n = 4096, fp16,
batch max under the 16 GB ceiling): vanilla, sdpa, linear and local, whose max-batch probes
run the compiled step (the compiled memory, measured), and ``flex`` with local's window, in
the eager model (its kernel compiled) and compiled, inference and a training step (no
backward on a CPU: this is where flex trains). Their compile times are in the rows.

    bash scripts/gpu_check.sh                  # on a CUDA machine; writes results/gpu_check/
    bash scripts/gpu_check.sh --decode-only    # the serving cells alone (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from attnbench.cell import Cell, validate
from attnbench.env import fix_malloc
from attnbench.measure import presets
from attnbench.row import Row, read
from attnbench.runner import MemoryModel, run_cell

NS = (512, 1024, 2048, 4096, 8192, 16384)
NS_TRAIN = (512, 1024, 2048, 4096)
LAYERWISE = (("sharing", "layerwise"),)
EAGER = (("kernel", "eager"), ("sharing", "layerwise"))  # the paper's materialised n × k P̄
MECHANISMS = (
    ("vanilla", None, ()),
    ("sdpa", None, ()),
    ("linformer", 128, EAGER),
    ("linformer", 256, EAGER),
    ("linformer", 256, LAYERWISE),
)
# the other mechanisms at their default budgets, inference only: each one's first
# real CUDA forward, its memory model against the device, and its time beside vanilla's
ZOO = tuple(
    (name, None, params)
    for name in ("performer", "nystromformer", "linear", "local", "reformer", "vanilla")
    for params in ((), (("causal", True),))
    if not (name == "nystromformer" and params) and not (name == "vanilla" and not params)
)
MIXER_NAMES = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")


def mixers() -> tuple:
    """The recurrent mixers, causal, inference: our chunked cores, and beside each
    flash-linear-attention's kernels (kernel=fla) where they can run here: ours against theirs."""
    from attnbench.attention import fla_kernels

    kernels = ("torch",) if fla_kernels.why_unavailable() else ("torch", "fla")
    return tuple(
        (name, None, (("causal", True), ("kernel", kernel)))
        for name in MIXER_NAMES
        for kernel in kernels
    )


TIMING = {"min_repeats": 3, "min_seconds": 0.3}  # keeps the whole check near 5 min on an H100
# serving: (mechanism, grouped-query heads): kv_heads = n_heads / 4 where True (3 of 12, as
# +sweep=serving), each at every n of NS_DECODE, causal, its decode steps timed
DECODE = (
    ("vanilla", False),
    ("vanilla", True),
    ("sdpa", False),
    ("linear", False),
    ("local", False),
    *((name, False) for name in MIXER_NAMES),
)
NS_DECODE = (2048,)
# compiled: (mechanism, params, mode, compile) at NS_COMPILED
COMPILED = (
    *((name, (), "inference", True) for name in ("vanilla", "sdpa", "linear", "local")),
    *(
        ("flex", (("pattern", "window"),), mode, comp)
        for mode in ("inference", "train")
        for comp in (False, True)
    ),
)
NS_COMPILED = (4096,)
DECODE_TOKENS = 64  # the steps timed at the max batch (the first two are warm-ups)


def cells(
    ns: tuple[int, ...],
    shape: dict,
    device: str,
    dtype: str,
    mechanisms: tuple = MECHANISMS,
    **train: object,
) -> list[Cell]:
    return [
        Cell(name, n=n, k=k, params=params, device=device, dtype=dtype, **shape, **train)
        for n in ns
        for name, k, params in mechanisms
        if k is None or k < n
    ]


def all_cells(ns: tuple, ns_train: tuple, shape: dict, device: str, dtype: str) -> list[Cell]:
    """Inference at ``ns`` (the zoo too); a training step at ``ns_train``; checkpointed at
    the second."""
    return (
        cells(ns, shape, device, dtype)
        + cells(ns, shape, device, dtype, ZOO)
        + cells(ns, shape, device, dtype, mixers())
        + cells(ns_train, shape, device, dtype, mode="train")
        + cells(
            ns_train[1:2], shape, device, dtype, mode="train", mode_settings={"checkpoint": True}
        )
    )


def decode_cells(
    ns: tuple[int, ...], shape: dict, device: str, dtype: str, batches: tuple = ("max",)
) -> list[Cell]:
    """The serving cells: each of :data:`DECODE` at each n and batch, causal."""
    return [
        Cell(
            name,
            n=n,
            batch=batch,
            params=(("causal", True),),
            device=device,
            dtype=dtype,
            mode="decode",
            mode_settings={"decode_tokens": DECODE_TOKENS},
            kv_heads=shape.get("n_heads", 12) // 4 if gqa else None,
            **shape,
        )
        for n in ns
        for batch in batches
        for name, gqa in DECODE
    ]


def compiled_cells(
    ns: tuple[int, ...], shape: dict, device: str, dtype: str, gpu: bool = True
) -> list[Cell]:
    """The compiled cells: each of :data:`COMPILED` at each n (flex's training only on a
    GPU: there is no FlexAttention backward on a CPU)."""
    return [
        Cell(name, n=n, params=params, device=device, dtype=dtype, mode=mode, compile=comp, **shape)
        for n in ns
        for name, params, mode, comp in COMPILED
        if gpu or not (name == "flex" and mode == "train")
    ]


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
        name = r.attention + (f" kv_heads={kv}" if kv else "")
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


def residual_table(rows: list[Row], todo: list[Cell]) -> str:
    """The memory model against the allocator, bytes not batches: each eager row's modeled
    peak at the batch the probes found, beside ``torch.cuda.max_memory_allocated`` there
    (both with the preset's overhead), and what the allocator reserved beyond it. A max
    batch the model overstates while its bytes agree is the allocator's fragmentation."""
    cells = {_done_key(c): c for c in todo}
    lines = [
        "| cell | max b | modeled GB | allocated GB | model − allocated | reserved − allocated |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cell = cells.get(_done_key(r))
        if r.status != "ok" or r.compile or not r.max_batch or cell is None or not r.peak_bytes:
            continue
        modeled = MemoryModel(cell, validate(cell)).peak(r.max_batch)
        extra = (r.peak_reserved_bytes or r.peak_bytes) - r.peak_bytes
        lines.append(
            f"| {cell.label} | {r.max_batch} | {modeled / 1e9:.3f} | {r.peak_bytes / 1e9:.3f} | "
            f"{(modeled - r.peak_bytes) / r.peak_bytes:+.2%} | {extra / r.peak_bytes:.1%} |"
        )
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    def work(r: Row) -> tuple:
        return (r.mode, r.checkpoint, bool(dict(r.params).get("causal")), r.compile)

    base = {(r.n, work(r)): r for r in rows if r.attention == "vanilla"}
    lines = [
        "| mechanism | mode | n | max b | memory | modeled max b | probes | model error | "
        "time/seq ms | time ratio vs vanilla | memory ratio vs vanilla | status |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        kernel = dict(r.params).get("kernel")
        name = (
            r.attention
            + (f" k={r.k}" if r.k else "")
            + (f" {kernel}" if kernel else "")
            + (" causal" if work(r)[2] else "")
        )
        v = base.get((r.n, work(r)))
        mode = r.mode + (" checkpoint" if r.checkpoint else "") + (" compiled" if r.compile else "")
        t, tv = r.time_per_seq_s, v and v.time_per_seq_s
        mb, mbv = r.max_batch, v and v.max_batch
        lines.append(
            f"| {name} | {mode} | {r.n} | {mb} | {r.memory_source} | "
            f"{r.predicted_max_batch} | {r.probes} | "
            f"{r.model_error} | {'-' if t is None else f'{t * 1e3:.3f}'} | "
            f"{'-' if not (t and tv) else f'{tv / t:.2f}'} | "
            f"{'-' if not (mb and mbv) else f'{mb / mbv:.2f}'} | "
            f"{r.status if r.status == 'ok' else r.status + ': ' + str(r.reason)} |"
        )
    return "\n".join(lines)


def _done_key(c: Cell | Row) -> str:
    """What tells this script's cells apart, read alike from a cell and from its stored row."""
    return json.dumps(
        [
            c.attention,
            c.n,
            c.k,
            sorted(dict(c.params).items()),
            c.mode,
            c.compile,
            c.device,
            bool(c.settings.get("checkpoint") if isinstance(c, Cell) else c.checkpoint),
            c.batch if isinstance(c, Cell) else c.batch_asked,
            (c.shape if isinstance(c, Cell) else c.model or {}).get("kv_heads"),
        ],
        default=str,
    )


def main(argv: list[str] | None = None) -> int:
    fix_malloc()  # the CPU smoke times on the CPU: the same steady allocator as attnbench run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check/rows.jsonl"))
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on the CPU preset: tests this script without a GPU",
    )
    parser.add_argument(
        "--decode-only",
        action="store_true",
        help="only the serving (mode=decode) cells",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out and run only the cells they lack (a check cut "
        "off by a time limit goes on where it stopped)",
    )
    parser.add_argument(
        "--zoo-last",
        action="store_true",
        help="run the zoo's inference cells after the training, compiled and serving ones "
        "(when device time is short, the zoo is what can wait)",
    )
    parser.add_argument(
        "--decode-device",
        default="h100_80gb",
        choices=presets.names(),
        help="the device preset of the serving cells' max batch (default: %(default)s; "
        "v100_16gb on a GPU with less memory)",
    )
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        tiny = {
            "layers": 2,
            "d_model": 64,
            "n_heads": 4,
            "d_ff": 128,
            "min_repeats": 2,
            "min_seconds": 0.0,
            "ceiling_bytes": 64 << 20,
        }
        # serving: batch=max is modeled only on a CPU; vanilla at batch=2 times its steps
        decode = decode_cells((128,), tiny, "cpu", "fp32")
        decode += [replace(c, batch=2) for c in decode[:1]]
        todo = compiled_cells((128,), tiny, "cpu", "fp32", gpu=False)
        todo += [c for c in all_cells((64, 128), (64, 128), tiny, "cpu", "fp32") if c.k is None]
        todo += [
            Cell(
                "linformer",
                n=128,
                k=32,
                params=(("sharing", "layerwise"),),
                device="cpu",
                dtype="fp32",
                layers=2,
                d_model=64,
                n_heads=4,
                d_ff=128,
                min_repeats=2,
                min_seconds=0.0,
                ceiling_bytes=64 << 20,
            )
        ]
    else:
        if not torch.cuda.is_available():
            print(
                "gpu_check: error: needs a CUDA GPU (torch.cuda.is_available() is False); "
                "use --cpu-smoke to exercise the script",
                file=sys.stderr,
            )
            return 2
        todo = all_cells(NS, NS_TRAIN, TIMING, "v100_16gb", "fp16")
        todo += compiled_cells(NS_COMPILED, TIMING, "v100_16gb", "fp16")
        decode = decode_cells(NS_DECODE, TIMING, args.decode_device, "fp16")
    todo = decode if args.decode_only else todo + decode
    try:  # a preset this GPU cannot hold: one line now, not a traceback minutes in
        validate(decode[0])
    except ValueError as e:
        print(f"gpu_check: error: --decode-device {args.decode_device}: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = read(args.out) if args.resume and args.out.exists() else []
    done = {_done_key(r) for r in rows}
    left = [c for c in todo if _done_key(c) not in done]
    if args.zoo_last:
        zoo = {_done_key(c) for c in todo if c.mode == "inference" and not c.compile}
        zoo -= {_done_key(c) for c in cells(NS, TIMING, "v100_16gb", "fp16")}
        left.sort(key=lambda c: _done_key(c) in zoo)  # stable: otherwise in order
    if rows:
        print(f"gpu_check: {len(rows)} rows kept from {args.out}, {len(left)} cells to run")
    with args.out.open("a" if rows else "w") as f:
        for i, cell in enumerate(left, 1):
            start = time.perf_counter()
            row = run_cell(cell)
            row.wall_s = time.perf_counter() - start
            rows.append(row)
            f.write(row.to_json() + "\n")
            f.flush()
            print(
                f"[{i}/{len(left)}] {cell.label}: {row.status} "
                f"b={row.max_batch} ({row.wall_s:.1f} s)",
                flush=True,
            )
    device = rows[0].env["device_name"] if rows else "?"
    print(
        f"\n{device}, torch {torch.__version__}, preset {todo[0].device}, {todo[0].dtype}; "
        f"rows in {args.out}\n"
    )
    rest = [r for r in rows if r.mode != "decode"]
    if rest:
        print(table(rest))
    if served := [r for r in rows if r.mode == "decode"]:
        print(f"\nserving ({served[0].device}, {served[0].dtype}):\n")
        print(decode_table(served))
    print("\nthe memory model against the allocator, at each measured max batch:\n")
    print(residual_table(rows, todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
