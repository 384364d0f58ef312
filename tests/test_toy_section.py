"""A report section and its document, added by a plugin from its own file
(``tests/toys/toy_section.py``), show up in every format without an edit of attnbench.

The file is loaded the way ``attnbench report`` loads it: named in ``$ATTNBENCH_PLUGINS`` and
imported by the report's first look at its sections (``outline.sections()``; one test imports
it itself, to have it registered before the built-ins); after each test it is unregistered, so
the rest of the suite sees the built-ins only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnbench import registry
from attnbench.report import files, outline
from attnbench.report.grid import Grid
from attnbench.report.outline import Document, Part, Section
from attnbench.report.sections import DOCUMENTS, SECTIONS

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results" / "reference" / "table3-v100_16gb-cpu"
TOY = "tests.toys.toy_section"


def _forget(section: str, document: str) -> None:
    outline._SECTIONS.pop(section, None)
    outline._DOCUMENTS.pop(document, None)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``$ATTNBENCH_PLUGINS`` names the toy; the plugins not yet loaded in this process."""
    monkeypatch.setenv(registry.PLUGIN_ENV, TOY)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    sys.modules.pop(TOY, None)
    yield
    _forget("toy-census", "toy")
    sys.modules.pop(TOY, None)


def _rendered() -> dict[str, bytes]:
    return files.render(files.build(RUN), with_plots=False)


def test_the_built_ins_alone_without_the_plugin() -> None:
    assert outline.sections() == list(SECTIONS)
    assert outline.documents() == list(DOCUMENTS)


def test_a_plugins_section_and_document_in_every_format(toy: None) -> None:
    out = _rendered()  # the first look at the sections imports the plugin
    assert "toy-census" in {s.name for s in outline.sections()}
    md = out["toy.md"].decode()
    assert "**Rows per mechanism (toy)**" in md and "Toy: one line per mechanism." in md
    assert "| mechanism | rows | ok | modes |" in md
    assert "| vanilla | 8 | 6 | inference |" in md and "| linformer | 34 | 34 | inference |" in md
    assert "Rows per mechanism (toy)" in out["toy.tex"].decode()
    assert "Rows per mechanism (toy)" in out["index.html"].decode()
    data = json.loads(out["report.json"])
    assert list(data)[-1] == "toy_census"  # after every built-in key
    (grid,) = data["toy_census"]
    assert grid["head"] == ["mechanism", "rows", "ok", "modes"]
    assert sum(int(r[1]) for r in grid["body"]) == data["rows"] == 42
    assert {f.removesuffix(".md") for f in out if f.endswith(".md")} == {"table3", "toy"}
    assert "Rows per mechanism" not in out["table3.md"].decode()


def test_the_report_without_the_plugin_is_unchanged(toy: None) -> None:
    with_toy = _rendered()
    _forget("toy-census", "toy")
    without = _rendered()
    assert set(with_toy) - set(without) == {"toy.md", "toy.tex"}
    for name in ("table3.md", "table3.tex"):
        assert with_toy[name] == without[name]
    data = json.loads(with_toy["report.json"])
    del data["toy_census"]
    assert data == json.loads(without["report.json"])


def test_registration_refuses_what_would_be_lost() -> None:
    part: list[Part] = [Part("x", Grid("x", ["a"], [], []))]

    def section(**kw: object) -> Section:
        return Section(**{"name": "refused-test", "title": "x", "applies": bool,
                          "make": lambda basis: part, **kw})  # type: ignore[arg-type]  # fmt: skip

    refused = [
        (section(name="ratios"), "section 'ratios' is already registered"),
        (section(document="table3", record="mine"), "document 'table3' has no record 'mine'"),
        (section(record="mine"), "a figure has no record 'mine'"),
    ]
    for s, why in refused:
        with pytest.raises(ValueError, match=why):
            outline.register(s)
    # a document not yet registered may come later (a plugin loaded before the built-ins)
    outline.register(section(document="nowhere"))
    try:
        with pytest.raises(ValueError, match="no document 'nowhere'; register_document it"):
            outline.sections()
    finally:
        _forget("refused-test", "")
    with pytest.raises(ValueError, match="document 'serving' is already registered"):
        outline.register_document(Document("serving", ""))
    with pytest.raises(ValueError, match=r"records \['quality'\] taken"):
        outline.register_document(Document("refused", "", ("quality",)))
    assert outline.sections() == list(SECTIONS) and outline.documents() == list(DOCUMENTS)


def test_a_plugin_loaded_before_the_built_ins_comes_after_them(toy: None) -> None:
    """Plugins load when ``attnbench.row`` is first imported, which can be before the
    report's modules are: the built-ins still come first, in their order."""
    saved = dict(outline._DOCUMENTS), dict(outline._SECTIONS)
    outline._DOCUMENTS.clear()
    outline._SECTIONS.clear()
    try:
        import tests.toys.toy_section as toy_section  # registers alone, as if first

        assert outline.documents() == [toy_section.DOCUMENT]
        outline.register_builtins(DOCUMENTS, SECTIONS)
        assert outline.documents() == [*DOCUMENTS, toy_section.DOCUMENT]
        assert outline.sections() == [*SECTIONS, toy_section.SECTION]
    finally:
        outline._DOCUMENTS.clear()
        outline._SECTIONS.clear()
        outline._DOCUMENTS.update(saved[0])
        outline._SECTIONS.update(saved[1])
