"""A toy row field, from this file alone: ``toy_seqs_per_s``, the sequences a second the
timed step gets through (1 / ``time_per_seq_s``), stored in every row from the moment the
plugin is loaded (``ATTNBENCH_PLUGINS=tests.toys.toy_field``), read back checked, and a
column of ``attnbench.load``."""

from __future__ import annotations

from typing import Any

from attnbench.row.checks import seconds
from attnbench.row.fields import Field, register


def seqs_per_s(fields: dict[str, Any]) -> float | None:
    """From the figures the row was assembled from; None where nothing was timed."""
    per_seq = fields.get("time_per_seq_s")
    return 1.0 / per_seq if per_seq else None


TOY_FIELD = register(
    Field("toy_seqs_per_s", float | None, seconds, "1/s", "time",
          "sequences per second (a test's toy field)"),
    seqs_per_s,
)  # fmt: skip
