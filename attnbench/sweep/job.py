"""One Hydra job = one cell: skipped if stored, measured (isolated where it must be), stored.

:func:`job` is Hydra's task function for ``attnbench run``; any launcher runs it (basic: in
turn; joblib: in parallel; submitit: separate processes or SLURM). A cell is measured in
this process under ``cell_timeout_s``, or — under joblib, whose loky workers are reused —
in a fresh process (:func:`measure`), so CUDA state cannot leak from one cell into the next.
A timeout or a crashed cell is a row with status ``error``, never a hole in the sweep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from attnbench import plan
from attnbench.cell import Cell
from attnbench.cell_key import KEY_VERSION, stored_key
from attnbench.cell_key import key as cell_key
from attnbench.cell_rules import ALLOC_CONF, ALLOC_CONFS
from attnbench.env import environment
from attnbench.measure import presets
from attnbench.measure.allocator_rules import conf_string
from attnbench.row import Row
from attnbench.runner import run_cell
from attnbench.store import RunStore, StoreError
from attnbench.sweep import claims, interrupts, launchers
from attnbench.sweep.cells import cell_from_cfg, preset_from_cfg
from attnbench.sweep.config import register_user_options
from attnbench.sweep.finish import busy_line
from attnbench.sweep.paths import run_dir
from attnbench.validators import check_limit


class CellTimeout(BaseException):
    """A BaseException, so the runner's ``except Exception`` (which turns a failing forward
    into an ``error`` row) lets it through to :func:`measure`."""


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CellTimeout after ``seconds`` (None: no limit; main thread only, elsewhere no
    limit either)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise CellTimeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _isolated() -> bool:
    """joblib's loky reuses worker processes: run each cell in a fresh one there."""
    try:
        return launchers.is_joblib(str(HydraConfig.get().launcher.get("_target_", "")))
    except ValueError:
        return False


def measure(planned: plan.Resolved, timeout_s: float | None, isolate: bool) -> Row:
    """One row for a planned cell; a timeout (after ``timeout_s``, None: no limit) is a row
    too. An isolated cell killed by Ctrl-C or SIGTERM is no row: it was interrupted, not
    broken, and the next command measures it. A cell in a process of its own is planned
    there again from its completed spec: where it runs decides ``on_gpu``, and the plan's
    workload and task are objects of that process."""
    cell, preset = planned.cell, planned.preset
    conf = _allocator_env(planned)
    if isolate or conf is not None:
        parent = os.getpid()  # the cell dies with this process (cell_process.die_with_parent)
        payload = json.dumps({"cell": cell.to_dict(), "preset": asdict(preset), "parent": parent})
        env = None
        if conf is not None:  # the cell's own, under the one name torch reads first here
            env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONFS}
            env[ALLOC_CONF] = conf
        try:
            done = subprocess.run(
                [sys.executable, "-m", "attnbench.sweep.cell_process", "--cell", payload],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return _failed(cell, preset, f"timed out after {timeout_s:g} s")
        if done.returncode in (-signal.SIGINT, -signal.SIGTERM):
            raise KeyboardInterrupt
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            why = lines[-1][:300] if lines else _exit_reason(done.returncode)
            return _failed(cell, preset, why)
        return Row.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))
    try:
        with _time_limit(timeout_s):
            return run_cell(cell, planned)
    except CellTimeout:
        return _failed(cell, preset, f"timed out after {timeout_s:g} s")


def _allocator_env(planned: plan.Resolved) -> str | None:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` a GPU cell's own process needs for its ``allocator``
    setting (read once, when CUDA starts: so the cell runs in a fresh process with it); None
    where the cell runs in this process (its CPU model replays the setting instead)."""
    if planned.cell.allocator == "default" or not planned.on_gpu:
        return None
    return conf_string(planned.cell.allocator)


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _failed(cell: Cell, preset: presets.Preset, reason: str) -> Row:
    ceiling = plan.spec(cell, preset)["ceiling_bytes"]
    return Row.new(
        cell, ceiling, preset.overhead_bytes, environment(), status="error", reason=reason
    )


class StoreFailed(BaseException):
    """The run's files cannot be written (disk full, read-only): a BaseException, so that
    Hydra's job runner, which catches Exception and goes on to the next cell, lets it through
    to the command, which says it in one line (:mod:`attnbench.sweep.command`)."""


def job(cfg: DictConfig) -> Row | None:
    """Hydra's task function (:func:`_job`); a store that cannot be written ends the sweep."""
    try:
        return _job(cfg)
    except StoreError as e:
        raise StoreFailed(str(e)) from None


def _job(cfg: DictConfig) -> Row | None:
    """Measure the cell of ``cfg`` unless the store has it, holding
    the cell's claim (:func:`claims.hold`) so that no other command measures it meanwhile."""
    try:
        in_sweep = HydraConfig.get().job.get("num") is not None
    except ValueError:  # called outside Hydra
        in_sweep = False
    asked = cell_from_cfg(cfg, in_sweep)
    if in_sweep and plan.left_out(asked, preset_from_cfg(cfg)):
        return None  # left out by the pre-check, which said so
    planned = plan.validate(asked, preset_from_cfg(cfg))  # in the pre-check's process: its plan
    cell, preset, label = planned.cell, planned.preset, plan.label(planned.cell)
    store = RunStore(run_dir(cfg), rekey=stored_key)
    key = cell_key(cell, preset)
    rerun = bool(cfg.rerun)
    if not claims.claim(key):
        return None  # the same cell as another job of this command: said once, before it ran
    if not rerun and key in store.done():
        print(f"  done before: {label}", flush=True)
        return None

    def waiting(who: str) -> None:
        print(f"  waiting: {label} is being measured by another command ({who})", flush=True)

    with claims.hold(store.dir, key, waiting, label):
        if _stored(store, key, rerun):  # by another command, while this one waited
            print(f"  done before: {label}", flush=True)
            return None
        if not in_sweep:
            record_command(store, cfg)
        start = time.perf_counter()
        timeout = check_limit("cell_timeout_s", cfg.cell_timeout_s)  # 0 or null: none
        with interrupts.measuring():  # Ctrl-C and SIGTERM bounded even in a native call
            row = measure(planned, timeout, _isolated())
        row = row.replaced(  # which run it is stored in, and when
            key=key,
            key_version=KEY_VERSION,
            sweep=cfg.sweep_name,
            wall_s=round(time.perf_counter() - start, 3),
            finished_at=time.time(),
            invocation=claims.invocation(),
            cell=plan.spec(cell, preset),
        )
        if not claims.command_alive():  # an orphan: its command was killed
            print(f"  dropped: {label}: its command has ended; not stored", flush=True)
            return None
        store.append(row, replace=rerun)
    print(f"  {row.status:7s} {label}: " + _summary(row), flush=True)
    if not in_sweep:
        print(f"attnbench: row stored in {_shown(store.cells)}", flush=True)
        if line := busy_line([row.to_dict()]):  # a sweep says it once, at its end
            print(line, flush=True)
    return row


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it is under it, else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _stored(store: RunStore, key: str, rerun: bool) -> bool:
    """Is ``key`` stored? With ``rerun``, only a row stored since this command started
    counts (another command measured it again meanwhile): measured again once, not once per
    command. The rows themselves are read only then, and only when the key is stored."""
    if key not in store.done():
        return False
    if not rerun:
        return True
    since = claims.started() or float("inf")
    return any(r["key"] == key and (r.get("finished_at") or 0) >= since for r in store.rows())


def record_command(store: RunStore, cfg: DictConfig, sweep: dict | None = None) -> None:
    """The run directory keeps the resolved config of its first command (``config.yaml``),
    the environment (``env.json``) and one line per command that wrote to it."""
    plain = {
        k: (OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k])
        for k in cfg
        if k != "hydra"
    }  # hydra's keys resolve in jobs
    if sweep is not None:
        plain["sweep"] = sweep
    store.write_once("config.yaml", OmegaConf.to_yaml(OmegaConf.create(plain)))
    store.write_once("env.json", json.dumps(environment(), indent=2))
    store.add_line(
        "commands.jsonl",
        {"invocation": claims.invocation(), "time": time.time(), "argv": sys.argv[1:]},
    )


def _summary(row: Row) -> str:
    parts = []
    if row.max_batch is not None:
        parts.append(f"max b {row.max_batch} ({row.memory_source})")
    if row.time_per_seq_s:
        parts.append(f"{row.time_per_seq_s * 1e3:.2f} ms/seq on {row.time_device}")
        if row.busy:
            parts.append(f"machine busy: {(row.contention or {}).get('why')}")
    q = row.quality or {}
    if "rel_frobenius" in q:
        parts.append(
            f"error {q['rel_frobenius']:.4g} (relative Frobenius), cosine {q['cosine']:.4f}"
        )
    if "test_accuracy" in q:  # listops beside its majority class, mqar beside chance
        bar = "majority_accuracy" if "majority_accuracy" in q else "chance"
        parts.append(
            f"accuracy {q['test_accuracy']:.3f} ({bar.split('_')[0]} {q[bar]:.3f}), "
            f"{q['steps_per_s']:.1f} steps/s"
        )
    if row.reason:
        parts.append(str(row.reason))
    return "; ".join(parts)


def hydra_main() -> None:
    """The Hydra app behind ``attnbench run`` (reads ``sys.argv``)."""
    import hydra

    register_user_options()
    hydra.main(config_path="pkg://attnbench.conf", config_name="config", version_base="1.3")(job)()
