"""PyTorch's CUDA caching allocator, replayed over a trace of allocations and frees.

A cap set by ``set_per_process_memory_fraction`` limits what the allocator *reserves* (whole
segments, cached free blocks included), not what tensors hold, so a forward whose live bytes
fit can still fail: its freed blocks are of sizes the next request cannot use. The allocator
is deterministic given the order of its calls, which the meta-device model records
(:func:`attnbench.measure.memory.traced`), so its reserved peak can be predicted without a GPU.

Every rule is the one in ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``;
the function named beside each), the settings those of ``c10/core/AllocatorConfig.cpp``.
What it leaves out, as a single-stream forward never meets it: other streams and their
events, CUDA graphs' private pools, ``garbage_collection_threshold`` (refused), and the
device's own out-of-memory below the cap. cudaMalloc's addresses are unknowable; new
segments take rising addresses, which only order equal-size blocks (best fit is by size,
then address). Pure Python: nothing here needs torch.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnbench.measure.allocator_rules import (
    LARGE_BUFFER,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
    Block,
    Pool,
    allocation_size,
)
from attnbench.measure.search import largest_fitting

_ADDRESS_SPACE = 1 << 48  # an expandable segment's reserved range: never the limit here


@dataclass(frozen=True)
class Replay:
    """What the allocator did over one trace: its peaks, and whether every request fit."""

    peak_reserved: int  # torch.cuda.max_memory_reserved
    peak_allocated: int  # torch.cuda.max_memory_allocated (blocks as handed out)
    allocated_at_peak: int  # the most allocated while reserved stood at its peak
    fits: bool  # False: a request could not be served under the cap (an OOM)
    oom_request: int | None  # the bytes of that request
    flushes: int  # cache releases to retry a request (memory_stats' num_alloc_retries)

    @property
    def fragmentation(self) -> float:
        """Reserved over allocated, less one, at the reserved peak: the cached space no
        request could use."""
        return self.peak_reserved / self.allocated_at_peak - 1 if self.allocated_at_peak else 0.0


class _Allocator:
    """The allocator's state for one replay: ``DeviceCachingAllocator`` on one stream."""

    def __init__(self, config: AllocatorConfig, cap: int | None) -> None:
        self.c, self.cap = config, cap
        self.pools = (Pool(small=False), Pool(small=True))  # release order: large first
        self.reserved = self.allocated = self.flushes = 0
        self.peak_reserved = self.peak_allocated = self.at_peak = 0
        self.top = SMALL_BUFFER  # the next new segment's address

    def malloc(self, nbytes: int) -> Block | None:
        """``malloc``: a cached block, else a new segment, else the same after releasing
        cached oversize blocks, else after releasing every cached whole segment; None: OOM."""
        size = self.c.round_size(nbytes)
        pool = self.pools[size <= SMALL_SIZE]
        block = self._cached(pool, size)
        if block is None:
            want = allocation_size(size)
            block = self._new(pool, size, want)
            if block is None and self._release_oversize(pool, size):
                block = self._new(pool, size, want)
            if block is None:
                self.flushes += 1
                self._release_cached()
                block = self._new(pool, size, want)
            if block is None:
                return None
        if self.c.should_split(pool.small, block.size, size):
            rest, block = block, Block(size, block.addr, pool, block.page, block.base)
            block.link(rest.prev, rest)  # alloc_found_block: the request takes the low end
            rest.addr, rest.size = rest.addr + size, rest.size - size
            pool.add(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        if self.reserved > self.peak_reserved:
            self.peak_reserved, self.at_peak = self.reserved, self.allocated
        elif self.reserved == self.peak_reserved:
            self.at_peak = max(self.at_peak, self.allocated)
        return block

    def free(self, block: Block) -> None:
        """``free_block``: merge with free neighbours of the same segment, then cache it."""
        block.allocated = False
        self.allocated -= block.size
        for other in (block.prev, block.next):
            self._merge(block, other)
        block.pool.add(block)

    def _cached(self, pool: Pool, size: int) -> Block | None:
        """``get_free_block``: the smallest cached block that fits, lowest address first."""
        keys = pool.keys
        i = bisect_left(keys, (size, 0))
        if i == len(keys):
            return None
        block = pool.free[keys[i][1]]
        if block.page:  # expandable: the size it can grow to decides among equals

            def grows(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while i + 1 < len(keys) and grows(nxt := pool.free[keys[i + 1][1]]) < grows(block):
                i, block = i + 1, nxt
        mss = self.c.max_split_size
        if size < mss <= block.size or mss <= size <= block.size - self.c.max_non_split_rounding:
            return None  # an oversize block serves only a request within the rounding of it
        pool.remove(block)
        return block

    def _new(self, pool: Pool, size: int, want: int) -> Block | None:
        """``alloc_block``: past the cap, nothing; else a new segment of ``want`` bytes, or
        with expandable segments the pages that make ``size`` fit."""
        if self.cap is not None and self.reserved + want > self.cap:
            return None
        if self.c.expandable_segments:
            return self._expand(pool, size)
        self.reserved += want
        self.top += want
        return Block(want, self.top - want, pool)

    def _release_oversize(self, pool: Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with max_split_size set, free the smallest
        cached oversize block that covers the request, else the largest ones until they do."""
        mss = self.c.max_split_size
        if mss == SIZE_MAX:
            return False
        key = max(size, mss)
        i = bisect_left(pool.keys, (key, 0))
        if i < len(pool.keys) and not (block := pool.free[pool.keys[i][1]]).page:
            self._release(block)
            return True
        released = 0
        for bytes_, addr in reversed(pool.keys[:i]):
            if released >= key or bytes_ < mss:
                break
            if not (block := pool.free[addr]).page:
                self._release(block)
                released += bytes_
        return released >= key

    def _release_cached(self) -> None:
        """``release_cached_blocks``: free every cached whole segment; of expandable ones,
        unmap every free page (``release_blocks``, ``unmap_block``)."""
        for pool in self.pools:
            blocks = [pool.free[addr] for _, addr in list(pool.keys)]
            for block in blocks:
                if not block.page and block.prev is None and block.next is None:
                    self._release(block)
            for block in (b for b in blocks if b.page):
                self._unmap(block)
                if not block.mapped and block.prev is None and block.next is None:  # all gone
                    pool.unmapped.remove(block)

    def _release(self, block: Block) -> None:
        block.pool.remove(block)  # release_block: cudaFree
        self.reserved -= block.size

    def _merge(self, dst: Block, src: Block | None) -> None:
        """``try_merge_blocks``: ``dst`` absorbs its free neighbour ``src`` of the same mapping."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            dst.pool.remove(src)
        else:
            dst.pool.unmapped.remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.link(src.prev, dst.next)
        else:
            dst.link(dst.prev, src.next)
        dst.size += src.size

    def _expand(self, pool: Pool, size: int) -> Block:
        """``try_allocate_expandable_block``: the lowest free-or-unmapped stretch of the
        pool's segment with room for ``size``, its unmapped part mapped page by page."""
        block = None
        for gap in pool.unmapped:  # find_expandable_block
            start = gap.prev if gap.prev is not None and not gap.prev.allocated else gap
            room, b = 0, start
            while room < size and b is not None and not b.allocated:
                room, b = room + b.size, b.next
            if room >= size:
                block = start
                break
        if block is None:  # a new segment: 2 MiB pages for the small pool, 20 MiB for large
            page = SMALL_BUFFER if pool.small else LARGE_BUFFER
            block = Block(_ADDRESS_SPACE, self.top, pool, page, self.top, mapped=False)
            self.top += _ADDRESS_SPACE
            insort(pool.unmapped, block, key=lambda b: b.addr)
        if not block.mapped:
            self._map(block, min(block.size, size))
        while block.size < size:
            nxt = block.next
            self._map(nxt, min(size - block.size, nxt.size))  # merges block into nxt
            block = nxt
        pool.remove(block)
        return block

    def _map(self, block: Block, size: int) -> None:
        """``map_block``: back the first pages of an unmapped range that hold ``size``."""
        pool, mapped = block.pool, -(-size // block.page) * block.page
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.size - mapped, block.addr + mapped, pool, block.page, block.base)
            rest.mapped = False
            rest.link(block, block.next)
            insort(pool.unmapped, rest, key=lambda b: b.addr)
            block.size = mapped
        for other in (block.prev, block.next):
            self._merge(block, other)
        pool.add(block)
        self.reserved += mapped

    def _unmap(self, block: Block) -> None:
        """``unmap_block``: give back the whole pages inside a free expandable block; what
        is left of it on either side stays cached."""
        page, pool = block.page, block.pool
        first = -(-(block.addr - block.base) // page) * page + block.base
        last = (block.addr + block.size - block.base) // page * page + block.base
        if first >= last:
            return
        pool.remove(block)
        if first > block.addr:
            before = Block(first - block.addr, block.addr, pool, page, block.base)
            before.link(block.prev, block)
            pool.add(before)
        if last < block.addr + block.size:
            after = Block(block.addr + block.size - last, last, pool, page, block.base)
            after.link(block, block.next)
            pool.add(after)
        block.addr, block.size, block.mapped = first, last - first, False
        for other in (block.prev, block.next):
            self._merge(block, other)
        insort(pool.unmapped, block, key=lambda b: b.addr)
        self.reserved -= last - first

    def result(self, oom: int | None) -> Replay:
        return Replay(
            self.peak_reserved, self.peak_allocated, self.at_peak, oom is None, oom, self.flushes
        )


def replay(
    events: Sequence[tuple], cap: int | None = None, config: AllocatorConfig | None = None
) -> Replay:
    """Replay ``events`` (``("alloc", id, bytes)`` / ``("free", id)``, as
    :func:`attnbench.measure.memory.traced` records them) through the allocator under
    ``cap`` allowed bytes (``set_per_process_memory_fraction`` × the card's memory; None:
    no cap). It stops at the first request that does not fit."""
    alloc = _Allocator(config or AllocatorConfig(), cap)
    live: dict[int, Block | None] = {}
    for event in events:
        if event[0] == "alloc" and len(event) == 3:
            block = alloc.malloc(event[2]) if event[2] else None  # 0 bytes: no call
            if event[2] and block is None:
                return alloc.result(event[2])
            live[event[1]] = block
        elif event[0] == "free" and len(event) == 2 and event[1] in live:
            if (block := live.pop(event[1])) is not None:
                alloc.free(block)
        else:
            raise ValueError(f"events: ('alloc', id, bytes) or ('free', live id), got {event!r}")
    return alloc.result(None)


def largest_batch(
    trace_of: Callable[[int], Sequence[tuple]],
    cap: int,
    config: AllocatorConfig | None = None,
    guess: int = 1,
) -> int:
    """The largest b whose trace ``trace_of(b)`` replays under ``cap``; 0: not even b = 1.

    A bisection (:func:`attnbench.measure.search.largest_fitting`), so it assumes that
    fitting is monotone in b: it is for live bytes, but fragmentation need not be, so a b
    above the answer may happen to fit, and one below it not, unnoticed.
    """
    return largest_fitting(lambda b: replay(trace_of(b), cap, config).fits, guess)[0]
