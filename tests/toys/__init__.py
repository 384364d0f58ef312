"""Toy extensions, each in a file of its own, loaded as plugins (``$ATTNBENCH_PLUGINS``) by
tests/test_extensions.py: what a user adds to attnbench without editing it. :func:`loaded` is
how a toy's own test file loads it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from attnbench import registry


@contextmanager
def loaded(
    monkeypatch: pytest.MonkeyPatch, module: str, registered: dict[str, Any], name: str
) -> Iterator[None]:
    """The toy ``module`` named in ``$ATTNBENCH_PLUGINS`` and imported by the registries' next
    look, as a fresh process imports it (never imported here); afterwards what it registered
    (``registered[name]``) and the module are forgotten, so the next test loads it afresh."""
    monkeypatch.setenv(registry.PLUGIN_ENV, module)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    sys.modules.pop(module, None)
    try:
        yield
    finally:
        registered.pop(name, None)
        sys.modules.pop(module, None)
