"""The variable-lengths table (report/packed.py), on rows made here: the figures it shows are
the rows' own, divided as its note says, checked by hand."""

from __future__ import annotations

from attnbench.report.packed import Packs, layout_tables
from attnbench.row import Row

LENGTHS = [100, 300, 50, 550]  # 1000 real tokens; padded: 4 × 550 = 2200
PACKS = Packs({"vanilla": "per document", "linear": "scan restarts"}, {"linformer": "fixed n"})


def _row(
    attention: str, layout: str, t: float, mb: int, wasted: float, lengths: list[int] = LENGTHS
) -> Row:
    return Row(
        attention=attention, n=1024, dtype="fp32", device="cpu", params={"causal": True},
        mode="packed", layout=layout, lengths=None, distribution="lognormal",
        total_tokens=1000, length_mean=256, length_min=16, length_seed=0, bucket_tokens=4096,
        batch_asked="max", ceiling_bytes=10**10, status="ok", max_batch=mb,
        memory_source="modeled", time_per_seq_s=t, time_median_s=t, time_batch=1,
        time_device="cpu", time_dtype="fp32",
        model={"layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128},
        packed={"lengths": lengths, "documents": 4, "real_tokens": 1000, "padded_tokens": 2200,
                "padding_share": 1 - 1000 / 2200, "max_len": 550, "layout_tokens": 2200,
                "batches": 1, "flops_real": 100, "flops_layout": 220,
                "flops_wasted_share": wasted},
        env={"device_name": "cpu", "attnbench": "0.1.0"},
    )  # fmt: skip


def test_time_per_real_token_ratios_and_real_tokens_that_fit() -> None:
    rows = [
        _row("vanilla", "padded", 0.5, 10, 0.6),
        _row("vanilla", "packed", 0.2, 30, 0.0),
        _row("linear", "padded", 0.4, 20, 0.55),
        _row("linear", "packed", 0.1, 60, 0.0),
        _row("linear", "bucketed", 0.25, 25, 0.2),
    ]
    (grid,) = layout_tables(rows, PACKS)
    assert "4 documents, 1000 real tokens (longest 550, 55 % of the padded" in grid.title
    by = {line[0].split(" ")[0]: line for line in grid.body}
    head = grid.head
    # vanilla padded: 0.5 s per 1000 real tokens = 500 ms / 1k tok, the baseline
    assert by["vanilla"][head.index("padded ms / 1k tok")] == "500"
    assert by["vanilla"][2] == "1.00x" and by["vanilla"][3] == "10000"  # 10 copies × 1000
    # linear packed: 100 ms / 1k tok, 5× faster than padded vanilla, 60 000 real tokens fit
    assert by["linear"][4:7] == ["100", "5.00x", "60000"]
    assert by["linear"][7:10] == ["250", "2.00x", "25000"]
    assert by["linear"][head.index("packing's speed-up")] == "4.00x"
    assert by["linear"][head.index("padded wasted FLOPs")] == "55 %"
    assert by["vanilla"][7:10] == ["-", "-", "-"]  # no bucketed row of vanilla
    assert by["linear"][head.index("how it packs")] == "scan restarts"
    assert "linformer cannot pack: fixed n" in grid.notes


def test_what_the_facts_do_not_name_is_missing_and_a_refusal_says_cannot() -> None:
    """The packing facts are handed in, not read from the registry: a mechanism they do not
    name (a plugin's, not loaded here) is shown as missing, one they say cannot pack as
    cannot."""
    rows = [_row("vanilla", "padded", 0.5, 10, 0.6), _row("linear", "padded", 0.4, 20, 0.5)]
    (grid,) = layout_tables(rows, Packs({"vanilla": "per document"}, {"linear": "why"}))
    how = {line[0].split(" ")[0]: line[grid.head.index("how it packs")] for line in grid.body}
    assert how == {"vanilla": "per document", "linear": "cannot"}
    (grid,) = layout_tables(rows, Packs({}, {}))
    assert {line[grid.head.index("how it packs")] for line in grid.body} == {"-"}
    assert not any("cannot pack" in note for note in grid.notes)


def test_draws_apart_are_tables_apart() -> None:
    rows = [_row("vanilla", "padded", 0.5, 10, 0.6), _row("vanilla", "packed", 0.2, 30, 0.0)]
    rows.append(_row("vanilla", "padded", 0.3, 10, 0.0, lengths=[1000]))
    assert [len(g.body) for g in layout_tables(rows, PACKS)] == [1, 1]


def test_the_figure_puts_each_mechanism_at_its_waste_and_speedup() -> None:
    """x: the padded row's wasted FLOP share (%), y: padded time over packed; a mechanism
    without both layouts has no point."""
    from attnbench.report.packed import waste_against_speedup

    rows = [
        _row("vanilla", "padded", 0.5, 10, 0.6),
        _row("vanilla", "packed", 0.2, 30, 0.0),
        _row("linear", "padded", 0.4, 20, 0.55),
        _row("linear", "packed", 0.1, 60, 0.0),
        _row("sdpa", "padded", 0.4, 20, 0.55),
    ]
    (plot,) = waste_against_speedup(rows)
    (ax,) = plot.figure.axes
    (dots,) = ax.collections
    got = sorted((round(x, 9), round(y, 9)) for x, y in dots.get_offsets().tolist())
    assert got == [(55.0, 4.0), (60.0, 2.5)]
