"""A run directory's report on disk.

:func:`build` reads ``cells.jsonl`` (a corrupt line is an error naming its number, never
dropped) and makes every table of the sections (:mod:`attnbench.report.outline`); :func:`render`
turns a report into file contents, all in memory, each format iterating over the sections;
:func:`write` (:mod:`attnbench.report.replace`) puts them in place in one step, so a crash
or a plotting error leaves the previous report whole rather than half of a new one, and one
writer at a time, so that two reports of one run (a sweep's end and a user's ``attnbench
report``) never collide. :mod:`attnbench.report.terminal` shows the tables in the terminal.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnbench import row
from attnbench.report import html, marks, outline, plots, sections, text
from attnbench.report.distinct import distinct
from attnbench.report.outline import Part, Section
from attnbench.report.replace import check_out as check_out
from attnbench.report.replace import os_error
from attnbench.report.replace import write as write
from attnbench.report.tables import RatioTable, about, need_baseline, ratio_tables
from attnbench.row import printable, shown
from attnbench.store import CELLS, RunStore
from attnbench.workload import DEFAULT


@dataclass(frozen=True)
class Report:
    """The rows and every table made of them, section by section; the figures are drawn
    when the report is rendered (they need matplotlib, the tables do not)."""

    run_dir: Path
    baseline: str
    rows: list[row.Row]
    made: list[tuple[Section, list[Part]]]  # every section of tables, with its parts
    stemmed_tables: list[tuple[RatioTable, str]]  # each with the stem of its files
    # rows that did not count, one line each (two rows of one cell: report.distinct)
    notes: list[str] = field(default_factory=list)

    @property
    def tables(self) -> list[RatioTable]:
        """The ratio tables against the baseline (Table 3's), if the rows have any."""
        return [t for t, _ in self.stemmed_tables]

    def documents(self) -> list[str]:
        """The documents the report writes: those with a section that applies to a row."""
        used = [s.document for s in outline.sections() if s.document and s.used(self.rows)]
        return list(dict.fromkeys(used))


def said(report: Report) -> list[str]:
    """The lines a report says of rows that did not count (:attr:`Report.notes`), each cut
    short: ``attnbench report`` prints them on stderr, a sweep's end on stdout."""
    return [f"attnbench report: {shown(note, 2000)}" for note in report.notes]


def default_out(run_dir: Path) -> Path:
    """Beside the rows it was made from: ``<run dir>/report``."""
    return Path(run_dir) / "report"


def _rows_file(run_dir: Path) -> Path:
    """``run_dir``'s ``cells.jsonl`` if it is a regular file; else ValueError, one line that
    says what is there instead (nothing, a file for a run dir, a directory, a FIFO that
    would block the read, a symlink loop)."""
    path = RunStore(run_dir).cells
    shown = printable(str(run_dir))
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise ValueError(
                f"run dir: no cells.jsonl in {shown} (is it a directory that 'attnbench run'"
                " wrote?)"
            ) from None
        if e.errno == errno.ENOTDIR:
            raise ValueError(f"run dir: {shown} is a file, not a run directory") from None
        if e.errno == errno.ELOOP:
            raise ValueError(f"run dir: {printable(str(path))} is a symlink loop") from None
        raise ValueError(f"run dir: {printable(str(path))}: {os_error(e)}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"run dir: {printable(str(path))} is not a regular file of rows")
    return path


def build(
    run_dir: Path, baseline: str = "vanilla", also: Sequence[Path] = (), *, asked: bool = False
) -> Report:
    """Every table of ``run_dir``'s rows, and of the rows of the run dirs ``also`` names
    (say, inference and training runs of one grid, so the max-batch plot has both);
    ValueError (one line) if there is nothing to report. Table 3's ratios need a baseline
    row (:func:`~attnbench.report.tables.ratio_tables`); a baseline the user ``asked`` for
    must have one in any run. The default's absence leaves serving and quality rows their
    tables: the bytes each sequence keeps, the bandwidth, the accuracies."""
    run_dir = Path(run_dir)
    path, *more = (_rows_file(Path(d)) for d in (run_dir, *also))
    rows, notes = distinct([(p, row.read_numbered(p)) for p in (path, *more)])
    if not rows:
        raise ValueError(f"run dir: {printable(str(path))} holds no rows yet")
    if asked:  # named on the command line: a name no row has is a typo, whatever the rows
        need_baseline(rows, baseline)
    # quality rows have no time or memory; serving's have tables of their own
    cost = list(filter(sections.cost_row, rows))
    tables = ratio_tables(cost, baseline) if cost else []
    stemmed = list(zip(tables, _stems(tables), strict=True))
    made = [
        (s, outline.make(s, rows, baseline, stemmed))
        for s in outline.sections()
        if s.document is not None
    ]
    return Report(run_dir, baseline, rows, made, stemmed, notes)


def command_for(run_dir: Path, baseline: str) -> str:
    """An ``attnbench report`` command that can make ``run_dir``'s report where one with
    ``baseline`` could not: another baseline when the rows have no ``baseline`` rows (the
    first mechanism they have), ``--no-plots`` without matplotlib. What a sweep prints when
    its own report failed, so the command it suggests is one that works."""
    import importlib.util
    import shlex

    command = f"attnbench report {shlex.quote(str(run_dir))}"
    try:
        cost = [r for r in row.read(_rows_file(Path(run_dir))) if sections.cost_row(r)]
    except (OSError, ValueError):
        return command
    names = sorted({r.attention for r in cost})
    if names and baseline not in names:
        command += f" --baseline {shlex.quote(names[0])}"
    if importlib.util.find_spec("matplotlib") is None:
        command += " --no-plots"
    return command


# a file name from a label is cut here (and a hash of the whole added): names over 255
# bytes are refused by every common file system, and a parameter's value can be a megabyte
SLUG_CHARS = 100


def slug(text: str) -> str:
    """A file name from a mechanism label: ``linformer-kernel-eager-sharing-layerwise``;
    only ``[a-z0-9-]``, never empty, never longer than :data:`SLUG_CHARS` + 9."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "mechanism"
    if len(name) > SLUG_CHARS:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[:SLUG_CHARS].rstrip('-')}-{digest}"
    return name


def _stems(tables: list[RatioTable]) -> list[str]:
    """A file name per table, none twice for one kind: two settings (dtype, ceiling) of one
    mechanism, or two labels that slug alike (``a (x=A)``, ``a (x=a)``), get a number;
    were a name still taken (a label that slugs to ``a-1``), a further one. Without this a
    table's CSV would silently overwrite another's."""
    slugs = [slug(t.mechanism + ("" if t.mode == DEFAULT else f" {t.mode}")) for t in tables]
    used: set[tuple[str, str]] = set()
    stems = []
    for i, (t, name) in enumerate(zip(tables, slugs, strict=True)):
        twice = sum(s == name and x.kind == t.kind for s, x in zip(slugs, tables, strict=True)) > 1
        stem = name + (f"-{i // 2}" if twice else "")  # tables come in pairs
        extra = 0
        while (stem, t.kind) in used:
            extra += 1
            stem = f"{name}-{i // 2}-{extra}"
        used.add((stem, t.kind))
        stems.append(stem)
    return stems


def _title(report: Report, document: str) -> str:
    """A document's heading: what it is, then what its rows are (``Table 3 — sweep table3,
    preset v100_16gb (ceiling 15.8 GiB), timed on cpu``), not the run directory's name."""
    doc = outline.document(document)
    used = [s for s in outline.sections() if s.document == document]
    rows = [r for r in report.rows if any(s.applies(r) for s in used)]
    return f"{doc.title or doc.name} — {about(rows or report.rows)}"


def _intro(report: Report, document: str) -> str:
    rows_file = printable(str(report.run_dir / CELLS))
    intro = outline.document(document).intro
    return f"Rows: {rows_file} ({len(report.rows)} cells)." + intro.format(report.baseline)


def _figures(report: Report) -> list[Part]:
    """Every figure the rows hold data for, in the order of the sections."""
    return [
        part
        for s in outline.sections()
        if s.document is None
        for part in outline.make(s, report.rows, report.baseline, report.stemmed_tables)
    ]


def render(report: Report, *, with_plots: bool = True) -> dict[str, bytes]:
    """Every file of the report, by relative path: a Markdown and a LaTeX file per document
    (:func:`Report.documents`), a CSV per ratio table, the plots, the HTML page and
    ``report.json``."""
    files: dict[str, bytes] = {}
    md: dict[str, list[str]] = {}
    tex: dict[str, list[str]] = {}
    for doc in report.documents():
        # what the document is, then where its rows are (the run directory) and the marks
        head = [_title(report, doc), _intro(report, doc), marks.LEGEND]
        md[doc] = [f"# {text.markdown(head[0])}", ""]
        md[doc] += [*(f"{text.markdown(line)}  " for line in head[1:]), ""]
        tex[doc] = [*map(text.comment, head), r"% needs \usepackage{booktabs}", ""]
        if report.notes:  # rows that did not count, as stderr said: the reader sees them too
            md[doc] += [*(f"{text.markdown(note)}  " for note in report.notes), ""]
            tex[doc] += [*map(text.comment, report.notes), ""]
    page: list[tuple[str, list[str]]] = []
    present = {s.record for s in outline.sections() if s.record and s.used(report.rows)}
    records: dict[str, list] = {
        k: [] for d in outline.documents() for k in d.records if d.always or k in present
    }
    for section, parts in report.made:
        for part in parts:
            if isinstance(part.body, RatioTable):
                files[f"{part.stem}-{part.body.kind}.csv"] = text.to_csv(part.body).encode()
            md[section.document] += text.markdown_blocks(part.body)
            tex[section.document] += text.latex_blocks(part.body)
            page.append((part.heading, [html.part_html(part.body, part.heading)]))
            if section.record:
                records[section.record] += part.records
    figures = []
    why_no_plots = plots.available() if with_plots else "plots not asked for"
    if why_no_plots is None:
        for part in _figures(report):
            p = part.body
            made = plots.save(p.figure, f"plots/{p.stem}")
            files.update(made)
            figures.append(html.figure_html(p.stem, made[f"plots/{p.stem}.svg"], p.caption))
    page.append(("plots", figures or [f"<p>no plots: {why_no_plots or 'nothing to draw'}</p>"]))
    for doc in md:
        files[f"{doc}.md"] = "\n".join(md[doc]).encode()
        files[f"{doc}.tex"] = "\n".join(tex[doc]).encode()
    docs = report.documents()
    first = sections.SERVING if sections.SERVING in docs else sections.QUALITY
    intro = _intro(report, sections.TABLE3 if report.tables else first)
    title = f"attnbench report — {about(report.rows)}"
    files["index.html"] = html.page(title, [intro, marks.LEGEND, *report.notes], page).encode()
    head = {
        "run_dir": printable(str(report.run_dir)),
        "baseline": report.baseline,
        "rows": len(report.rows),
    }
    files["report.json"] = json.dumps({**head, **records}, indent=1).encode()
    return files


def summary(files: dict[str, bytes]) -> str:
    """What a rendered report holds, in a line: its documents, CSV files and plots."""
    documents = sorted(f for f in files if f.endswith((".md", ".tex")))
    csvs = sum(f.endswith(".csv") for f in files)
    pngs = sum(f.endswith(".png") for f in files)
    return f"index.html, {', '.join(documents)}, {csvs} CSV, {pngs} plots"
