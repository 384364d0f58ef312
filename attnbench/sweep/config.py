"""Config → cells: every job of ``attnbench run ARGS`` composed and validated up front.

:func:`prevalidate` composes each job with Hydra's compose API, expanded as Hydra's sweeper
will expand it (:func:`expand_jobs`; once per choice of config groups,
:func:`attnbench.sweep.compose.compose_each`),
checks the keys of ``attnbench run`` itself, validates each job's cell
(:func:`attnbench.cell.validate`) and checks that each run directory can be written,
*before* Hydra starts: a typo ends with one line and exit code 2 and nothing on disk. The
same expansion gives the regression gate its suite, so a suite is an ordinary sweep.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import torch
from hydra.core.config_loader import ConfigLoader
from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from attnbench import cell as cells
from attnbench import registry
from attnbench.cell import Cell
from attnbench.env import resolve_threads
from attnbench.measure import presets
from attnbench.registry import BUILTINS
from attnbench.sweep import slurm
from attnbench.sweep.compose import compose_each
from attnbench.sweep.hydra_api import split_sweep
from attnbench.validators import (
    check_bool,
    check_choice,
    check_int,
    check_limit,
    check_name,
    check_number,
    parse_size,
)
from attnbench.writable import check_writable

CONFIG_MODULE = "attnbench.conf"


def _plain(value: Any) -> Any:
    """Hashable plain data from config values (lists become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def cell_from_cfg(cfg: DictConfig, in_sweep: bool = False) -> Cell:
    """The cell a (composed) job config describes; which ``k`` it keeps is
    :func:`attnbench.cell.kept_k`'s rule, and ``k`` is checked in any case (k=0 is a typo)."""
    if not isinstance(cfg.get("device"), DictConfig):
        raise ValueError(f"device: must select a preset (device=NAME), got {cfg.get('device')!r}")
    name = _setting(cfg, "attention.name")
    registry.info(name)  # an unknown mechanism: one line
    params = OmegaConf.to_container(_setting(cfg, "attention.params"), resolve=True) or {}
    causal = _setting(cfg, "causal")
    check_bool("causal", causal)
    mode = _setting(cfg, "mode")
    if causal or mode == "decode":  # the top-level key sets the mechanism's own parameter (a
        params["causal"] = True  # sweepable key); a decoder is causal whatever it says
    k = _setting(cfg, "k")
    if k is not None:
        check_int("k", k)
    return Cell(
        attention=name,
        k=cells.kept_k(name, k, in_sweep=in_sweep),
        device=cfg.device.name,
        ceiling_bytes=parse_size(_setting(cfg, "ceiling")),
        params=tuple(sorted((key, _plain(v)) for key, v in params.items())),
        kv_heads=cfg.model.get("kv_heads"),  # model groups without grouped-query heads omit it
        quality=_quality(cfg),
        **{field: _read(cfg, field, key) for field, key in CELL_KEYS.items()},
    )


# Cell fields read as they are from a key of conf/config.yaml (a test holds each Cell
# default equal to the composed config's): one list, no default of this module's own
CELL_KEYS = {
    "n": "n",
    "batch": "batch",
    "dtype": "dtype",
    "layers": "model.layers",
    "d_model": "model.d_model",
    "n_heads": "model.n_heads",
    "d_ff": "model.d_ff",
    "min_repeats": "timing.min_repeats",
    "min_seconds": "timing.min_seconds",
    "cpu_batch": "timing.cpu_batch",
    "time_budget_s": "timing.time_budget_s",
    "flush_l2": "timing.flush_l2",
    "threads": "timing.threads",
    "mode": "mode",
    "optimizer": "optimizer",
    "checkpoint": "checkpoint",
    "decode_tokens": "decode_tokens",
    "state_dtype": "state_dtype",
    "prefill_chunk": "prefill_chunk",
    "compile": "compile",
    "compile_mode": "compile_mode",
    "task": "task",
}
_ABSENT = object()
_FLOATS = ("min_seconds", "time_budget_s")  # seconds, whether written 1 or 1.0


def _read(cfg: DictConfig, field: str, key: str) -> Any:
    value = _setting(cfg, key)
    return float(value) if field in _FLOATS and isinstance(value, (int, float)) else value


def _setting(cfg: DictConfig, key: str) -> Any:
    """The value of a key conf/config.yaml declares; removed (``~key``) it is one line, not
    a default of this code's nor Hydra's ``ConfigAttributeError``."""
    value = OmegaConf.select(cfg, key, default=_ABSENT)
    if value is _ABSENT:
        raise ValueError(
            f"{key}: required (conf/config.yaml declares it; set it instead of removing it)"
        )
    return value


def _quality(cfg: DictConfig) -> tuple[tuple[str, Any], ...]:
    """The settings of the cell's quality task (``quality.<task>.*``); none for cost."""
    task = cfg.get("task", "cost")
    block = OmegaConf.select(cfg, f"quality.{task}") if task != "cost" else None
    if block is None:
        return ()
    values = OmegaConf.to_container(block, resolve=True)
    if task in ("approx", "spectrum") and values.get("inputs") == "listops":
        # the trained model these inputs come from is task=listops's, at its settings
        listops = OmegaConf.to_container(OmegaConf.select(cfg, "quality.listops"), resolve=True)
        values["listops"] = tuple(sorted(listops.items()))
    return tuple(sorted((key, _plain(v)) for key, v in values.items()))


def preset_from_cfg(cfg: DictConfig) -> presets.Preset:
    return presets.from_dict(OmegaConf.to_container(cfg.device, resolve=True))


def run_dir(cfg: DictConfig) -> Path:
    """``<out_dir>/<sweep_name>/<run>``; run ``auto`` names the device and where it runs, so
    the same command resumes in the same place. ``run`` and ``sweep_name`` are names (one
    path component), so a run never writes outside ``out_dir``; an empty ``out_dir`` would
    silently mean the current directory."""
    out_dir = cfg.out_dir
    if isinstance(out_dir, int) and not isinstance(out_dir, bool):
        out_dir = str(out_dir)
    if not isinstance(out_dir, str) or not out_dir.strip():
        raise ValueError(f"out_dir: must be a directory path, got {out_dir!r}")
    sweep = check_name("sweep_name", cfg.sweep_name)
    run = check_name("run", cfg.run)
    if run == "auto":
        here = "cuda" if torch.cuda.is_available() and cfg.device.gpu else "cpu"
        run = check_name("run", f"{cfg.device.name}-{here}")
    return Path(out_dir) / sweep / run


def register_user_mechanisms() -> None:
    """A mechanism registered in Python but without a YAML file is still an ``attention``
    option (with its default parameters): it shows up in sweeps with no extra step."""
    cs = ConfigStore.instance()
    for name in registry.names():
        if name not in BUILTINS:
            cs.store(group="attention", name=name, node={"name": name, "params": {}})


def _unknown(group: str, option: Any, options: list[str]) -> str:
    """The one line for an option a config group does not have."""
    allowed = f"; allowed: {', '.join(options)}" if options else ""
    return f"{group}: unknown option {option!r}{allowed}"


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    found = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if found:
        group, option = found.groups()
        options = [o for o in re.findall(r"^\t(\S+)", text, re.M) if "=" not in o]
        return _unknown(group, option, options)
    return " ".join(text.split())


class GroupOptions:
    """The options (or, with ``groups``, the subgroups) of a config group, asked of Hydra's
    config loader once per group and command. ``search`` adds ``--config-dir``, whose
    groups and options count too."""

    def __init__(self, loader: ConfigLoader, search: list[str]) -> None:
        self.loader, self.search = loader, search
        self.listed: dict[tuple[str, bool], list[str]] = {}

    def __call__(self, group: str, groups: bool = False) -> list[str]:
        if (group, groups) not in self.listed:
            self.listed[group, groups] = self.loader.get_group_options(
                group,
                results_filter=ObjectType.GROUP if groups else ObjectType.CONFIG,
                overrides=self.search,
            )
        return self.listed[group, groups]


def check_choices(overrides: list[Override], options: GroupOptions) -> None:
    """Each config group an override chooses (``attention=``, ``device=``, ``+sweep=``, a
    sweep's ``attention: a,b``) names one of the group's options, as typed. Hydra resolves a
    choice as a path under the group, so ``device=../../conf/config`` would load another
    file and fail on a name the user never typed; a group removed (``~device``,
    ``device=null``) would leave a config without it, which no cell can be made from."""
    for o in overrides:
        group = o.key_or_group
        parent, _, name = group.rpartition("/")
        if group.split("/")[0] == "hydra" or name not in options(parent, groups=True):
            continue  # a value, not a group (Hydra's own groups are Hydra's to check)
        if o.is_delete() or o.value() is None:
            raise ValueError(f"{group}: cannot be removed; allowed: {', '.join(options(group))}")
        typed = (
            o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        )
        for option in typed:
            if option not in options(group):
                raise ValueError(_unknown(group, option, options(group)))


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


def split_args(args: list[str]) -> tuple[list[str], dict[str, str], set[str]]:
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
    launcher: list[str] | None = None,
) -> tuple[list[DictConfig], bool]:
    """Every job's composed config, expanded exactly as a multirun will expand them (sweep
    file params first, the command line winning), and whether the command is a multirun;
    ``launcher``, if given, receives the Hydra launcher's ``_target_`` (however it was
    chosen: command line, sweep file, ``--config-dir``). Raises ValueError with one line on
    a bad override."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    search = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    register_user_mechanisms()
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            parser = OverridesParser.create(config_loader=loader)
            parsed = parser.parse_overrides(overrides)
            options = GroupOptions(loader, search)
            check_choices(parsed, options)
            fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
            base = compose(config_name, overrides=fixed + search, return_hydra_config=True)
            multirun = multirun or str(base.hydra.mode).endswith("MULTIRUN")
            if launcher is not None:
                launcher.append(str(base.hydra.launcher.get("_target_", "")))
            if not multirun:
                if len(fixed) != len(parsed):
                    raise ValueError(
                        "overrides: a,b or range() sweeps need multirun: add -m, or use +sweep=NAME"
                    )
                return [compose(config_name, overrides=overrides + search)], False
            params = base.hydra.sweeper.params
            params = OmegaConf.to_container(params, resolve=False) if params else {}
            every = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides)
            check_choices(every, options)  # the sweep file's choices too
            jobs = compose_each(compose, parser, config_name, split_sweep(every), search)
    except (HydraException, ConfigCompositionException, ImportError) as e:
        raise ValueError(_one_line(e)) from None
    return jobs, True


def check_run_keys(cfg: DictConfig) -> None:
    """The keys of ``attnbench run`` itself, before any cell runs (a typo is not a row)."""
    for key in ("rerun", "progress", "report", "timing.flush_l2"):
        check_bool(key, _setting(cfg, key))
    check_limit("cell_timeout_s", _setting(cfg, "cell_timeout_s"))
    for key in ("timing.min_seconds", "timing.time_budget_s"):
        check_number(key, _setting(cfg, key), low=0)
    baseline = _setting(cfg, "report_baseline")
    check_choice("report_baseline", baseline, registry.names(), "a mechanism")


def prevalidate(args: list[str]) -> list[tuple[str, str]]:
    """Validate every cell of ``attnbench run ARGS`` before Hydra starts; returns the
    distinct (run dir, cell key) pairs the command will fill (the progress bar's cells).
    Each run directory and Hydra's ``<out_dir>/<sweep_name>/.hydra`` must be writable: a
    read-only or misplaced ``out_dir`` is one line here, not a traceback once cells ran."""
    overrides, valued, bare = split_args(args)
    launcher: list[str] = []
    jobs, is_sweep = expand_jobs(
        overrides,
        valued.get("--config-dir", valued.get("-cd")),
        valued.get("--config-name", valued.get("-cn", "config")),
        multirun=bool(bare & {"-m", "--multirun"}),
        launcher=launcher,
    )
    plan: dict[tuple[str, str], None] = {}
    # jobs on other machines (SLURM) check timing.threads against their own CPUs, where
    # they run (an error row naming the key); this process's CPUs say nothing of theirs
    here = not slurm.runs_elsewhere(launcher[0])
    left_out: list[str] = []
    once: dict[str, None] = {}  # why some jobs are one cell: said once each, not per job
    for cfg in jobs:
        for key in ("n", "batch", "dtype"):
            if OmegaConf.is_missing(cfg, key):
                raise ValueError(f"{key}: missing")
        check_run_keys(cfg)
        where = str(run_dir(cfg))
        cell = cell_from_cfg(cfg, is_sweep)
        why = cells.left_out(cell) if is_sweep else None
        if why:
            left_out.append(f"{cell.label}: {why}")
            continue
        preset = preset_from_cfg(cfg)
        cells.validate(cell, preset)
        if here:  # the jobs run on this machine, with this process's CPUs: check them now
            resolve_threads(cell.threads)
        planned = (where, cells.key(cell, preset))
        if cfg.k is not None and cell.k is None:  # said whether or not k was swept
            once[f"{cell.attention} ignores k: measured once"] = None
        elif planned in plan:
            once[f"{cell.label}: the same cell as another job, measured once"] = None
        plan[planned] = None
    if left_out:
        print(
            f"attnbench run: {len(left_out)} combinations left out (k >= n for a fixed-length "
            f"mechanism, causal=true without a causal form, kv_heads without grouped-query "
            f"heads, or a mode the mechanism cannot run), e.g. {left_out[0]}",
            file=sys.stderr,
        )
    for line in once:
        print(f"attnbench run: {line}", file=sys.stderr)
    if not plan:
        raise ValueError(
            "k: every combination has k >= n, no causal form, no grouped-query heads or a mode "
            "its mechanism cannot run; nothing to run"
        )
    for d in sorted({Path(d) for d, _ in plan}):  # Hydra's output directory first
        check_writable("out_dir", d.parent / ".hydra")
        check_writable("out_dir", d)
    return list(plan)
