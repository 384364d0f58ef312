"""The CUDA caching allocator's sizes, settings and blocks, as the replay
(:mod:`attnbench.measure.allocator`) uses them.

The sizes are ``c10/cuda/CUDACachingAllocator.cpp``'s constants; the settings those
``PYTORCH_CUDA_ALLOC_CONF`` sets (``c10/core/AllocatorConfig.cpp``), parsed as it parses them;
the blocks its ``Block`` and ``BlockPool``, with only what a replay needs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize: every size is rounded to a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segments (and expandable pages)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: large requests below it take a kLargeBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer: their segment (and the large pool's expandable page)
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to it
SIZE_MAX = (1 << 64) - 1  # max_split_size's default: no block is too big to split
_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB, 2 MiB, ... 32 GiB and above
# PYTORCH_CUDA_ALLOC_CONF keys that change nothing of device blocks' layout
_HOST_ONLY = {
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
}


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings that change the replay, as ``PYTORCH_CUDA_ALLOC_CONF`` sets them."""

    expandable_segments: bool = False
    max_split_size: int = SIZE_MAX  # bytes; blocks this big are never split
    max_non_split_rounding: int = LARGE_BUFFER  # bytes an oversize block may exceed a request
    # divisions per power-of-two interval from 1 MiB (index 0) up; 0 or 1: plain 512 B rounding
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS

    def __post_init__(self) -> None:
        for name in ("max_split_size", "max_non_split_rounding"):
            if getattr(self, name) < LARGE_BUFFER:  # AllocatorConfig::parseMaxSplitSize
                raise ValueError(f"{name}: at least {LARGE_BUFFER} bytes (20 MB)")
        divs = self.roundup_power2_divisions
        if len(divs) != _INTERVALS or any(d and not _pow2(d) for d in divs):
            raise ValueError(f"roundup_power2_divisions: {_INTERVALS} values, each 0 or 2^k")

    @classmethod
    def parse(cls, conf: str) -> AllocatorConfig:
        """From a ``PYTORCH_CUDA_ALLOC_CONF`` string (``AllocatorConfig::parseArgs``), e.g.
        ``"expandable_segments:True,max_split_size_mb:128"``; a key this replay does not know
        or cannot honour, or a bad value, is one ValueError line naming the key."""
        kw: dict = {}
        for item in _split(conf):
            key, _, value = (s.strip() for s in item.partition(":"))
            bad = f"PYTORCH_CUDA_ALLOC_CONF key {key!r}"
            if key == "expandable_segments" and value in ("True", "False"):
                kw[key] = value == "True"
            elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                if not value.isdigit() or int(value) < LARGE_BUFFER >> 20:
                    raise ValueError(f"{bad}: an integer >= 20 (MB), got {value!r}")
                kw[key.removesuffix("_mb")] = int(value) << 20
            elif key == "roundup_power2_divisions":
                kw[key] = _divisions(value, bad)
            elif key in _HOST_ONLY or (key == "backend" and value == "native"):
                pass
            elif key in ("expandable_segments", "backend"):
                raise ValueError(f"{bad}: True or False (backend: native), got {value!r}")
            else:
                raise ValueError(
                    f"{bad}: unknown or not replayed; replayed: expandable_segments,"
                    " max_split_size_mb, max_non_split_rounding_mb, "
                    "roundup_power2_divisions"
                )
        return cls(**kw)

    def should_split(self, small: bool, block: int, size: int) -> bool:
        """Whether a cached block of ``block`` bytes that serves ``size`` keeps the rest cached
        (``should_split``): any 512 B of it in the small pool or an expandable segment, over
        1 MiB in the large pool, and none for a request of max_split_size or more."""
        if small or self.expandable_segments:
            return block - size >= MIN_BLOCK
        return size < self.max_split_size and block - size > SMALL_SIZE

    def round_size(self, size: int) -> int:
        """Bytes a request of ``size`` takes (``round_size``, ``roundup_power2_next_division``)."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        index = min(max(size.bit_length() - 1 - 20, 0), _INTERVALS - 1)
        divisions = self.roundup_power2_divisions[index]
        if divisions > 1 and size > MIN_BLOCK * divisions:
            if _pow2(size):
                return size
            floor = 1 << (size.bit_length() - 1)
            step = floor >> (divisions.bit_length() - 1)
            if step == 0:
                return floor << 1
            return -(-size // step) * step
        return -(-size // MIN_BLOCK) * MIN_BLOCK


WORDS = {"default": "", "expandable": "expandable_segments:True"}  # the setting's names


def from_setting(value: str) -> AllocatorConfig:
    """The cell's ``allocator`` setting as the allocator's configuration: ``default``,
    ``expandable`` (``expandable_segments:True``) or a ``PYTORCH_CUDA_ALLOC_CONF`` string;
    a bad one is one ValueError line naming ``allocator``."""
    try:
        return AllocatorConfig.parse(conf_string(value))
    except ValueError as e:
        raise ValueError(f"allocator: {e}; or default, expandable") from None


def conf_string(value: str) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` a real run of the setting sets for its process."""
    return WORDS.get(value, value)


def _split(conf: str) -> list[str]:
    """``conf``'s ``key:value`` items: commas inside ``[...]`` belong to the value."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(conf + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(conf[start:i])
            start = i + 1
    return [item for item in items if item.strip()]


def _divisions(value: str, bad: str) -> tuple[int, ...]:
    """``roundup_power2_divisions``: one power of two for every size, or ``[mb:d,...,>:d]``
    (``parseRoundUpPower2Divisions``: the first interval's value also covers the sizes below
    it; ``>`` every interval above the last one named, as c10/test/core/AllocatorConfig_test
    holds)."""
    try:
        if not value.startswith("["):
            if not _pow2(int(value)):
                raise ValueError
            return (int(value),) * _INTERVALS
        table, last = [0] * _INTERVALS, -1
        for part in value.strip("[]").split(","):
            mb, _, div = (s.strip() for s in part.partition(":"))
            d = int(div)
            if d and not _pow2(d):
                raise ValueError
            if mb == ">":
                table[last + 1 :] = [d] * (_INTERVALS - last - 1)
                continue
            if not _pow2(int(mb)):
                raise ValueError
            index = min(int(mb).bit_length() - 1, _INTERVALS - 1)
            if last < 0:
                table[:index] = [d] * index
            table[index], last = d, index
        return tuple(table)
    except ValueError:
        raise ValueError(
            f"{bad}: a power of 2 or [MB:divisions,...,>:divisions], with MB "
            f"and divisions powers of 2 (divisions may be 0), got {value!r}"
        ) from None


def allocation_size(size: int) -> int:
    """The segment a rounded request opens when no cached block fits (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False, slots=True)
class Block:
    """A range of one segment (``Block``): blocks of a segment are linked through prev/next,
    and only those ever merge."""

    size: int
    addr: int
    pool: Pool
    page: int = 0  # an expandable segment's page size; 0: a cudaMalloc'd segment
    base: int = 0  # an expandable segment's first address, where its pages start
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = None
    next: Block | None = None

    def link(self, prev: Block | None, nxt: Block | None) -> None:
        """Put this block between ``prev`` and ``nxt`` (``Block::splice``)."""
        self.prev, self.next = prev, nxt
        if prev is not None:
            prev.next = self
        if nxt is not None:
            nxt.prev = self


@dataclass(eq=False)
class Pool:
    """One pool's cached free blocks, in ``BlockComparatorSize`` order (size, then address),
    and an expandable segment's unmapped ranges in address order (``BlockPool``)."""

    small: bool
    keys: list[tuple[int, int]] = field(default_factory=list)
    free: dict[int, Block] = field(default_factory=dict)
    unmapped: list[Block] = field(default_factory=list)

    def add(self, b: Block) -> None:
        insort(self.keys, (b.size, b.addr))
        self.free[b.addr] = b

    def remove(self, b: Block) -> None:
        del self.keys[bisect_left(self.keys, (b.size, b.addr))]
        del self.free[b.addr]
