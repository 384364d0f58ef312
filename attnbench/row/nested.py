"""The objects a row stores a workload's figures in (``packed``, ``prompts``, ``decode``,
``modeled_step``),
declared once: each key's check and those a report reads, so that a hand-edited row missing
one is a line naming it (``cells.jsonl:3: packed.real_tokens: missing``), never a
``KeyError`` inside a report. The per-value checks are :mod:`attnbench.row.checks`'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.row.checks import (
    count,
    json_value,
    lengths,
    mapping,
    number,
    positive,
    samples,
    seconds,
    share,
    text,
)
from attnbench.validators import check_choice


def _or_null(check: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    return lambda name, value: None if value is None else check(name, value)


@dataclass(frozen=True)
class Nested:
    """An object a row stores a workload's figures in, declared once: the check of each key
    it may hold and those every such object must hold (``required``: all a report reads, so
    that a hand-edited row missing one is a line naming it, never a ``KeyError`` in a
    report). Any other key is a JSON value (:func:`json_value`), kept as it is."""

    checks: dict[str, Callable[[str, Any], None]]
    required: frozenset[str] = frozenset()

    def __call__(self, name: str, value: Any) -> None:
        mapping(name, value)
        json_value(name, value)
        for key in (k for k in self.checks if k in self.required and k not in value):
            raise ValueError(f"{name}.{key}: missing")
        for key, v in value.items():
            if key in self.checks:
                self.checks[key](f"{name}.{key}", v)

    def extended(self, checks: dict[str, Callable[[str, Any], None]]) -> Nested:
        """This object's keys and ``checks``, all required: a draw's record and a workload's
        figures beside it."""
        return Nested({**self.checks, **checks}, self.required | set(checks))


# a draw's record (attnbench.lengths.summary): its lengths and the padded layout's arithmetic
DRAW = Nested(
    {"lengths": lengths, "documents": positive, "real_tokens": positive,
     "padded_tokens": positive, "padding_share": share, "max_len": positive},
    frozenset({"lengths", "documents", "real_tokens", "padded_tokens", "padding_share",
               "max_len"}),
)  # fmt: skip
# a packed row's draw and FLOPs per copy (attnbench/workload/packed.py): the wasted share is
# below 0 where one pass over the row costs less than each document alone
packed = DRAW.extended(
    {"layout_tokens": positive, "batches": positive, "flops_real": count, "flops_layout": count,
     "flops_wasted_share": lambda name, v: number(name, v, low=None, high=1)}
)  # fmt: skip
# a decode row's mix of contexts (attnbench/workload/decode.py, contexts=drawn): the draw, a
# sequence's own cache or state bytes on average, the share of the allocated ones its left
# padding takes
prompts = DRAW.extended({"own_state_bytes": count, "state_padding_share": share})
# a decode row's serving figures (attnbench/workload/decode.py): each may be null (no prefill
# timed: filled_by random) or absent (own_*: a mix only); a report reads them with .get
decode = Nested(
    {
        **dict.fromkeys(("prefill_s", "prefill_iqr_s", "tokens_per_s", "bytes_per_s",
                         "copy_bytes_per_s"), _or_null(seconds)),
        **dict.fromkeys(("prefill_chunk", "steps", "context", "read_bytes", "state_read_bytes",
                         "own_context", "own_state_read_bytes"), _or_null(count)),
        "prefill_samples_s": _or_null(samples),
    }
)  # fmt: skip


def _by_kind(name: str, value: Any) -> None:
    """A schedule's kinds, each its mechanism, layers and bytes (what a report sums)."""
    mapping(name, value)
    for kind, entry in value.items():
        mapping(f"{name}.{kind}", entry)
        for key, check in (("mechanism", text), ("layers", count), ("bytes", count)):
            if key not in entry:
                raise ValueError(f"{name}.{kind}.{key}: missing")
            check(f"{name}.{kind}.{key}", entry[key])


# a decode row's step modeled over its preset's datasheet (attnbench/measure/roofline.py):
# every key a report reads is required
modeled_step = Nested(
    {
        **dict.fromkeys(("batch", "context", "read_bytes", "state_read_bytes", "weight_bytes",
                         "flops"), count),
        **dict.fromkeys(("bandwidth_bytes_per_s", "memory_s", "compute_s", "step_s",
                         "per_token_s"), seconds),
        "peak_flops_per_s": _or_null(seconds),
        "bound": lambda name, v: check_choice(name, v, ("memory", "compute")),
        "state_by_kind": lambda name, v: _by_kind(name, v),
    },
    frozenset({"batch", "read_bytes", "state_read_bytes", "weight_bytes", "flops",
               "bandwidth_bytes_per_s", "step_s", "per_token_s", "bound", "state_by_kind"}),
)  # fmt: skip
# the nested objects of the schema's fields, by field (tests/test_hostile.py fuzzes each key)
NESTED = {"packed": packed, "prompts": prompts, "decode": decode, "modeled_step": modeled_step}
