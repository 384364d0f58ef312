"""Hardening ``attnbench run`` at its edges: names that would write outside
``out_dir``, disks that are full or read-only, and messages that named the wrong thing.

Every refusal is one line and exit code 2 with nothing written; a failed write of the store
is one line naming the path and the errno, and leaves the rows already stored as they were.
The tests run as root here, and root ignores directory permissions, so a read-only
directory is a chmod only when not root; as root it is a path under a file, a path in
/proc, or (where a private mount namespace can be had) a read-only tmpfs.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from attnbench.cell import Cell
from attnbench.measure import presets
from attnbench.plan import validate
from attnbench.store import RunStore, StoreError, read_rows, replace_file
from attnbench.sweep.config import prevalidate
from attnbench.sweep.paths import run_dir
from attnbench.validators import check_name
from attnbench.writable import check_writable
from tests.conftest import CLI

TINY = ("model=tiny", "dtype=fp32", "ceiling=1GB", "progress=false", "report=false")


def one_line_exit_2(out: subprocess.CompletedProcess[str], needle: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("attnbench run: error: ") and out.stderr.count("\n") == 1
    assert needle in out.stderr and "Traceback" not in out.stderr and not out.stdout


# --- 1. a run and a sweep are names: nothing lands outside out_dir ---------------------------


@pytest.mark.parametrize("good", ["auto", "v100_16gb-cpu", "a..b", "run 1", "é", 7])
def test_a_name_is_one_path_component(good: object) -> None:
    assert check_name("run", good) == str(good)


@pytest.mark.parametrize(
    "bad", ["", " ", ".", "..", "../../escaped", "/abs/path", "a/b", ".hydra", "a\\b", None, True]
)
def test_a_name_with_a_separator_or_a_dot_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^run: must be a name \(one path component") as e:
        check_name("run", bad)
    assert "\n" not in str(e.value) and repr(bad) in str(e.value)


def _cfg(**keys: object) -> object:
    base = {"out_dir": "results", "sweep_name": "single", "run": "r", "device": {"name": "cpu"}}
    return OmegaConf.create({**base, **keys})


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        ({"run": "../../escaped"}, "run: must be a name"),
        ({"run": "/abs/path"}, "run: must be a name"),
        ({"run": "a/b"}, "run: must be a name"),
        ({"sweep_name": "../../x"}, "sweep_name: must be a name"),
        ({"sweep_name": ""}, "sweep_name: must be a name"),
        ({"out_dir": ""}, "out_dir: must be a directory path, got ''"),
        ({"out_dir": None}, "out_dir: must be a directory path, got None"),
        ({"run": "auto", "device": {"name": "../up", "gpu": None}}, "run: must be a name"),
    ],
)
def test_run_dir_refuses_what_would_leave_out_dir(keys: dict, needle: str) -> None:
    with pytest.raises(ValueError, match="^" + needle.replace("(", r"\(")):
        run_dir(_cfg(**keys))


def test_run_dir_of_names(tmp_path: Path) -> None:
    assert run_dir(_cfg(out_dir=str(tmp_path), run=3)) == tmp_path / "single" / "3"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run=../../escaped",), "run: must be a name (one path component"),
        (("run=ABS",), "run: must be a name (one path component"),
        (("-m", "sweep_name=../../x", "n=32,64"), "sweep_name: must be a name"),
        (("out_dir=",), "out_dir: must be a directory path, got ''"),
    ],
)
def test_names_that_leave_out_dir_are_one_line_exit_2_nothing_written(
    tmp_path: Path, args: tuple[str, ...], needle: str, cli_in_process
) -> None:
    # in this process (cli.main, as the command line calls it): the refusal is said before
    # anything is written; the real processes of this refusal path are the read-only and
    # full file systems' below (and test_run_cli.py's bad override)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    args = tuple(a.replace("ABS", str(tmp_path / "abs")) for a in args)
    one_line_exit_2(cli_in_process("run", *TINY, "n=32", *args, cwd=work), needle)
    assert [p for p in tmp_path.rglob("*") if p != work and p != work.parent] == []


def test_out_dir_that_is_a_file_is_one_line(tmp_path: Path, cli_in_process) -> None:
    (tmp_path / "afile").write_text("x")
    out = cli_in_process("run", *TINY, "n=32", "out_dir=afile", cwd=tmp_path)
    one_line_exit_2(out, "out_dir: cannot write afile/single/.hydra: 'afile' is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# --- 2. full and read-only disks: one line naming the path and the errno ---------------------


def _rows(n: int) -> list[dict]:
    return [{"key": f"k{i}", "v": i} for i in range(n)]


def _enospc_after(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    """``os.write`` writes ``nbytes`` more bytes, then the disk is full (as it happens: part
    of a line lands, then ENOSPC)."""
    real = os.write
    left = [nbytes]

    def write(fd: int, data: bytes) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[: left[0]]))
        left[0] -= n
        return n

    monkeypatch.setattr(os, "write", write)


def test_append_on_a_full_disk_is_one_line_and_the_stored_rows_stand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path)
    for r in _rows(3):
        store.append(r)
    before = store.cells.read_bytes()
    _enospc_after(monkeypatch, 10)  # ten bytes of the row land, then the disk is full
    with pytest.raises(StoreError) as e:
        store.append({"key": "new", "v": "x" * 100})
    assert str(e.value) == f"cannot write {store.cells}: [Errno 28] No space left on device"
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert store.cells.read_bytes() == before  # no half line after the stored rows
    monkeypatch.undo()
    assert store.done() == {"k0", "k1", "k2"} and store.append({"key": "new"})
    assert [r["key"] for r in read_rows(store.cells)] == ["k0", "k1", "k2", "new"]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_every_write_of_the_store_names_the_path_and_the_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    store = RunStore(tmp_path)
    store.append({"key": "a"})
    store.write_once("config.yaml", "old: 1\n")
    real_open = os.open

    def refuse(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refuse)  # the store's appends
    monkeypatch.setattr(os, "fsync", lambda fd: refuse("x", os.O_WRONLY))  # replace_file's
    why = f"[Errno {code}] {os.strerror(code)}"
    for attempt, path in [
        (lambda: store.append({"key": "b"}), store.cells),
        (lambda: store.add_line("commands.jsonl", {"argv": []}), tmp_path / "commands.jsonl"),
        (lambda: store.write_once("env.json", "{}"), tmp_path / "env.json"),
        (lambda: store.append({"key": "a", "v": 2}, replace=True), store.cells),
    ]:
        with pytest.raises(StoreError) as e:
            attempt()
        assert str(e.value) == f"cannot write {path}: {why}"
    monkeypatch.undo()
    assert read_rows(store.cells) == [{"key": "a"}]
    assert (tmp_path / "config.yaml").read_text() == "old: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "cells.jsonl", "config.yaml"]


def test_replace_file_removes_its_temp_file_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StoreError, match=r"cannot write .*report.json: \[Errno 28\] No space"):
        replace_file(target, "new" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no .report.json.tmp-PID
    assert target.read_text() == "old"


def test_a_store_error_pickles_for_the_launchers_processes() -> None:
    e = StoreError(errno.ENOSPC, "No space left on device", "/x/cells.jsonl")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is StoreError and str(back) == str(e) and back.errno == errno.ENOSPC


def test_a_run_dir_under_a_file_is_a_store_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match=r"cannot write .*afile/run: \[Errno 20\] Not a dir"):
        RunStore(tmp_path / "afile" / "run").append({"key": "a"})


def test_check_writable_names_what_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    check_writable("out_dir", tmp_path / "new" / "deeper")  # made later, by the store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the probe is gone
    with pytest.raises(ValueError, match=r"^out_dir: cannot write .*afile/x: '.*afile' is not"):
        check_writable("out_dir", tmp_path / "afile" / "x")
    with pytest.raises(ValueError, match=r"^out_dir: cannot write /proc/attnbench-x: \[Errno"):
        check_writable("out_dir", Path("/proc/attnbench-x"))  # refused even to root


def test_a_full_disk_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Full:  # three blocks left
        f_frsize, f_bavail, f_bfree = 4096, 3, 3

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    with pytest.raises(
        ValueError, match=r"^out_dir: cannot write results/single/.hydra: \[Errno 28"
    ):
        prevalidate([*TINY, "n=32"])
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 directory")
def test_a_read_only_directory_is_refused_before_anything_runs(
    tmp_path: Path, cli_in_process
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        out = cli_in_process("run", *TINY, "n=32", f"out_dir={ro}", cwd=tmp_path)
        one_line_exit_2(out, f"out_dir: cannot write {ro}/single/.hydra: [Errno 13]")
        assert not any(ro.iterdir())
    finally:
        ro.chmod(0o755)


def test_prevalidate_refuses_an_out_dir_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"^out_dir: cannot write afile/x/single/.hydra: 'afile'"):
        prevalidate([*TINY, "n=32", "out_dir=afile/x"])
    with pytest.raises(ValueError, match=r"^out_dir: cannot write /proc/x/single/.hydra: \[Errno"):
        prevalidate([*TINY, "n=32", "out_dir=/proc/x"])
    ((where, _),) = prevalidate([*TINY, "n=32", "run=r"])
    assert where == "results/single/r"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # validated, not written


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs root and a private mount namespace")
@pytest.mark.parametrize(
    ("mount", "fill", "needle"),
    [
        ("ro,size=64k", "", "[Errno 30] Read-only file system"),
        ("size=64k", "dd if=/dev/zero of={mnt}/fill bs=4k 2>/dev/null;", "[Errno 28] No space"),
    ],
)
def test_a_read_only_or_full_file_system_is_one_line_exit_2(
    tmp_path: Path, mount: str, fill: str, needle: str
) -> None:
    """A real read-only (EROFS) or full (ENOSPC) tmpfs, mounted in a mount namespace of the
    test's own: it goes with the process, nothing is left mounted."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    run = " ".join([*CLI, "run", *TINY, "n=32"])
    script = (
        f"mount -t tmpfs -o {mount} tmpfs {mnt} && {fill.format(mnt=mnt)} cd {tmp_path} && "
        f"{run} out_dir={mnt}"
    )
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
    )
    one_line_exit_2(out, f"out_dir: cannot write {mnt}/single/.hydra: {needle}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fs"] and not any(mnt.iterdir())


def test_a_disk_that_fills_during_a_sweep_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process
) -> None:
    """The disk fills after the checks passed: the store's StoreError reaches the user as
    one line naming the file and the errno, not as Hydra's traceback. In this process
    (cli.main, as the command line calls it): the line and the exit code are the command's,
    not its process's."""
    real = os.write

    def write(fd: int, data: bytes) -> int:  # the disk is full for cells.jsonl, only for it
        if os.readlink(f"/proc/self/fd/{fd}").endswith("cells.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    args = ("-m", *TINY, "n=32,64", "timing.min_seconds=0")
    out = cli_in_process("run", *args, cwd=tmp_path)
    monkeypatch.setattr(os, "write", real)
    line = (
        "attnbench run: error: cannot write results/single/v100_16gb-cpu/cells.jsonl: "
        "[Errno 28] No space left on device"
    )
    assert out.returncode == 2 and line in out.stderr.splitlines(), out.stderr
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr


# --- 3. messages that name what is wrong -----------------------------------------------------

V100 = presets.load("v100_16gb")
SMALL = {"layers": 2, "d_model": 64, "n_heads": 2, "d_ff": 128}


def test_linformer_without_k_says_it_needs_k() -> None:
    for n in (64, 512):  # was "k: must be an integer in [1, 64], got 256", or silently k=256
        with pytest.raises(ValueError, match=r"^k: attention=linformer needs k \(its budget\)"):
            validate(Cell.of("linformer", n=n, k=None, **SMALL), V100)
    validate(Cell.of("linformer", n=64, k=None, params=(("k", 32),), **SMALL), V100)
    validate(Cell.of("performer", n=64, k=None, **SMALL), V100)  # nb_features has a default
    validate(Cell.of("vanilla", n=64, k=None, **SMALL), V100)


def test_linformer_k_null_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^k: attention=linformer needs k \(its budget\), got"):
        prevalidate([*TINY, "attention=linformer", "k=null", "n=64"])


@pytest.mark.parametrize("n", [10**12, 2**40, 10**7])
def test_n_beyond_the_ceiling_for_one_sequence_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match=rf"^n: must fit one sequence's input .* got n={n}$"):
        validate(Cell.of("vanilla", n=n, dtype="fp32", ceiling_bytes=10**9, **SMALL), V100)


def test_n_that_fits_one_sequence_is_still_a_cell() -> None:
    usable = 10**9 - V100.overhead_bytes
    edge = usable // (64 * 4)
    validate(Cell.of("vanilla", n=edge, dtype="fp32", ceiling_bytes=10**9, **SMALL), V100)
    with pytest.raises(ValueError, match=r"^n: must fit"):
        validate(Cell.of("vanilla", n=edge + 1, dtype="fp32", ceiling_bytes=10**9, **SMALL), V100)
    validate(Cell.of("vanilla", n=65536), V100)  # Table 3's largest n: an oom row, not a typo


def test_an_absurd_n_is_one_line_exit_2_not_an_error_row(tmp_path: Path, cli_in_process) -> None:
    out = cli_in_process("run", *TINY, "n=1000000000000", cwd=tmp_path)
    one_line_exit_2(out, "n: must fit one sequence's input in the ceiling: 1000000000000 × ")
    assert not any(tmp_path.iterdir())
