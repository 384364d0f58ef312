"""Command line: ``attnbench run`` (Hydra; see :mod:`attnbench.sweep`), ``list``, ``demo``.

``run`` is taken off the command line before Hydra sees it; ``list`` and ``demo`` are plain
argparse, as are ``report`` (see :mod:`attnbench.report.files`) and ``check``. What
``demo``, ``report`` and ``check`` do is in :mod:`attnbench.commands`, ``list`` in
:mod:`attnbench.listing`; here, the parser.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench import commands
from attnbench.listing import cmd_list
from attnbench.plugins import PluginError
from attnbench.validators import argtype, parse_fraction, parse_int, parse_path

# torch, rich and the measuring code are imported by the commands that use them, so that
# `attnbench --help` and a typo's one line come back without loading torch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Is this efficient attention really faster and leaner than the "
        "Transformer's, on my machine, at my sequence lengths?",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_run, _add_list, _add_report, _add_check, _add_demo):
        add(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction) -> None:
    """Only for the help: main() hands ``run`` to Hydra before this parser sees it."""
    sub.add_parser(
        "run",
        help="measure one cell or a sweep (Hydra overrides; "
        "'attnbench run --help' for keys, groups and examples)",
    )


def _add_list(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="mechanisms, their capabilities and whether they run here")
    p.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    p.set_defaults(fn=cmd_list)


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="Table 3 from a run directory: Markdown, CSV, LaTeX, HTML, plots",
        description="Time and memory ratio tables (rows n, columns k) of every mechanism "
        "against the baseline, the paper's Table 3 beside Linformer's, and plots. "
        "Written to OUT in one step; the tables are also printed.",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="a directory holding cells.jsonl, e.g. results/table3/v100_16gb-cpu",
    )
    p.add_argument(
        "--out",
        type=argtype(parse_path, "--out"),
        help="where to write (default RUN_DIR/report); replaced as a whole",
    )
    p.add_argument(
        "--baseline",
        help=f"the mechanism every ratio is taken against (default {commands.BASELINE})",
    )
    p.add_argument(
        "--also",
        type=Path,
        action="append",
        default=[],
        metavar="RUN_DIR",
        help="another run's rows in the same report (repeatable), e.g. the inference run "
        "beside a training run of the same grid: its tables too, and both in the plots",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")
    p.set_defaults(fn=commands.cmd_report)


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="the CI regression gate: working tree against a git ref, interleaved",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time the regression suite (conf/sweep/regression.yaml) for the working "
        "tree (B) and a git ref (A,\nchecked out in a temporary worktree), "
        "interleaved A B A B ..., and fail when a cell is slower\nby more than "
        "its threshold AND significantly so (one-sided Mann-Whitney U, p < "
        "alpha).",
        epilog="exit status: 1 if a cell regressed, 0 if none did, 2 on misuse, 3 if the "
        "machine was\ntoo busy to judge a cell (its samples ran on a contended CPU, even "
        "taken again\nafter a pause; 0 instead with --on-busy pass)\n\n"
        "examples:\n"
        "  attnbench check                          # against the parent commit\n"
        "  attnbench check --against origin/main --threshold 15%\n"
        "  attnbench check --write-baseline results/baseline.json   # on a CI runner\n"
        "  attnbench check --baseline results/baseline.json",
    )
    _add_check_versions(p)
    p.add_argument(
        "--suite",
        default="regression",
        help="the sweep whose cells and check: settings to use (default regression)",
    )
    p.add_argument("--config-dir", metavar="DIR", help="extra config dir holding sweep/SUITE.yaml")
    p.add_argument(
        "--threshold",
        type=argtype(parse_fraction, "--threshold"),
        help="default slowdown a cell may show before failing, e.g. 0.1 or 10%% "
        "(default: the suite's check.threshold)",
    )
    p.add_argument(
        "--rounds",
        type=argtype(parse_int, "--rounds"),
        help="samples per cell and version (default: the suite's check.rounds)",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="also time each forward cell's layer under torch.compile, compiled before its "
        "first sample (default: the suite's check.compile)",
    )
    p.add_argument(
        "--on-busy",
        choices=("fail", "pass"),
        help="when cells stay too contended to judge after check.busy_retries more tries: "
        "fail (exit 3) or pass (exit 0, the no-verdict line printed; a regression still "
        "exits 1) (default: the suite's check.on_busy)",
    )
    p.add_argument(
        "--json",
        type=argtype(parse_path, "--json"),
        default=Path("results/check/latest.json"),
        help="where to write every sample and verdict (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="order of the interleaving")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=commands.cmd_check)


def _add_check_versions(p: argparse.ArgumentParser) -> None:
    """``check``'s three ways to say what version A is, of which one at most: a git ref,
    timed interleaved with the working tree; a stored baseline; or none, storing one."""
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--against", metavar="REF", help="git ref of version A (default: the parent commit, HEAD~1)"
    )
    which.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="compare with samples stored by --write-baseline on this machine",
    )
    which.add_argument(
        "--write-baseline",
        type=argtype(parse_path, "--write-baseline"),
        metavar="FILE",
        help="time the working tree only and store its samples in FILE",
    )


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="time vanilla against Linformer (layerwise) on one cell")
    p.add_argument(
        "--n", type=argtype(parse_int, "--n"), default=1024, help="sequence length (default 1024)"
    )
    p.add_argument(
        "--k", type=argtype(parse_int, "--k"), default=128, help="Linformer's k (default 128)"
    )
    p.add_argument(
        "--repeats",
        type=argtype(parse_int, "--repeats"),
        default=3,
        help="timed forwards (default 3)",
    )
    p.set_defaults(fn=commands.cmd_demo)


def cmd_run(args: list[str]) -> int:
    """``attnbench run ARGS``: see :mod:`attnbench.sweep.command`."""
    from attnbench.sweep import command

    return command.main(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["run"]:  # taken off before Hydra sees the command line
            return cmd_run(argv[1:])
        args = build_parser().parse_args(argv)
        try:
            return args.fn(args)
        except KeyboardInterrupt:  # a report is written in one rename: nothing is half-written
            print(f"\nattnbench {args.command}: interrupted; nothing was changed", file=sys.stderr)
            return 130
    except PluginError as e:  # wherever the command first looked at its plugins: before it wrote
        print(f"attnbench {argv[0]}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
