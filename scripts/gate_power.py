"""Benchmark the regression gate itself: how often it cries wolf, how often it catches a drop.

    python scripts/gate_power.py pool --slowdown 0.15 --rounds 60 --out results/gate/pool-15.json
    python scripts/gate_power.py replay results/gate/pool-*.json --rounds 30 --draws 1000
    python scripts/gate_power.py whole --slowdown 0 --runs 6
    python scripts/gate_power.py whole --slowdown 0.15 --part backward --runs 3
    python scripts/gate_power.py whole --slowdown 0.15 --part decode --runs 2

``pool`` checks out HEAD in a temporary worktree, plants a known extra cost into one
mechanism there (every forward of ``vanilla`` made ``slowdown`` longer, of its own time, by
a busy wait: 0 for an A/A pool; ``--part`` backward or decode: its backward, its decode
step) and runs ``attnbench check --against HEAD`` in it with many rounds, keeping every
real interleaved sample. ``replay`` re-decides the gate on random subsets of a pool's
rounds (the same rounds for A and B, so the interleaving pairs stay together) and counts
how often the gate fails. ``whole`` runs the gate end to end.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from attnbench.check.stats import compare

ROOT = Path(__file__).resolve().parent.parent
PLANT = """

# --- planted by scripts/gate_power.py: every forward costs {slowdown:.0%} more of its own time
import time as _time  # noqa: E402

_forward = VanillaAttention.forward


def _slow_forward(self, *args, **kwargs):
    start = _time.perf_counter()
    out = _forward(self, *args, **kwargs)
    end = start + (_time.perf_counter() - start) * (1 + {slowdown!r})
    while _time.perf_counter() < end:
        pass
    return out


VanillaAttention.forward = _slow_forward
"""

PLANT_BACKWARD = """

# --- planted by scripts/gate_power.py: every backward costs {slowdown:.0%} more of its own time
import time as _time  # noqa: E402

_forward = VanillaAttention.forward


def _slow_backward(self, x, *args, **kwargs):
    out = _forward(self, x, *args, **kwargs)
    if out.requires_grad and x.requires_grad:  # the layer's backward: from out's grad to x's
        began = []

        def start(grad):
            began.append(_time.perf_counter())

        def stop(grad):
            now = _time.perf_counter()
            end = now + (now - began[0]) * {slowdown!r}
            while _time.perf_counter() < end:
                pass
            handle.remove()

        out.register_hook(start)
        handle = x.register_hook(stop)
    return out


VanillaAttention.forward = _slow_backward
"""

PLANT_DECODE = """

# --- planted by scripts/gate_power.py: every decode step costs {slowdown:.0%} more of its own time
import time as _time  # noqa: E402

_extend = VanillaAttention.extend


def _slow_extend(self, *args, **kwargs):
    start = _time.perf_counter()
    out = _extend(self, *args, **kwargs)
    end = start + (_time.perf_counter() - start) * (1 + {slowdown!r})
    while _time.perf_counter() < end:
        pass
    return out


VanillaAttention.extend = _slow_extend
"""


def planted_tree(slowdown: float, part: str = "forward") -> tuple[Path, Path]:
    """(temporary dir, a worktree of HEAD in it with the slowdown planted into vanilla's
    forward or backward)."""
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-gate-"))
    tree = tmp / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(tree), "HEAD"], cwd=ROOT, check=True
    )
    if slowdown:
        target = tree / "attnbench/attention/vanilla.py"
        plant = {"forward": PLANT, "backward": PLANT_BACKWARD, "decode": PLANT_DECODE}[part]
        target.write_text(target.read_text() + plant.format(slowdown=slowdown))
    return tmp, tree


def remove(tree: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


def check(tree: Path, out: Path, *extra: str) -> int:
    cmd = [
        sys.executable,
        "-m",
        "attnbench.cli",
        "check",
        "--against",
        "HEAD",
        "--quiet",
        "--json",
        str(out.resolve()),
        *extra,
    ]
    return subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL).returncode


def cmd_pool(args: argparse.Namespace) -> None:
    _, tree = planted_tree(args.slowdown, args.part)
    try:
        rc = check(tree, args.out, "--rounds", str(args.rounds), "--seed", str(args.seed))
    finally:
        remove(tree)
    data = json.loads(args.out.read_text())
    data["planted"] = {"mechanism": "vanilla", "slowdown": args.slowdown, "part": args.part}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: exit {rc}, {data['settings']['rounds']} rounds, {data['wall_s']} s")


def decide(pool: dict, rounds: list[int], threshold: float, alpha: float) -> set[str]:
    """The cells the gate would call regressed on these rounds of the pool."""
    a, b = pool["samples"]["A"], pool["samples"]["B"]
    failed = set()
    for cell in a:
        v = compare(
            [a[cell][i] for i in rounds],
            [b[cell][i] for i in rounds],
            threshold=threshold,
            alpha=alpha,
            resamples=1,
        )
        if v.verdict == "regressed":
            failed.add(cell)
    return failed


def cmd_replay(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    for path in args.pools:
        pool = json.loads(Path(path).read_text())
        total = pool["settings"]["rounds"]
        slow = pool.get("planted", {}).get("slowdown", 0)
        gate_fails, cell_fails, cells = 0, 0, 0
        for _ in range(args.draws):
            rounds = rng.sample(range(total), args.rounds)
            failed = decide(pool, rounds, args.threshold, args.alpha)
            gate_fails += bool(failed)
            unplanted = [c for c in pool["samples"]["A"] if not c.startswith("vanilla")]
            cell_fails += len(failed & set(unplanted))
            cells += len(unplanted)
        print(
            f"{path}: planted {slow:.0%} in vanilla; {args.draws} draws of {args.rounds} "
            f"of {total} rounds, threshold {args.threshold:.0%}, alpha {args.alpha}: "
            f"gate failed {gate_fails}/{args.draws} ({gate_fails / args.draws:.1%}); "
            f"unplanted cells called regressed {cell_fails}/{cells}"
        )


def cmd_whole(args: argparse.Namespace) -> None:
    _, tree = planted_tree(args.slowdown, args.part)
    fails = 0
    try:
        for i in range(args.runs):
            out = args.keep / f"whole-{args.part}-{args.slowdown:g}-{i + 1}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            rc = check(tree, out, "--seed", str(i))
            fails += rc == 1
            print(f"run {i + 1}: exit {rc} ({json.loads(out.read_text())['wall_s']} s)", flush=True)
    finally:
        remove(tree)
    print(
        f"planted {args.slowdown:.0%} in vanilla's {args.part}: the gate failed {fails} of "
        f"{args.runs} whole runs"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(required=True)
    s = sub.add_parser("pool")
    s.add_argument("--slowdown", type=float, required=True)
    s.add_argument("--rounds", type=int, default=60)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--part", choices=("forward", "backward", "decode"), default="forward")
    s.set_defaults(fn=cmd_pool)
    s = sub.add_parser("replay")
    s.add_argument("pools", nargs="+")
    s.add_argument("--rounds", type=int, default=30)
    s.add_argument("--draws", type=int, default=1000)
    s.add_argument("--threshold", type=float, default=0.10)
    s.add_argument("--alpha", type=float, default=0.002)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_replay)
    s = sub.add_parser("whole")
    s.add_argument("--slowdown", type=float, required=True)
    s.add_argument("--runs", type=int, default=5)
    s.add_argument(
        "--keep",
        type=Path,
        default=Path("results/gate"),
        help="where each run's JSON goes (whole-<slowdown>-<i>.json)",
    )
    s.add_argument("--part", choices=("forward", "backward", "decode"), default="forward")
    s.set_defaults(fn=cmd_whole)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
