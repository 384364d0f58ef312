"""Efficiency length: the shortest n at which a mechanism beats a baseline, hand-computed."""

from __future__ import annotations

import pytest

from attnbench.report.efficiency import crossing, efficiency_lengths, grid
from attnbench.report.text import grid_markdown
from attnbench.row import Row


def _row(attention: str, n: int, t: float | None, b: int | None, **kw: object) -> Row:
    status = kw.pop("status", "ok")
    return Row(
        attention=attention,
        n=n,
        dtype="fp16",
        device="v100_16gb",
        params=dict(kw.pop("params", {})),
        k=kw.pop("k", None),
        status=status,
        time_per_seq_s=t,
        max_batch=b,
        model={"layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072},
    )


def test_crossing_interpolates_in_log_log() -> None:
    # ratio 0.5 at n=512 and 2.0 at n=2048: log ratio is -1, +1 (base 2) -> the middle, 1024
    n, text, between, note = crossing([(256, 0.25), (512, 0.5), (2048, 2.0)])
    assert n == pytest.approx(1024.0) and text == "≈ 1024" and between == (512, 2048)
    assert note == ""
    # a ratio of exactly 1 is not "faster": the crossing is there, interpolated, not "≤ 512"
    n, text, between, _ = crossing([(512, 1.0), (1024, 4.0)])
    assert (round(n), text, between) == (512, "≈ 512", (512, 1024))


def test_crossing_at_the_edges_claims_no_more_than_measured() -> None:
    assert crossing([(256, 1.3), (512, 2.0)])[1] == "≤ 256"
    assert crossing([(256, 0.3), (512, 0.9)])[1] == "> 512"
    assert crossing([])[1] == "n/m"
    # the baseline stops fitting: ahead with no ratio (None), nothing to interpolate towards
    n, text, between, _ = crossing([(1024, 0.8), (2048, None)])
    assert (n, text, between) == (None, "1024–2048", (1024, 2048))
    # ahead, then behind again: said, not hidden
    assert crossing([(256, 0.5), (512, 2.0), (1024, 0.9)])[3] == "behind again at n = 1024"


def test_lengths_against_each_baseline_and_setting() -> None:
    rows = [
        # vanilla's time grows as n², the mechanism's as n: crossing where 1e-6 n² = 1e-3 n
        *(_row("vanilla", n, 1e-6 * n * n, 4096 * 1024 // n // n) for n in (256, 512, 2048)),
        *(_row("sdpa", n, 0.5e-6 * n * n, 4 * 4096 * 1024 // n // n) for n in (256, 512, 2048)),
        *(_row("linear", n, 1e-3 * n, 4096 * 4 // n) for n in (256, 512, 2048)),
        # causal rows are compared with causal baselines only: none here, so no entry
        _row("linear", 512, 1e-9, 9999, params={"causal": True}),
        # skipped everywhere (xformers without CUDA): nothing to compare, and it says so
        *(_row("xformers", n, None, None, status="skipped") for n in (256, 512)),
    ]
    got = {(x.mechanism, x.kind, x.baseline): x for x in efficiency_lengths(rows)}
    t = got[("linear", "time", "vanilla")]
    assert t.text == "≈ 1000" and t.between == (512, 2048) and t.compared == (256, 512, 2048)
    assert got[("linear", "time", "sdpa")].text == "≈ 2000"
    # max batch 64 / 16 / 1 (vanilla) against 64 / 32 / 8 (linear): 1.0, 2.0, 8.0
    assert got[("linear", "memory", "vanilla")].text == "≈ 256"  # equal at 256, ahead above
    assert ("linear (causal=True)", "time", "vanilla") not in got
    xformers = got[("xformers", "time", "vanilla")]
    assert (xformers.text, xformers.n, xformers.compared) == ("n/m", None, ())
    assert xformers.note == "no n with both figures: xformers: skipped: None (n = 256, 512)"
    assert ("sdpa", "time", "vanilla") in got  # sdpa itself against vanilla


def test_oom_baseline_counts_as_behind_for_memory() -> None:
    rows = [
        _row("vanilla", 1024, 1.0, 2),
        _row("vanilla", 2048, None, None, status="oom"),
        _row("local", 1024, 2.0, 1, params={"window": 64}),
        _row("local", 2048, 3.0, 1, params={"window": 64}),
    ]
    got = {(x.kind, x.baseline): x for x in efficiency_lengths(rows)}
    assert got[("memory", "vanilla")].text == "1024–2048"
    assert got[("time", "vanilla")].text == "> 1024"  # no time where vanilla did not fit


def test_markdown_table_has_a_row_per_mechanism_and_the_legend() -> None:
    rows = [_row("vanilla", n, 1e-6 * n * n, 8) for n in (256, 1024)]
    rows += [_row("linear", n, 1e-3 * n, 8) for n in (256, 1024)]
    md = grid_markdown(grid(efficiency_lengths(rows)))
    assert "| linear | ≈ 1000 | \\> 1024 |" in md  # Markdown's > escaped
    assert "interpolated" in md and md.count("\n| ") == 2


def test_a_mechanism_never_timed_beside_the_baseline_says_why_not_a_blank() -> None:
    """A CPU run times few cells (the rest are estimated over timing.time_budget_s): a
    mechanism with no n at which both times exist gets ``n/m`` and a numbered note giving
    each reason and its n, in the table every format prints."""
    skipped = "time skipped: ~9 s per forward on this CPU; 7 forwards exceed time_budget_s=30"
    rows = [
        _row("vanilla", 512, 0.5, 64),
        _row("vanilla", 1024, None, 16),
        _row("vanilla", 2048, None, None, status="oom"),
        _row("linear", 512, 0.4, 128, k=256),
        _row("linear", 1024, None, 64, k=512),
        _row("linear", 2048, None, 32, k=512),
    ]
    rows[4].reason = skipped
    got = {(x.mechanism, x.kind): x for x in efficiency_lengths(rows, ("vanilla",))}
    assert got[("linear k=256", "time")].text == "≤ 512"
    never = got[("linear k=512", "time")]
    assert never.text == "n/m" and never.note == (
        "no n with both figures: time not measured: a CPU run was estimated over "
        "timing.time_budget_s (n = 1024); the baseline does not fit at b = 1 under the "
        "ceiling (measured) (n = 2048)"
    )
    g = grid(efficiency_lengths(rows, ("vanilla",)))
    assert g.body[1] == ["linear k=512", "n/m (1)", "≤ 1024"]
    assert g.notes[-1].startswith("(1) linear k=512, time against vanilla: no n with both")
