"""``mode=decode contexts=drawn``: serving a mix of prompt lengths, each sequence its own.

Sequence i's prompt is the draw's i-th length (:mod:`attnbench.workload.draw`, the same draw
as packed's documents; a batch larger than the draw takes its lengths again, in turn). A mix
is served from a static cache: every cache, ring or state is allocated for the longest
prompt plus ``decode_tokens``, and every shorter prompt is left-padded to it, its padding
masked. So the longest prompt decides the max batch and a step reads every cache up to it;
what each sequence's own prompt holds is recorded beside (:func:`own_figures`,
:func:`prompts_field`), what an engine with caches of each sequence's own length would hold.
The scenario that serves it (:class:`~attnbench.workload.decode_memory.ServingScenario`)
marks each slot's left padding instead of prefilling every prompt (``pad_left``).
"""

from __future__ import annotations

import statistics
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from torch import nn

import attnbench.lengths as draws
from attnbench.validators import check_int
from attnbench.workload.base import setting
from attnbench.workload.draw import draw_of, draw_words

if TYPE_CHECKING:
    from attnbench.cell import Cell

CONTEXTS = ("n", "drawn")
WARMUP = 2  # decode steps not counted: the first ones pay for lazy initialisation
# The most tokens a cell generates: each is a step a GPU times in full (no budget there), ~11
# minutes at 10 ms a step; the steps' mean context, n + decode_tokens / 2, is n's to set.
MAX_DECODE_TOKENS = 1 << 16


def timed_tokens(name: str, value: Any) -> int:
    """``decode_tokens``' check: more tokens than the :data:`WARMUP` steps, so that at least
    one step is timed (the rule ``Decode.time`` applies, checked before anything runs), and
    at most :data:`MAX_DECODE_TOKENS`."""
    tokens = check_int(name, value)
    if tokens <= WARMUP:
        raise ValueError(
            f"{name}: must be an integer > {WARMUP} (the first {WARMUP} steps are warm-up, not "
            f"timed), got {value!r}"
        )
    if tokens > MAX_DECODE_TOKENS:
        raise ValueError(
            f"{name}: must be an integer <= {MAX_DECODE_TOKENS} (each token is a step a GPU "
            f"times; a longer context is n's to set), got {value!r}"
        )
    return tokens


@lru_cache(maxsize=256)
def prompts(cell: Cell) -> tuple[int, ...] | None:
    """``contexts=drawn``: the cell's draw, the prompts' lengths in the order sequences take
    them (sequence i the draw's i mod D-th); ``contexts=n``: None, every prompt n tokens."""
    return draw_of(cell) if setting(cell, "contexts") == "drawn" else None


def prompt_len(cell: Cell) -> int:
    """The longest prompt: what every slot is positioned after (the others are left-padded
    to it) and every cache allocated for, as a static cache is for its longest."""
    lengths = prompts(cell)
    return cell.n if lengths is None else max(lengths)


def left_pads(cell: Cell, b: int) -> list[int] | None:
    """Each of b sequences' left padding, the longest prompt less its own; None without a
    mix (every prompt n)."""
    lengths = prompts(cell)
    if lengths is None:
        return None
    longest = max(lengths)
    return [longest - lengths[i % len(lengths)] for i in range(b)]


def context(cell: Cell, prompt: int | None = None) -> int:
    """The mean number of positions a timed step's new token reads (itself included): the
    prompt (the longest, its left padding included, unless ``prompt`` names one), the steps
    before it, itself. What FLOPs and bytes per token are given at."""
    n = prompt_len(cell) if prompt is None else prompt
    tokens = setting(cell, "decode_tokens")
    first, last = n + WARMUP + 1, n + tokens
    return (first + last) // 2 if tokens > WARMUP else n + 1


def mix_label(item: Any) -> str:
    """A label's words for a mix of contexts (:func:`~attnbench.workload.draw.draw_words`),
    from the settings alone: a cell's or a stored row's alike."""
    return f", contexts {draw_words(item)}" if setting(item, "contexts") == "drawn" else ""


def own_figures(model: nn.Module, cell: Cell, b: int, itemsize: int) -> dict[str, Any]:
    """With a mix, a timed row's: the mean context the b sequences' own tokens make, and the
    bytes their caches or states hold at it (what a step reads of real tokens beside
    ``state_read_bytes``, padding included); without one, nothing."""
    pads = left_pads(cell, b)
    if pads is None:
        return {}
    own = [context(cell, prompt_len(cell) - pad) for pad in pads]
    return {
        "own_context": round(statistics.fmean(own)),
        "own_state_read_bytes": sum(model.state_bytes(c, itemsize) for c in own),
    }


def prompts_field(model: nn.Module, cell: Cell, itemsize: int) -> dict[str, Any]:
    """The bytes one sequence is allocated at the longest prompt plus decode_tokens
    (``state_bytes``) and, with a mix, the row's ``prompts``: the draw, a sequence's own
    bytes (the draw's mean) and the share of the allocated ones its padding takes."""
    tokens = setting(cell, "decode_tokens")
    static = model.state_bytes(prompt_len(cell) + tokens, itemsize)
    lengths = prompts(cell)
    if lengths is None:
        return {"state_bytes": static}
    own = statistics.fmean(model.state_bytes(n + tokens, itemsize) for n in lengths)
    mix = {"own_state_bytes": round(own), "state_padding_share": 1 - own / static}
    return {"state_bytes": static, "prompts": {**draws.summary(lengths), **mix}}
