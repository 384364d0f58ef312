"""Every registered mechanism is an ``attention=`` option, a built-in as a plugin's, whether or
not ``conf/attention/`` holds a YAML file for it: one is needed only to say more (a comment,
parameters other than the defaults), and where there is one it is the option. Composed in this
process, as ``attnbench run`` composes before it runs."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from attnbench import registry
from attnbench.sweep.config import expand_jobs

SHIPPED = Path(__file__).resolve().parents[1] / "conf" / "attention"
NAME = "toy_builtin"


@pytest.fixture
def toy_builtin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The built-in of tests/toys/toy_builtin.py, registered as registry.py registers one
    of :data:`attnbench.registry.BUILTINS`, with no YAML file; afterwards the registry and
    the ``attention`` options are as they were."""
    module = importlib.import_module("tests.toys.toy_builtin")
    monkeypatch.setattr(
        registry, "BUILTINS", (*registry.BUILTINS, registry._register_builtin(module))
    )
    repo = ConfigStore.instance().repo
    before = dict(repo.get("attention", {}))
    try:
        yield
    finally:
        registry._REGISTRY.pop(NAME, None)
        if "attention" in repo:
            repo["attention"].clear()
            repo["attention"].update(before)


def _attention(*overrides: str) -> list[dict]:
    jobs, _ = expand_jobs(list(overrides), multirun=True)
    return [OmegaConf.to_container(job.attention) for job in jobs]


def test_a_built_in_without_a_yaml_file_is_an_option(toy_builtin: None) -> None:
    assert NAME in registry.BUILTINS and not (SHIPPED / f"{NAME}.yaml").exists()
    assert _attention(f"attention={NAME}") == [{"name": NAME, "params": {}}]


def test_each_built_ins_option_is_its_yaml_file_where_it_has_one() -> None:
    got = _attention(f"attention={','.join(registry.BUILTINS)}")
    for name, attention in zip(registry.BUILTINS, got, strict=True):
        yaml = SHIPPED / f"{name}.yaml"
        want = OmegaConf.to_container(OmegaConf.load(yaml)) if yaml.exists() else None
        assert attention == (want or {"name": name, "params": {}}), name
