"""A report's tables as text: Markdown, LaTeX and CSV.

Each writer escapes what is special to its format, after :func:`attnbench.row.shown` has
put every value on one line and cut a long one short (marked): :func:`markdown` inline HTML,
links and table pipes, :func:`latex` the TeX specials (and :func:`comment` nothing but the
end of the line). :func:`to_csv` is data: its headings are whole, on one line
(:func:`attnbench.row.printable`), quoted as CSV does.
"""

from __future__ import annotations

import csv
import io

from attnbench.report.grid import Grid
from attnbench.report.paper import Beside
from attnbench.report.tables import MARKS, RatioTable, heading, split_marks
from attnbench.row import printable, shown

# what would be markup in a Markdown line: inline HTML (<script>), entities (&lt;), links
# and images ([x](javascript:...)), code spans, emphasis and table pipes; CommonMark shows a
# backslash-escaped punctuation character as itself. `_` stays: it is in every context line
# (v100_16gb, d_model) and emphasises nothing inside a word.
MARKDOWN_SPECIALS = "\\`*<>&[]|"
_MARKDOWN = str.maketrans({c: "\\" + c for c in MARKDOWN_SPECIALS})


def markdown(text: str) -> str:
    """``text`` shown as itself in a Markdown line: on one line, no markup, cut short."""
    return shown(text).translate(_MARKDOWN)


def to_markdown(t: RatioTable) -> str:
    title = (
        f"**{markdown(t.kind)} ratio: {markdown(t.mechanism)}** "
        f"(rows n, columns {markdown(t.column)})"
    )
    lines = [
        title,
        "",
        "| n | " + " | ".join("ratio" if k is None else markdown(str(k)) for k in t.ks) + " |",
        "|---:|" + "---:|" * len(t.ks),
    ]
    lines += [f"| {n} | " + " | ".join(markdown(t.text[(n, k)]) for k in t.ks) + " |" for n in t.ns]
    lines += ["", *(f"{markdown(f)}  " for f in t.footnotes), markdown(t.context)]
    return "\n".join(lines).rstrip() + "\n"


def grid_markdown(g: Grid) -> str:
    """A plain table of text in Markdown: first column left-aligned, the rest
    right-aligned, every cell escaped, notes under it."""
    lines = [
        f"**{markdown(g.title)}**",
        "",
        "| " + " | ".join(map(markdown, g.head)) + " |",
        "|---|" + "---:|" * (len(g.head) - 1),
        *("| " + " | ".join(map(markdown, r)) + " |" for r in g.body),
        "",
        *(f"{markdown(t)}  " for t in g.notes),
    ]
    return "\n".join(lines).rstrip() + "\n"


def to_csv(t: RatioTable) -> str:
    """Numbers only (empty where there is none), one row per n: for spreadsheets. Headings
    are quoted as CSV quotes (a budget is an identifier, so in practice never)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["n", *(printable(heading(t, k)) for k in t.ks)])
    for n in t.ns:
        writer.writerow(
            [n, *("" if t.value[(n, k)] is None else f"{t.value[(n, k)]:.6g}" for k in t.ks)]
        )
    return buf.getvalue()


# the characters TeX reads as commands or structure, as text-mode commands that print them;
# < > | print as other glyphs in the default OT1 font encoding
LATEX = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "#": r"\#",
    "^": r"\^{}",
    "_": r"\_",
    "%": r"\%",
    "~": r"\~{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
}


_LATEX = str.maketrans(LATEX)
_MARKS = str.maketrans(MARKS, "0123456789")


def latex(text: str) -> str:
    """``text`` as LaTeX that prints it: on one line (a newline would end a ``%`` comment
    and make the rest live), every TeX special as the command that prints it; cut short."""
    return shown(text).translate(_LATEX)


def comment(text: str) -> str:
    """``text`` in a ``%`` comment: TeX ignores everything up to the end of the line, so
    the one thing to escape is whatever ends it (:func:`attnbench.row.shown`); the
    specials stay as written, readable (``v100_16gb``, ``10%``)."""
    return "% " + shown(text)


def to_latex(t: RatioTable) -> str:
    """A booktabs table; footnote marks as superscripts. Every value from a row is escaped:
    :func:`latex` in the table, :func:`comment` in the notes under it."""

    def tex(s: str) -> str:
        """A cell (``1.22x¹,²``) or a label: escaped, its footnote marks a superscript."""
        body, marks = split_marks(s)
        out = latex(body).replace("–", "--")
        if out[:1].isdigit() and out.endswith("x"):  # 1.22x: a ratio
            out = out[:-1] + r"$\times$"
        return out + (f"$^{{{','.join(m.translate(_MARKS) for m in marks)}}}$" if marks else "")

    cols = "r" + "r" * len(t.ks)
    lines = [
        r"\begin{tabular}{" + cols + "}",
        r"\toprule",
        r"$n$ & " + " & ".join(_tex_heading(t, k) for k in t.ks) + r" \\",
        r"\midrule",
    ]
    lines += [f"{n} & " + " & ".join(tex(t.text[(n, k)]) for k in t.ks) + r" \\" for n in t.ns]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [comment(f) for f in t.footnotes]
    # each piece shown once (cut on its own): a line of pieces cut again would lose the rest
    lines += [f"% {tex(t.mechanism)}, {t.kind} ratio; {shown(t.context)}"]
    return "\n".join(lines) + "\n"


def markdown_blocks(body: Grid | RatioTable | Beside) -> list[str]:
    """A section's part in a Markdown document: its tables, each followed by a blank line."""
    if isinstance(body, Grid):
        return [grid_markdown(body), ""]
    if isinstance(body, Beside):
        return [to_markdown(body.paper), "", to_markdown(body.quotient), ""]
    return [to_markdown(body), ""]


def latex_blocks(body: Grid | RatioTable | Beside) -> list[str]:
    """A section's part in a LaTeX document. A grid goes in as its Markdown, each line a
    comment: it is read beside the tables, not typeset. Its lines are shown already (each
    cell on one line, cut short): a line is not cut again, which would cut the row."""
    if isinstance(body, Grid):
        return [*(f"% {line}" for line in grid_markdown(body).splitlines()), ""]
    if isinstance(body, Beside):
        return [to_latex(body.paper), "", to_latex(body.quotient), ""]
    return [to_latex(body), ""]


def _tex_heading(t: RatioTable, k: object) -> str:
    """A column's heading: ``$k=128$``, ``ratio``, or a mechanism's label, escaped."""
    if isinstance(k, str):
        return latex(k)
    return "ratio" if k is None else f"${_tex_name(t.column)}={k}$"


def _tex_name(name: str) -> str:
    """A column's name in math mode: one ASCII letter as a symbol (``k``), anything else as
    escaped upright text (``\\text{nb\\_features}``)."""
    if len(name) == 1 and name.isascii() and name.isalpha():
        return name
    return r"\text{" + latex(name) + "}"
