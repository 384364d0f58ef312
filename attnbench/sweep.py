"""``attnbench run``: Hydra composition, one cell per Hydra job, the results store, progress.

Flow: :func:`prevalidate` composes every job of the command with Hydra's compose API and
validates its cell *before* Hydra starts, so a typo ends with one line and exit code 2 and
nothing on disk. Then Hydra runs :func:`job` once per cell through whatever launcher the user
chose (basic: in turn; joblib: in parallel; submitit: separate processes or SLURM). A job
skips a cell already in ``cells.jsonl`` (resume), runs it, and appends its row. The progress
display (a Hydra callback) watches ``cells.jsonl``, so it works with every launcher.
"""

from __future__ import annotations

import itertools
import json
import os
import re
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

import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

import attnbench
from attnbench.measure import presets
from attnbench.runner import Cell, environment, run_cell, validate
from attnbench.store import RunStore, cell_key, read_rows

CONFIG_MODULE = "attnbench.conf"
TOTAL_ENV = "ATTNBENCH_SWEEP_CELLS"  # distinct cells of this command, for the progress bar
SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class NotACell(Exception):
    """A sweep combination that is no cell (k >= n for a mechanism with a budget)."""


def parse_size(value: Any) -> int | None:
    """Bytes from ``16GB`` (10⁹), ``15.5GiB`` (2³⁰) or a plain number; None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = SIZE.match(str(value))
    if not m:
        raise ValueError(f"ceiling: must be a number of bytes or a size like 16GB or 15.5GiB, "
                         f"got {value!r}")
    return int(float(m.group(1)) * UNITS[(m.group(2) or "b").lower()])


def _plain(value: Any) -> Any:
    """Hashable plain data from config values (lists become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def cell_from_cfg(cfg: DictConfig, *, in_sweep: bool = False) -> Cell:
    """The cell a (composed) job config describes."""
    name = cfg.attention.name
    info = attnbench.info(name)  # unknown mechanism: one line
    params = OmegaConf.to_container(cfg.attention.params, resolve=True) or {}
    k = cfg.k if info.budget else None
    if in_sweep and k is not None and isinstance(cfg.n, int) and isinstance(k, int) and k >= cfg.n:
        raise NotACell(f"k={k} >= n={cfg.n}")
    t = cfg.timing
    return Cell(
        attention=name, n=cfg.n, k=k, batch=cfg.batch, dtype=cfg.dtype, device=cfg.device.name,
        ceiling_bytes=parse_size(cfg.ceiling),
        params=tuple(sorted((key, _plain(v)) for key, v in params.items())),
        layers=cfg.model.layers, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads,
        d_ff=cfg.model.d_ff, min_repeats=t.min_repeats, min_seconds=float(t.min_seconds),
        cpu_batch=t.cpu_batch, time_budget_s=float(t.time_budget_s), flush_l2=t.flush_l2,
    )


def preset_from_cfg(cfg: DictConfig) -> presets.Preset:
    return presets.from_dict(OmegaConf.to_container(cfg.device, resolve=True))


def cell_spec(cell: Cell, preset: presets.Preset) -> dict[str, Any]:
    """The cell as stored with its row: the ceiling resolved, the model shape grouped."""
    spec = asdict(cell)
    spec["ceiling_bytes"] = cell.ceiling_bytes or preset.total_bytes
    spec["model"] = {f: spec[f] for f in ("layers", "d_model", "n_heads", "d_ff")}
    return spec


def run_dir(cfg: DictConfig) -> Path:
    """``<out_dir>/<sweep_name>/<run>``; run ``auto`` names the device and where it runs, so
    the same command resumes in the same place."""
    run = cfg.run
    if run == "auto":
        here = "cuda" if torch.cuda.is_available() and cfg.device.gpu else "cpu"
        run = f"{cfg.device.name}-{here}"
    return Path(cfg.out_dir) / cfg.sweep_name / str(run)


def register_user_mechanisms() -> None:
    """A mechanism registered in Python but without a YAML file is still an ``attention``
    option (with its default parameters): it shows up in sweeps with no extra step."""
    shipped = {"vanilla", "sdpa", "xformers", "linformer", "performer"}
    cs = ConfigStore.instance()
    for name in attnbench.names():
        if name not in shipped:
            cs.store(group="attention", name=name, node={"name": name, "params": {}})


# --- before Hydra starts: compose and validate every job --------------------------------------


def _one_line(e: Exception) -> str:
    text = str(e)
    found = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if found:
        group, option = found.groups()
        options = [o for o in re.findall(r"^\t(\S+)", text, re.M) if "=" not in o]
        allowed = f"; allowed: {', '.join(options)}" if options else ""
        return f"{group}: unknown option {option!r}{allowed}"
    return " ".join(text.split())


def _split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(overrides, Hydra flags with their values)."""
    overrides, flags = [], []
    takes_value = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn",
                   "--cfg", "-c", "--package", "-p", "--experimental-rerun"}
    it = iter(args)
    for a in it:
        if a.startswith("-"):
            flags.append(a)
            if a in takes_value:
                flags.append(next(it, ""))
        else:
            overrides.append(a)
    return overrides, flags


def expand_jobs(overrides: list[str], config_dir: str | None = None, multirun: bool = False
                ) -> tuple[list[DictConfig], bool]:
    """Every job's composed config, as Hydra's basic sweeper would expand them, and
    whether this is a sweep. Raises ValueError with one line on any bad override."""
    from hydra import compose, initialize_config_module

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:
        raise ValueError(f"overrides: {_one_line(e)}") from None
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = {o.get_key_element(): list(o.sweep_string_iterator()) for o in parsed
             if o.is_sweep_override()}
    if config_dir:
        fixed.append(f"hydra.searchpath=[file://{Path(config_dir).resolve()}]")
    register_user_mechanisms()
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        try:
            base = compose("config", overrides=fixed, return_hydra_config=True)
        except ConfigCompositionException as e:
            raise ValueError(_one_line(e)) from None
        params = base.hydra.sweeper.params
        params = OmegaConf.to_container(params, resolve=False) if params else {}
        grid = {k: [s.strip() for s in str(v).split(",")] for k, v in params.items()}
        for o in parsed:  # the command line wins over the sweep file, as in Hydra
            grid.pop(o.get_key_element().lstrip("+~"), None)
        grid.update(swept)
        multirun = multirun or bool(swept) or str(base.hydra.mode).endswith("MULTIRUN")
        keys = list(grid)
        jobs = []
        for values in itertools.product(*grid.values()) if grid else [()]:
            extra = [f"{k}={v}" for k, v in zip(keys, values, strict=True)]
            try:
                jobs.append(compose("config", overrides=fixed + extra))
            except ConfigCompositionException as e:
                raise ValueError(_one_line(e)) from None
    return jobs, multirun or bool(grid)


def prevalidate(args: list[str]) -> int:
    """Validate every cell of ``attnbench run ARGS``; returns the number of distinct cells."""
    overrides, flags = _split_args(args)
    config_dir = next((flags[i + 1] for i, f in enumerate(flags)
                       if f in ("--config-dir", "-cd") and i + 1 < len(flags)), None)
    jobs, is_sweep = expand_jobs(overrides, config_dir,
                                 multirun=any(f in ("-m", "--multirun") for f in flags))
    keys, left_out = set(), 0
    for cfg in jobs:
        try:
            cell = cell_from_cfg(cfg, in_sweep=is_sweep)
        except NotACell:
            left_out += 1
            continue
        for key in ("n", "batch", "dtype"):
            if OmegaConf.is_missing(cfg, key):
                raise ValueError(f"{key}: missing")
        preset = preset_from_cfg(cfg)
        validate(cell, preset)
        keys.add(cell_key(cell_spec(cell, preset)))
    if not keys:
        raise ValueError(f"k: every combination has k >= n ({left_out} left out); nothing to run")
    return len(keys)


# --- one Hydra job = one cell ---------------------------------------------------------------


class CellTimeout(Exception):
    pass


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise CellTimeout after ``seconds`` (main thread only; elsewhere no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
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
    """joblib's loky reuses worker processes: run each cell in a fresh one there, so CUDA
    state (allocator caches, memory fractions) cannot leak from one cell into the next."""
    try:
        return "joblib" in str(HydraConfig.get().launcher.get("_target_", "")).lower()
    except ValueError:
        return False


def measure(cell: Cell, preset: presets.Preset, timeout_s: float, isolate: bool
            ) -> dict[str, Any]:
    """One row for ``cell``; a timeout is a row too."""
    if isolate:
        payload = json.dumps({"cell": asdict(cell), "preset": asdict(preset)})
        try:
            done = subprocess.run([sys.executable, "-m", "attnbench.sweep", "--cell", payload],
                                  capture_output=True, text=True,
                                  timeout=timeout_s if timeout_s > 0 else None)
        except subprocess.TimeoutExpired:
            return _failed(cell, preset, f"timed out after {timeout_s:g} s")
        if done.returncode != 0:
            return _failed(cell, preset, done.stderr.strip().splitlines()[-1][:300]
                           if done.stderr.strip() else f"exit code {done.returncode}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    try:
        with _time_limit(timeout_s):
            return run_cell(cell, validate(cell, preset))
    except CellTimeout:
        return _failed(cell, preset, f"timed out after {timeout_s:g} s")


def _failed(cell: Cell, preset: presets.Preset, reason: str) -> dict[str, Any]:
    return {"attention": cell.attention, "params": dict(cell.params), "n": cell.n, "k": cell.k,
            "dtype": cell.dtype, "device": cell.device,
            "ceiling_bytes": cell.ceiling_bytes or preset.total_bytes, "status": "error",
            "reason": reason, "env": environment()}


def job(cfg: DictConfig) -> dict[str, Any] | None:
    """Hydra's task function: measure the cell of ``cfg`` unless the store has it."""
    try:
        in_sweep = HydraConfig.get().job.get("num") is not None
    except ValueError:  # called outside Hydra
        in_sweep = False
    try:
        cell = cell_from_cfg(cfg, in_sweep=in_sweep)
    except NotACell:
        return None
    preset = preset_from_cfg(cfg)
    store = RunStore(run_dir(cfg))
    spec = cell_spec(cell, preset)
    key = cell_key(spec)
    label = " ".join([cell.attention, f"n={cell.n}"] + ([f"k={cell.k}"] if cell.k else [])
                     + [f"{p}={v}" for p, v in cell.params])
    if not cfg.rerun and key in store.done():
        print(f"  done before: {label}", flush=True)
        return None
    if not in_sweep:
        store.write_once("config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    store.write_once("env.json", json.dumps(environment(), indent=2))
    start = time.perf_counter()
    row = measure(cell, preset, float(cfg.cell_timeout_s), _isolated())
    row.update(key=key, sweep=cfg.sweep_name, wall_s=round(time.perf_counter() - start, 3),
               model=spec["model"], cell=spec)
    store.append(row, replace=bool(cfg.rerun))
    print(f"  {row['status']:7s} {label}: " + _summary(row), flush=True)
    return row


def _summary(row: dict[str, Any]) -> str:
    parts = []
    if row.get("max_batch") is not None:
        parts.append(f"max b {row['max_batch']} ({row.get('memory_source')})")
    if row.get("time_per_seq_s"):
        parts.append(f"{row['time_per_seq_s'] * 1e3:.2f} ms/seq on {row.get('time_device')}")
    if row.get("reason"):
        parts.append(str(row["reason"]))
    return "; ".join(parts)


# --- progress across the whole sweep, for any launcher ------------------------------------


class Progress(Callback):
    """A rich progress bar (with ETA) and a live table of finished rows, fed by watching
    ``cells.jsonl``; with ``progress=false``, only the jobs' own one-line reports."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # launchers (joblib, submitit) pickle callbacks into jobs; the watcher stays

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        store = RunStore(run_dir(config))
        cfg = {k: (OmegaConf.to_container(config[k], resolve=True)
                if OmegaConf.is_config(config[k]) else config[k])
               for k in config if k != "hydra"}  # hydra's own keys resolve only inside jobs
        cfg["sweep"] = OmegaConf.to_container(config.hydra.sweeper.params or {})
        cfg["overrides"] = list(config.hydra.overrides.task)
        store.write_once("config.yaml", OmegaConf.to_yaml(OmegaConf.create(cfg)))
        if not config.progress:
            return
        total = int(os.environ.get(TOTAL_ENV, "0")) or None
        self._thread = threading.Thread(target=self._watch, args=(store, total), daemon=True)
        self._thread.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        rows = read_rows(RunStore(run_dir(config)).cells, strict=False)
        counts = {s: sum(r.get("status") == s for r in rows) for s in
                  ("ok", "oom", "skipped", "error")}
        print(f"attnbench: {len(rows)} rows in {RunStore(run_dir(config)).cells} "
              f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)})", flush=True)

    def _watch(self, store: RunStore, total: int | None) -> None:
        from rich.console import Group
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar
        from rich.table import Table

        start_rows = len(read_rows(store.cells, strict=False))
        bar = Bar(TextColumn("cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn())
        task = bar.add_task("cells", total=total)
        with Live(Group(bar), refresh_per_second=2, transient=False) as live:
            while True:
                stopping = self._stop.wait(0.5)
                rows = read_rows(store.cells, strict=False)
                bar.update(task, completed=len(rows) if total else len(rows) - start_rows)
                table = Table("attention", "n", "k", "status", "max b", "ms/seq", "memory",
                              title="finished cells (last 8)")
                for r in rows[-8:]:
                    t = r.get("time_per_seq_s")
                    table.add_row(str(r.get("attention")), str(r.get("n")), str(r.get("k")),
                                  str(r.get("status")), str(r.get("max_batch")),
                                  "-" if not t else f"{t * 1e3:.2f}",
                                  str(r.get("memory_source")))
                live.update(Group(bar, table))
                if stopping:  # one last frame with every row, then out
                    break


def _main_cell(payload: str) -> int:
    """``python -m attnbench.sweep --cell JSON``: one isolated cell, its row on stdout."""
    data = json.loads(payload)
    cell = Cell(**{**data["cell"], "params": tuple(tuple(p) for p in data["cell"]["params"])})
    row = run_cell(cell, validate(cell, presets.Preset(**data["preset"])))
    print(json.dumps(row, default=str))
    return 0


def hydra_main() -> None:
    """The Hydra app behind ``attnbench run`` (reads ``sys.argv``)."""
    import hydra

    register_user_mechanisms()
    hydra.main(config_path="pkg://attnbench.conf", config_name="config",
               version_base="1.3")(job)()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--cell":
    sys.exit(_main_cell(sys.argv[2]))
