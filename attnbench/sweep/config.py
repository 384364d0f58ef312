"""Config → cells: every job of ``attnbench run ARGS`` composed and validated up front.

:func:`prevalidate` composes each job with Hydra's compose API, expanded as Hydra's sweeper
will expand it (:func:`expand_jobs`; once per choice of config groups,
:func:`attnbench.sweep.compose.compose_each`),
checks the keys of ``attnbench run`` itself, validates each job's cell
(:func:`attnbench.plan.validate`) and checks that each run directory can be written,
*before* Hydra starts: a typo ends with one line and exit code 2 and nothing on disk. The
same expansion gives the regression gate its suite, so a suite is an ordinary sweep.
"""

from __future__ import annotations

import re
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from attnbench import cell_key, plan, registry
from attnbench.env import resolve_threads
from attnbench.quality import tasks
from attnbench.quality.estimate import note as training_note
from attnbench.sweep import help as help_keys
from attnbench.sweep import keys, launchers, slurm
from attnbench.sweep.cells import cell_from_cfg, preset_from_cfg, setting
from attnbench.sweep.compose import compose_each
from attnbench.sweep.hydra_api import split_sweep
from attnbench.sweep.paths import check_hydra_dirs, run_dir
from attnbench.validators import (
    check_bool,
    check_choice,
    check_limit,
    check_number,
)
from attnbench.writable import check_writable

CONFIG_MODULE = "attnbench.conf"


def register_user_options() -> None:
    """A mechanism or a quality task registered in Python but without a YAML file is still an
    ``attention`` or ``task`` option (a mechanism with its default parameters, a task with the
    config's model, device, dtype and batch), a built-in one too: it shows up in sweeps with
    no extra step. A shipped ``conf/attention/NAME.yaml`` or ``conf/task/NAME.yaml``, where
    there is one, is the option (a task's brings its own model and device)."""
    help_keys.register()  # and in the keys --help lists
    cs = ConfigStore.instance()
    for name in registry.names():
        if not (files(CONFIG_MODULE) / "attention" / f"{name}.yaml").is_file():
            cs.store(group="attention", name=name, node={"name": name, "params": {}})
    for name in tasks.names():
        if not (files(CONFIG_MODULE) / "task" / f"{name}.yaml").is_file():
            cs.store(group="task", name=name, node={"task": name}, package="_global_")


def _unknown(group: str, option: Any, options: list[str]) -> str:
    """The one line for an option a config group does not have."""
    allowed = f"; allowed: {', '.join(options)}" if options else ""
    return f"{group}: unknown option {option!r}{allowed}"


def _one_line(e: BaseException, config_dir: str | None = None) -> str:
    """Hydra's error as the user's one line: an unknown option names its group's options,
    a key Hydra cannot override (no ``+``) is an unknown key, said as
    :func:`attnbench.sweep.keys.unknown` says it, never Hydra's advice to add a ``+``."""
    text = str(e) or type(e).__name__
    found = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if found:
        group, option = found.groups()
        options = [o for o in re.findall(r"^\t(\S+)", text, re.M) if "=" not in o]
        return _unknown(group, option, options)
    if found := re.search(r"Could not override '([^']+)'\.\s+To append to your config use", text):
        return keys.unknown(found.group(1), keys.known_keys([config_dir] if config_dir else []))
    if found := re.search(r"Could not delete from config\. '([^']+)' does not exist", text):
        return keys.removed(found.group(1), keys.known_keys([config_dir] if config_dir else []))
    if found := re.match(r"LexerNoViableAltException: (.*)\n( *)\^", text):
        line, at = found.group(1), len(found.group(2)) - len("LexerNoViableAltException: ")
        return keys.unreadable(line, at, keys.known_keys([config_dir] if config_dir else []))
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
    launcher: list[DictConfig] | None = None,
) -> tuple[list[DictConfig], bool]:
    """Every job's composed config, expanded exactly as a multirun will expand them (sweep
    file params first, the command line winning), and whether the command is a multirun;
    ``launcher``, if given, receives the Hydra launcher's config (``_target_``, ``n_jobs``
    …, however it was chosen: command line, sweep file, ``--config-dir``). Raises
    ValueError with one line on a bad override."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    search = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    register_user_options()
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
                launcher.append(base.hydra.launcher)
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
        raise ValueError(_one_line(e, config_dir)) from None
    return jobs, True


def check_run_keys(cfg: DictConfig, known: set[str]) -> None:
    """One composed job's keys, before any cell runs (a typo is not a row): the ones every
    cell needs present, none unknown (:func:`keys.check_known`), and ``attnbench run``'s own
    valid; else ValueError, one line."""
    for key in ("n", "batch", "dtype"):
        if OmegaConf.is_missing(cfg, key):
            raise ValueError(f"{key}: missing")
    keys.check_known(cfg, known)
    for key in ("rerun", "progress", "report", "timing.flush_l2"):
        check_bool(key, setting(cfg, key))
    check_limit("cell_timeout_s", setting(cfg, "cell_timeout_s"))
    for key in ("timing.min_seconds", "timing.time_budget_s"):
        check_number(key, setting(cfg, key), low=0)
    baseline = setting(cfg, "report_baseline")
    check_choice("report_baseline", baseline, registry.names(), "a mechanism")


def _say_once(left_out: list[str], once: list[str]) -> None:
    """What the sweep will not measure, or measure once for several jobs: a line each on
    stderr, said before anything runs rather than per job."""
    if left_out:
        print(
            f"attnbench run: {len(left_out)} combinations left out (k >= n for a fixed-length "
            f"mechanism, causal=true without a causal form, kv_heads without grouped-query "
            f"heads, a mode the mechanism cannot run, or a decoder that cannot hold one "
            f"sequence under its ceiling), e.g. {left_out[0]}",
            file=sys.stderr,
        )
    for line in once:
        print(f"attnbench run: {line}", file=sys.stderr)


def prevalidate(args: list[str]) -> list[tuple[str, str]]:
    """Validate every cell of ``attnbench run ARGS`` before Hydra starts; returns the
    distinct (run dir, cell key) pairs the command will fill (the progress bar's cells).
    Each run directory and Hydra's ``<out_dir>/<sweep_name>/.hydra`` must be writable: a
    read-only or misplaced ``out_dir`` is one line here, not a traceback once cells ran."""
    overrides, valued, bare = split_args(args)
    hydra_dirs = check_hydra_dirs(overrides)
    launcher: list[DictConfig] = []
    jobs, is_sweep = expand_jobs(
        overrides,
        valued.get("--config-dir", valued.get("-cd")),
        valued.get("--config-name", valued.get("-cn", "config")),
        multirun=bool(bare & {"-m", "--multirun"}),
        launcher=launcher,
    )
    todo: dict[tuple[str, str], None] = {}
    on_gpu: set[tuple[str, str]] = set()  # the cells that run on this machine's GPU
    # jobs on other machines (SLURM) check timing.threads against their own CPUs, where
    # they run (an error row naming the key); this process's CPUs say nothing of theirs
    here = not slurm.runs_elsewhere(str(launcher[0].get("_target_", "")))
    left_out: list[str] = []
    once: dict[str, None] = {}  # why some jobs are one cell: said once each, not per job
    config_dir = valued.get("--config-dir", valued.get("-cd"))
    known = keys.known_keys([config_dir] if config_dir else [])
    for cfg in jobs:
        check_run_keys(cfg, known)
        where = str(run_dir(cfg))
        cell = cell_from_cfg(cfg, is_sweep)
        preset = preset_from_cfg(cfg)
        if is_sweep and (why := plan.left_out(cell, preset)):
            left_out.append(f"{plan.label(cell)}: {why}")
            continue
        gpu = plan.validate(cell, preset).on_gpu
        if here:  # the jobs run on this machine, with this process's CPUs: check them now
            resolve_threads(cell.timing.threads)
            if line := training_note(cell):  # hours of training: said before it starts
                once[line] = None
        planned = (where, cell_key.key(cell, preset))
        if cfg.k is not None and cell.k is None:  # said whether or not k was swept
            once[f"{cell.attention} ignores k: measured once"] = None
        elif planned in todo:
            once[f"{plan.label(cell)}: the same cell as another job, measured once"] = None
        todo[planned] = None
        if gpu:
            on_gpu.add(planned)
    if is_sweep:
        launchers.check_one_gpu(launcher[0], len(on_gpu))
    _say_once(left_out, list(once))
    if not todo:
        raise ValueError(
            "k: every combination has k >= n, no causal form, no grouped-query heads, a mode "
            "its mechanism cannot run or a context too long for one sequence; nothing to run"
        )
    for d in sorted({Path(d) for d, _ in todo}):  # Hydra's output directory first
        check_writable("out_dir", d.parent / ".hydra")
        for key, path in hydra_dirs:  # one given: under a file, say, it would fail late
            check_writable(key, d.parent.parent / path)
        check_writable("out_dir", d)
    return list(todo)
