"""Hydra's composition, with the work that does not change from one compose to the next done
once: for the tests that compose hundreds of configs (every job of every shipped sweep, every
command the docs show), in this process, where a compose is ~0.1 s of CPU.

* :func:`files_read_once`: each config file (and its defaults list) read and parsed once,
  and each compose given a copy of it; Hydra still builds each defaults tree, merges and
  applies each override itself, as it would from disk.
* :func:`each_composed_once`: ``hydra.compose`` with the same arguments composed once, and
  a copy given each time.

Both last for the ``with`` block: a config file or a ConfigStore entry changed inside it
would not be seen, and none is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hydra
import pytest
from hydra._internal.config_repository import ConfigRepository


@contextmanager
def files_read_once() -> Iterator[None]:
    """Hydra's config repository, reading each config file once for the block. Keyed by the
    search path's sources as well as the file, so that a ``--config-dir`` (a source more)
    reads its own."""
    real = ConfigRepository.load_config
    read: dict[tuple[Any, ...], Any] = {}

    def load_config(self: ConfigRepository, config_path: str) -> Any:
        sources = tuple((type(s).__name__, s.provider, s.path) for s in self.get_sources())
        key = (sources, config_path)
        if key not in read:
            read[key] = real(self, config_path)
        return copy.deepcopy(read[key])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ConfigRepository, "load_config", load_config)
        yield


@contextmanager
def each_composed_once() -> Iterator[None]:
    """``hydra.compose`` (as ``from hydra import compose`` finds it when called) composing
    each distinct (config, overrides, with the hydra node or not) once for the block."""
    real = hydra.compose
    composed: dict[str, Any] = {}

    def compose(
        config_name: str | None = None,
        overrides: list[str] | None = None,
        return_hydra_config: bool = False,
    ) -> Any:
        key = repr((config_name, overrides, return_hydra_config))
        if key not in composed:
            composed[key] = real(
                config_name, overrides=overrides, return_hydra_config=return_hydra_config
            )
        return copy.deepcopy(composed[key])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(hydra, "compose", compose)
        yield
