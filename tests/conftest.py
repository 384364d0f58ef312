"""Shared fixtures. Everything runs on CPU; GPU-only tests skip themselves with a reason."""

from __future__ import annotations

import pytest
import torch

import attnbench


def runnable_here() -> list[str]:
    """Mechanisms that can run on this machine (CPU), per the registry's own info()."""
    return [
        n
        for n in attnbench.names()
        if attnbench.info(n).unavailable is None and "cpu" in attnbench.info(n).devices
    ]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
