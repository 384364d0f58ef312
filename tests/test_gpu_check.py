"""scripts/gpu_check.py without a GPU: its CPU smoke, its order and plan, its budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from attnbench.attention import fla_kernels
from attnbench.row import read

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
ROWS = Path("results/gpu_check/rows.jsonl")  # the last GPU run's: the plan's estimates
MIXERS = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script as a module (its siblings importable, as when it runs); main() would fix
    this process's malloc."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("ATTNBENCH_MALLOC_FIX", "0")
    import gpu_check

    return gpu_check


@pytest.fixture
def plan() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check_plan
    finally:
        sys.path.remove(str(SCRIPTS))
    return gpu_check_plan


def test_gpu_check_script_runs_its_cpu_smoke(tmp_path, script, capsys) -> None:
    out = tmp_path / "rows.jsonl"
    smoke = ["--cpu-smoke", "--budget", "1e9", "--out", str(out)]  # a budget never reached
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", *smoke], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout
    # fla's kernels and flex's backward cannot run on the cpu preset: listed, skipped
    assert (
        "refused at validation, not run: gla (causal=True, kernel=fla) n=128 b=8: kernel:" in said
    )
    assert "flex (pattern=window) n=128 train(adamw): mode: attention=flex cannot train" in said
    assert "| linformer k=32 | inference | 128 |" in said
    assert "| sdpa | train checkpoint | 128 |" in said
    assert "| local causal | inference | 128 |" in said  # the zoo
    assert "| gla torch causal | packed(packed) b=2 | 128 |" in said
    assert "| sdpa expandable_segments:True | inference | 128 |" in said
    # serving: the max batch of each decode cell (modeled on a CPU), some of them timed
    assert "| vanilla kv_heads=1 | 128 | max |" in said
    assert "| sdpa drawn | 128 | max |" in said
    timed = next(line for line in said.splitlines() if line.startswith("| vanilla | 128 | 2 |"))
    assert timed.count(" - |") == 0, timed  # its time per token and bandwidths are there
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["status"] == "ok" for r in rows), rows
    torch_ = {"kernel": "torch", "causal": True}
    # the sections in order: the mixers on our kernel (two in the smoke) in each workload at
    # one batch, the fp32 Gated DeltaNet, flex's forward, decode over a mix beside every
    # prompt n, packed against padded, the allocator's default then expandable segments
    # (in a child process), then the rest of the first run
    assert [(r["attention"], r["mode"], r["batch_asked"]) for r in rows[:8]] == [
        (name, mode, b)
        for mode, b in (("inference", 8), ("train", 2), ("decode", 8), ("packed", 2))
        for name in ("gla", "deltanet")
    ]
    assert all(r["params"] == torch_ for r in rows[:9]) and rows[8]["attention"] == "gated_deltanet"
    assert (rows[9]["attention"], rows[9]["compiled"]) == ("flex", "kernel")
    assert [(r["attention"], r["contexts"]) for r in rows[10:14]] == [
        ("vanilla", "drawn"), ("vanilla", "n"), ("sdpa", "drawn"), ("sdpa", "n"),
    ]  # fmt: skip
    assert [r["layout"] for r in rows[14:16]] == ["packed", "padded"]
    alloc = [(r["attention"], r["env"].get("PYTORCH_CUDA_ALLOC_CONF")) for r in rows[16:20]]
    assert alloc == [
        ("sdpa", None), ("linformer", None),
        ("sdpa", "expandable_segments:True"), ("linformer", "expandable_segments:True"),
    ]  # fmt: skip
    # the rest: vanilla and the zoo at n = 128 (11), the mixers (5), training (6), compiled
    # (5: flex's forward ran above, its training is the GPU's), serving (10 but vanilla's
    # and sdpa's, above) and vanilla's serving timed at batch=2
    assert len(rows) == 20 + 11 + 5 + 6 + 5 + 8 + 1, [r["attention"] for r in rows]
    compiled = [r for r in rows if r["compiled"] == "layers"]
    assert [r["attention"] for r in compiled] == ["vanilla", "sdpa", "linear", "local", "flex"]
    assert all(r["compile_s"] > 0 and r["time_per_seq_s"] > 0 for r in compiled)
    served = [r for r in rows if r["mode"] == "decode" and r["batch_asked"] == "max"]
    assert [(r["attention"], r["model"].get("kv_heads")) for r in served[4:]] == [
        ("vanilla", 1),
        ("linear", None),
        ("local", None),
        *((name, None) for name in MIXERS),
    ]
    assert rows[-1]["decode"]["bytes_per_s"] > 0 and rows[-1]["decode"]["copy_bytes_per_s"] > 0

    # --plan with --resume, on this run's rows: nothing left; cut after ten, the eleventh
    assert script.main(["--cpu-smoke", "--plan", "--resume", "--out", str(out)]) == 0
    assert "gpu_check plan: 0 cells" in capsys.readouterr().out
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(out.read_text().splitlines(keepends=True)[:10]))
    assert script.main(["--cpu-smoke", "--plan", "--resume", "--out", str(cut)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"gpu_check plan: {len(rows) - 10} cells in this order")
    first = next(line for line in lines if line.startswith("   1 "))
    assert first.endswith(
        "vanilla (causal=True) n=128 decode(64 tokens, contexts lognormal mean 64)"
    )
    assert cut.read_text().count("\n") == 10  # --plan writes nothing


def _cells(lines: list[str]) -> list[tuple[int, float, float, str, str]]:
    """The plan's cell lines: (number, estimate, running sum, where the estimate is from,
    the cell)."""
    parts = [line.split(maxsplit=4) for line in lines]
    return [
        (int(p[0]), float(p[1]), float(p[2]), p[3], p[4])
        for p in parts
        if len(p) == 5 and p[0].isdigit()
    ]


def test_the_plan_says_the_gpu_order_and_its_seconds_without_a_gpu(
    script, plan, monkeypatch, capsys, tmp_path
) -> None:
    # fla installed or not, the plan is a GPU's with it (its kernels are never called here)
    monkeypatch.setattr(fla_kernels, "why_unavailable", lambda: None)
    out = tmp_path / "out" / "rows.jsonl"
    assert script.main(["--plan", "--budget", "600", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not out.parent.exists()  # nothing written
    sections = [line[3:].split(":")[0] for line in lines if line.startswith("-- ")]
    assert sections == [
        "fla against torch", "an fp32 Gated DeltaNet", "flex trains after an inference cell",
        "decode over a mix", "packed against padded", "the allocator's fragmentation",
        "the rest",
    ]  # fmt: skip
    cells = _cells(lines)
    fla = [f"{m} (causal=True, kernel={k}) n=2048 b=8" for m in MIXERS for k in ("fla", "torch")]
    assert [c[4] for c in cells[:10]] == fla  # each mixer's forward first, fla beside ours
    assert cells[0][3] == f"kind+{plan.FLA_TUNE_S:g}" and cells[1][3] == "kind"
    assert cells[0][1] == pytest.approx(cells[1][1] + plan.FLA_TUNE_S, abs=0.1)
    # a cell the last GPU run measured takes its wall time; the sum runs on
    walls = {(r.attention, r.n, r.mode): r.wall_s for r in read(ROWS) if not r.params}
    sdpa = next(c for c in cells if c[4] == "sdpa n=512")
    assert sdpa[3] == "measured" and sdpa[1] == pytest.approx(
        walls["sdpa", 512, "inference"], abs=0.05
    )
    expandable = next(c for c in cells if c[4].startswith("sdpa n=512 PYTORCH_CUDA_ALLOC_CONF"))
    assert expandable[1:4:2] == sdpa[1:4:2]  # the same cell's time under the default
    children = [float(line.split()[0]) for line in lines if "start a process with" in line]
    assert children == [plan.CHILD_S]  # expandable segments' child, once
    rounding = 0.05 * len(cells) + 0.1
    assert cells[-1][2] == pytest.approx(sum(c[1] for c in cells) + plan.CHILD_S, abs=rounding)
    total = next(line for line in lines if line.startswith("total: "))
    assert total.startswith(f"total: {len(cells)} cells, {cells[-1][2]:.0f} s")
    # --budget 600 stops before the first cell whose sum and the tables' reserve pass it
    said = next(line for line in lines if line.startswith("--budget 600: "))
    k = next(c[0] for c in cells if said.endswith(f"stops before {c[4]}"))

    def reserve(rows: int) -> float:
        return plan.TABLES_S + plan.TABLE_ROW_S * rows

    assert cells[k - 1][2] + reserve(k) > 600 >= cells[k - 2][2] + reserve(k - 1) - 0.1
    assert said.startswith(f"--budget 600: {k - 1} cells")


def test_the_order_holds_each_cell_once_and_the_last_runs_cells_match_their_rows(script) -> None:
    items = script.order(script.GPU)
    keys = [script._done_key(i) for i in items]
    assert len(keys) == len(set(keys))
    rows = [r for r in read(ROWS) if r.status == "ok"]
    assert {script._done_key(r) for r in rows} <= set(keys)  # every measured cell estimated
    # the allocator's setting tells two cells apart, read alike from a row's env
    frag = [i for i in items if i.section.startswith("the allocator's")]
    assert [i.alloc for i in frag] == [None, None] + ["expandable_segments:True"] * 2
    row = next(r for r in rows if script._done_key(r) == script._done_key(frag[0]))
    row.update(env={**row.env, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert script._done_key(row) == script._done_key(frag[2])


@pytest.mark.parametrize("budget", ["0", "-5", "abc", "nan", "inf", ""])
def test_a_budget_that_is_not_a_positive_number_is_one_line(
    script, budget: str, capsys, tmp_path
) -> None:
    out = tmp_path / "out" / "rows.jsonl"
    assert script.main(["--cpu-smoke", "--budget", budget, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gpu_check: error: --budget: must be a number of seconds > 0 (the time this call may "
        f"run), got {budget!r}\n"
    )
    assert not out.parent.exists()


@pytest.mark.parametrize("flag", ["--out", "--estimates"])
def test_rows_it_cannot_read_are_one_line(script, flag: str, capsys, tmp_path) -> None:
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"schema": 2, "attention": "vanilla"}\n')
    assert script.main(["--cpu-smoke", "--plan", "--resume", flag, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_check: error: {flag} {bad}: cannot read its rows")
    assert err.count("\n") == 1


def _steps(plan: ModuleType, *spec: tuple[str, float, str | None]) -> list:
    """Steps of items named as given; ``child`` rows are a child process's start."""
    return [
        plan.Step(None if name == "child" else SimpleNamespace(name=name, alloc=alloc),
                  seconds, "", alloc)
        for name, seconds, alloc in spec
    ]  # fmt: skip


def test_the_budget_stops_before_a_cell_whose_estimate_would_pass_it(plan, monkeypatch) -> None:
    monkeypatch.setattr(plan, "TABLES_S", 4.0)
    monkeypatch.setattr(plan, "TABLE_ROW_S", 1.0)
    x = "expandable_segments:True"
    steps = _steps(
        plan, ("a", 10, None), ("b", 20, None), ("c", 30, None), ("child", 15, x),
        ("d", 10, x), ("e", 10, x), ("f", 5, None),
    )  # fmt: skip
    taken = {"a": 25, "b": 20, "c": 30, "d": 10, "e": 10, "f": 5}  # a ran over its estimate
    now, ran, children = [0.0], [], []

    def one(step) -> None:
        now[0] += taken[step.item.name]
        ran.append(step.item.name)

    def child(alloc, group, left) -> None:  # finishes the first of its two cells
        children.append((alloc, [s.item.name for s in group], left))
        now[0] += 15 + taken["d"]
        ran.append("d")

    def call(budget: float | None, rows: int = 0) -> list[str]:
        now[0], ran[:], children[:] = 0.0, [], []
        left = plan.run(
            steps, budget=budget, start=0.0, clock=lambda: now[0], rows=rows,
            run_one=one, run_child=child, done=lambda item: item.name in ran,
        )  # fmt: skip
        return [s.item.name if s.item else "child" for s in left]

    # at 45 s (a took 25), c's 30 and the reserve (4 s and 1 s for each of 3 rows) pass 81:
    # stop there, and not at f either, which would fit: the order is the priority
    assert call(81) == ["c", "child", "d", "e", "f"] and ran == ["a", "b"]
    assert call(82) == ["child", "d", "e", "f"] and ran == ["a", "b", "c"]
    assert call(82, rows=1) == ["c", "child", "d", "e", "f"]  # a row kept is tabulated too
    # the child is handed what is left; a cell it did not finish stops the call
    assert call(200) == ["e", "f"] and children == [(x, ["d", "e"], 200 - 75)]
    assert call(None) == ["e", "f"] and children[0][2] is None
    # what --plan shows: the same rule on the estimates alone (the child's cells within its
    # budget), and the seconds that takes
    left, spent = plan.simulate(steps, 78, 0)
    assert [s.item.name for s in left if s.item] == ["d", "e", "f"] and spent == 60
    left, spent = plan.simulate(steps, 1000, 0)
    assert left == [] and spent == 100


def test_gpu_check_lists_its_gpu_serving_cells_and_refuses_without_a_gpu(script, capsys) -> None:
    assert subprocess.run(["bash", "-n", "scripts/gpu_check.sh"]).returncode == 0
    # the cells a GPU runs: each decode mechanism at the max batch of the preset asked for
    todo = script.decode_cells(script.NS_DECODE, script.TIMING, "h100_80gb", "fp16")
    assert [(c.attention, c.model.kv_heads) for c in todo] == [
        ("vanilla", None),
        ("vanilla", 3),
        ("sdpa", None),
        ("linear", None),
        ("local", None),
        *((name, None) for name in MIXERS),
    ] * len(script.NS_DECODE)
    assert {(c.mode, c.batch, c.device, c.dtype, dict(c.params)["causal"]) for c in todo} == {
        ("decode", "max", "h100_80gb", "fp16", True)
    }
    # its refusals, in this process
    with pytest.raises(SystemExit) as bad:
        script.main(["--decode-device", "nope"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "--decode-device: invalid choice: 'nope'" in err
    # the shell script: a bad budget before it writes anything (the check's one real process)
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--budget", "0"], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--budget: must be a number of seconds > 0" in done.stderr
    if torch.cuda.is_available():
        return
    assert script.main(["--decode-only", "--decode-device", "h100_80gb"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
