"""A mechanism added by a plugin from its own file (``tests/toys/toy_mechanism.py``, the example
docs/mechanisms.md quotes in "Add a mechanism") passes the registry-wide suites that cover a
new mechanism without editing them: the common contract (tests/test_contract.py), the decode
contract's refusals (tests/test_decode_contract.py), the packed layout's memory model
(tests/test_packed_workload.py) and the context-memory census (tests/test_context_memory.py).
Each suite's own tests run on it, chosen by the same capabilities that choose them for the
built-ins.

The file is loaded as ``attnbench`` loads it: named in ``$ATTNBENCH_PLUGINS`` and imported by
the registry's first look, never imported here; after each test it is unregistered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import attnbench
from attnbench import registry
from tests import test_context_memory as census
from tests import test_contract as contract
from tests import test_decode_contract as decode
from tests import test_packed_workload as packed
from tests.toys import loaded

NAME, TOY = "local_window", "tests.toys.toy_mechanism"


@pytest.fixture(autouse=True)
def _toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with loaded(monkeypatch, TOY, registry._REGISTRY, NAME):
        yield


def test_it_keeps_the_common_contract() -> None:
    info = attnbench.info(NAME)
    assert info.unavailable is None and "cpu" in info.devices and info.padding_mask
    for causal in contract._causal_modes(NAME):
        contract.test_padding_is_the_sequence_cut_short(NAME, causal)
        contract.test_nothing_at_padded_positions_reaches_a_real_output(NAME, causal)
    if info.causal:
        contract.test_causal_outputs_never_see_a_later_position(NAME)
    else:
        contract.test_causal_is_refused_with_a_reason(NAME)
    contract.test_bad_parameters_are_one_line_naming_the_parameter(NAME)


def test_it_keeps_the_decode_contracts_refusals() -> None:
    assert NAME not in decode.decoders()
    decode.test_a_mechanism_that_cannot_decode_says_why_in_one_line(NAME)
    decode.test_kv_heads_without_grouped_heads_is_refused(NAME)


def test_its_packed_peak_is_the_profilers() -> None:
    """It packs, has no causal form and no ``causal`` setting: its cells are not causal."""
    cases = packed.packers([NAME])
    assert cases == [(NAME, (), "packed", False), (NAME, (), "packed", True)]
    for case in cases:
        packed.test_modeled_peak_equals_the_profilers(*case)


def test_the_context_memory_census_counts_built_ins_only() -> None:
    assert NAME in attnbench.names()
    census.test_every_built_in_mechanism_declares_its_context_memory()
