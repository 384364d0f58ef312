"""``attnbench run``: Hydra composition, one cell per Hydra job, the results store, progress.

Flow: :func:`prevalidate` composes every job of the command with Hydra's compose API and
validates its cell *before* Hydra starts, so a typo ends with one line and exit code 2 and
nothing on disk. Then Hydra runs :func:`job` once per cell through whatever launcher the user
chose (basic: in turn; joblib: in parallel; submitit: separate processes or SLURM). A job
skips a cell already in ``cells.jsonl`` (resume), runs it, and appends its row. The progress
display (a Hydra callback) watches ``cells.jsonl``, so it works with every launcher.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
from attnbench.attention.base import check_int
from attnbench.measure import presets
from attnbench.runner import Cell, empty_row, environment, run_cell, validate
from attnbench.store import RunStore, cell_key, read_rows

CONFIG_MODULE = "attnbench.conf"
SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


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
        raise ValueError(
            f"ceiling: must be a number of bytes or a size like 16GB or 15.5GiB, got {value!r}"
        )
    return int(float(m.group(1)) * UNITS[(m.group(2) or "b").lower()])


def _plain(value: Any) -> Any:
    """Hashable plain data from config values (lists become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def cell_from_cfg(cfg: DictConfig, *, in_sweep: bool = False) -> Cell:
    """The cell a (composed) job config describes."""
    if not isinstance(cfg.get("device"), DictConfig):
        raise ValueError(f"device: must select a preset (device=NAME), got {cfg.get('device')!r}")
    name = cfg.attention.name
    info = attnbench.info(name)  # unknown mechanism: one line
    params = OmegaConf.to_container(cfg.attention.params, resolve=True) or {}
    if cfg.k is not None:
        check_int("k", cfg.k)  # even where the mechanism ignores it: k=0 is a typo
    k = cfg.k if info.budget else None
    if (
        in_sweep and info.fixed_max_len and k is not None and isinstance(cfg.n, int) and k >= cfg.n
    ):  # Linformer's k < n, as in the paper; Performer's m is free
        raise NotACell(f"k={k} >= n={cfg.n}")
    t = cfg.timing
    return Cell(
        attention=name,
        n=cfg.n,
        k=k,
        batch=cfg.batch,
        dtype=cfg.dtype,
        device=cfg.device.name,
        ceiling_bytes=parse_size(cfg.ceiling),
        params=tuple(sorted((key, _plain(v)) for key, v in params.items())),
        layers=cfg.model.layers,
        d_model=cfg.model.d_model,
        n_heads=cfg.model.n_heads,
        d_ff=cfg.model.d_ff,
        min_repeats=t.min_repeats,
        min_seconds=float(t.min_seconds),
        cpu_batch=t.cpu_batch,
        time_budget_s=float(t.time_budget_s),
        flush_l2=t.flush_l2,
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


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    found = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if found:
        group, option = found.groups()
        options = [o for o in re.findall(r"^\t(\S+)", text, re.M) if "=" not in o]
        allowed = f"; allowed: {', '.join(options)}" if options else ""
        return f"{group}: unknown option {option!r}{allowed}"
    return " ".join(text.split())


FLAGS_WITH_VALUE = {
    "--config-dir",
    "-cd",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--experimental-rerun",
}


def _split_args(args: list[str]) -> tuple[list[str], dict[str, str], set[str]]:
    """(overrides, flags with a value, flags without) — ``--flag value`` or ``--flag=value``."""
    overrides, valued, bare = [], {}, set()
    it = iter(args)
    for a in it:
        if not a.startswith("-"):
            overrides.append(a)
        elif "=" in a and a.split("=", 1)[0] in FLAGS_WITH_VALUE:
            flag, value = a.split("=", 1)
            valued[flag] = value
        elif a in FLAGS_WITH_VALUE:
            valued[a] = next(it, "")
        else:
            bare.add(a)
    return overrides, valued, bare


def expand_jobs(
    overrides: list[str],
    config_dir: str | None = None,
    config_name: str = "config",
    multirun: bool = False,
) -> tuple[list[DictConfig], bool]:
    """Every job's composed config, expanded by Hydra's own BasicSweeper exactly as a
    multirun will expand them (sweep file params first, the command line winning), and
    whether the command is a multirun. Raises ValueError with one line on a bad override."""
    from hydra import compose, initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    search = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    register_user_mechanisms()
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            parsed = parser.parse_overrides(overrides)
            fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
            base = compose(config_name, overrides=fixed + search, return_hydra_config=True)
            multirun = multirun or str(base.hydra.mode).endswith("MULTIRUN")
            if not multirun:
                if len(fixed) != len(parsed):
                    raise ValueError(
                        "overrides: a,b or range() sweeps need multirun: add -m, or use +sweep=NAME"
                    )
                return [compose(config_name, overrides=overrides + search)], False
            params = base.hydra.sweeper.params
            params = OmegaConf.to_container(params, resolve=False) if params else {}
            every = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides)
            jobs = [
                compose(config_name, overrides=list(job) + search)
                for batch in BasicSweeper.split_arguments(every, None)
                for job in batch
            ]
    except (HydraException, ConfigCompositionException, ImportError) as e:
        raise ValueError(_one_line(e)) from None
    return jobs, True


def _check_run_keys(cfg: DictConfig) -> None:
    """The keys of ``attnbench run`` itself, before any cell runs (a typo is not a row)."""
    for key in ("rerun", "progress", "report", "timing.flush_l2"):
        if not isinstance(OmegaConf.select(cfg, key), bool):
            raise ValueError(f"{key}: must be true or false, got {OmegaConf.select(cfg, key)!r}")
    for key in ("cell_timeout_s", "timing.min_seconds", "timing.time_budget_s"):
        value = OmegaConf.select(cfg, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{key}: must be a number >= 0, got {value!r}")
    baseline = cfg.report_baseline
    if baseline not in attnbench.names():
        raise ValueError(
            f"report_baseline: must be a mechanism ({', '.join(attnbench.names())})"
            f", got {baseline!r}"
        )


def prevalidate(args: list[str]) -> list[tuple[str, str]]:
    """Validate every cell of ``attnbench run ARGS`` before Hydra starts; returns the
    distinct (run dir, cell key) pairs the command will fill (the progress bar's cells)."""
    overrides, valued, bare = _split_args(args)
    flag_m = bool(bare & {"-m", "--multirun"})
    jobs, is_sweep = expand_jobs(
        overrides,
        valued.get("--config-dir", valued.get("-cd")),
        valued.get("--config-name", valued.get("-cn", "config")),
        multirun=flag_m,
    )
    plan: dict[tuple[str, str], None] = {}
    left_out: list[str] = []
    for cfg in jobs:
        for key in ("n", "batch", "dtype"):
            if OmegaConf.is_missing(cfg, key):
                raise ValueError(f"{key}: missing")
        _check_run_keys(cfg)
        try:
            cell = cell_from_cfg(cfg, in_sweep=is_sweep)
        except NotACell as e:
            left_out.append(f"{cfg.attention.name} {e}")
            continue
        preset = preset_from_cfg(cfg)
        validate(cell, preset)
        plan[(str(run_dir(cfg)), cell_key(cell_spec(cell, preset)))] = None
    if left_out:
        print(
            f"attnbench run: {len(left_out)} combinations left out (k >= n for a fixed-length "
            f"mechanism), e.g. {left_out[0]}",
            file=sys.stderr,
        )
    if not plan:
        raise ValueError("k: every combination has k >= n; nothing to run")
    return list(plan)


# --- one Hydra job = one cell ---------------------------------------------------------------


class CellTimeout(BaseException):
    """A BaseException, so the runner's ``except Exception`` (which turns a failing forward
    into an ``error`` row) lets it through to :func:`measure`."""


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


def measure(cell: Cell, preset: presets.Preset, timeout_s: float, isolate: bool) -> dict[str, Any]:
    """One row for ``cell``; a timeout is a row too."""
    if isolate:
        payload = json.dumps({"cell": asdict(cell), "preset": asdict(preset)})
        try:
            done = subprocess.run(
                [sys.executable, "-m", "attnbench.sweep", "--cell", payload],
                capture_output=True,
                text=True,
                timeout=timeout_s if timeout_s > 0 else None,
            )
        except subprocess.TimeoutExpired:
            return _failed(cell, preset, f"timed out after {timeout_s:g} s")
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return _failed(
                cell, preset, lines[-1][:300] if lines else f"exit code {done.returncode}"
            )
        return json.loads(done.stdout.strip().splitlines()[-1])
    try:
        with _time_limit(timeout_s):
            return run_cell(cell, validate(cell, preset))
    except CellTimeout:
        return _failed(cell, preset, f"timed out after {timeout_s:g} s")


def _failed(cell: Cell, preset: presets.Preset, reason: str) -> dict[str, Any]:
    row = empty_row(cell, cell.ceiling_bytes or preset.total_bytes, preset.overhead_bytes)
    row.update(status="error", reason=reason)
    return row


INVOCATION_ENV = "ATTNBENCH_INVOCATION"  # one id per `attnbench run` command
PLAN_ENV = "ATTNBENCH_SWEEP_PLAN"  # a JSON file: the (run dir, key) pairs of this command


def _claim(key: str) -> bool:
    """First job of this command to reach ``key``? Vanilla ignores k, so a sweep over k
    launches the same cell several times; parallel launchers would run the copies at once,
    and rerun=true would measure each. A file per (command, key) in the temp dir decides."""
    invocation = os.environ.get(INVOCATION_ENV)
    if not invocation:
        return True
    claims = _claims_dir()
    claims.mkdir(exist_ok=True)
    try:
        os.close(os.open(claims / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _claims_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"attnbench-{os.environ.get(INVOCATION_ENV)}"


def forget_invocation() -> None:
    """Remove this command's plan file and claim directory (temp files only)."""
    if os.environ.get(INVOCATION_ENV):
        shutil.rmtree(_claims_dir(), ignore_errors=True)
    plan = os.environ.pop(PLAN_ENV, None)
    if plan:
        Path(plan).unlink(missing_ok=True)


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
    label = " ".join(
        [cell.attention, f"n={cell.n}"]
        + ([f"k={cell.k}"] if cell.k else [])
        + [f"{p}={v}" for p, v in cell.params]
    )
    if not _claim(key) or (not cfg.rerun and key in store.done()):
        print(f"  done before: {label}", flush=True)
        return None
    if not in_sweep:
        record_command(store, cfg)
    start = time.perf_counter()
    row = measure(cell, preset, float(cfg.cell_timeout_s), _isolated())
    row.update(
        key=key,
        sweep=cfg.sweep_name,
        wall_s=round(time.perf_counter() - start, 3),
        finished_at=time.time(),
        invocation=os.environ.get(INVOCATION_ENV),
        model=spec["model"],
        cell=spec,
    )
    store.append(row, replace=bool(cfg.rerun))
    print(f"  {row['status']:7s} {label}: " + _summary(row), flush=True)
    return row


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
        {"invocation": os.environ.get(INVOCATION_ENV), "time": time.time(), "argv": sys.argv[1:]},
    )


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
    """A rich progress bar (with ETA) and a live table of this command's finished rows, fed
    by watching the run directories' ``cells.jsonl`` (so it works under every launcher);
    with ``progress=false``, only the jobs' own one-line reports."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # launchers (joblib, submitit) pickle callbacks into jobs; the watcher stays

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        plan = _plan()
        params = config.hydra.sweeper.params
        sweep = {
            "params": OmegaConf.to_container(params) if params else {},
            "overrides": list(config.hydra.overrides.task),
        }
        for d in {d for d, _ in plan} or {str(run_dir(config))}:
            record_command(RunStore(Path(d)), config, sweep)
        if config.progress and plan:
            self._thread = threading.Thread(
                target=self._watch, args=(plan, config.rerun), daemon=True
            )
            self._thread.start()
            atexit.register(self._halt)  # a crashed sweep must not leave the cursor hidden

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._thread is not None:
            self._halt()
            print(flush=True)  # the live display's last frame ends without a newline
        plan = _plan()
        rows = _rows_of(plan) if plan else []
        counts = {
            s: sum(r.get("status") == s for r in rows) for s in ("ok", "oom", "skipped", "error")
        }
        dirs = sorted({d for d, _ in plan})
        print(
            f"attnbench: {len(rows)} of {len(plan)} cells in {', '.join(dirs)} "
            f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)})",
            flush=True,
        )
        if config.report:
            for d in dirs:
                write_report(Path(d), config.report_baseline, show=config.progress)

    def _watch(self, plan: list[tuple[str, str]], rerun: bool) -> None:
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

        started = time.time()

        def finished() -> list[dict[str, Any]]:
            rows = _rows_of(plan)
            return [r for r in rows if r.get("finished_at", 0) >= started] if rerun else rows

        before = 0 if rerun else len(finished())
        bar = Bar(
            TextColumn("cells"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        task = bar.add_task("cells", total=len(plan), completed=before)
        with Live(Group(bar), refresh_per_second=2, transient=False) as live:
            while True:
                stopping = self._stop.wait(0.5)
                rows = finished()
                bar.update(task, completed=len(rows))
                table = Table(
                    "attention",
                    "n",
                    "k",
                    "status",
                    "max b",
                    "ms/seq",
                    "memory",
                    title="finished cells (last 8)",
                )
                for r in rows[-8:]:
                    t = r.get("time_per_seq_s")
                    table.add_row(
                        str(r.get("attention")),
                        str(r.get("n")),
                        str(r.get("k")),
                        str(r.get("status")),
                        str(r.get("max_batch")),
                        "-" if not t else f"{t * 1e3:.2f}",
                        str(r.get("memory_source")),
                    )
                live.update(Group(bar, table))
                if stopping:  # one last frame with every row, then out
                    break


def write_report(run: Path, baseline: str, show: bool) -> None:
    """The report of a sweep's run dir. Its rows are already safe on disk, so a report that
    cannot be made (no baseline rows, no matplotlib) is one line, not a failed sweep."""
    from rich.console import Console

    from attnbench.report import files

    try:
        report = files.build(run, baseline)
        if show:
            files.print_tables(report, Console())
        out = files.default_out(run)
        files.write(files.render(report), out)
    except Exception as e:  # the sweep's rows stand: say why, go on
        print(
            f"attnbench: no report for {run}: {e} (make it later: attnbench report {run})",
            flush=True,
        )
        return
    print(f"attnbench: report in {out}/index.html", flush=True)


def _plan() -> list[tuple[str, str]]:
    path = os.environ.get(PLAN_ENV)
    return [tuple(p) for p in json.loads(Path(path).read_text())] if path else []


def _rows_of(plan: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """This command's rows, from every run directory it writes to."""
    wanted = set(plan)
    rows = []
    for d in sorted({d for d, _ in plan}):
        rows += [
            r
            for r in read_rows(RunStore(Path(d)).cells, strict=False)
            if (d, r.get("key")) in wanted
        ]
    return rows


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
    hydra.main(config_path="pkg://attnbench.conf", config_name="config", version_base="1.3")(job)()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--cell":
    sys.exit(_main_cell(sys.argv[2]))
