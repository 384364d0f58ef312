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
import time
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
        rows.append(
            (
                name,
                i.summary,
                "yes" if i.causal else "no",
                "yes" if i.padding_mask else "no",
                ", ".join(i.devices),
                ", ".join(i.dtypes),
                i.budget or "-",
            )
        )
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
        print(
            f"attnbench demo: error: --k: must be below --n={args.n}, got {args.k}", file=sys.stderr
        )
        return 2
    torch.manual_seed(0)
    x = torch.randn(1, args.n, 768)
    console = _console()
    console.print(
        f"One Table 3 cell on {torch.get_num_threads()} CPU threads: 12-layer "
        f"RoBERTa-base encoder, n={args.n}, k={args.k}, batch 1, fp32, median of "
        f"{args.repeats} forwards (a first look, not the paper's GPU protocol)."
    )
    t = {}
    for name, params in (("vanilla", {}), ("linformer", {"k": args.k, "sharing": "layerwise"})):
        model = attnbench.build_model(name, max_seq_len=args.n, **params)
        t[name] = time_forward(
            lambda m=model: m(x),
            x.device,
            min_repeats=args.repeats,
            max_repeats=args.repeats,
            min_seconds=0.0,
            warmup=1,
        ).median
        console.print(f"  {name:10s} {t[name] * 1e3:9.1f} ms per forward")
    console.print(f"  time ratio (vanilla / linformer): {t['vanilla'] / t['linformer']:.2f}x")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from attnbench.report import files
    from attnbench.store import CorruptLine

    out = args.out or files.default_out(args.run_dir)
    try:
        files.check_out(out)
        report = files.build(args.run_dir, args.baseline)
    except (ValueError, CorruptLine) as e:
        print(f"attnbench report: error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        files.print_tables(report, _console())
    written = files.render(report, with_plots=not args.no_plots)
    files.write(written, out)
    print(
        f"attnbench: report of {len(report.rows)} cells in {out}/ (index.html, table3.md, "
        f"table3.tex, {sum(f.endswith('.csv') for f in written)} CSV, "
        f"{sum(f.endswith('.png') for f in written)} plots)"
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The regression gate: exit 1 on a regression, 0 otherwise, 2 on misuse or error."""
    import signal

    from attnbench.check import gate

    # CI cancels with SIGTERM: unwind, so that the temporary worktree and workers go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _check(args)
    except gate.Misuse as e:
        print(f"attnbench check: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("attnbench check: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a crash is not a regression: never exit 1 for it
        print(f"attnbench check: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from attnbench.check import gate

    err = Console(stderr=True)
    started = time.time()
    cwd = Path.cwd()
    root = _git_root_or(cwd) if (args.baseline or args.write_baseline) else gate.repo_root(cwd)
    # a user's own mechanisms ($ATTNBENCH_PLUGINS) live in their repo: importable here too
    sys.path.insert(0, str(root))
    suite = gate.load_suite(
        args.suite, args.config_dir, {"threshold": args.threshold, "rounds": args.rounds}
    )
    stored = gate.read_baseline(args.baseline) if args.baseline else None
    a_name = a_commit = None
    if stored is None and not args.write_baseline:
        a_name, a_commit = gate.resolve_ref(root, args.against)
    here = gate.fingerprint(suite.settings)  # for the warning and the result file
    if stored is not None:
        why = gate.settings_mismatch(stored["settings"], suite.settings)
        if why:
            raise gate.Misuse(f"--baseline: {why}; write it again with --write-baseline")
        for line in gate.fingerprint_mismatch(stored["fingerprint"], here):
            err.print(
                f"[yellow]attnbench check: warning: the baseline was recorded on "
                f"another machine or setup ({line}); its times may not compare[/]",
                markup=True,
                highlight=False,
            )
    expect = gate.expected_modules(root)
    for cell, why in suite.skipped:
        err.print(f"attnbench check: skipped {cell}: {why}", markup=False, highlight=False)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=args.quiet,
    ) as bar:
        task = bar.add_task("samples", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if stored is not None or args.write_baseline:
            got = gate.sample(
                {"B": root},
                suite,
                seed=args.seed,
                expect=expect,
                reps=stored["reps"] if stored else None,
                progress=tick,
            )
        else:
            bar.update(task, description=f"A = {a_name}, B = working tree")
            with gate.worktree(root, a_commit) as tree:
                got = gate.sample(
                    {"A": tree, "B": root}, suite, seed=args.seed, expect=expect, progress=tick
                )
    if args.write_baseline:
        if got.unavailable.get("B"):
            raise gate.Misuse(
                "--write-baseline: these cells cannot run here: "
                + "; ".join(f"{c}: {w}" for c, w in got.unavailable["B"].items())
            )
        gate.write_baseline(args.write_baseline, suite, got.versions["B"], got.reps)
        print(
            f"attnbench check: baseline of {len(got.versions['B'])} cells x "
            f"{suite.settings['rounds']} samples written to {args.write_baseline}"
        )
        return 0
    if stored is not None:
        a, a_name = stored["samples"], f"baseline {args.baseline}"
    else:
        a = got.versions["A"]
    why_not = {**got.unavailable.get("A", {}), **got.unavailable.get("B", {})}
    results = gate.judge(suite, a, got.versions["B"], why_not)
    failed = [r for r in results if r.verdict in gate.FAILING]
    if not failed and not any(r.stats for r in results):
        raise gate.Misuse(
            "nothing to compare: no cell ran in both versions ("
            + "; ".join(f"{r.cell}: {r.verdict} {r.note}" for r in results)
            + ")"
        )
    _console().print(gate.table(results, a_name, "working tree", 0.99))
    meta = {
        "against": a_name,
        "against_commit": a_commit,
        "suite": args.suite,
        "settings": suite.settings,
        "fingerprint": here,
        "wall_s": round(time.time() - started, 1),
    }
    gate.write_json(args.json, gate.result_json(results, meta, {"A": a, "B": got.versions["B"]}))
    counts = {
        v: sum(r.verdict == v for r in results)
        for v in ("regressed", "broken", "improved", "same", "new", "gone", "skipped")
    }
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    verdict = (
        ("FAILED: " + ", ".join(f"{r.cell} {r.verdict}" for r in failed)) if failed else "passed"
    )
    print(f"attnbench check: {verdict} ({tally}; {meta['wall_s']:.0f} s; details in {args.json})")
    return 1 if failed else 0


def _git_root_or(cwd: Path) -> Path:
    from attnbench.check import gate

    try:
        return gate.repo_root(cwd)
    except gate.Misuse:
        return cwd


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        value = -1.0
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction like 0.1 or 10%, got {text!r}")
    return value


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
    sub.add_parser(
        "run",
        help="measure one cell or a sweep (Hydra overrides; "
        "'attnbench run --help' for keys, groups and examples)",
    )
    p = sub.add_parser("list", help="mechanisms, their capabilities and whether they run here")
    p.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    p.set_defaults(fn=cmd_list)
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
        "--out", type=Path, help="where to write (default RUN_DIR/report); replaced as a whole"
    )
    p.add_argument(
        "--baseline",
        default="vanilla",
        help="the mechanism every ratio is taken against (default vanilla)",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    p.add_argument("--quiet", action="store_true", help="do not print the tables")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser(
        "check",
        help="the CI regression gate: working tree against a git ref, interleaved",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time the regression suite (conf/sweep/regression.yaml) for the working "
        "tree (B) and a git ref (A,\nchecked out in a temporary worktree), "
        "interleaved A B A B ..., and fail when a cell is slower\nby more than "
        "its threshold AND significantly so (one-sided Mann-Whitney U, p < "
        "alpha).",
        epilog="exit status: 1 if a cell regressed, 0 if none did, 2 on misuse\n\n"
        "examples:\n"
        "  attnbench check                          # against the parent commit\n"
        "  attnbench check --against origin/main --threshold 15%\n"
        "  attnbench check --write-baseline results/baseline.json   # on a CI runner\n"
        "  attnbench check --baseline results/baseline.json",
    )
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
        type=Path,
        metavar="FILE",
        help="time the working tree only and store its samples in FILE",
    )
    p.add_argument(
        "--suite",
        default="regression",
        help="the sweep whose cells and check: settings to use (default regression)",
    )
    p.add_argument("--config-dir", metavar="DIR", help="extra config dir holding sweep/SUITE.yaml")
    p.add_argument(
        "--threshold",
        type=_fraction,
        help="default slowdown a cell may show "
        "before failing, e.g. 0.1 or 10%% (default: the suite's, 10%%)",
    )
    p.add_argument(
        "--rounds", type=_positive, help="samples per cell and version (default: the suite's, 15)"
    )
    p.add_argument(
        "--json",
        type=Path,
        default=Path("results/check/latest.json"),
        help="where to write every sample and verdict (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="order of the interleaving")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_check)
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

    if not any(
        a in ("--help", "-h", "--hydra-help", "--info", "-i")
        or a.startswith("--cfg")
        or a in ("-c",)
        for a in args
    ):
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
