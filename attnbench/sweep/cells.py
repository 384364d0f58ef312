"""A composed job config → its cell: every ``Cell`` field read from a key that
conf/config.yaml declares (:data:`CELL_KEYS`), with no default of this code's own, so that
a removed key is one line and the cell made from Python and from the command line agree.
"""

from __future__ import annotations

from typing import Any

from omegaconf import Container, DictConfig, OmegaConf

from attnbench import registry, workload
from attnbench.cell import OPTIONAL_SHAPE, SCHEDULE_FIELDS, Cell
from attnbench.cell_rules import kept_k
from attnbench.measure import presets
from attnbench.quality import tasks
from attnbench.settings import CELL_FIELDS
from attnbench.validators import check_bool, check_int, parse_size


def _plain(value: Any) -> Any:
    """Hashable plain data from config values: a ``ListConfig`` or list becomes a tuple, so
    that a row stores a list as a JSON list (a ``ListConfig`` reached ``json.dumps`` as its
    ``str``, ``"[10, 20]"``, which no reader takes back) and a launcher can serialise it."""
    if isinstance(value, Container):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def cell_from_cfg(cfg: DictConfig, in_sweep: bool = False) -> Cell:
    """The cell a (composed) job config describes; which ``k`` it keeps is
    :func:`attnbench.cell_rules.kept_k`'s rule, and ``k`` is checked in any case (k=0 is a typo)."""
    if not isinstance(cfg.get("device"), DictConfig):
        raise ValueError(f"device: must select a preset (device=NAME), got {cfg.get('device')!r}")
    name = setting(cfg, "attention.name")
    registry.info(name)  # an unknown mechanism: one line
    params = OmegaConf.to_container(setting(cfg, "attention.params"), resolve=True) or {}
    causal = setting(cfg, "causal")
    check_bool("causal", causal)
    mode = setting(cfg, "mode")
    work = workload.find(mode)  # an unknown mode: refused in one line by the plan
    if causal or (work is not None and work.causal):  # the top-level key sets the mechanism's
        params["causal"] = True  # own parameter (a sweepable key); a decoder is causal anyway
    k = setting(cfg, "k")
    if k is not None:
        check_int("k", k)
    read = {field: _read(cfg, field, key) for field, key in CELL_KEYS.items()}
    return Cell.from_dict(  # the stored form, one level: each part's fields by their names
        {
            **read,
            "attention": name,
            "k": kept_k(name, k, in_sweep=in_sweep, params=params),
            "device": cfg.device.name,
            "ceiling_bytes": parse_size(setting(cfg, "ceiling")),
            "params": tuple(sorted((key, _plain(v)) for key, v in params.items())),
            # a model group may omit these: grouped-query heads, heads of their own width,
            # a layer schedule and its kinds
            **{f: _plain(cfg.model.get(f)) for f in (*OPTIONAL_SHAPE, *SCHEDULE_FIELDS)},
            "mode_settings": _mode_settings(cfg, mode),
            "quality": _quality(cfg),
        }
    )


# Cell fields read as they are from a key of conf/config.yaml: the grid's own, then every
# declared setting of the model, timing and compiling (a test holds each Cell default equal
# to the composed config's); no default of this module's own
CELL_KEYS = {
    "n": "n",
    "batch": "batch",
    "dtype": "dtype",
    "mode": "mode",
    "task": "task",
    **{s.name: s.key for s in CELL_FIELDS if s.name not in (*OPTIONAL_SHAPE, *SCHEDULE_FIELDS)},
}
_ABSENT = object()


def _read(cfg: DictConfig, field: str, key: str) -> Any:
    value = _plain(setting(cfg, key))
    floats = DECLARED.get(field) is not None and DECLARED[field].type is float
    return float(value) if floats and isinstance(value, (int, float)) else value


DECLARED = {s.name: s for s in CELL_FIELDS}


def _mode_settings(cfg: DictConfig, mode: Any) -> dict[str, Any]:
    """The settings of the cell's workload, each from its top-level key: required where
    conf/config.yaml declares it (a built-in's), a plugin's declared default where the
    config has no such key. Every other workload's settings that the config holds are
    checked too, whatever the mode: a typo never passes silently."""
    own: dict[str, Any] = {}
    for name in workload.names():
        work = workload.get(name)
        for s in work.settings:
            if name == mode:
                builtin = name in workload.BUILTINS
                own[s.name] = _plain(setting(cfg, s.key) if builtin else cfg.get(s.key, s.default))
                s.validate(own[s.name])
            elif (value := OmegaConf.select(cfg, s.key, default=_ABSENT)) is not _ABSENT:
                s.validate(_plain(value))
    return own


def setting(cfg: DictConfig, key: str) -> Any:
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
    owner = tasks.REGISTRY.get(task)
    borrowed = owner.borrows(values) if owner is not None and owner.borrows else None
    if borrowed is not None:  # the task's cell carries that task's settings too (Task.borrows)
        carried = OmegaConf.select(cfg, f"quality.{borrowed}")
        values[borrowed] = tuple(sorted(OmegaConf.to_container(carried, resolve=True).items()))
    return tuple(sorted((key, _plain(v)) for key, v in values.items()))


def preset_from_cfg(cfg: DictConfig) -> presets.Preset:
    return presets.from_dict(OmegaConf.to_container(cfg.device, resolve=True))
