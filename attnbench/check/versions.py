"""The two versions of the code: git, a temporary worktree, one worker process per version.

Version A is a git ref checked out in a worktree that is removed afterwards whatever
happens; version B is the working tree, uncommitted changes included. Each version is timed
by its own :class:`Worker`, a process importing that version's tree (``check.pythonpath``),
so that a user's own mechanism living in their repository is compared as well as ours.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnbench import plugins
from attnbench.check import Misuse
from attnbench.env import with_malloc_fixed

WORKER = Path(__file__).with_name("worker.py")


def git(*args: str, cwd: Path) -> str:
    """``git ARGS`` in ``cwd``; its last line of stderr as a :class:`Misuse` on failure."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise Misuse(
            done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"git {' '.join(args)} failed"
        )
    return done.stdout.strip()


def repo_root(cwd: Path) -> Path:
    """The repository around ``cwd``, or a :class:`Misuse` that says what to do instead."""
    try:
        return Path(git("rev-parse", "--show-toplevel", cwd=cwd))
    except FileNotFoundError:
        raise Misuse("--against: git is not installed here") from None
    except Misuse as e:
        raise Misuse(
            f"--against: {cwd} is not usable as a git repository ({e}); use "
            "--baseline FILE to compare with stored samples instead"
        ) from None


def root_or_cwd(cwd: Path) -> Path:
    """The repository around ``cwd`` if there is one, else ``cwd``: the stored-baseline
    modes time the working tree alone and need no git."""
    try:
        return repo_root(cwd)
    except Misuse:
        return cwd


def resolve_ref(root: Path, ref: str | None) -> tuple[str, str]:
    """(the name asked for, its commit); the default is the parent commit, ``HEAD~1``."""
    name = ref or "HEAD~1"
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=root)
    except Misuse:
        if ref is None:
            shallow = git("rev-parse", "--is-shallow-repository", cwd=root) == "true"
            raise Misuse(
                "--against: HEAD has no parent commit"
                + (
                    " in this shallow clone (fetch more history: git fetch --deepen=1, or "
                    "fetch-depth: 0 in actions/checkout)"
                    if shallow
                    else "; name a ref to compare with"
                )
            ) from None
        raise Misuse(f"--against: unknown git ref {name!r}") from None
    return name, commit


@contextmanager
def worktree(root: Path, commit: str) -> Iterator[Path]:
    """The commit checked out in a temporary worktree, removed afterwards whatever happens."""
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-check-"))
    path = tmp / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(path), commit, cwd=root)
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=root, capture_output=True
        )
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)


def expected_modules(root: Path) -> dict[str, str]:
    """Where, relative to the repository root, the driver found attnbench and the user's
    plugins: each worker must import its own copies from the same place in its own tree.
    Modules from outside the repository (an installed attnbench) are not version-specific."""
    try:
        modules = [importlib.import_module("attnbench"), *map(plugins.imported, plugins.named())]
    except plugins.PluginError as e:
        raise Misuse(str(e)) from None
    out = {}
    for module in modules:
        path = Path(module.__file__ or "").resolve()
        if path.is_relative_to(root.resolve()):
            out[module.__name__] = str(path.relative_to(root.resolve()))
    return out


class Worker:
    """One version's worker process (:mod:`attnbench.check.worker`): importing ``tree``'s
    code, timing on request, one JSON line each way."""

    def __init__(self, tree: Path, settings: dict[str, Any], expect: dict[str, str]) -> None:
        paths = [str((tree / p).resolve()) for p in settings["pythonpath"]]
        # the malloc thresholds fixed (the user's own values win): otherwise a difference
        # between the two worker *processes* reads as one between the two versions
        env = {
            **with_malloc_fixed(dict(os.environ)),
            "ATTNBENCH_CHECK_EXPECT": json.dumps(expect),
            "PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        # run by path from the version's tree as cwd: the driver's package is not imported
        code = (
            "import runpy, sys; sys.argv = ['worker', sys.argv[1]]; "
            f"runpy.run_path({str(WORKER)!r}, run_name='__main__')"
        )
        self.tree = tree
        # stderr to a file, not a pipe: a chatty version cannot fill a pipe and hang us both
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(tree)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        hello = self._read()
        if "error" in hello:
            self.close()
            raise Misuse(f"the version in {tree}: {hello['error']}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            self.log.seek(0)
            err = self.log.read().strip()
            raise RuntimeError(
                f"the worker for {self.tree} died: {err.splitlines()[-1] if err else 'no output'}"
            )
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"the worker for {self.tree} answered {line[:80]!r}") from None

    def ask(self, **msg: Any) -> dict[str, Any]:
        """Send one request, wait for its one reply."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """End the worker (closing its stdin ends its loop), killing it if it hangs."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # end of input: the worker's loop ends, it exits
        except OSError:  # it is already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
