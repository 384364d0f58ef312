"""What ``attnbench demo``, ``report`` and ``check`` do, each returning its exit code.

:mod:`attnbench.cli` parses the command line and dispatches here, so that the parser's module
stays short. Each command imports torch, rich and the measuring code inside itself, so that
importing this module (as ``attnbench --help`` does) loads none of them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# the report's baseline where none is named (conf/config.yaml's report_baseline for a sweep)
BASELINE = "vanilla"


def make_console() -> Console:
    """Rich console; piped output (logs, CI) gets a wide page rather than 80 wrapped columns."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def cmd_demo(args: argparse.Namespace) -> int:
    """One Table 3 cell timed on the CPU, vanilla against Linformer: a first look."""
    import torch

    from attnbench.cell_rules import check_k
    from attnbench.env import fix_malloc, use_threads
    from attnbench.measure.timing import time_forward
    from attnbench.model import build_model

    try:  # the rule every cell applies (Linformer projects n positions onto at most n)
        check_k("linformer", args.n, args.k)
    except ValueError as e:
        print(f"attnbench demo: error: --{e}", file=sys.stderr)
        return 2
    fix_malloc()  # steady CPU timings, as attnbench run has them
    use_threads(None)  # the CPUs this process was given, as attnbench run times on
    torch.manual_seed(0)
    x = torch.randn(1, args.n, 768)
    console = make_console()
    console.print(
        f"One Table 3 cell on {torch.get_num_threads()} CPU threads: 12-layer "
        f"RoBERTa-base encoder, n={args.n}, k={args.k}, batch 1, fp32, median of "
        f"{args.repeats} forwards (a first look, not the paper's GPU protocol)."
    )
    t, busy = {}, []
    for name, params in (("vanilla", {}), ("linformer", {"k": args.k, "sharing": "layerwise"})):
        model = build_model(name, max_seq_len=args.n, **params)
        timing = time_forward(
            lambda m=model: m(x),
            x.device,
            min_repeats=args.repeats,
            max_repeats=10 * args.repeats,  # room to take contended forwards again
            min_seconds=0.0,
            warmup=1,
            patience_s=10.0,
        )
        t[name] = timing.median
        if timing.busy and timing.contention is not None:
            busy.append(f"{name}: {timing.contention.why}")
        console.print(f"  {name:10s} {t[name] * 1e3:9.1f} ms per forward")
    if busy:
        console.print(f"  no time ratio: machine busy ({'; '.join(busy)})", markup=False)
        return 0
    console.print(f"  time ratio (vanilla / linformer): {t['vanilla'] / t['linformer']:.2f}x")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A run directory's report. Bad rows, a bad run dir or ``--out`` and a disk that
    refuses the write (full, read-only, a file in the way) are one line on stderr and exit
    2, with nothing written; the line is made printable, as it may quote a hostile value."""
    from attnbench.report import files, terminal
    from attnbench.row import printable, shown

    def error(message: str) -> int:
        print(f"attnbench report: error: {shown(message, 2000)}", file=sys.stderr)
        return 2

    out = args.out or files.default_out(args.run_dir)
    try:  # the rows first: a bad run dir is said as such, not as a bad default --out
        asked = args.baseline is not None
        report = files.build(args.run_dir, args.baseline or BASELINE, args.also, asked=asked)
        files.check_out(out)
    except ValueError as e:  # a bad row or line (BadRow, CorruptLine), run dir, --out
        return error(str(e))
    except OSError as e:  # the rows unreadable
        return error(f"cannot read the rows: {files.os_error(e)}")
    for line in files.said(report):  # said whether or not the tables are shown
        print(line, file=sys.stderr)
    if not args.quiet:
        terminal.print_tables(report, make_console())
    written = files.render(report, with_plots=not args.no_plots)
    try:
        files.write(written, out)
    except ValueError as e:  # --out became something else while the report was made
        return error(str(e))
    except OSError as e:
        return error(f"cannot write the report to {out}: {files.os_error(e)}")
    print(
        f"attnbench: report of {len(report.rows)} cells in {printable(str(out))}/ "
        f"({files.summary(written)})"
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The regression gate (:func:`attnbench.check.run.run`): exit 1 on a regression, 3
    when the machine was too busy to judge, 0 otherwise; misuse and crashes are one line
    and exit 2 (a crash is not a regression), an interrupt one line and exit 130."""

    from attnbench.check import Misuse
    from attnbench.plugins import PluginError

    # CI cancels with SIGTERM: unwind, so that the temporary worktree and workers go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        from attnbench.check.run import run

        return run(
            against=args.against,
            baseline=args.baseline,
            write_baseline=args.write_baseline,
            suite_name=args.suite,
            config_dir=args.config_dir,
            threshold=args.threshold,
            rounds=args.rounds,
            compile=args.compile,
            on_busy=args.on_busy,
            json_path=args.json,
            seed=args.seed,
            quiet=args.quiet,
            out=make_console(),
        )
    except (Misuse, PluginError) as e:
        print(f"attnbench check: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("attnbench check: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a crash is not a regression: never exit 1 for it
        print(f"attnbench check: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 2
