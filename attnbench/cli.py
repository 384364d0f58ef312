"""Command line: ``attnbench run`` (Hydra; see :mod:`attnbench.sweep`), ``list``, ``demo``.

``run`` is taken off the command line before Hydra sees it; ``list`` and ``demo`` are plain
argparse, as is ``report`` (see :mod:`attnbench.report.files`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import attnbench
from attnbench.measure.timing import time_forward


def mechanism_rows() -> list[tuple[str, str, str, str, str, str, str]]:
    """One row per mechanism from ``info()``: the source of README's table and ``list``."""
    rows = []
    for name in attnbench.names():
        i = attnbench.info(name)
        rows.append((
            name, i.summary, "yes" if i.causal else "no", "yes" if i.padding_mask else "no",
            ", ".join(i.devices), ", ".join(i.dtypes), i.budget or "-",
        ))
    return rows


HEADERS = ("name", "what", "causal", "padding mask", "devices", "dtypes", "budget (k)")


def markdown_table() -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", r"\|") for c in r) + " |" for r in mechanism_rows()]
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown_table())
        return 0
    table = Table(*HEADERS, "available here", title="attnbench mechanisms")
    table.columns[0].no_wrap = True
    for row in mechanism_rows():
        why = attnbench.info(row[0]).unavailable
        table.add_row(*row, "yes" if why is None else f"no: {why}")
    _console().print(table)
    return 0


def _console() -> Console:
    """Rich console; piped output (logs, CI) gets a wide page rather than 80 wrapped columns."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.k >= args.n:
        print(f"attnbench demo: error: --k: must be below --n={args.n}, got {args.k}",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    x = torch.randn(1, args.n, 768)
    console = _console()
    console.print(f"One Table 3 cell on {torch.get_num_threads()} CPU threads: 12-layer "
                  f"RoBERTa-base encoder, n={args.n}, k={args.k}, batch 1, fp32, median of "
                  f"{args.repeats} forwards (a first look, not the paper's GPU protocol).")
    t = {}
    for name, params in (("vanilla", {}), ("linformer", {"k": args.k, "sharing": "layerwise"})):
        model = attnbench.build_model(name, max_seq_len=args.n, **params)
        t[name] = time_forward(lambda m=model: m(x), x.device, min_repeats=args.repeats,
                               max_repeats=args.repeats, min_seconds=0.0, warmup=1).median
        console.print(f"  {name:10s} {t[name] * 1e3:9.1f} ms per forward")
    console.print(f"  time ratio (vanilla / linformer): {t['vanilla'] / t['linformer']:.2f}x")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from attnbench.report import files
    from attnbench.store import CorruptLine

    try:
        report = files.build(args.run_dir, args.baseline)
    except (ValueError, CorruptLine) as e:
        print(f"attnbench report: error: {e}", file=sys.stderr)
        return 2
    out = args.out or files.default_out(args.run_dir)
    if not args.quiet:
        files.print_tables(report, _console())
    written = files.render(report, with_plots=not args.no_plots)
    files.write(written, out)
    print(f"attnbench: report of {len(report.rows)} cells in {out}/ (index.html, table3.md, "
          f"table3.tex, {sum(f.endswith('.csv') for f in written)} CSV, "
          f"{sum(f.endswith('.png') for f in written)} plots)")
    return 0


def _positive(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Is this efficient attention really faster and leaner than the "
                    "Transformer's, on my machine, at my sequence lengths?",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("run", help="measure one cell or a sweep (Hydra overrides; "
                              "'attnbench run --help' for keys, groups and examples)")
    p = sub.add_parser("list", help="mechanisms, their capabilities and whether they run here")
    p.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser(
        "report", help="Table 3 from a run directory: Markdown, CSV, LaTeX, HTML, plots",
        description="Time and memory ratio tables (rows n, columns k) of every mechanism "
                    "against the baseline, the paper's Table 3 beside Linformer's, and plots. "
                    "Written to OUT in one step; the tables are also printed.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="a directory holding cells.jsonl, e.g. results/table3/v100_16gb-cpu")
    p.add_argument("--out", type=Path, help="where to write (default RUN_DIR/report); "
                   "replaced as a whole")
    p.add_argument("--baseline", default="vanilla",
                   help="the mechanism every ratio is taken against (default vanilla)")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("demo", help="time vanilla against Linformer (layerwise) on one cell")
    p.add_argument("--n", type=_positive, default=1024, help="sequence length (default 1024)")
    p.add_argument("--k", type=_positive, default=128, help="Linformer's k (default 128)")
    p.add_argument("--repeats", type=_positive, default=3, help="timed forwards (default 3)")
    p.set_defaults(fn=cmd_demo)
    return parser


def cmd_run(args: list[str]) -> int:
    """``attnbench run ARGS``: validate every cell first (one line, exit 2, nothing written),
    then hand the same arguments to Hydra."""
    from attnbench import sweep

    if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i") or a.startswith("--cfg")
               or a in ("-c",) for a in args):
        try:
            plan = sweep.prevalidate(args)
        except ValueError as e:
            print(f"attnbench run: error: {e}", file=sys.stderr)
            return 2
        # shared with the Hydra callback and every job, also in launcher subprocesses
        fd, path = tempfile.mkstemp(prefix="attnbench-plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(plan, f)
        os.environ[sweep.PLAN_ENV] = path
        os.environ[sweep.INVOCATION_ENV] = uuid.uuid4().hex
    sys.argv = ["attnbench run", *args]
    try:
        sweep.hydra_main()
    finally:  # the plan and the claims of this command are of no use after it
        sweep.forget_invocation()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # taken off before Hydra sees the command line
        return cmd_run(argv[1:])
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
