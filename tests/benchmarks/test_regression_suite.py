r"""The regression suite (conf/sweep/regression.yaml) as pytest-benchmark tests.

The same cells `attnbench check` times, for users who already keep pytest-benchmark history:

    pytest tests/benchmarks/test_regression_suite.py --benchmark-enable --benchmark-only \
        --benchmark-autosave                       # on the old version
    pytest tests/benchmarks/test_regression_suite.py --benchmark-enable --benchmark-only \
        --benchmark-compare --benchmark-compare-fail=median:10%    # on the new one

Unlike `attnbench check`, the two versions are timed at different times, so drift between
the runs counts as a change: use a quiet, dedicated machine.
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.check.suite import load_suite

SUITE = load_suite("regression")
# a forward per cell: the gate's decode cells (one decode step on a state at position n,
# attnbench.check.worker._decode) have no forward to time here, and its compiled twins
# (check.compile) are the same forwards compiled by the gate's worker, not timed here
FORWARDS = [c for c in SUITE.cells if c.mode != "decode" and not c.compiled]


@pytest.mark.parametrize("cell", FORWARDS, ids=lambda c: c.name)
def test_forward(benchmark, cell) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(SUITE.settings["threads"])
    try:
        layer = attnbench.create(
            cell.attention,
            d_model=cell.d_model,
            n_heads=cell.n_heads,
            max_seq_len=cell.n,
            **cell.params,
        ).eval()
        x = torch.randn(
            cell.batch, cell.n, cell.d_model, generator=torch.Generator().manual_seed(0)
        )
        benchmark.extra_info.update(cell=cell.name, threads=torch.get_num_threads())
        with torch.inference_mode():
            benchmark.pedantic(
                layer,
                args=(x,),
                rounds=SUITE.settings["rounds"],
                warmup_rounds=SUITE.settings["warmup"],
                iterations=1,
            )
    finally:
        torch.set_num_threads(threads)
