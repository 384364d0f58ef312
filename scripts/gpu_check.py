"""GPU check: what has never run on a GPU first, then real against modeled max batch, probes
and time ratios under a 16 GB ceiling; within one device window (``--budget``).

Each cell runs through :func:`attnbench.runner.run_cell`. At ``batch=max`` the model
predicts the max batch, real probes under ``set_per_process_memory_fraction`` confirm or
correct it, and the step is timed at that batch with CUDA events; at a fixed batch the peak
and the time are measured there. The ``v100_16gb`` preset and fp16 throughout but where
said. The cells, in this order (a device window is 15 minutes, start-up included, and may
not come twice: what has never run on a GPU comes first):

1. **fla against torch**: each recurrent mixer (retnet, gla, mamba2, deltanet,
   gated_deltanet), causal, n = 2048, flash-linear-attention's kernels (``kernel=fla``)
   beside our chunked cores (``kernel=torch``) at one batch for both, so that the rows
   differ by the kernel alone and no search spends the window: the forward (b = 8), a
   training step (AdamW, fp16 autocast over fp32 weights, b = 2), decode (64 tokens after a
   prompt of n, b = 8) and a packed forward (``mode=packed``: the default draw, lognormal
   documents around 1024 tokens under 16 384 a copy, one row a copy, b = 2).
2. **An fp32 Gated DeltaNet**, both kernels, the forward (fla's ``tl.dot`` runs fp32 as
   TF32 on this GPU; the rows record it).
3. **flex trains after an inference cell**: flex (window) at n = 4096, the forward and
   then a training step in one process (the first run's finding 5: a block mask cached
   under ``inference_mode`` could not be saved for backward).
4. **Decode over a mix**: vanilla and sdpa serving drawn prompts (``contexts=drawn``, the
   same draw) beside every prompt n = 2048, at the serving preset's max batch.
5. **Packed against padded**: sdpa and Gated DeltaNet (``kernel=fla``), one draw packed
   and padded, ``batch=max``.
6. **The allocator's fragmentation**: sdpa and Linformer (k = 256, layerwise) at n = 512
   with the default allocator, then with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
   in a child process (the setting is read when CUDA starts); the first run's finding 3:
   the modeled max batch 8-25 % over the real one while the bytes agree. The row's
   ``env`` records the setting.
7. **The rest of the first run** (the cells it never finished first): Table 3 (vanilla,
   sdpa, Linformer layerwise k = 128, 256; n = 512 ... 16384) and the other mechanisms'
   forward (the zoo, and the mixers on both kernels at ``batch=max``); training steps
   (n = 512 ... 4096, and with ``checkpoint=true`` at 1024), which check the training
   memory model, its emulated autocast included, against the allocator; compiled cells
   (``compile=true``, n = 4096: vanilla, sdpa, linear, local, whose probes run the compiled
   step, and flex in the eager model and compiled, forward and training step); serving
   (``mode=decode``, ``batch=max``, 64 tokens after n = 2048: vanilla, vanilla with
   kv_heads = 3, sdpa, linear, local and the mixers): the serving max batch, the time per
   token, and the bytes a step reads over its time against the GPU's copy bandwidth.

Serving runs under the ``h100_80gb`` preset (``--decode-device v100_16gb`` on a GPU with
less than 80 GB; a preset this GPU cannot hold ends the script before anything runs). A cell
that validation refuses (fla's fp32 delta rule, flex's backward on a CPU) is listed with its
reason and skipped. Rows go to ``--out`` as JSON lines, each as its cell finishes; the tables
are printed at the end. ``--plan`` prints the order with each cell's estimated seconds,
without a GPU; ``--budget S`` stops before S seconds, and ``--resume`` goes on from there
(scripts/gpu_check_plan.py: how estimates are made, and the stopping rule).

    bash scripts/gpu_check.sh --budget 540       # on a CUDA machine; writes results/gpu_check/
    python scripts/gpu_check.py --plan --budget 540   # anywhere: what that call runs
    bash scripts/gpu_check.sh --decode-only      # the serving cells alone
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from gpu_check_cells import (
    ALLOC_ENV,
    DECODE_TOKENS,
    GPU,
    NS_DECODE,
    SMOKE,
    TIMING,
    Item,
    _done_key,
    decode_cell,
    decode_cells,
    order,
)
from gpu_check_plan import Estimates, Step, as_on_a_gpu, parse_budget, plan_lines, run, schedule
from gpu_check_tables import decode_table, residual_table, table

from attnbench.env import fix_malloc
from attnbench.measure import presets
from attnbench.plan import label, validate
from attnbench.row import read
from attnbench.runner import run_cell

# what the tests and a reader reach through this script
__all__ = ["DECODE_TOKENS", "NS_DECODE", "TIMING", "decode_cells", "main", "order"]


def validated(items: list[Item]) -> tuple[dict[str, Any], list[tuple[Item, str]]]:
    """Each item's validation (by key), and the items refused with their one-line reason."""
    resolved, refused = {}, []
    for item in items:
        try:
            resolved[_done_key(item)] = validate(item.cell)
        except ValueError as e:
            refused.append((item, str(e)))
    return resolved, refused


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check/rows.jsonl"))
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on the CPU preset: tests this script without a GPU",
    )
    parser.add_argument(
        "--decode-only", action="store_true", help="only the serving (mode=decode) cells"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out and run only the cells they lack (a check cut "
        "off by --budget or a time limit goes on where it stopped)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the cells in order with their estimated seconds and the sum, run "
        "nothing (no GPU needed); with --budget, where that call would stop",
    )
    parser.add_argument(
        "--budget",
        metavar="SECONDS",
        help="stop before this many seconds from the start: no cell starts whose estimate "
        "would pass it (the tables' time reserved); rows kept, --resume continues",
    )
    parser.add_argument(
        "--estimates",
        type=Path,
        default=Path("results/gpu_check/rows.jsonl"),
        help="the last GPU run's rows, whose wall times estimate each cell (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-device",
        default="h100_80gb",
        choices=presets.names(),
        help="the device preset of the serving cells' max batch (default: %(default)s; "
        "v100_16gb on a GPU with less memory)",
    )
    parser.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)
    # gpu_check.sh's start (seconds since the epoch): --budget counts from there
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--alloc-conf", help=argparse.SUPPRESS)  # the child of section 6
    return parser


def error(message: str) -> int:
    print(f"gpu_check: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parser().parse_args(argv)
    if args.started is not None:
        started -= min(max(time.time() - args.started, 0.0), 60.0)
    try:
        budget = parse_budget(args.budget)
    except ValueError as e:
        return error(str(e))
    if args.check_args:  # gpu_check.sh: the arguments, before it writes anything
        return 0
    gpu = not args.cpu_smoke
    if gpu and not args.plan and not torch.cuda.is_available():
        return error(
            "needs a CUDA GPU (torch.cuda.is_available() is False); use --plan to see what "
            "it would run, --cpu-smoke to exercise the script"
        )
    profile = replace(GPU, decode_device=args.decode_device) if gpu else SMOKE
    try:
        rows = read(args.out) if args.resume and args.out.exists() else []
    except (ValueError, OSError) as e:
        return error(f"--out {args.out}: cannot read its rows to resume: {e}")
    try:
        before = read(args.estimates) if args.estimates.exists() else []
    except (ValueError, OSError) as e:
        return error(f"--estimates {args.estimates}: cannot read its rows: {e}")
    estimates = Estimates.of(before, _done_key, str(args.estimates))
    items = order(profile, set(estimates.measured))
    if args.decode_only:
        items = [i for i in items if i.cell.mode == "decode"]
    if args.alloc_conf is not None:  # the child: its own cells alone
        items = [i for i in items if i.alloc == args.alloc_conf]
    if not args.plan:
        try:  # a preset this GPU cannot hold: one line now, not a refusal per cell
            first = profile.ns_decode[0]
            validate(
                decode_cell("vanilla", first, profile.shape, profile.decode_device, profile.dtype)
            )
        except ValueError as e:
            return error(f"--decode-device {args.decode_device}: {e}")
    with as_on_a_gpu() if args.plan and gpu else contextlib.nullcontext():
        resolved, refused = validated(items)
    done = {_done_key(r) for r in rows}
    left = [i for i in items if _done_key(i) not in done and _done_key(i) in resolved]
    mine = os.environ.get(ALLOC_ENV)

    def estimate(item: Item) -> tuple[float, str]:  # another allocator's: the default's time
        return estimates.seconds(item.cell, _done_key(item), _done_key(item.cell))

    steps = schedule(left, estimate, mine)

    def describe(item: Item) -> str:
        c = item.cell
        return (
            label(c)
            + (f" b={c.batch}" if c.batch != "max" else "")
            + (f" {c.dtype}" if c.dtype != profile.dtype else "")
            + (f" on {c.device}" if c.device != profile.device else "")
            + (f" {ALLOC_ENV}={item.alloc}" if item.alloc else "")
        )

    if args.plan:
        print("\n".join(plan_lines(steps, refused, estimates, budget, len(rows), describe)))
        return 0
    fix_malloc()  # the CPU smoke times on the CPU: the same steady allocator as attnbench run
    if args.alloc_conf is None:
        for item, why in refused:
            print(f"gpu_check: refused at validation, not run: {describe(item)}: {why}")
    if rows:
        print(f"gpu_check: {len(rows)} rows kept from {args.out}, {len(left)} cells to run")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        args.out.write_text("")
    count = iter(range(1, len(left) + 1))

    def run_one(step: Step) -> None:
        item, start = step.item, time.perf_counter()
        row = run_cell(item.cell, resolved[_done_key(item)])
        row.wall_s = time.perf_counter() - start
        if mine:  # the allocator setting it ran under (section 6)
            row.update(env={**row.env, ALLOC_ENV: mine})
        rows.append(row)
        done.add(_done_key(row))
        with args.out.open("a") as f:
            f.write(row.to_json() + "\n")
        print(
            f"[{next(count)}/{len(left)}] {describe(item)}: {row.status} "
            f"b={row.max_batch} ({row.wall_s:.1f} s)",
            flush=True,
        )

    def run_child(alloc: str | None, group: list[Step], left_s: float | None) -> None:
        command = [sys.executable, __file__, "--resume", "--out", str(args.out)]
        command += ["--estimates", str(args.estimates), "--alloc-conf", str(alloc)]
        command += ["--decode-device", args.decode_device]
        command += ["--cpu-smoke"] * args.cpu_smoke + ["--decode-only"] * args.decode_only
        command += [] if left_s is None else ["--budget", f"{max(left_s, 1e-3):.3f}"]
        env = {k: v for k, v in os.environ.items() if k != ALLOC_ENV}
        print(f"gpu_check: {len(group)} cells in a process with {ALLOC_ENV}={alloc}", flush=True)
        code = subprocess.run(command, env={**env, ALLOC_ENV: alloc} if alloc else env).returncode
        if code:
            print(f"gpu_check: that process exited {code}", flush=True)
        rows[:] = read(args.out)
        done.update(_done_key(r) for r in rows)
        for _ in group:  # numbered there
            next(count, None)

    not_run = run(
        steps, budget=budget, start=started, clock=time.monotonic, rows=len(rows),
        run_one=run_one, run_child=run_child, done=lambda i: _done_key(i) in done,
    )  # fmt: skip
    if args.alloc_conf is not None:  # the child: its parent prints the tables
        return 0
    device = rows[0].env["device_name"] if rows else "?"
    print(
        f"\n{device}, torch {torch.__version__}, preset {profile.device}, {profile.dtype}; "
        f"rows in {args.out}\n"
    )
    if rest := [r for r in rows if r.mode != "decode"]:
        print(table(rest, profile.dtype))
    if served := [r for r in rows if r.mode == "decode"]:
        print(f"\nserving ({served[0].device}, {served[0].dtype}):\n")
        print(decode_table(served))
    print("\nthe memory model against the allocator, at each measured max batch:\n")
    print(residual_table(rows, items))
    if not_run := [s for s in not_run if s.item is not None]:
        why = f"--budget {budget:g} s" if budget else "a child process did not finish"
        print(
            f"\ngpu_check: stopped ({why}) before {len(not_run)} cells "
            f"({sum(s.seconds for s in not_run):.0f} s estimated); --resume runs them:"
        )
        print("\n".join(f"  {describe(s.item)}" for s in not_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
