"""The replay of PyTorch's CUDA caching allocator (attnbench/measure/allocator.py), rule by
rule on hand-made traces whose expected figures are worked out in each test's comment, and
the trace the memory model records (attnbench/measure/memory.py: ``traced``).

Sizes in MiB unless said; "seg" is a segment (one cudaMalloc), [a|b] its blocks in address
order, "live"/"free" what each block is.
"""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.measure.allocator import AllocatorConfig, allocation_size, largest_batch, replay
from attnbench.measure.fit import live_peak
from attnbench.measure.memory import module_bytes, rounded, traced, tracked_peak

MiB = 1 << 20


def allocs(*sizes: int) -> list[tuple]:
    """Allocations of ``sizes`` bytes, ids 0, 1, ..., none freed."""
    return [("alloc", i, n) for i, n in enumerate(sizes)]


def test_requests_round_up_to_512_bytes():
    # 1 B -> 512 B, 513 B -> 1024 B, both from one 2 MiB small segment: 1536 B allocated
    r = replay(allocs(1, 513))
    assert (r.peak_allocated, r.peak_reserved, r.fits) == (1536, 2 * MiB, True)


def test_roundup_power2_divisions_rounds_to_a_division_of_the_power_of_two():
    # 3 MiB + 1: between 2 and 4 MiB; 4 divisions of 2 MiB are 512 KiB steps -> 3.5 MiB.
    # Without divisions: the next 512 B, 3 MiB + 512
    four = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert four.round_size(3 * MiB + 1) == 3 * MiB + MiB // 2
    assert AllocatorConfig().round_size(3 * MiB + 1) == 3 * MiB + 512
    assert four.round_size(4 * MiB) == 4 * MiB  # a power of two stays
    assert four.round_size(1000) == 1024  # not above 512 x 4 B: plain rounding


def test_a_small_block_is_split_for_the_next_request():
    # two 1000 B requests (1024 B each) share one 2 MiB segment: the first split it
    r = replay(allocs(1000, 1000))
    assert (r.peak_reserved, r.peak_allocated) == (2 * MiB, 2048)


def test_a_large_request_splits_a_20_mib_segment():
    # 5 MiB: seg 20 [5 live|15 free] (15 > 1 MiB: split); 5 MiB more from the 15: [5|5|10]
    r = replay(allocs(5 * MiB, 5 * MiB))
    assert (r.peak_reserved, r.peak_allocated) == (20 * MiB, 10 * MiB)


def test_a_large_block_is_not_split_for_a_remainder_of_1_mib_or_less():
    # 12 MiB: its own seg 12; freed and cached; 11 MiB takes the 12 MiB block whole (the 1 MiB
    # left is not > 1 MiB): 12 MiB allocated
    whole = replay([("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 11 * MiB)])
    assert (whole.peak_allocated, whole.peak_reserved) == (12 * MiB, 12 * MiB)
    # 10 MiB splits it [10|2 free]: a 2 MiB request then takes the cached 2, no new segment
    more = replay(
        [("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 10 * MiB), ("alloc", 2, 2 * MiB)]
    )
    assert (more.peak_allocated, more.peak_reserved) == (12 * MiB, 12 * MiB)
    # after the 11 MiB took it whole no rest is cached: 2 MiB opens a seg 20, 12 + 20 = 32
    rest = replay(
        [("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 11 * MiB), ("alloc", 2, 2 * MiB)]
    )
    assert rest.peak_reserved == 32 * MiB


def test_a_large_block_keeps_a_rest_of_exactly_1_mib():
    # seg 20: 6 -> [6|14], 6 -> [6|6|8]; 7 MiB leaves 1 MiB of the 8, not > 1 MiB: it takes
    # the 8 whole, 20 allocated. A third 6 leaves 2: split, 18 allocated
    assert replay(allocs(6 * MiB, 6 * MiB, 7 * MiB)).peak_allocated == 20 * MiB
    assert replay(allocs(6 * MiB, 6 * MiB, 6 * MiB)).peak_allocated == 18 * MiB


def test_free_neighbours_merge_within_a_segment():
    # 6, 6, 6 MiB in one seg 20: [6|6|6|2 free]. Free the first two: they merge to 12 free.
    # 11 MiB then fits the merged 12 (rest 1 MiB: no split): still 20 reserved. Unmerged, the
    # largest free block would be 6 and 11 MiB would open a 12 MiB segment: 32
    events = [*allocs(6 * MiB, 6 * MiB, 6 * MiB), ("free", 0), ("free", 1), ("alloc", 3, 11 * MiB)]
    r = replay(events)
    assert (r.peak_reserved, r.peak_allocated) == (20 * MiB, 18 * MiB)


def test_free_blocks_of_two_segments_never_merge():
    # 12 and 12 MiB: two segs of 12, adjacent in this replay's addresses. Both freed: two
    # cached 12s, not one 24. 24 MiB opens its own seg 24: 12 + 12 + 24 = 48 reserved
    events = [*allocs(12 * MiB, 12 * MiB), ("free", 0), ("free", 1), ("alloc", 2, 24 * MiB)]
    assert replay(events).peak_reserved == 48 * MiB


def test_the_small_pool_ends_at_1_mib():
    # 1 MiB exactly is small: a 2 MiB segment. 1 MiB + 1 B (1 MiB + 512) is large: 20 MiB
    assert replay(allocs(MiB)).peak_reserved == 2 * MiB
    assert replay(allocs(MiB + 1)).peak_reserved == 20 * MiB
    # and the pools do not share: a small request never takes a large block's free rest
    assert replay(allocs(MiB + 1, 1000)).peak_reserved == 22 * MiB


def test_large_segments_are_20_mib_below_10_mib_then_rounded_to_2_mib():
    # 10 MiB - 512 -> 20; 10 MiB -> 10; 10 MiB + 1 (10 MiB + 512) -> 12; 33 MiB -> 34
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB
    assert replay(allocs(10 * MiB + 1)).peak_reserved == 12 * MiB
    assert replay(allocs(33 * MiB)).peak_reserved == 34 * MiB


def test_at_the_cap_cached_segments_are_released_and_the_request_retried():
    # cap 40. 24 MiB: seg 24, freed (cached). 30 MiB: the cached 24 is too small; a new seg
    # 30 would make 54 > 40, so every cached whole segment goes (the 24), and 30 fits: peak 30.
    # Uncapped, nothing is released and the reserved peak is the 54 a no-flush replay would
    # have had to fit under the cap
    events = [("alloc", 0, 24 * MiB), ("free", 0), ("alloc", 1, 30 * MiB)]
    capped = replay(events, cap=40 * MiB)
    assert (capped.fits, capped.flushes, capped.peak_reserved) == (True, 1, 30 * MiB)
    assert replay(events).peak_reserved == 54 * MiB > 40 * MiB


def test_out_of_memory_where_it_does_not_fit():
    # cap 40: 24 MiB live + 30 MiB = 54 > 40, nothing cached to release: OOM at the 30 MiB
    r = replay(allocs(24 * MiB, 30 * MiB), cap=40 * MiB)
    assert (r.fits, r.oom_request, r.peak_reserved) == (False, 30 * MiB, 24 * MiB)
    # a split segment cannot be released: 5 MiB live in seg 20 [5|15 free]; 30 MiB needs
    # 20 + 30 = 50 > 40, the flush finds no whole segment (the 15 is part of a live one): OOM
    r = replay(allocs(5 * MiB, 30 * MiB), cap=40 * MiB)
    assert (r.fits, r.flushes) == (False, 1)


# five 8 MiB requests, all kept live: 40 MiB live
EIGHTS = allocs(*[8 * MiB] * 5)


def test_expandable_segments_fit_what_fragments_the_default_allocator():
    # default, cap 50: 8 -> seg A 20 [8|12]; 8 -> [8|8|4]; 8: the 4 is too small -> seg B 20
    # [8|12] (40 reserved); 8 -> B [8|8|4]; the fifth finds two 4s: a seg 20 would make
    # 60 > 50, no whole segment to release: OOM with 32 live
    default = replay(EIGHTS, cap=50 * MiB)
    assert (default.fits, default.peak_reserved, default.peak_allocated) == (
        False,
        40 * MiB,
        32 * MiB,
    )
    # expandable, cap 50: one segment of 20 MiB pages. 8 -> page 1 [8|12]; 8 -> [8|8|4];
    # 8: the 4 free + a second page mapped behind it (check: 20 + 20 <= 50) -> [..|8|16];
    # 8 -> [..|8|8]; 8 takes the last 8 whole: 40 reserved, 40 allocated, fits
    conf = AllocatorConfig.parse("expandable_segments:True")
    expandable = replay(EIGHTS, cap=50 * MiB, config=conf)
    assert (expandable.fits, expandable.peak_reserved, expandable.peak_allocated) == (
        True,
        40 * MiB,
        40 * MiB,
    )
    assert expandable.fragmentation == 0.0
    assert replay(EIGHTS).fragmentation == pytest.approx(60 / 40 - 1)  # default, uncapped


def test_expandable_segments_unmap_free_pages_at_the_cap():
    # expandable, cap 22. Three 1 MiB (small pool, 2 MiB pages): page 1 [1|1], page 2 mapped
    # for the third (2 + 2 <= 22): [1|1|1|1 free], 4 reserved. Free the 2nd and 3rd: they merge
    # with the free 4th: [1 live|3 free]. A 3 MiB request is large: a 20 MiB page, and
    # 4 + 20 = 24 > 22; the flush unmaps the one whole free page (page 2; 4 -> 2 reserved), and
    # 2 + 20 = 22 fits: peak 22
    conf = AllocatorConfig.parse("expandable_segments:True")
    events = [*allocs(MiB, MiB, MiB), ("free", 1), ("free", 2), ("alloc", 3, 3 * MiB)]
    r = replay(events, cap=22 * MiB, config=conf)
    assert (r.fits, r.flushes, r.peak_reserved) == (True, 1, 22 * MiB)
    # with the third kept live no page is wholly free ([1|1 free] and [1|1 free]): nothing to
    # unmap, 24 > 22: OOM
    events = [*allocs(MiB, MiB, MiB), ("free", 1), ("alloc", 3, 3 * MiB)]
    r = replay(events, cap=22 * MiB, config=conf)
    assert (r.fits, r.flushes, r.peak_reserved) == (False, 1, 4 * MiB)


def test_max_split_size_keeps_oversize_blocks_whole():
    # max_split_size 40 MiB. 50 MiB: seg 50, freed. 30 MiB: default splits the cached 50
    # ([30|20 free], 50 reserved); with the setting the 50 is oversize and a request under
    # 40 MiB may not take it: a new seg 30, 80 reserved
    events = [("alloc", 0, 50 * MiB), ("free", 0), ("alloc", 1, 30 * MiB)]
    conf = AllocatorConfig.parse("max_split_size_mb:40")
    assert replay(events).peak_reserved == 50 * MiB
    assert replay(events, config=conf).peak_reserved == 80 * MiB
    # 45 MiB (oversize itself) takes the cached 50 whole (50 < 45 + 20): 50 allocated;
    # from a cached 70 it may not (70 >= 45 + 20): a new seg 46, 116 reserved
    take = replay([("alloc", 0, 50 * MiB), ("free", 0), ("alloc", 1, 45 * MiB)], config=conf)
    assert (take.peak_allocated, take.peak_reserved) == (50 * MiB, 50 * MiB)
    refuse = replay([("alloc", 0, 70 * MiB), ("free", 0), ("alloc", 1, 45 * MiB)], config=conf)
    assert refuse.peak_reserved == 116 * MiB
    # at a cap of 70 the 30 MiB request (50 + 30 > 70) frees the one oversize cached block
    # first (release_available_cached_blocks): it fits without the full flush
    capped = replay(events, cap=70 * MiB, config=conf)
    assert (capped.fits, capped.flushes, capped.peak_reserved) == (True, 0, 50 * MiB)


def test_the_largest_batch_is_the_largest_that_replays_under_the_cap():
    # b requests of 8 MiB, cap 50: the default fits 4 (the fifth OOMs, above), expandable 5
    # (six would need a third page: 40 + 20 = 60 > 50)
    def trace(b: int) -> list[tuple]:
        return allocs(*[8 * MiB] * b)

    assert largest_batch(trace, 50 * MiB) == 4
    assert largest_batch(trace, 50 * MiB, AllocatorConfig(expandable_segments=True)) == 5


def test_alloc_conf_strings_parse_as_pytorch_parses_them():
    # c10/test/core/AllocatorConfig_test.cpp's example: the first value covers the sizes
    # below it, '>' those above the last one named
    conf = AllocatorConfig.parse(
        "max_split_size_mb:40,roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],"
        "expandable_segments:True"
    )
    assert (conf.max_split_size, conf.expandable_segments) == (40 * MiB, True)
    by_mb = {
        mb: conf.roundup_power2_divisions[mb.bit_length() - 1]
        for mb in (32, 64, 128, 1024, 2048, 8192)
    }
    assert by_mb == {32: 8, 64: 8, 128: 2, 1024: 4, 2048: 1, 8192: 1}
    gaps = AllocatorConfig.parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    assert [gaps.roundup_power2_divisions[i] for i in (6, 7, 8, 9, 10, 11, 12)] == [
        8,
        8,
        16,
        1,
        0,
        8,
        2,
    ]
    assert AllocatorConfig.parse("") == AllocatorConfig()


@pytest.mark.parametrize(
    ("conf", "key"),
    [
        ("foo:1", "foo"),
        ("max_split_size_mb:10", "max_split_size_mb"),
        ("max_split_size_mb:lots", "max_split_size_mb"),
        ("expandable_segments:yes", "expandable_segments"),
        ("roundup_power2_divisions:3", "roundup_power2_divisions"),
        ("roundup_power2_divisions:[100:4]", "roundup_power2_divisions"),
        ("garbage_collection_threshold:0.5", "garbage_collection_threshold"),
        ("backend:cudaMallocAsync", "backend"),
    ],
)
def test_a_bad_alloc_conf_is_one_line_naming_its_key(conf: str, key: str):
    with pytest.raises(ValueError, match=f"'{key}'") as err:
        AllocatorConfig.parse(conf)
    assert "\n" not in str(err.value)


def test_a_free_of_an_unknown_id_is_refused():
    with pytest.raises(ValueError, match="events"):
        replay([("free", 7)])


@pytest.mark.parametrize("grad", [False, True])
def test_the_trace_of_a_modeled_forward_peaks_where_the_tracker_does(grad: bool):
    # the trace is the tracker's own record: the running sum of its rounded requests
    # (weights and input first) peaks at tracked_peak's figure, to the byte, for a forward
    # and for one with autograd (its saved activations)
    with torch.device("meta"):
        layer = registry.create("vanilla", d_model=64, n_heads=4, max_seq_len=128)
        x = torch.empty(3, 128, 64)
    weights = [t.untyped_storage().nbytes() for t in layer.parameters()]
    base_sizes = [*weights, x.untyped_storage().nbytes()]
    events = traced(lambda: layer(x), base_sizes, grad=grad)
    peak = live_peak(events)
    base = module_bytes(layer) + rounded(x.nbytes)
    assert sum(rounded(n) for n in base_sizes) == base
    assert peak == tracked_peak(lambda: layer(x), base, grad=grad) > base
    assert any(e[0] == "free" for e in events)  # the forward's transients come and go
    freed = {e[1] for e in events if e[0] == "free"}
    assert not freed & set(range(len(base_sizes)))  # the weights and input stay
    # replayed, every request of a layer this small is <= 1 MiB: small-pool blocks split off
    # exactly the rounded request (remainders are multiples of 512 B), so the allocator's
    # allocated peak is the trace's, and it reserves whole 2 MiB segments
    r = replay(events)
    assert max(e[2] for e in events if e[0] == "alloc") <= MiB
    assert (r.fits, r.peak_allocated, r.peak_reserved % (2 * MiB)) == (True, peak, 0)
