"""The cell's draw of lengths: an explicit list, or lengths drawn from a seeded distribution
under a token budget (:mod:`attnbench.lengths`). One declaration of its settings, shared by
``mode=packed`` (the documents) and ``mode=decode`` (each sequence's prompt, with
``contexts=drawn``), so that a draw means the same in both and is checked in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attnbench.lengths as draws
from attnbench.settings import Setting, choice, integer
from attnbench.workload.base import setting


def _lengths(name: str, value: Any) -> tuple[int, ...] | None:
    """An explicit list of lengths (each checked against n later, with the cell), or null."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name}: must be a list of lengths or null, got {value!r}")
    return draws.explicit(value, max_len=None)


DRAW = (
    Setting("lengths", None, "the lengths (packed: the documents', decode: the prompts'), each "
            "1..n; null: drawn by `distribution`",
            tuple | None, _lengths),
    Setting("distribution", "lognormal", "how lengths are drawn: "
            + ", ".join(f"`{d}`" for d in draws.DISTRIBUTIONS), str, choice(draws.DISTRIBUTIONS)),
    Setting("total_tokens", 16384, "the draw's budget: lengths are drawn until the next would "
            "pass it", int, integer()),
    Setting("length_mean", 1024, "the drawn lengths' mean (lognormal)", int, integer()),
    Setting("length_min", 16, "the shortest a drawn length may be", int, integer()),
    Setting("length_seed", 0, "the draw's seed: the same seed, the same lengths", int,
            integer(low=0)),
)  # fmt: skip


# the distribution's own settings: unused where the lengths are given
DRAWN = tuple(s.name for s in DRAW if s.name != "lengths")


def in_use(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` less the distribution's where explicit ``lengths`` replace the draw: two
    cells of one list of lengths are one cell, whatever their unused ``distribution``."""
    if settings.get("lengths") is None:
        return settings
    return {k: v for k, v in settings.items() if k not in DRAWN}


def draw_of(cell: Any) -> tuple[int, ...]:
    """The cell's lengths: its explicit ``lengths``, else its seeded draw (none above n)."""
    given = setting(cell, "lengths")
    if given is not None:
        return draws.explicit(given, max_len=cell.n)
    return draws.draw(
        setting(cell, "distribution"),
        total_tokens=setting(cell, "total_tokens"),
        seed=setting(cell, "length_seed"),
        max_len=cell.n,
        length_min=setting(cell, "length_min"),
        length_max=cell.n,
        length_mean=setting(cell, "length_mean"),
    )


def draw_words(item: Any) -> str:
    """A draw in a few words, from the settings alone (a cell's or a stored row's alike):
    the explicit lengths' range and count, or the distribution and its mean."""
    given = setting(item, "lengths")
    if given is not None:
        return f"{min(given)}..{max(given)} ×{len(given)}"
    return f"{setting(item, 'distribution')} mean {setting(item, 'length_mean')}"
