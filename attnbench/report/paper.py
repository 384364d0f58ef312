"""The paper's Table 3 beside the measured one: its figures on the measured table's rows
and columns, and the quotient measured ÷ paper cell by cell. Pure functions, like
:mod:`attnbench.report.tables`; the paper's figures ship as ``attnbench/data``'s CSV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.report.marks import MISSING
from attnbench.report.tables import RatioTable, marked, split_marks
from attnbench.workload import DEFAULT

PAPER = "Linformer paper (Wang et al. 2020), Table 3"


def paper_rows(text: str) -> list[dict[str, Any]]:
    """Parse the shipped ``linformer_table3.csv`` (``#`` lines are its provenance)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    head = lines[0].split(",")
    return [
        dict(
            zip(
                head,
                (
                    float(v) if "." in v or "ratio" in h else int(v)
                    for h, v in zip(head, ln.split(","), strict=True)
                ),
                strict=True,
            )
        )
        for ln in lines[1:]
    ]


def load_paper() -> list[dict[str, Any]]:
    """The paper's Table 3 as shipped with the package (``attnbench/data``)."""
    from importlib.resources import files

    return paper_rows(files("attnbench").joinpath("data/linformer_table3.csv").read_text())


def paper_table(measured: RatioTable, paper: list[dict[str, Any]]) -> RatioTable:
    """The paper's figures laid out on the measured table's rows and columns."""
    got = {(r["n"], r["k"]): r[f"{measured.kind}_ratio"] for r in paper}
    value = {(n, k): got.get((n, k)) for n in measured.ns for k in measured.ks}
    text = {c: MISSING if v is None else f"{v:g}x" for c, v in value.items()}
    return RatioTable(
        PAPER + " (Linformer, layerwise sharing)",
        measured.kind,
        measured.ns,
        measured.ks,
        text,
        value,
        (),
        "16 GB Tesla V100, each model at its maximum batch size; '-': not in the paper",
        attention="linformer",
        column="k",
    )


def quotient(measured: RatioTable, paper: RatioTable) -> RatioTable:
    """Measured ÷ paper, cell by cell: 1.00 means the paper's figure is reproduced."""
    value: dict[tuple[int, int], float | None] = {}
    for c in measured.text:
        m, p = measured.value.get(c), paper.value.get(c)
        value[c] = None if m is None or p is None else m / p
    # the measured cell's footnote marks stay on its quotient (CPU time, modeled memory)
    marks = {c: split_marks(t)[1] for c, t in measured.text.items()}
    text = {c: MISSING if v is None else marked(f"{v:.2f}", *marks[c]) for c, v in value.items()}
    used = {m for c, v in value.items() if v is not None for m in marks[c]}
    return RatioTable(
        f"{measured.mechanism} ÷ paper",
        measured.kind,
        measured.ns,
        measured.ks,
        text,
        value,
        tuple(f for f in measured.footnotes if f.split(" ", 1)[0] in used),
        f"{MISSING} where either table has no number; " + measured.context,
        attention=measured.attention,
        column=measured.column,
    )


def compares_with_paper(t: RatioTable) -> bool:
    """The paper's Table 3 is Linformer against the Transformer at inference, both eager:
    set it beside those only (the paper has no training table, nothing compiled)."""
    return t.attention == "linformer" and t.mode == DEFAULT and not t.compiled


@dataclass(frozen=True)
class Beside:
    """A measured table with the paper's figures on its cells and the quotient of the two."""

    measured: RatioTable
    paper: RatioTable
    quotient: RatioTable


def beside(measured: RatioTable, paper: list[dict[str, Any]]) -> Beside | None:
    """``measured`` beside the paper's Table 3 where the paper speaks to it, else None."""
    if not compares_with_paper(measured):
        return None
    theirs = paper_table(measured, paper)
    return Beside(measured, theirs, quotient(measured, theirs))
