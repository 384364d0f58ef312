"""What a new built-in mechanism needs beyond its module under ``attnbench/attention/``, each
said by a test in one line naming the file to edit when it is missing:

* its module imported and listed in ``attnbench/registry.py``'s ``BUILTINS``, which registers
  it (``attention.base.declare`` only keeps the declaration on the class), checked here of
  every module of the package;
* a hand count of its context memory in tests/test_context_memory.py
  (:func:`tests.test_context_memory.uncounted`).

Nothing else: no ``conf/attention/NAME.yaml`` (tests/test_attention_options.py), and the
registry-wide suites cover it without an edit. ``tests/toys/toy_builtin.py`` is such a
module, outside the package, so that the messages are shown on a module that lacks each.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import attnbench
from attnbench import attention, registry
from tests import test_context_memory as census

ROOT = Path(__file__).resolve().parents[1]
TOY = "tests.toys.toy_builtin"


def declared(module: ModuleType) -> list[str]:
    """The mechanisms a module declares as a built-in does: a class of its own carrying
    ``declare``'s declaration (a helper that makes the decorator, as the mixers' config does,
    declares nothing itself)."""
    return [
        v.declared[0]
        for v in vars(module).values()
        if isinstance(v, type) and v.__module__ == module.__name__ and "declared" in vars(v)
    ]


def unregistered(modules: Iterable[ModuleType]) -> list[str]:
    """One line per mechanism a module declares that the registry does not register from it."""
    out = []
    for module in modules:
        for name in declared(module):
            if name in registry.BUILTINS and registry.mechanism_class(name).__module__ == (
                module.__name__
            ):
                continue
            where = Path(module.__file__).resolve().relative_to(ROOT).as_posix()
            out.append(
                f"{where} declares mechanism {name!r}, which attnbench/registry.py does not "
                f"register: import its module there and list it in BUILTINS (now: "
                f"{', '.join(registry.BUILTINS)})"
            )
    return out


def package_modules() -> list[ModuleType]:
    """Every module of ``attnbench/attention/``, imported."""
    return [
        importlib.import_module(f"{attention.__name__}.{m.name}")
        for m in pkgutil.iter_modules(attention.__path__)
    ]


def test_every_module_that_declares_a_mechanism_is_a_built_in() -> None:
    modules = package_modules()
    assert sum(len(declared(m)) for m in modules) == len(registry.BUILTINS)
    gaps = unregistered(modules)
    assert not gaps, "\n".join(gaps)


@pytest.fixture
def toy() -> Iterator[ModuleType]:
    """The toy built-in's module; afterwards nothing of it is registered."""
    try:
        yield importlib.import_module(TOY)
    finally:
        registry._REGISTRY.pop("toy_builtin", None)


def test_a_new_built_in_is_told_what_it_lacks(
    toy: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "toy_builtin" not in attnbench.names()  # declaring registers nothing
    (line,) = unregistered([toy])
    assert line == (
        "tests/toys/toy_builtin.py declares mechanism 'toy_builtin', which attnbench/registry.py "
        "does not register: import its module there and list it in BUILTINS (now: "
        f"{', '.join(registry.BUILTINS)})"
    )
    # listed in BUILTINS, as registry.py lists a module of the package
    monkeypatch.setattr(registry, "BUILTINS", (*registry.BUILTINS, registry._register_builtin(toy)))
    assert unregistered([toy]) == [] and attnbench.info("toy_builtin").summary
    assert census.uncounted(registry.BUILTINS) == [
        "add a hand count for toy_builtin in tests/test_context_memory.py (a CASES entry and its "
        "rule in hand())"
    ]
    with pytest.raises(AssertionError, match="add a hand count for toy_builtin in tests/"):
        census.test_every_built_in_mechanism_declares_its_context_memory()
    assert census.uncounted(registry.BUILTINS[:-1]) == []  # the built-ins today: all counted
