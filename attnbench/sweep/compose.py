"""Many jobs' configs at the cost of few composes: :func:`compose_each`.

Apart from :mod:`attnbench.sweep.config` because it leans on how Hydra 1.3 applies an
override, which its docstring argues step by step and tests/test_scale.py checks against
Hydra's own compose for every shipped sweep.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict


def compose_each(
    compose: Callable[..., DictConfig],
    parser: OverridesParser,
    config_name: str,
    jobs: list[list[str]],
    search: list[str],
) -> list[DictConfig]:
    """``[compose(job) for job in jobs]``, composing once per distinct choice of config groups.

    A compose costs ~0.15 s (every YAML file read and merged again): 1 000 jobs took minutes
    before the first cell. Why the shortcut gives the same configs: Hydra builds the defaults
    list from the group overrides alone (a value cannot change it), composes it, sets struct
    mode and only then applies each plain ``key=value`` override, in the job's order, as
    ``OmegaConf.update(cfg, key, value, merge=True)`` (``ConfigLoaderImpl.
    _apply_overrides_to_config``, Hydra 1.3). Here a copy of the groups' config gets the same
    updates. Group choices and ``hydra.*`` values (a node apart) select the base config. Anything
    else (``+key``, ``++key``, ``~key``, a package, ``hydra.searchpath``, which decides what is
    a group) is composed job by job; so is a job whose update fails, so that Hydra's own error
    is raised; and the first job is composed both ways and compared.
    """
    every_job = [[*job, *search] for job in jobs]
    if len(jobs) < 2:
        return [compose(config_name, overrides=job) for job in every_job]
    first = compose(config_name, overrides=every_job[0], return_hydra_config=True)
    groups = set(first.hydra.runtime.choices)
    parsed: dict[str, tuple[bool, Any] | None] = {}  # line -> (is a value override, override)

    def kind(line: str) -> tuple[bool, Any] | None:
        if line not in parsed:
            (o,) = parser.parse_overrides([line])
            parsed[line] = _kind(o, groups)
        return parsed[line]

    bases: dict[tuple[str, ...], DictConfig] = {}
    out = []
    for job, full in zip(jobs, every_job, strict=True):
        kinds = [kind(line) for line in job]
        if None in kinds:
            return [compose(config_name, overrides=j) for j in every_job]
        chosen = tuple(
            line for line, k in zip(job, kinds, strict=True) if k is not None and not k[0]
        )
        try:
            if chosen not in bases:
                bases[chosen] = compose(config_name, overrides=[*chosen, *search])
            cfg = copy.deepcopy(bases[chosen])
            for k in kinds:
                if k is not None and k[0]:
                    OmegaConf.update(cfg, k[1].key_or_group, k[1].value(), merge=True)
        except Exception:  # Hydra's own error (or, were the shortcut wrong, its config)
            cfg = compose(config_name, overrides=full)
        out.append(cfg)
    # not reached with Hydra 1.3; a later Hydra that composes differently stays correct
    if not _same(first, out[0]):
        return [compose(config_name, overrides=j) for j in every_job]
    return out


def _kind(o: Override, groups: set[str]) -> tuple[bool, Override] | None:
    """What the shortcut does with the parsed override ``o``: (False, o) where it selects
    the base config (a group's choice, a ``hydra.*`` value), (True, o) where it is applied
    to a copy of the base as Hydra applies it (a plain ``key=value``), None where the job
    must be composed by Hydra itself (``+key``, ``++key``, ``~key``, a package,
    ``hydra.searchpath``). ``groups``: the config groups, the first job's choices."""
    key, value = o.key_or_group, o.value()
    if o.is_hydra_override():  # Hydra's own node: apart from the job's, the base's
        hydra_value = key.startswith("hydra.") and not key.startswith("hydra.searchpath")
        return (False, o) if hydra_value or key in groups else None
    if o.type is OverrideType.CHANGE and o.package is None:
        return (key not in groups or isinstance(value, dict), o)
    if o.type is OverrideType.ADD and key in groups and not isinstance(value, dict):
        return (False, o)
    return None


def _same(first: DictConfig, shortcut: DictConfig) -> bool:
    """Whether the first job composed by Hydra (``first``, with its ``hydra`` node, which is
    dropped here) and by the shortcut are the same config, struct mode included."""
    with open_dict(first):
        del first["hydra"]
    return OmegaConf.to_container(first) == OmegaConf.to_container(shortcut) and (
        OmegaConf.is_struct(first) == OmegaConf.is_struct(shortcut)
    )
