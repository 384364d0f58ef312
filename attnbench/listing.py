"""``attnbench list``: every mechanism, what it can do and whether it runs here; and the
README's table of them (``list --markdown``; ``python -m attnbench.mirrors`` writes it into
the README)."""

from __future__ import annotations

import argparse
import re

from attnbench import commands


def decode_cell(why: str | None) -> str:
    """The ``decode`` column: yes, or why not cut to its first clause (the whole reason is
    ``info().cannot_decode``)."""
    return "yes" if why is None else re.split(r"[:;(]", why, maxsplit=1)[0].strip()


WEIGHTS_N = 4096  # the length a fixed-length mechanism's weights (Linformer's E, F) are sized for


def layer_weights(name: str) -> str:
    """Parameters of one layer of ``name`` at its defaults, in the base model's shape
    (conf/model/base.yaml) and n = :data:`WEIGHTS_N`, counted on meta; vanilla's are
    4·d·(d + 1). ``-`` where the layer cannot be built here."""
    from importlib.resources import files

    import torch
    from omegaconf import OmegaConf

    from attnbench import registry

    # the package's own copy of conf/ (attnbench.conf): the one an installed wheel has
    base = OmegaConf.load(str(files("attnbench.conf") / "model" / "base.yaml"))
    try:
        with torch.device("meta"):
            layer = registry.create(
                name, d_model=base.d_model, n_heads=base.n_heads, max_seq_len=WEIGHTS_N
            )
    except Exception:  # a mechanism whose package is absent: its row says so already
        return "-"
    return f"{sum(p.numel() for p in layer.parameters()) / 1e6:.2f}M"


def mechanism_rows() -> list[tuple[str, ...]]:
    """One row per mechanism from ``info()``: the source of README's table and ``list``."""
    from attnbench import registry  # loads torch: not for --help

    rows = []
    for name in registry.names():
        i = registry.info(name)
        rows.append(
            (
                name,
                i.summary,
                "only" if i.causal_only else "yes" if i.causal else "no",
                "yes" if i.padding_mask else "no",
                ", ".join(i.devices),
                ", ".join(i.dtypes),
                i.budget or "-",
                decode_cell(i.cannot_decode),
                "yes" if i.gqa else "no",
                "yes" if i.compiles else "no",
                layer_weights(name),
                i.limits or "-",
            )
        )
    return rows


HEADERS = (
    "name",
    "what",
    "causal",
    "padding mask",
    "devices",
    "dtypes",
    "budget (k)",
    "decode",
    "gqa",
    "compiles",
    "weights/layer",
    "limits",
)


def markdown_table() -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", r"\|") for c in r) + " |" for r in mechanism_rows()]
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    from attnbench import registry

    if args.markdown:
        print(markdown_table())
        return 0
    from rich.table import Table

    table = Table(*HEADERS, "available here", title="attnbench mechanisms")
    table.columns[0].no_wrap = True
    for row in mechanism_rows():
        why = registry.info(row[0]).unavailable
        table.add_row(*row, "yes" if why is None else f"no: {why}")
    commands.make_console().print(table)
    return 0
