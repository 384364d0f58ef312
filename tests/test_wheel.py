"""attnbench installed as a user installs it: the wheel built from this tree, installed
without ``-e`` into a fresh venv, its ``attnbench`` command run from a directory outside the
clone. Everything the package reads at run time (conf/ as ``attnbench.conf``, the paper's
table) must ship inside the wheel: an editable install, or ``python -m`` from the repo
root, finds the checkout's files and hides a file the wheel lacks (``attnbench list`` once
imported the checkout's ``conf`` and failed for every installed user).

The fresh venv borrows this environment's installed dependencies through a ``.pth`` line
(torch is the build this machine's user chose, and gigabytes: never installed again here);
``pip check`` then holds the wheel's declared dependencies to them, and the test holds
that ``attnbench`` itself is imported from the venv, never from this checkout.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fresh venv's ``bin`` with the wheel installed in it."""
    where = tmp_path_factory.mktemp("wheel")
    dist = where / "dist"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", str(ROOT), "-w", str(dist)], check=True)
    (wheel,) = dist.glob("attnbench-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = (venv / "lib").glob("python*/site-packages")
    # this environment's packages, after the venv's own: a path line (not an import line),
    # so that the editable install's finder there is never loaded into the venv
    (purelib / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = str(venv / "bin" / "python")
    subprocess.run([*pip, "--python", python, "install", "-q", "--no-deps", str(wheel)], check=True)
    return venv / "bin"


def _run(bin_: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(bin_ / "attnbench"), *args], cwd=cwd, capture_output=True, text=True, env=env
    )


def test_the_installed_wheel_runs_every_command_outside_the_clone(
    installed: Path, tmp_path: Path
) -> None:
    python = str(installed / "python")
    where = subprocess.run(
        [python, "-c", "import attnbench, attnbench.conf; print(attnbench.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(installed.parent), where  # the wheel's, not ours
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    assert "requires" not in check.stdout, check.stdout  # pip check: what the wheel declares

    out = _run(installed, "--help", cwd=tmp_path)
    assert out.returncode == 0 and "list" in out.stdout, out.stderr
    out = _run(installed, "list", "--markdown", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("| name |") and "| vanilla |" in out.stdout
    assert "2.36M" in out.stdout  # weights per layer: conf/model/base.yaml read from the wheel
    out = _run(installed, "list", cwd=tmp_path)
    assert out.returncode == 0 and "linformer" in out.stdout, out.stderr

    two = ("attention=vanilla,linformer", "n=64", "timing.min_seconds=0", "progress=false")
    out = _run(installed, "run", "+sweep=smoke", *two, "report=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/smoke/*/cells.jsonl")
    rows = [json.loads(line) for line in cells.read_text().splitlines()]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"ok"}
    out = _run(installed, "report", str(cells.parent), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # the paper's figures (attnbench/data) beside the measurement, read from the wheel
    assert (cells.parent / "report" / "table3.md").read_text().count("paper") >= 1
    assert not (tmp_path / "conf").exists() and not (tmp_path / "attnbench").exists()
