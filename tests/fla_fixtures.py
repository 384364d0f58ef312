"""The fixtures every test of ``kernel=fla`` through Triton's interpreter shares: a test
module imports them by name (pytest finds a fixture in the module's namespace)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from attnbench.attention import fla_kernels
from tests import fla_interpret


@pytest.fixture(scope="module")
def interpreted() -> None:
    """fla's kernels under Triton's interpreter, or the reason they cannot be here."""
    if why := fla_interpret.why_not():
        if os.environ.get("ATTNBENCH_REQUIRE_TRITON") == "1":
            pytest.fail(f"ATTNBENCH_REQUIRE_TRITON=1 but {why}")
        pytest.skip(why)
    fla_interpret.load()


@pytest.fixture
def calls(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """kernel=fla let run on CPU tensors (the one seam: their kernels are real), and the
    names of the fla ops each call reaches, in order."""
    monkeypatch.setattr(fla_kernels, "why_unavailable", lambda: None)
    monkeypatch.setattr(fla_kernels, "_device", lambda q: None)
    seen: list[str] = []
    op = fla_kernels._op

    def recorded(package: str, name: str) -> Callable[..., object]:
        seen.append(name)
        return op(package, name)

    monkeypatch.setattr(fla_kernels, "_op", recorded)
    return seen
