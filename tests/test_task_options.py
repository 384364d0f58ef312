"""Every quality task is a ``task=`` option, a built-in as a plugin's, whether or not
``conf/task/`` holds a YAML file for it: one is needed only to bring more (the task's own
model, device, dtype and batch), and where there is one it is the option. Composed in this
process, as ``attnbench run`` composes before it runs (tests/test_attention_options.py says
the same of mechanisms)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from attnbench.quality import tasks
from attnbench.quality.tasks import Figure, Task
from attnbench.sweep.config import expand_jobs

SHIPPED = Path(__file__).resolve().parents[1] / "conf" / "task"
NAME = "toy_builtin_task"
# what a task's YAML may set, beside ``task``: the keys its option decides
DECIDED = ("task", "dtype", "batch", "n", "model", "device")


def _nothing(cell: Any, s: dict[str, Any]) -> None:
    """No rule of its own."""


def _run(cell: Any, s: dict[str, Any]) -> dict[str, Any]:
    return {"one": 1.0}


@pytest.fixture
def toy_builtin_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A task that is one of :data:`attnbench.quality.tasks.BUILTINS`, with no YAML file;
    afterwards the tasks and the ``task`` options are as they were."""
    toy = Task(NAME, "one (a test's toy built-in task)", (), (Figure("one", "number", "1"),),
               _nothing, _run)  # fmt: skip
    monkeypatch.setitem(tasks.REGISTRY, NAME, toy)
    monkeypatch.setattr(tasks, "BUILTINS", (*tasks.BUILTINS, NAME))
    monkeypatch.setattr(tasks, "TASKS", (*tasks.TASKS, NAME))
    repo = ConfigStore.instance().repo
    before = dict(repo.get("task", {}))
    try:
        yield
    finally:
        if "task" in repo:
            repo["task"].clear()
            repo["task"].update(before)


def _decided(*overrides: str) -> list[dict[str, Any]]:
    """What each job's ``task`` option decided, as the composed config holds it."""
    jobs, _ = expand_jobs(list(overrides), multirun=True)
    return [
        {key: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
         for key in DECIDED if (v := job.get(key)) is not None}
        for job in jobs
    ]  # fmt: skip


def test_a_built_in_task_without_a_yaml_file_is_an_option(toy_builtin_task: None) -> None:
    assert NAME in tasks.BUILTINS and not (SHIPPED / f"{NAME}.yaml").exists()
    (plain,) = _decided()
    (toy,) = _decided(f"task={NAME}")
    assert toy == {**plain, "task": NAME}  # the config's model, device, dtype and batch


def test_each_built_in_tasks_option_is_its_yaml_file_where_it_has_one() -> None:
    """Each shipped file's own values win over the config's; ``task`` is the task's name."""
    got = _decided(f"task={','.join(tasks.TASKS)}")
    for name, decided in zip(tasks.TASKS, got, strict=True):
        yaml = SHIPPED / f"{name}.yaml"
        assert decided["task"] == name
        if yaml.exists():
            own = OmegaConf.to_container(OmegaConf.load(yaml))
            assert {k: own[k] for k in ("dtype", "batch", "n") if k in own} == {
                k: decided[k] for k in ("dtype", "batch", "n") if k in own
            }, name
