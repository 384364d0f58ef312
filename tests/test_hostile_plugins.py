"""Plugins that fail, each in one line (docs/reliability.md, "Plugins").

A plugin named in ``$ATTNBENCH_PLUGINS`` or declared as an entry point of the group
``attnbench.mechanisms`` that cannot be loaded — missing, a syntax error, anything raised on
import, ``sys.exit``, a file path for a module name, a name it registers already taken — is
one line from every command naming the variable or the entry point, the module and the
error, exit 2, nothing written. A plugin's mechanism that breaks a forward's contract as it
runs is named as at fault in its cell's row. Each plugin is a real file written into
``tmp_path``, put on ``sys.path`` and imported as ``attnbench`` imports it; the commands run
in this process (:func:`attnbench.cli.main`), and once in a fresh one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnbench import plugins, registry, workload
from tests.conftest import run_cli
from tests.test_extensions import registries_kept

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "results/reference/table3-v100_16gb-cpu/cells.jsonl"
TINY = ("n=64", "batch=1", "device=cpu", "dtype=fp32", "model=tiny", "progress=false")

MECHANISM = """
from dataclasses import dataclass
import attnbench
from attnbench.attention.base import MultiHeadAttention
@dataclass
class Config:
    causal: bool = False
"""
# each plugin module of the tests, by name: its source
SOURCES = {
    "hp_syntax": "x = 1\n\ndef f(:\n    pass\n",
    "hp_raises": "raise RuntimeError('boom at import')\n",
    "hp_exit": "import sys\nsys.exit(3)\n",
    "hp_workload": (
        "from attnbench import workload\nfrom attnbench.workload.inference import INFERENCE\n"
        "class Mine(type(INFERENCE)):\n    name = 'packed'\nworkload.register(Mine())\n"
    ),
    "hp_mechanism": MECHANISM
    + "@attnbench.register('vanilla', config=Config, causal=False, summary='x')\n"
    "class Mine(MultiHeadAttention):\n    pass\n",
    "hp_task": (
        "import dataclasses\nfrom attnbench.quality import tasks\n"
        "tasks.register(dataclasses.replace(tasks.REGISTRY['approx']))\n"
    ),
    "hp_gain_a": (
        "import dataclasses\nfrom attnbench.quality import tasks\n"
        "tasks.register(dataclasses.replace(tasks.REGISTRY['approx'], name='hp_gain'))\n"
    ),
    "hp_gain_b": (  # a second plugin's task of the same name: no longer replaces the first
        "import dataclasses\nfrom attnbench.quality import tasks\n"
        "tasks.register(dataclasses.replace(tasks.REGISTRY['spectrum'], name='hp_gain'))\n"
    ),
    "hp_field": "from attnbench.row import fields\n"
    "fields.register(fields.BY_NAME['n'], lambda values: 1)\n",
    "hp_section": "import dataclasses\nfrom attnbench.report import outline, sections\n"
    "outline.register(dataclasses.replace(sections.SECTIONS[0]))\n",
    "hp_document": "import dataclasses\nfrom attnbench.report import outline, sections\n"
    "outline.register_document(dataclasses.replace(sections.DOCUMENTS[0]))\n",
    "hp_fine": "",  # an entry point's module, whose object is missing
}
IMPORT = "ATTNBENCH_PLUGINS: cannot import"
# (what $ATTNBENCH_PLUGINS says, or "ep:NAME = VALUE" for an entry point; the line's end)
CASES = [
    ("hp_missing", f"{IMPORT} 'hp_missing': ModuleNotFoundError: No module named 'hp_missing'"),
    ("hp_syntax", f"{IMPORT} 'hp_syntax': SyntaxError: invalid syntax (hp_syntax.py, line 3)"),
    ("hp_raises", f"{IMPORT} 'hp_raises': RuntimeError: boom at import"),
    ("hp_exit", f"{IMPORT} 'hp_exit': SystemExit: 3"),
    (
        "plugins/hp_raises.py",
        "ATTNBENCH_PLUGINS: 'plugins/hp_raises.py' is not a module name; name the module "
        "('hp_raises') and put its directory ('plugins') on PYTHONPATH",
    ),
    ("hp_workload", f"{IMPORT} 'hp_workload': ValueError: register: workload 'packed' is already"),
    ("hp_mechanism", f"{IMPORT} 'hp_mechanism': ValueError: register: attention 'vanilla' is "),
    ("hp_task", f"{IMPORT} 'hp_task': ValueError: register: task 'approx' is already registered"),
    ("hp_gain_a,hp_gain_b", f"{IMPORT} 'hp_gain_b': ValueError: register: task 'hp_gain' is "),
    ("hp_field", f"{IMPORT} 'hp_field': ValueError: register: row field 'n' is already registered"),
    ("hp_section", f"{IMPORT} 'hp_section': ValueError: report: section 'efficiency' is already"),
    ("hp_document", f"{IMPORT} 'hp_document': ValueError: report: document 'table3' is already"),
    (
        "ep:hp_ep = hp_raises:Mine",
        "entry point 'hp_ep' (hp_raises:Mine) of group attnbench.mechanisms: cannot load "
        "'hp_raises': RuntimeError: boom at import",
    ),
    (
        "ep:hp_ep = hp_fine:Mine",
        "entry point 'hp_ep' (hp_fine:Mine) of group attnbench.mechanisms: cannot load "
        "'hp_fine': AttributeError: module 'hp_fine' has no attribute 'Mine'",
    ),
]
COMMANDS = {
    "run": ("run", "attention=vanilla", *TINY),
    "list": ("list", "--markdown"),
    "report": ("report", "rows", "--no-plots"),
    "check": ("check", "--write-baseline", "baseline.json", "--quiet"),
    "demo": ("demo", "--n", "64", "--k", "8", "--repeats", "1"),
}


def write_plugins(where: Path) -> None:
    """Every plugin of :data:`SOURCES` as a module file in ``where``."""
    for name, source in SOURCES.items():
        (where / f"{name}.py").write_text(source)


def set_plugins(monkeypatch: pytest.MonkeyPatch, where: Path, plugins_env: str) -> None:
    """``plugins_env`` as $ATTNBENCH_PLUGINS, or (``ep:NAME = VALUE``) as the one entry point
    of a distribution installed in ``where`` (its dist-info on ``sys.path``)."""
    if plugins_env.startswith("ep:"):
        info = where / "hp_ep-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hp-ep\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[attnbench.mechanisms]\n{plugins_env[3:]}\n")
        monkeypatch.delenv(registry.PLUGIN_ENV, raising=False)
    else:
        monkeypatch.setenv(registry.PLUGIN_ENV, plugins_env)


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory with the test plugins on ``sys.path``, none of them loaded yet, and the
    registries as they were afterwards; returns an empty working directory beside them."""
    where = tmp_path / "plugins"
    where.mkdir()
    write_plugins(where)
    monkeypatch.syspath_prepend(str(where))  # sys.path put back afterwards, the gate's too
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.delenv(registry.PLUGIN_ENV, raising=False)
    ours = [*SOURCES, "hp_missing"]
    for name in ours:
        sys.modules.pop(name, None)
    work = tmp_path / "work"
    work.mkdir()
    with registries_kept():
        yield work
    for name in ours:
        sys.modules.pop(name, None)


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("plugins_env", "line"), CASES, ids=[c[0] for c in CASES])
def test_a_plugin_that_cannot_be_loaded_is_one_line_from_every_command(
    fresh: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_in_process: Callable[..., subprocess.CompletedProcess[str]],
    plugins_env: str,
    line: str,
    command: str,
) -> None:
    set_plugins(monkeypatch, fresh.parent / "plugins", plugins_env)
    (fresh / "rows").mkdir()
    shutil.copy(ROWS, fresh / "rows" / "cells.jsonl")
    before = files_under(fresh)
    out = cli_in_process(*COMMANDS[command], cwd=fresh)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"attnbench {command}: error: {line}"), out.stderr
    assert files_under(fresh) == before  # no run dir, report, baseline or check JSON


def test_a_plugin_that_exits_is_one_line_and_exit_2_in_a_fresh_process(tmp_path: Path) -> None:
    """``sys.exit(3)`` on import ended the whole process with 3 and no word: a property of
    the process, so in one."""
    write_plugins(tmp_path)
    env = {
        registry.PLUGIN_ENV: "hp_exit",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    (tmp_path / "work").mkdir()
    out = run_cli("run", "attention=vanilla", *TINY, cwd=tmp_path / "work", env=env)
    assert out.returncode == 2
    want = f"attnbench run: error: {IMPORT} 'hp_exit': SystemExit: 3"
    assert out.stderr.strip() == want and out.stdout == ""
    assert not any((tmp_path / "work").iterdir())


def test_a_plugin_imported_again_registers_nothing_twice(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plugins are looked at again in one process (the registries' first looks, the gate's
    driver): the module is imported once, so its registrations never meet themselves."""
    source = SOURCES["hp_workload"].replace("'packed'", "'hp_mode'")
    (fresh.parent / "plugins" / "hp_mode.py").write_text(source)
    monkeypatch.setenv(registry.PLUGIN_ENV, "hp_mode")
    try:
        for _ in range(2):
            plugins.load()
            monkeypatch.setattr(registry, "_plugins_loaded", False)
            assert workload.names().count("hp_mode") == 1
    finally:
        sys.modules.pop("hp_mode", None)


BROKEN = (
    MECHANISM
    + """
import torch
@attnbench.register("hp_nan", config=Config, causal=True, summary="NaN from a finite input")
class NanAttention(MultiHeadAttention):
    def attend(self, x, key_padding_mask):
        return torch.full_like(x, float("nan"))
@attnbench.register("hp_narrow", config=Config, causal=True, summary="too few features")
class NarrowAttention(MultiHeadAttention):
    def attend(self, x, key_padding_mask):
        return x[..., :8]
@attnbench.register("hp_shape", config=Config, causal=True, summary="forward: wrong shape")
class ShapeAttention(MultiHeadAttention):
    def forward(self, x, key_padding_mask=None, packing=None):
        return x[:, :-1]
@attnbench.register("hp_tuple", config=Config, causal=True, summary="forward: a tuple")
class TupleAttention(MultiHeadAttention):
    def forward(self, x, key_padding_mask=None, packing=None):
        return x, None
@attnbench.register("hp_raising", config=Config, causal=True, summary="forward raises")
class RaisingAttention(MultiHeadAttention):
    def attend(self, x, key_padding_mask):
        return {}["state"]
@attnbench.register("hp_unbuilt", config=Config, causal=True, summary="cannot be built")
class UnbuiltAttention(MultiHeadAttention):
    def __init__(self, **kwargs):
        raise RuntimeError("no such kernel here")
"""
)
WHO = "attention={} (plugin hp_broken): "
FAULTS = [
    ("hp_nan", "forward returned NaN or inf for a finite input (1, 64, 64)"),
    ("hp_narrow", "RuntimeError: "),  # out_proj's, on what its attend returned: torch's words
    ("hp_shape", "forward returned shape (1, 63, 64) for input (1, 64, 64)"),
    ("hp_tuple", "forward returned a tuple for input (1, 64, 64)"),
    ("hp_raising", "KeyError: 'state'"),
]


@pytest.mark.parametrize(("attention", "why"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_plugins_mechanism_that_breaks_the_forward_is_named_in_its_row(
    fresh: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_in_process: Callable[..., subprocess.CompletedProcess[str]],
    attention: str,
    why: str,
) -> None:
    """Its row says ``error``, the mechanism and its module first, never ``ok`` (NaN was
    timed as any figure) nor a shape error from deep inside the next layer."""
    (fresh.parent / "plugins" / "hp_broken.py").write_text(BROKEN)
    monkeypatch.setenv(registry.PLUGIN_ENV, "hp_broken")
    sys.modules.pop("hp_broken", None)
    try:
        timing = ("timing.min_seconds=0", "timing.min_repeats=2", "report=false")
        out = cli_in_process("run", f"attention={attention}", *TINY, *timing, cwd=fresh)
    finally:
        sys.modules.pop("hp_broken", None)
    assert out.returncode == 0, out.stderr
    (cells,) = fresh.glob("results/*/*/cells.jsonl")
    (row,) = [json.loads(line) for line in cells.read_text().splitlines()]
    assert row["status"] == "error" and row["reason"].startswith(WHO.format(attention) + why)
    assert f"{attention} n=64: {row['reason']}" in out.stdout


def test_a_plugins_mechanism_that_cannot_be_built_is_refused_before_anything_runs(
    fresh: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_in_process: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    (fresh.parent / "plugins" / "hp_broken.py").write_text(BROKEN)
    monkeypatch.setenv(registry.PLUGIN_ENV, "hp_broken")
    sys.modules.pop("hp_broken", None)
    try:
        out = cli_in_process("run", "attention=hp_unbuilt", *TINY, cwd=fresh)
    finally:
        sys.modules.pop("hp_broken", None)
    assert out.returncode == 2
    why = "building its layer raised RuntimeError: no such kernel here"
    assert out.stderr == f"attnbench run: error: {WHO.format('hp_unbuilt')}{why}\n"
    assert not any(fresh.iterdir())
