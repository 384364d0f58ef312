"""Names and paths that become files or folders are checked against the file system they
land on (its longest name and longest path, :func:`attnbench.validators.check_fits`) before
anything is created: one line naming the key, exit 2, nothing written. Without it a run of
300 characters ended in ``OSError: File name too long`` after Hydra had made its folders.
In-process: tests/test_edges_run.py runs a refusal of ``attnbench run`` as a real process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnbench.validators import check_fits, fs_limits

LONG = "r" * 300  # over every common file system's 255 bytes for a name
DEEP = "/".join(["d" * 200] * 21)  # each name fits; the whole is over Linux's 4096 bytes


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("run", f"run={LONG}"), "run: a name must be at most 255 bytes on this file system"),
        (
            ("run", "-m", f"sweep_name={LONG}", "n=64,128"),
            "sweep_name: a name must be at most 255 bytes on this file system, got 300 bytes",
        ),
        (("run", f"out_dir=out/{LONG}/x"), "out_dir: a name must be at most 255 bytes"),
        (("run", f"out_dir={DEEP}"), "out_dir: the files written there would have paths of"),
        (("report", "rows", "--out", LONG), "argument --out: a name must be at most 255 bytes"),
        (("report", "rows", "--out", ""), "argument --out: must be a path, got ''"),
        (("check", "--json", f"{LONG}/x.json"), "argument --json: a name must be at most 255"),
        (("check", "--write-baseline", DEEP), "argument --write-baseline: the files written"),
    ],
    ids=["run", "sweep_name", "out_dir", "out_dir-deep", "report-out", "report-out-empty",
         "check-json", "check-write-baseline"],
)  # fmt: skip
def test_a_name_or_path_the_file_system_cannot_hold_is_one_line_and_nothing_written(
    tmp_path: Path, cli_in_process, args: tuple[str, ...], line: str
) -> None:
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "cells.jsonl").write_text("")
    out = cli_in_process(*args, cwd=tmp_path)
    assert out.returncode == 2, out
    last = out.stderr.strip().splitlines()[-1]  # argparse puts its usage above its line
    assert line in last, out.stderr
    assert f"attnbench {args[0]}: error: " in last and LONG not in last
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cells.jsonl", "rows"]


def test_the_limits_are_the_file_systems_asked_of_the_nearest_existing_folder(
    tmp_path: Path,
) -> None:
    here = (os.pathconf(tmp_path, "PC_NAME_MAX"), os.pathconf(tmp_path, "PC_PATH_MAX"))
    assert fs_limits(tmp_path / "not" / "yet" / LONG) == here
    check_fits(str(tmp_path / "a"), {"sweep_name": "b" * here[0]})  # at the limit: fits
    with pytest.raises(ValueError, match=r"^sweep_name: a name must be at most"):
        check_fits(str(tmp_path / "a"), {"sweep_name": "b" * (here[0] + 1)})
