"""The README says what the code does, and the CLI behaves for a user (run in a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench import registry
from tests.conftest import run_cli

README = Path(__file__).resolve().parents[1] / "README.md"
MEASUREMENT = README.parent / "docs" / "measurement.md"
MECHANISMS = README.parent / "docs" / "mechanisms.md"


def _section(title: str, page: Path = README) -> str:
    text = page.read_text()
    start = re.search(rf"^#{{1,2}} {re.escape(title)}$", text, re.M).start()
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_add_a_mechanism_example_runs() -> None:
    code = re.search(r"```python\n(.*?)```", _section("Add a mechanism", MECHANISMS), re.S).group(1)
    try:
        exec(compile(code, "docs/mechanisms.md:add-a-mechanism", "exec"), {})
        m = attnbench.create("local_window", d_model=32, n_heads=4, max_seq_len=64, window=3)
        mask = torch.zeros(2, 16, dtype=torch.bool)
        mask[1, 10:] = True
        assert m(torch.randn(2, 16, 32), mask).shape == (2, 16, 32)
    finally:
        registry._REGISTRY.pop("local_window", None)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)


def test_cli_list_shows_every_mechanism_and_why_not() -> None:
    out = _cli("list")
    assert out.returncode == 0, out.stderr
    for name in attnbench.names():
        assert name in out.stdout
    if attnbench.info("xformers").unavailable:
        assert "no:" in out.stdout


def test_cli_demo_runs_one_cell() -> None:
    out = _cli("demo", "--n", "64", "--k", "16", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert re.search(r"vanilla +\d+\.\d ms per forward", out.stdout), out.stdout
    # a ratio, or, where every forward waited for a CPU (a loaded CI), no ratio and why
    assert re.search(r"time ratio \(vanilla / linformer\): \d+\.\d\dx", out.stdout) or re.search(
        r"no time ratio: machine busy \(\w+: (\d+ of \d+ samples waited over 10%|its \d+ "
        r"samples together waited \d+% of their time)",
        out.stdout,
    ), out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("demo", "--n", "0"), "--n: must be an integer >= 1, got '0'"),
        (("demo", "--n", "64", "--k", "65"), "--k: must be at most n=64, got 65"),
        (("launch",), "invalid choice: 'launch'"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    args: tuple[str, ...],
    needle: str,
    tmp_path: Path,
    cli_in_process: Callable[..., subprocess.CompletedProcess],
) -> None:
    """argparse's refusals come before torch is imported: a real process each, at no cost;
    the demo's own (--k, after torch) runs in this process (the real demo is
    test_cli_demo_runs_one_cell)."""
    if "--k" in args:
        out = cli_in_process(*args, cwd=tmp_path)
    else:
        out = _cli(*args)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_readme_measurement_example_runs() -> None:
    code = re.search(r"```python\n(.*?)```", _section("Measurement", MEASUREMENT), re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/measurement.md", "exec"), scope)
    row = scope["row"]
    assert row.status == "ok" and row.max_batch > 0
    assert row.memory_source == ("measured" if torch.cuda.is_available() else "modeled")


def test_no_committed_run_sits_where_the_readme_commands_write() -> None:
    """A committed cells.jsonl under results/<sweep>/ would make a new user's run resume
    from it and measure nothing."""
    import subprocess as sp

    root = README.parent
    done = sp.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    sweeps = [p.stem for p in (root / "conf" / "sweep").glob("*.yaml")] + ["single"]
    clashing = [f for f in done.stdout.split() if f.split("/")[1] in sweeps]
    assert not clashing, clashing


def test_every_package_of_attnbench_ships_in_the_wheel() -> None:
    """pyproject lists packages by hand (conf/ ships as attnbench.conf); an editable install
    finds an unlisted subpackage anyway, so only this test notices one a wheel would drop."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(root).parts)
        for p in (root / "attnbench").rglob("__init__.py")
    }
    # folders of data files are packages too, or setuptools warns and may leave them out:
    # attnbench/data (the paper's table) and every folder of conf/ (shipped as attnbench.conf)
    found |= {"attnbench.data"} | {
        ".".join(("attnbench", *p.parent.relative_to(root).parts))
        for p in (root / "conf").rglob("*.yaml")
    }
    assert found <= listed, sorted(found - listed)


def test_a_users_runs_stay_out_of_git_status_and_the_published_results_do_not() -> None:
    """`attnbench run` writes under results/<sweep_name>/ of the clone a user works in: git
    ignores it, while what the repository publishes under results/ stays visible to git."""
    root = Path(__file__).parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git clone")

    def ignored(path: str) -> bool:
        out = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, check=False)
        assert out.returncode in (0, 1), path
        return out.returncode == 0

    assert ignored("results/table3/v100_16gb-cpu/cells.jsonl")
    assert ignored("results/my_sweep/cpu-cpu/report/index.html")
    for kept in (
        "results/gpu_check/rows.jsonl",
        "results/reference/x/cells.jsonl",
        "results/gate/new.md",
        "results/benchmarks/x.json",
        "results/README.md",
    ):
        assert not ignored(kept), kept


@pytest.mark.parametrize("args", [["--help"], ["lst"], ["report", "--bogus"]])
def test_help_and_a_typo_do_not_load_torch(args: list[str]) -> None:
    """`attnbench --help` and a typo's one line answer before torch is imported (seconds on
    a loaded machine): checked by what the process imported, not by a clock."""
    code = (
        "import sys\nfrom attnbench.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print('torch' in sys.modules, code)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split()[-2:] == ["False", "0" if args == ["--help"] else "2"], out.stderr
