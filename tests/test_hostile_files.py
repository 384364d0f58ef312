"""Hostile files, paths and entry points (docs/reliability.md, "Odd files, paths and entry
points"): each is one line on stderr naming what to change, exit code 2, and nothing
written, never a traceback.

* what ``attnbench run`` writes into: a ``cells.jsonl`` that is a directory or a symlink
  loop, an ``out_dir`` or a run directory under a dangling symlink, Hydra's directory under
  a file; a key removed (``~out_dir``) or removed where its value is null (``~k``); a run
  name Hydra reads only quoted;
* the modules a user can type (``python -m attnbench.sweep.cell_process``, ``...check.worker``,
  ``attnbench.mirrors``): each says what it is for with ``--help`` and refuses bad
  arguments in one line;
* a ``cells.jsonl`` of one row pasted thousands of times: one line with the count.

In this process (:func:`attnbench.cli.main`, each module's own ``main``); one real process
per path a user takes: ``attnbench run``, and each module as ``python -m``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from attnbench import mirrors
from attnbench.check import worker
from attnbench.sweep import cell_process
from tests.conftest import run_cli

ROOT = Path(__file__).parent.parent
# a cell that costs a second, were a refusal ever to let it run
TINY = ("model=tiny", "device=cpu", "n=64", "dtype=fp32", "progress=false", "report=false")


def _tree(where: Path) -> set[str]:
    return {p.relative_to(where).as_posix() for p in where.rglob("*")}


def _setup(tmp: Path, case: str) -> None:
    """What the case's command finds on disk."""
    if case == "rows are a directory":
        (tmp / "r/single/x/cells.jsonl").mkdir(parents=True)
    elif case == "rows are a symlink loop":
        (tmp / "r/single/x").mkdir(parents=True)
        (tmp / "r/single/x/cells.jsonl").symlink_to("cells.jsonl")
    elif case == "out_dir under a dangling symlink":
        (tmp / "gone").symlink_to("nowhere")
    elif case == "run dir a dangling symlink":
        (tmp / "r/single").mkdir(parents=True)
        (tmp / "r/single/x").symlink_to("nowhere")
    elif case == "hydra.sweep.dir under a file":
        (tmp / "r").mkdir()
        (tmp / "r/a-file").write_text("x")


RUN_CASES = {
    "rows are a directory": (
        ("out_dir=r", "run=x"),
        "out_dir: cannot write r/single/x/cells.jsonl: not a regular file of rows",
    ),
    "rows are a symlink loop": (
        ("out_dir=r", "run=x"),
        "out_dir: cannot write r/single/x/cells.jsonl: not a regular file of rows",
    ),
    "out_dir under a dangling symlink": (
        ("out_dir=gone/x",),
        "'gone' is a symlink to 'nowhere', which does not exist",
    ),
    "run dir a dangling symlink": (
        ("out_dir=r", "run=x"),
        "out_dir: cannot write r/single/x: 'r/single/x' is a symlink to 'nowhere', which",
    ),
    "hydra.sweep.dir under a file": (
        ("-m", "n=64,128", "out_dir=r", "hydra.sweep.dir=${out_dir}/a-file/sub"),
        "hydra.sweep.dir: cannot write r/a-file/sub: 'r/a-file' is not a directory",
    ),
    **{
        f"~{key}": (
            (f"~{key}",),
            f"{key}: required (conf/config.yaml declares it; set it instead of removing it)",
        )
        for key in ("out_dir", "run", "sweep_name")
    },
    **{
        f"~{key}": ((f"~{key}",), f"{key}: cannot be removed (its value is null); set {key}=null")
        for key in ("k", "ceiling", "model.kv_heads")
    },
    "~ an unknown key": (("~k_max",), "k_max: unknown key"),
    "a run name to quote": (
        ("run=résumé",),
        """run: the value 'résumé' can only be given quoted: 'run="résumé"'""",
    ),
    "a sweep of names to quote": (("-m", "run=a,é"), "run: the value 'a,é' can only be"),
    "a key of letters Hydra cannot read": (("résumé=1",), "résumé: unknown key"),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_a_run_refused_in_one_line_writes_nothing(
    case: str, tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    args, needle = RUN_CASES[case]
    _setup(tmp_path, case)
    before = _tree(tmp_path)
    done = cli_in_process("run", *TINY, *args, cwd=tmp_path)
    assert done.returncode == 2, (case, done.stderr[-2000:])
    assert done.stderr.startswith("attnbench run: error: ") and done.stderr.count("\n") == 1
    assert needle in done.stderr, (case, done.stderr)
    assert "http" not in done.stderr  # Hydra's grammar page is no answer
    assert _tree(tmp_path) == before, case  # not even an empty .hydra/


def test_a_run_into_a_directory_of_rows_through_a_real_process(tmp_path: Path) -> None:
    _setup(tmp_path, "rows are a directory")
    done = run_cli("run", *TINY, "out_dir=r", "run=x", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "attnbench run: error: out_dir: cannot write r/single/x/cells.jsonl: not a regular "
        "file of rows\n"
    )
    assert _tree(tmp_path) == {"r", "r/single", "r/single/x", "r/single/x/cells.jsonl"}


# --- the modules a user can type ---------------------------------------------------------

PRESET = {"name": "cpu", "gpu": None, "total_bytes": 2**30, "overhead_bytes": 0}
ENTRY_POINTS = {  # name: its main, given argv
    "job": cell_process._cli,
    "worker": worker._root,
    "mirrors": mirrors.main,
}
PROGS = {"job": "sweep.cell_process", "worker": "check.worker", "mirrors": "mirrors"}
BAD_ARGUMENTS = [
    ("job", ["--cell", "{bad json"], "--cell: not JSON: Expecting property name"),
    ("job", ["--cell", "{}"], "--cell: not as attnbench run writes it (KeyError: 'cell')"),
    ("job", ["--cell", '{"parent": "x"}'], "parent: must be a pid, got 'x'"),
    ("job", ["--cell", json.dumps({"cell": {"attention": "vanilla", "n": 0}, "preset": {}})],
     "missing 4 required positional arguments"),
    ("job", ["--cell", json.dumps({"cell": {"attention": "vanilla", "n": 0}, "preset": PRESET})],
     "--cell: n: must be an integer >= 1, got 0"),
    ("job", [], "the following arguments are required: --cell"),
    ("worker", [], "the following arguments are required: ROOT"),
    ("worker", ["/no/such/tree"], "ROOT: '/no/such/tree' is not a directory"),
    ("mirrors", ["--write"], "unrecognized arguments: --write"),
]  # fmt: skip


def _call(name: str, argv: list[str]) -> int:
    try:
        ENTRY_POINTS[name](argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


@pytest.mark.parametrize(("name", "argv", "needle"), BAD_ARGUMENTS)
def test_a_module_refuses_bad_arguments_in_one_line(
    name: str, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _call(name, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") or err.count("\n") == 1, err
    last = err.splitlines()[-1]
    assert last.startswith(f"python -m attnbench.{PROGS[name]}: ")
    assert needle in last, err


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_each_module_says_what_it_is_for(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _call(name, ["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m attnbench.")
    assert ("Not a command to type" if name != "mirrors" else "source checkout") in out


def test_the_worker_refuses_a_terminal_for_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    assert _call("worker", [str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "python -m attnbench.check.worker: error: stdin is a terminal: it reads the requests "
        "of attnbench check, a JSON line each\n"
    )


@pytest.mark.parametrize("argv", [[], ["--check"]])
def test_mirrors_refuses_outside_a_source_checkout(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Installed as a wheel, its files are not there: attnbench/ sits in site-packages."""
    (tmp_path / "conf").mkdir()  # an installed tree has no pyproject.toml, conf/ nor docs/
    monkeypatch.setattr(mirrors, "ROOT", tmp_path)
    assert mirrors.main(argv) == 2
    assert capsys.readouterr().err == (
        f"python -m attnbench.mirrors: error: no pyproject.toml in {tmp_path}: it "
        "rewrites files of a source checkout (git clone), not of an installed attnbench\n"
    )
    assert _tree(tmp_path) == {"conf"}


@pytest.mark.parametrize(
    ("module", "argv", "code", "needle"),
    [
        ("attnbench.sweep.cell_process", ["--cell", "{bad json"], 2, "--cell: not JSON"),
        ("attnbench.check.worker", [], 2, "the following arguments are required: ROOT"),
        ("attnbench.mirrors", ["--help"], 0, ""),
    ],
)
def test_each_module_through_a_real_process(
    module: str, argv: list[str], code: int, needle: str, tmp_path: Path
) -> None:
    """As typed (the ``__main__`` wiring): from outside the checkout, nothing rewritten."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=tmp_path, capture_output=True, text=True,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and needle in done.stderr
    assert _tree(tmp_path) == set()


# --- a file of one row pasted thousands of times ------------------------------------------


def test_a_row_repeated_thousands_of_times_is_one_line_with_a_count(
    tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    lines = (ROOT / "results/reference/table3-v100_16gb-cpu/cells.jsonl").read_text().splitlines()
    (tmp_path / "run").mkdir()
    (tmp_path / "run/cells.jsonl").write_text("\n".join([lines[0], *[lines[8]] * 2000]) + "\n")
    done = cli_in_process("report", "run", "--out", "out", "--no-plots", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == (
        "attnbench report: run/cells.jsonl: 1999 rows repeat a row read before exactly: each "
        "counted once (the first: run/cells.jsonl:3 repeats run/cells.jsonl:2)\n"
    )
    assert (tmp_path / "out/table3.md").read_text().count("counted once") == 1
