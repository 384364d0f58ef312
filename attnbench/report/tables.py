"""Table 3 as the paper lays it out: rows n, columns k, ratios against the baseline.

Pure functions of rows (``cells.jsonl``): no measuring, no files. For each efficient
mechanism (with its parameters) against the baseline at the same n, dtype, device and model:

* time ratio   = baseline time per sequence ÷ mechanism time per sequence (speed-up)
* memory ratio = mechanism max batch ÷ baseline max batch (memory saved)

each model at its own max batch, as in section 5.3. Cells never claim more than the rows
hold: a baseline that does not fit at b = 1 gives ``OOM`` with a footnote, a time that was
skipped gives ``–`` with its reason, and modeled memory or CPU-measured time is marked.

Escaping: a row's free text (a device, a reason, a parameter's value) may hold anything a
JSON string can. It reaches a table through :func:`attnbench.row.printable`, once, where
the table is made (mechanism label, footnotes, context): every character that is not
printable (newline, CR, NUL, ESC, bidi overrides, lone surrogates) becomes its Python escape
(``\\n``, ``\\x00``, ``\\u202e``), so no value can start a line of its own in any format.
Each writer then escapes what is special to its format: :func:`latex` the TeX specials,
:func:`markdown` inline HTML, links and table pipes, :func:`to_csv` quotes as CSV does, and
:mod:`attnbench.report.html` escapes HTML.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from attnbench import cell
from attnbench.row import NOISY, Row, as_rows, printable, shorten

MISSING = "-"  # no such cell (e.g. k >= n), as in the paper
SKIPPED = "–"  # the cell exists but this figure was not measured (footnote says why)


@dataclass(frozen=True)
class RatioTable:
    """One of Table 3's two halves for one mechanism: ``text[(n, k)]`` is what to print,
    ``value[(n, k)]`` the number behind it (None where there is none)."""

    mechanism: str
    kind: str  # "time" or "memory"
    ns: tuple[int, ...]
    ks: tuple[int, ...]
    text: dict[tuple[int, int], str]
    value: dict[tuple[int, int], float | None]
    footnotes: tuple[str, ...] = field(default=())
    context: str = ""
    attention: str = ""  # the registry name behind ``mechanism`` (which carries its params)
    column: str = "k"  # what the columns are: the mechanism's budget (k, nb_features)
    mode: str = "inference"  # or "train": a training step's table (the paper has none)


def label(row: Row) -> str:
    """A row's mechanism with its own parameters (:func:`attnbench.cell.label`), on one
    line whatever its parameters' values hold (:func:`attnbench.row.printable`)."""
    return printable(cell.label(row.attention, row.params))


def group(row: dict[str, Any]) -> tuple:
    """What must match between a mechanism's row and its baseline's: the same n, dtype,
    preset, ceiling, model, batch setting (``max`` or a fixed b), the same machine and the
    same work: inference, or a training step with the same optimizer and checkpointing;
    causal rows against a causal baseline (``causal`` is a mechanism parameter)."""
    return (
        row["n"],
        row["dtype"],
        row["device"],
        row.get("ceiling_bytes"),
        tuple(sorted((row.get("model") or {}).items())),
        str(row.batch_asked),
        (row.get("env") or {}).get("device_name"),
        row.mode,
        row.optimizer,
        row.checkpoint,
        bool((row.get("params") or {}).get("causal")),
    )


def setting(row: dict[str, Any]) -> tuple:
    """Everything of :func:`group` but n: rows of one setting form one table (or line)."""
    return group(row)[1:]


def heading(t: RatioTable, k: int | None) -> str:
    """A column's heading: ``k=128``; ``ratio`` for a mechanism without a budget."""
    return "ratio" if k is None else f"{t.column}={k}"


def _context(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    model = first.get("model") or {}
    env = first.get("env") or {}
    shape = ", ".join(f"{k} {v}" for k, v in model.items())
    ceiling = first.get("ceiling_bytes")
    when = first.get("finished_at")
    date = ""
    if when:
        import datetime

        date = datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%d")
    batch = str(first.batch_asked)
    work = (
        f"one training step, {cell.train_label(first.optimizer, first.checkpoint)} "
        "(the paper has no training table), "
        if first.mode == "train"
        else ""
    )
    return printable(
        work + f"preset {first['device']}, run on {env.get('device_name', '?')}, {first['dtype']}, "
        f"model {shape}, ceiling {ceiling} bytes, "
        + ("" if batch == "max" else f"fixed batch {batch}, ")
        + f"attnbench {env.get('attnbench', '?')}"
        + (f", {date}" if date else "")
    )


def ratio_tables(
    rows: Iterable[Row | dict[str, Any]], baseline: str = "vanilla"
) -> list[RatioTable]:
    """Time and memory ratio tables for every mechanism other than ``baseline``."""
    rows = as_rows(rows)
    base = {group(r): r for r in rows if r["attention"] == baseline}
    if not base:
        have = sorted({r["attention"] for r in rows})
        raise ValueError(
            f"baseline: no rows of {shorten(repr(baseline), 80)}; the rows have "
            f"{', '.join(shorten(a, 80) for a in have[:20])}{', ...' if len(have) > 20 else ''}"
        )
    # one table per mechanism and setting: a run dir that holds fp16 and fp32 rows (or two
    # ceilings) gives two tables, never one that silently mixes them; grouped by the label
    # as stored, so that two values that print alike ("a\nb" and "a\\nb") stay apart
    by_mech: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r["attention"] != baseline:
            by_mech.setdefault((cell.label(r.attention, r.params), setting(r)), []).append(r)
    tables = []
    for (raw, where), mrows in by_mech.items():
        mech = printable(raw)
        ns = tuple(sorted({r["n"] for r in mrows} | {b[0] for b in base if b[1:] == where}))
        # a mechanism without a budget (sdpa, xformers) gets one column, headed "ratio"
        ks = tuple(sorted({r["k"] for r in mrows if r["k"] is not None})) or (None,)
        for kind in ("time", "memory"):
            tables.append(_table(mech, kind, ns, ks, mrows, base))
    return tables


def _table(
    mech: str,
    kind: str,
    ns: tuple[int, ...],
    ks: tuple[int, ...],
    mrows: list[dict[str, Any]],
    base: dict[tuple, dict[str, Any]],
) -> RatioTable:
    text: dict[tuple[int, int], str] = {}
    value: dict[tuple[int, int], float | None] = {}
    notes: dict[str, str] = {}  # footnote text -> its mark

    def mark(note: str) -> str:  # a note quotes a row's reason and names: one line, always
        return notes.setdefault(printable(note), superscript(len(notes) + 1))

    cells = {(r["n"], r["k"]): r for r in mrows}
    for n in ns:
        for k in ks:
            r = cells.get((n, k))
            value[(n, k)] = None
            if r is None:
                text[(n, k)] = MISSING
                continue
            b = base.get(group(r))
            if b is None:
                text[(n, k)] = SKIPPED + mark(f"no {r['attention']} baseline row at n={n}")
                continue
            text[(n, k)], value[(n, k)] = _cell(kind, r, b, mark)
    return RatioTable(
        mech,
        kind,
        ns,
        ks,
        text,
        value,
        tuple(f"{m} {t}" for t, m in notes.items()),
        _context(mrows),
        attention=mrows[0]["attention"],
        column=mrows[0].budget or "k",
        mode=mrows[0].mode,
    )


MARKS = "⁰¹²³⁴⁵⁶⁷⁸⁹"  # footnote marks are superscript digits
SUPERSCRIPT = str.maketrans("0123456789", MARKS)


def superscript(i: int) -> str:
    return str(i).translate(SUPERSCRIPT)


def _why(reason: str | None) -> str:
    """A footnote for a skipped figure: one per kind of reason, not one per cell."""
    if reason and "exceed time_budget_s" in reason:
        return "time not measured: a CPU run was estimated over timing.time_budget_s"
    return (reason or "not timed").split(";")[0]


def _cell(kind: str, r: dict[str, Any], b: dict[str, Any], mark: Any) -> tuple[str, float | None]:
    if b["status"] == "oom":
        return "OOM" + mark(
            f"the baseline does not fit at b = 1 under the ceiling "
            f"({b.get('memory_source') or 'measured'})"
        ), None
    if r["status"] == "oom":
        return "OOM" + mark("this mechanism does not fit at b = 1 under the ceiling"), None
    if r["status"] != "ok" or b["status"] != "ok":
        bad = r if r["status"] != "ok" else b
        return SKIPPED + mark(f"{bad['attention']}: {bad['status']}: {bad.get('reason')}"), None
    if kind == "memory":
        if not r.get("max_batch") or not b.get("max_batch"):
            return SKIPPED + mark("fixed batch: no max batch was searched"), None
        v = r["max_batch"] / b["max_batch"]
        modeled = "modeled" in (r.get("memory_source"), b.get("memory_source"))
        return f"{v:.1f}x" + (mark("memory modeled, not measured") if modeled else ""), v
    t, tb = r.get("time_per_seq_s"), b.get("time_per_seq_s")
    if not t or not tb:
        return SKIPPED + mark(_why((r if not t else b).get("reason"))), None
    v = tb / t
    if not math.isfinite(v):  # 1 s over 1e-320 s: no ratio a table can show
        return SKIPPED + mark(f"time ratio beyond a float's range: {tb!r} s / {t!r} s"), None
    where = {(x.get("time_device"), x.get("time_dtype"), x.get("time_batch")) for x in (r, b)}
    elsewhere = sorted((w for w in where if w[0] != "cuda"), key=str)
    note = "".join(
        mark(f"time measured on {d} in {t} at b = {tb}, not at max batch on the device")
        for d, t, tb in elsewhere
    )
    note += "".join(
        mark(f"noisy: {x.attention}'s time has an IQR over {NOISY:.0%} of its median")
        for x in (r, b)
        if (x.spread() or 0) > NOISY
    )
    return f"{v:.2f}x" + note, v


# what would be markup in a Markdown line: inline HTML (<script>), entities (&lt;), links
# and images ([x](javascript:...)), code spans, emphasis and table pipes; CommonMark shows a
# backslash-escaped punctuation character as itself. `_` stays: it is in every context line
# (v100_16gb, d_model) and emphasises nothing inside a word.
MARKDOWN_SPECIALS = "\\`*<>&[]|"
_MARKDOWN = str.maketrans({c: "\\" + c for c in MARKDOWN_SPECIALS})


def markdown(text: str) -> str:
    """``text`` shown as itself in a Markdown line: on one line, no markup."""
    return printable(text).translate(_MARKDOWN)


def to_markdown(t: RatioTable) -> str:
    title = (
        f"**{markdown(t.kind)} ratio: {markdown(t.mechanism)}** "
        f"(rows n, columns {markdown(t.column)})"
    )
    lines = [
        title,
        "",
        "| n | " + " | ".join("ratio" if k is None else str(k) for k in t.ks) + " |",
        "|---:|" + "---:|" * len(t.ks),
    ]
    lines += [f"| {n} | " + " | ".join(markdown(t.text[(n, k)]) for k in t.ks) + " |" for n in t.ns]
    lines += ["", *(f"{markdown(f)}  " for f in t.footnotes), markdown(t.context)]
    return "\n".join(lines).rstrip() + "\n"


def grid_markdown(title: str, head: list[str], body: list[list[str]], notes: list[str]) -> str:
    """A plain table of text in Markdown (the efficiency lengths, the quality tables): first
    column left-aligned, the rest right-aligned, every cell escaped, notes under it."""
    lines = [
        f"**{markdown(title)}**",
        "",
        "| " + " | ".join(map(markdown, head)) + " |",
        "|---|" + "---:|" * (len(head) - 1),
        *("| " + " | ".join(map(markdown, r)) + " |" for r in body),
        "",
        *(f"{markdown(t)}  " for t in notes),
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
_NO_MARKS = str.maketrans(dict.fromkeys(MARKS))


def latex(text: str) -> str:
    """``text`` as LaTeX that prints it: on one line (a newline would end a ``%`` comment
    and make the rest live), every TeX special as the command that prints it."""
    return printable(text).translate(_LATEX)


def comment(text: str) -> str:
    """``text`` in a ``%`` comment: TeX ignores everything up to the end of the line, so
    the one thing to escape is whatever ends it (:func:`attnbench.row.printable`); the
    specials stay as written, readable (``v100_16gb``, ``10%``)."""
    return "% " + printable(text)


def to_latex(t: RatioTable) -> str:
    """A booktabs table; footnote marks as superscripts. Every value from a row is escaped:
    :func:`latex` in the table, :func:`comment` in the notes under it."""

    def tex(s: str) -> str:
        """A cell (``1.22x¹²``) or a label: escaped, its footnote marks a superscript."""
        marks = re.sub(f"[^{MARKS}]", "", s).translate(_MARKS)
        out = latex(s.translate(_NO_MARKS)).replace("–", "--")
        if out[:1].isdigit() and out.endswith("x"):  # 1.22x: a ratio
            out = out[:-1] + r"$\times$"
        return out + (f"$^{{{marks}}}$" if marks else "")

    cols = "r" + "r" * len(t.ks)
    lines = [
        r"\begin{tabular}{" + cols + "}",
        r"\toprule",
        r"$n$ & "
        + " & ".join("ratio" if k is None else f"${_tex_name(t.column)}={k}$" for k in t.ks)
        + r" \\",
        r"\midrule",
    ]
    lines += [f"{n} & " + " & ".join(tex(t.text[(n, k)]) for k in t.ks) + r" \\" for n in t.ns]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [comment(f) for f in t.footnotes]
    lines += [comment(f"{tex(t.mechanism)}, {t.kind} ratio; {t.context}")]
    return "\n".join(lines) + "\n"


def _tex_name(name: str) -> str:
    """A column's name in math mode: one ASCII letter as a symbol (``k``), anything else as
    escaped upright text (``\\text{nb\\_features}``)."""
    if len(name) == 1 and name.isascii() and name.isalpha():
        return name
    return r"\text{" + latex(name) + "}"
