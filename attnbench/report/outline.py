"""The report's outline: its documents and its sections, each declared once and registered.

A :class:`Document` is a Markdown and LaTeX file of tables: its name, what it says of its rows
and the keys of ``report.json`` its sections record under. A :class:`Section` is a table or a
figure that declares itself (which rows it reads, what it makes of them, the document it goes
in). The built-ins are declared in :mod:`attnbench.report.sections`; a plugin (a module named
by ``$ATTNBENCH_PLUGINS``) declares its own in its file and calls :func:`register_document` and
:func:`register`, so a new table, figure or document needs no edit of attnbench. The writers of
:mod:`attnbench.report.files` ask :func:`sections` and :func:`documents`, which load the
plugins first: ``attnbench report`` never asks the mechanism registry anything else, so
without that a plugin's section would not be there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench import registry

if TYPE_CHECKING:  # a plugin imports this module while attnbench.row may be half-imported
    from attnbench.report.grid import Grid
    from attnbench.report.paper import Beside
    from attnbench.report.plots import Plot
    from attnbench.report.tables import RatioTable
    from attnbench.row import Row


@dataclass(frozen=True)
class Part:
    """One table or figure: its heading (on the page and in the terminal), what it shows,
    what ``report.json`` keeps of it, and for a ratio table the stem of its CSV file."""

    heading: str
    body: Grid | RatioTable | Beside | Plot
    records: tuple[Any, ...] = ()
    stem: str = ""


@dataclass(frozen=True)
class Basis:
    """What a section is made from: the rows it applies to, the baseline, and the report's
    ratio tables with their file stems (made once: the paper and the plots read them too)."""

    rows: list[Row]
    baseline: str
    tables: list[tuple[RatioTable, str]]


@dataclass(frozen=True)
class Section:
    """A kind of table or figure: ``name`` and ``title`` say what it is, ``applies`` which
    rows it reads, ``make`` its parts (none where the rows hold nothing for it).
    ``document`` is the file its tables go in (None: a figure); ``record`` its key in
    ``report.json`` (None: nothing kept), one its document declares. ``wanted``: a section
    that reads rows it is not made for (the compiled ones read the eager twins) is there only
    where a row is one it is made for."""

    name: str
    title: str
    applies: Callable[[Row], bool]
    make: Callable[[Basis], list[Part]]
    document: str | None = None
    record: str | None = None
    wanted: Callable[[Row], bool] | None = None

    def used(self, rows: list[Row]) -> bool:
        """Whether the rows hold anything for this section."""
        return any(map(self.applies, rows)) and (self.wanted is None or any(map(self.wanted, rows)))


@dataclass(frozen=True)
class Document:
    """A Markdown and a LaTeX file of tables, ``<name>.md`` and ``<name>.tex``, written where
    a section of it applies to a row. ``intro``: what it says of its rows after where they
    are (``{0}``: the baseline's name). ``records``: the keys of ``report.json`` its sections
    record under, in the order the file has them; ``always``: those keys are there (empty)
    even where none of its sections applies, as ``report.json`` has always had them.
    ``title``: what its heading calls it (``Table 3``; empty: its name), before what its
    rows are (:func:`attnbench.report.tables.about`)."""

    name: str
    intro: str
    records: tuple[str, ...] = ()
    always: bool = False
    title: str = ""


# in order: the built-ins first (register_builtins), then the plugins' as they registered
_DOCUMENTS: dict[str, Document] = {}
_SECTIONS: dict[str, Section] = {}


def register_document(document: Document) -> Document:
    """Add ``document`` after those registered before it (its records' keys after theirs in
    ``report.json``); a name or a record key already taken is refused."""
    if document.name in _DOCUMENTS:
        raise ValueError(f"report: document {document.name!r} is already registered")
    taken = {k for d in _DOCUMENTS.values() for k in d.records}
    if clash := taken & set(document.records):
        raise ValueError(f"report: document {document.name!r}: records {sorted(clash)} taken")
    _DOCUMENTS[document.name] = document
    return document


def register(section: Section) -> Section:
    """Add ``section`` after those registered before it (every format shows them in that
    order). Refused: a name already taken, and (:func:`_check`, here if its document is
    registered already, else when the sections are listed) a document never registered, a
    record its document does not declare, a record on a figure (figures keep nothing)."""
    if section.name in _SECTIONS:
        raise ValueError(f"report: section {section.name!r} is already registered")
    if section.document is None or section.document in _DOCUMENTS:
        _check(section)
    _SECTIONS[section.name] = section
    return section


def register_builtins(docs: tuple[Document, ...], parts: tuple[Section, ...]) -> None:
    """The built-ins (:mod:`attnbench.report.sections`), put before whatever a plugin has
    registered already: plugins are loaded when ``attnbench.row`` is first imported (its
    fields ask the workloads), which can be before the report's modules are, and the
    built-ins keep their order (``report.json``'s keys) whichever came first."""
    plugin_docs = [d for d in _DOCUMENTS.values() if d not in docs]
    plugin_sections = [s for s in _SECTIONS.values() if s not in parts]
    _DOCUMENTS.clear()
    _SECTIONS.clear()
    for d in (*docs, *plugin_docs):
        register_document(d)
    for s in (*parts, *plugin_sections):
        register(s)


def _check(section: Section) -> None:
    doc = _DOCUMENTS.get(section.document) if section.document is not None else None
    if section.document is not None and doc is None:
        raise ValueError(
            f"report: section {section.name!r}: no document {section.document!r}; "
            f"register_document it first (registered: {', '.join(_DOCUMENTS)})"
        )
    if section.record is not None and (doc is None or section.record not in doc.records):
        where = f"document {doc.name!r}" if doc else "a figure"
        raise ValueError(
            f"report: section {section.name!r}: {where} has no record {section.record!r}"
        )


def sections() -> list[Section]:
    """Every section, the built-ins' then the plugins', in order; the plugins loaded first."""
    registry.load_plugins()
    for s in _SECTIONS.values():
        _check(s)
    return list(_SECTIONS.values())


def documents() -> list[Document]:
    """Every document, the built-ins' then the plugins'; the plugins loaded first."""
    registry.load_plugins()
    return list(_DOCUMENTS.values())


def document(name: str) -> Document:
    return _DOCUMENTS[name]


def make(
    section: Section, rows: list[Row], baseline: str, tables: list[tuple[RatioTable, str]]
) -> list[Part]:
    """``section``'s parts from the rows it applies to; none where it is not
    :meth:`~Section.used`."""
    if not section.used(rows):
        return []
    return section.make(Basis([r for r in rows if section.applies(r)], baseline, tables))
