"""Every key of ``attnbench run`` is known or refused.

Hydra accepts any new key given with ``+`` (``+compile_mod=max-autotune``) and the run
would go on without it, silently; without the ``+`` its advice is to add one. A key is
known when a declaration (:func:`attnbench.sweep.declared.all_settings`) or a shipped or
user config file (``conf/``, ``--config-dir``) has it; the keys below :data:`OPEN` belong
to whoever reads them (a mechanism's parameters are checked by the mechanism, Hydra's by
Hydra). Anything else is one line naming the key and what was probably meant.
"""

from __future__ import annotations

import difflib
import importlib.resources
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnbench import workload
from attnbench.sweep.declared import all_settings

# keys whose sub-keys are another's to check: a mechanism's parameters (its config refuses
# what it does not take), a schedule's kinds (attnbench.schedule refuses an unknown key),
# Hydra's own, the gate's per-cell thresholds
OPEN = ("attention.params.", "model.kinds.", "hydra.", "check.")
GLOBAL = "# @package _global_"


def known_keys(config_dirs: Iterable[Path | str] = ()) -> set[str]:
    """Every key a declaration (a plugin workload's too) or a config file (``conf/``, then
    each of ``config_dirs``) has, as dotted paths: the top config's at the top, a group
    option's under its group (``model.kv_heads``) unless it is a ``_global_`` package (a
    sweep file)."""
    known = {s.key for s in all_settings()}
    known |= {s.key for name in workload.names() for s in workload.get(name).settings}
    roots: list[Any] = [importlib.resources.files("attnbench.conf")]
    roots += [Path(d) for d in config_dirs]
    for root in roots:
        for path, group in _yaml_files(root):
            text = path.read_text()
            data = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
            if not isinstance(data, dict):
                continue
            data.pop("defaults", None)
            prefix = "" if group is None or GLOBAL in text else f"{group}."
            known.update(f"{prefix}{k}" for k in leaves(data))
            if prefix:
                known.add(group)
    # the sections on the way to each key (quality.toy_gain for quality.toy_gain.gain)
    known |= {key.rsplit(".", i)[0] for key in known for i in range(1, key.count(".") + 1)}
    return known


def _yaml_files(root: Any) -> Iterator[tuple[Any, str | None]]:
    """(file, its group or None at the top) for a config dir, one level of groups deep."""
    for entry in root.iterdir():
        if entry.is_file() and entry.name.endswith(".yaml"):
            yield entry, None
        elif entry.is_dir():
            for sub in entry.iterdir():
                if sub.is_file() and sub.name.endswith(".yaml"):
                    yield sub, entry.name


def leaves(data: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted path of every leaf (a value that is not a non-empty mapping), and of every
    mapping on the way (``timing``, ``quality.mqar``)."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict):
            yield from leaves(value, f"{path}.")


def check_known(cfg: DictConfig, known: set[str]) -> None:
    """Every key of a job's composed config is known (or under :data:`OPEN`); else
    ValueError, one line: ``KEY: unknown key; did you mean ...?``."""
    data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("hydra", None)
    for key in leaves(data):
        if key not in known and not key.startswith(OPEN):
            raise ValueError(unknown(key, known))


def unknown(key: str, known: set[str]) -> str:
    """The line for a key nobody knows, with the nearest known setting: the closest
    spelling in its own section (``decode_tokenz`` -> ``decode_tokens``, ``quality.mqar.lr``
    -> ``quality.mqar.lrs``, not ListOps' ``lr``), else the same name at another depth
    (``kv_heads`` -> ``model.kv_heads``), else the keys its section has."""
    mappings = {k.rsplit(".", 1)[0] for k in known if "." in k}
    settings = sorted(k for k in known if k not in mappings and not k.startswith(OPEN))
    section, _, last = key.rpartition(".")
    siblings = {
        k.rpartition(".")[2]: k for k in settings if k.rpartition(".")[0] == section
    }  # fmt: skip
    close = [siblings[m] for m in difflib.get_close_matches(last, list(siblings), n=1)]
    close += [k for k in settings if k.rpartition(".")[2] == last and k != key]
    if close:
        hint = f"; did you mean {close[0]}?"
    elif section in mappings and siblings:
        hint = f"; {section} has {', '.join(siblings)}"
    else:
        hint = ""
    return f"{key}: unknown key{hint} (attnbench run --help lists the keys)"


def removed(key: str, known: set[str]) -> str:
    """The line for ``~key`` where Hydra says the key "does not exist": Hydra removes no key
    whose value is null, so a known key here is one set to null (``k``, ``ceiling``)."""
    if key in known:
        return f"{key}: cannot be removed (its value is null); set {key}=null instead"
    if key.startswith(OPEN):
        return f"{key}: cannot be removed: not there, or its value is null"
    return unknown(key, known)


def unreadable(line: str, at: int, known: set[str]) -> str:
    """The line for an override Hydra's grammar cannot read, ``at`` where it stopped: in the
    key, a key nobody knows; in the value, a value to quote (unquoted, a value is ASCII
    letters, digits and a few signs: ``run=résumé`` must be ``'run="résumé"'``)."""
    key, eq, value = line.partition("=")
    name = key.lstrip("+~")
    if not eq or at < len(key):
        return unknown(name, known)
    how = "in double quotes, the whole override in single quotes"
    if "," in value:  # a sweep: each value apart
        how = f"each such value {how}"
    elif not set(value) & set("'\"\\"):
        how = f"""'{key}="{value}"'"""
    return f"{name}: the value {value!r} can only be given quoted: {how}"
