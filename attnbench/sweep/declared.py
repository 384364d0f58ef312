"""Every declared setting in one list, and what is generated from it: the settings part of
conf/config.yaml and the settings table of docs/running.md.

Each owner declares its own (:mod:`attnbench.settings`, the workloads, the quality tasks);
this module only gathers them, in the order the config and the docs list them.
``python -m attnbench.mirrors`` writes both into their files (tests/test_mirrors.py holds
the files to it).
"""

from __future__ import annotations

from attnbench import workload
from attnbench.quality import tasks
from attnbench.settings import (
    ALLOCATOR,
    COMPILE,
    MODEL,
    TIMING,
    Setting,
    markdown_table,
    yaml_block,
)


def all_settings() -> tuple[Setting, ...]:
    """The model's, each built-in workload's, compiling's, the allocator's, each quality
    task's, timing's."""
    work = workload.workload_settings(workload.get(name) for name in workload.BUILTINS)
    quality = [s for t in tasks.REGISTRY.values() for s in t.settings]
    return (*MODEL, *work, *COMPILE, *ALLOCATOR, *quality, *TIMING)


def config_block() -> str:
    """The part of conf/config.yaml between its ``settings`` markers: every setting but the
    model's (their defaults are the ``model: base`` group's, conf/model/base.yaml)."""
    notes = {"quality": 'each quality task\'s settings (README, "Quality beside cost")'}
    notes.update({f"quality.{t.name}": t.doc for t in tasks.REGISTRY.values()})
    return yaml_block([s for s in all_settings() if s.owner != "model"], notes)


def docs_table() -> str:
    """docs/running.md's settings table: every setting, the model's included."""
    return markdown_table(all_settings())
