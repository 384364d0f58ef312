"""Every generated file or region is what its generator makes now, and
``python -m attnbench.mirrors`` (attnbench/mirrors.py) is the one command that rewrites them:
``--check`` names each stale file and writes nothing; a region it cannot make (markers lost,
a quoted table gone) is one line, exit 2, nothing written.

The command's ``--help``, its refusal of a bad argument and of an installed tree are with the
other modules a user can type, in tests/test_hostile_files.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnbench import mirrors
from attnbench.mirrors import PROG, MirrorError

ROOT = Path(__file__).resolve().parents[1]


def test_every_mirror_is_what_its_generator_makes() -> None:
    try:
        stale = mirrors.stale()
    except MirrorError as e:
        pytest.fail(f"{e}: mend it, then run {PROG}")
    assert not stale, "\n".join(f"{rel} is stale: run {PROG}" for rel in stale)


# -- the command, on a copy of the files it reads and writes ------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's mirrors, the committed files their quotes read, and pyproject.toml."""
    where = tmp_path_factory.mktemp("checkout")
    sources = {
        m["src"]
        for page in mirrors.pages(ROOT)
        for m in mirrors.QUOTE.finditer((ROOT / page).read_text())
    }
    for rel in {"pyproject.toml", *mirrors.mirrors(ROOT), *sources}:
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, where / rel)
    return where


@pytest.fixture
def tree(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of :func:`template`, which the command takes for the checkout."""
    root = tmp_path / "checkout"
    shutil.copytree(template, root)
    monkeypatch.setattr(mirrors, "ROOT", root)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert text.count(old) == 1, (rel, old)
    path.write_text(text.replace(old, new))


STALE = [  # (file, a line of a generated region, what it becomes)
    ("docs/architecture.md", "| cell | the mechanism |", "| cell | a mechanism |"),
    ("attnbench/row/static.py", "    schema: int\n", "    schema: str\n"),
    ("docs/quality.md", "<!-- /quote -->", "| a row typed in by hand |\n<!-- /quote -->"),
    ("docs/mechanisms.md", "    window: int = 128\n", "    window: int = 64  # edited here\n"),
]


def test_check_names_each_stale_mirror_and_the_command_mends_them(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = _files(tree)
    for rel, old, new in STALE:
        text = (tree / rel).read_text()
        (tree / rel).write_text(text.replace(old, new, 1))
    edited = _files(tree)
    assert mirrors.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{rel} is stale: run python -m attnbench.mirrors"
        for rel in mirrors.mirrors(tree)
        if rel in {s[0] for s in STALE}
    ]
    assert _files(tree) == edited  # --check writes nothing
    assert mirrors.main([]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(f"rewrote {s[0]}" for s in STALE)
    assert _files(tree) == fresh
    assert mirrors.main(["--check"]) == 0 and capsys.readouterr().out == ""


BROKEN = [  # (file, old, new, the error after "python -m attnbench.mirrors: error: ")
    ("docs/architecture.md", "<!-- row-schema:end -->\n", "",
     "docs/architecture.md: 0 regions <!-- row-schema:begin ... <!-- row-schema:end, need one"),
    ("conf/config.yaml", "# <settings:begin>", "# <settings begin>",
     "conf/config.yaml: 0 regions # <settings:begin> ... # <settings:end>, need one"),
    ("docs/quality.md", "| ListOps accuracy over seeds |", "| ListOps accuracy, renamed |",
     "docs/quality.md: quote of reports/listops_seeds-cpu-cpu/quality.md: 0 tables titled "
     "'ListOps accuracy, renamed', need one"),
    ("docs/quality.md", "768) | rows=1,6,12", "768) | rows=1,6,99",
     "docs/quality.md: quote of reports/spectrum-cpu-cpu/quality.md: the table titled 'Spectrum "
     "of P, n=512, random model (12 layers, d_model 768)' lacks some of the rows ['1', '6', '99']"),
    ("docs/quality.md", "recall-cpu-cpu/quality.md | MQAR test accuracy, n=64, V=128 -->",
     "no-such-run/quality.md | MQAR test accuracy, n=64, V=128 -->",
     "docs/quality.md: quote of reports/no-such-run/quality.md: no such file"),
    ("docs/mechanisms.md", "toy_mechanism.py | code -->", "toy_mechanism.py | LocalConfig -->",
     "docs/mechanisms.md: quote of tests/toys/toy_mechanism.py: a Python file is quoted whole, "
     "after its docstring: TITLE must be 'code', got 'LocalConfig'"),
]  # fmt: skip


@pytest.mark.parametrize(("rel", "old", "new", "error"), BROKEN, ids=[b[3][:40] for b in BROKEN])
def test_a_region_it_cannot_make_is_one_line_and_nothing_written(
    tree: Path, rel: str, old: str, new: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "attnbench/row/static.py").write_text("stale\n")  # would be rewritten, if any were
    _edit(tree, rel, old, new)
    before = _files(tree)
    assert mirrors.main([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"python -m attnbench.mirrors: error: {error}\n"
    assert _files(tree) == before
