"""Writing a report: writers that race, writers killed mid-write, and disks that refuse.

:func:`attnbench.report.replace.write` (``files.write``) lets one writer at a time replace
an output directory (an ``flock`` on ``.<out>.lock`` beside it), swaps the new report in
whole, and leaves nothing behind: no ``.old-*`` or temporary directory, no lock file. A full
or read-only disk is one line from ``attnbench report`` naming the path and the errno, exit 2.

Run as root (as CI and this project's machines do), ``chmod`` stops nothing, so an
unwritable directory is simulated (``EACCES`` raised where the kernel would); a full and a
read-only disk are real where this process may mount a small tmpfs (skipped otherwise).
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attnbench import cli
from attnbench.report import files, replace
from tests.conftest import HANG_S, run_cli

ROOT = Path(__file__).parent.parent
REFERENCE = ROOT / "results/reference/table3-v100_16gb-cpu/cells.jsonl"


def _report_files(tag: str) -> dict[str, bytes]:
    """A report's worth of files that say which write they came from."""
    return {
        "report.json": json.dumps({"tag": tag}).encode(),
        "table3.md": tag.encode(),
        "plots/a.svg": tag.encode() * 200,
    }


def _writer(out: str, who: int, times: int, start: Any, results: Any) -> None:
    """One process's writes; all start together at ``start``, so that they do race."""
    errors = []
    start.wait()
    for j in range(times):
        try:
            files.write(_report_files(f"{who}-{j}"), Path(out))
        except Exception as e:  # the test counts every kind
            errors.append(repr(e))
    results.put(errors)


def _leftovers(parent: Path, out: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p != out)


def _whole(out: Path) -> str:
    """The tag of the one write ``out`` holds, all of it (no file of another write)."""
    tag = json.loads((out / "report.json").read_text())["tag"]
    assert (out / "table3.md").read_text() == tag
    assert (out / "plots/a.svg").read_bytes() == tag.encode() * 200
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "plots",
        "plots/a.svg",
        "report.json",
        "table3.md",
    ]
    return tag


def _can_exchange(tmp_path: Path) -> bool:
    a, b = tmp_path / "probe-a", tmp_path / "probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return replace._exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def test_concurrent_writers_take_turns_and_leave_nothing_behind(tmp_path: Path) -> None:
    """4 processes x 10 writes to one output (before: about half raised 'Directory not
    empty' or FileNotFoundError and left .old-PID directories). Meanwhile the output is
    never missing: the new report is swapped in, not put where the old one was removed."""
    out = tmp_path / "reports" / "rep"
    files.write(_report_files("first"), out)
    watch = _can_exchange(tmp_path)
    missing = 0
    # forked: four real processes, each with its own lock and files, without four fresh
    # Pythons importing torch (seconds each, which is not what races here)
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(4), ctx.Queue()
    writers = [
        ctx.Process(target=_writer, args=(str(out), who, 10, start, results)) for who in range(4)
    ]
    for w in writers:
        w.start()
    errors = []
    guard = time.monotonic() + HANG_S  # against a deadlock only: no load comes near it
    while len(errors) < 4:  # each writer's list, or its death
        missing += not out.is_dir()
        try:
            errors.append(results.get(timeout=0.001))
        except queue.Empty:
            assert all(w.is_alive() or w.exitcode == 0 for w in writers)
            assert time.monotonic() < guard, "the writers hung"
    for w in writers:
        w.join()
    assert errors == [[], [], [], []]
    assert _leftovers(out.parent, out) == []  # no .rep.tmp-*, no .rep.old-*, no .rep.lock
    assert _whole(out).endswith("-9")  # the last write of one of the writers
    if watch:
        assert missing == 0


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    files.write(_report_files("old"), out)
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (files.write(_report_files("new"), out), done.set()), daemon=True
    )
    with replace._locked(out):
        thread.start()
        time.sleep(0.5)
        assert not done.is_set() and _whole(out) == "old"  # it waits for the lock
    thread.join()
    assert done.is_set() and _whole(out) == "new"
    assert _leftovers(tmp_path, out) == []


def _stuck_writer(out: str, stuck: Any) -> None:
    """A writer that writes the first file of a report, says so, and hangs there (holding
    the lock) until it is killed."""
    real = Path.write_bytes

    def write_and_hang(self: Path, data: bytes) -> int:
        real(self, data)
        stuck.set()
        time.sleep(600)
        return 0

    Path.write_bytes = write_and_hang  # in the child only
    files.write({"report.json": b"{}", "table3.md": b"half"}, Path(out))


def test_a_writer_killed_mid_write_leaves_nothing_the_next_one_keeps(tmp_path: Path) -> None:
    """SIGKILL while holding the lock with half a report written: the kernel drops the
    lock, and the next writer removes the half report (and the lock file) it left. The
    writer is a real process, forked (a fresh Python would spend seconds importing torch)."""
    out = tmp_path / "rep"
    files.write(_report_files("old"), out)
    ctx = multiprocessing.get_context("fork")
    stuck = ctx.Event()
    child = ctx.Process(target=_stuck_writer, args=(str(out), stuck))
    child.start()
    try:
        while not stuck.wait(0.1):  # its first file written, or it died trying
            assert child.is_alive(), child.exitcode
        left = _leftovers(tmp_path, out)
        assert ".rep.lock" in left and any(n.startswith(".rep.tmp-") for n in left)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert child.exitcode == -signal.SIGKILL
    assert _whole(out) == "old"  # never half of a new one
    (tmp_path / ".rep.tmp-keepme").mkdir()  # not a name write() makes: kept
    (tmp_path / ".rep.x.tmp-abcd1234").mkdir()  # another output's (rep.x): kept
    files.write(_report_files("new"), out)
    assert _whole(out) == "new"
    assert _leftovers(tmp_path, out) == [".rep.tmp-keepme", ".rep.x.tmp-abcd1234"]


def test_without_an_atomic_exchange_two_renames_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without RENAME_EXCHANGE: the old report is moved aside, the new one
    renamed in; if that second rename fails, the old one is put back."""
    monkeypatch.setattr(replace, "_exchange", lambda a, b: False)
    out = tmp_path / "rep"
    files.write(_report_files("one"), out)
    files.write(_report_files("two"), out)
    assert _whole(out) == "two" and _leftovers(tmp_path, out) == []
    real = os.rename

    def failing(src: Any, dst: Any) -> None:
        md = Path(src) / "table3.md"
        if Path(dst) == out and md.is_file() and md.read_text() == "three":  # the new one
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="Invalid cross-device link"):
        files.write(_report_files("three"), out)
    assert _whole(out) == "two" and _leftovers(tmp_path, out) == []


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_text(REFERENCE.read_text())
    return run


def _report(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["report", str(run), "--out", str(out), "--no-plots", "--quiet"])
    return code, capsys.readouterr().err


def _enospc_on_second_file(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_bytes
    calls: list[Path] = []

    def full(self: Path, data: bytes) -> int:
        calls.append(self)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)


def test_a_full_disk_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)
    _enospc_on_second_file(monkeypatch)
    code, err = _report(run, tmp_path / "new" / "deeper" / "rep", capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"attnbench report: error: cannot write the report to {tmp_path}")
    assert "/new/deeper/.rep.tmp-" in err and "No space left on device (ENOSPC)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # not even new/deeper


def test_a_full_disk_keeps_the_previous_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, out = _run(tmp_path), tmp_path / "rep"
    assert _report(run, out, capsys)[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _enospc_on_second_file(monkeypatch)
    code, err = _report(run, out, capsys)
    assert code == 2 and "(ENOSPC)" in err and err.count("\n") == 1
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _leftovers(tmp_path, out) == ["run"]


@pytest.mark.parametrize(
    ("where", "code", "needle"),
    [
        ("exchange", errno.EROFS, "Read-only file system (EROFS)"),
        ("mkdtemp", errno.EACCES, "Permission denied (EACCES)"),
        ("lock", errno.EACCES, "Permission denied (EACCES)"),
    ],
)
def test_a_refused_rename_temp_dir_or_lock_is_one_line(
    where: str,
    code: int,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a read-only disk or an unwritable directory does, raised where the kernel
    would (root is not stopped by chmod, so they cannot be made real here)."""
    run, out = _run(tmp_path), tmp_path / "rep"
    assert _report(run, out, capsys)[0] == 0
    before = (out / "table3.md").read_bytes()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("dir")
        raise OSError(code, os.strerror(code), str(path))

    if where == "exchange":
        monkeypatch.setattr(replace, "_exchange", refuse)
    elif where == "mkdtemp":
        monkeypatch.setattr(replace.tempfile, "mkdtemp", refuse)
    else:
        real_open = os.open
        monkeypatch.setattr(
            replace.os,
            "open",
            lambda p, *a, **k: refuse(p) if str(p).endswith(".lock") else real_open(p, *a, **k),
        )
    status, err = _report(run, out, capsys)
    assert status == 2 and err.count("\n") == 1 and needle in err, err
    assert (out / "table3.md").read_bytes() == before
    assert _leftovers(tmp_path, out) == ["run"]


def test_out_under_a_file_through_a_real_process(tmp_path: Path) -> None:
    _run(tmp_path)
    (tmp_path / "a-file").write_text("x")
    done = run_cli("report", "run", "--out", "a-file/rep", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"attnbench report: error: --out: {tmp_path / 'a-file'} is a file, not a directory\n"
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 1 MiB tmpfs of its own, or a skip where this process may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "attnbench-test", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not root?): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_and_read_only_disk(
    tmp_path: Path, small_disk: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """The CLI on a tmpfs that is full, then read-only: the kernel's own ENOSPC and EROFS.
    In this process (the errors are the file system's, not the process's; the real process
    of a refused report is test_out_under_a_file_through_a_real_process)."""
    _run(tmp_path)

    def report(out: str) -> subprocess.CompletedProcess[str]:
        return cli_in_process("report", "run", "--out", out, "--no-plots", cwd=tmp_path)

    assert report(str(small_disk / "rep")).returncode == 0
    before = {p.name: p.read_bytes() for p in (small_disk / "rep").iterdir() if p.is_file()}
    with open(small_disk / "filler", "wb") as f:  # every block taken
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    done = report(str(small_disk / "rep"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{small_disk}/.rep.tmp-" in done.stderr  # the file that did not fit
    assert "No space left on device (ENOSPC)" in done.stderr
    (small_disk / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    done = report(str(small_disk / "rep"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{small_disk}/.rep.lock: Read-only file system (EROFS)" in done.stderr
    after = {p.name: p.read_bytes() for p in (small_disk / "rep").iterdir() if p.is_file()}
    assert after == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["rep"]
