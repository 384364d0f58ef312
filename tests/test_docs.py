"""The README and docs/ stay true: their links resolve, every page of the index exists, every
reference report they discuss is quoted, the figures they tabulate by hand are the committed
runs', and every command they show is one attnbench accepts.

Tables quoted from a committed file sit between markers::

    <!-- quote: reports/table3-v100_16gb-cpu/table3.md | TITLE | rows=512,1024 notes -->
    ...the table, as the file has it...
    <!-- /quote -->

``python -m attnbench.mirrors`` rewrites every block from its file (after a new reference
run) and tests/test_mirrors.py holds them to it; attnbench/mirrors.py says what the options do.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnbench.mirrors import QUOTE
from tests.compose_once import each_composed_once, files_read_once

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(path: Path) -> list[re.Match[str]]:
    return list(QUOTE.finditer(path.read_text()))


# -- quoted figures ----------------------------------------------------------------------


def test_the_docs_quote_every_committed_report_they_cite() -> None:
    """Each reference report the docs discuss has at least one table quoted from it."""
    sources = {m.group("src") for path in PAGES for m in _blocks(path)}
    for report, document in (
        ("table3-v100_16gb-cpu", "table3.md"),
        ("zoo-v100_16gb-cpu", "table3.md"),
        ("approx-cpu-cpu", "quality.md"),
        ("listops-cpu-cpu", "quality.md"),
        ("listops_seeds-cpu-cpu", "quality.md"),
        ("spectrum-cpu-cpu", "quality.md"),
    ):
        assert f"reports/{report}/{document}" in sources, report
    assert "results/benchmarks/forward-cpu.md" in sources
    assert "results/benchmarks/train-cpu.md" in sources


def _rows(run: str) -> list[dict]:
    path = ROOT / "results" / "reference" / run / "cells.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _md_table(text: str, header_start: str) -> list[list[str]]:
    """The body rows of the one table whose header starts with ``header_start``."""
    lines = text.splitlines()
    (i,) = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    rows = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _batch(rows: list[dict], attention: str, n: int, k: int | None, mode: str) -> str:
    (row,) = [
        r
        for r in rows
        if r["attention"] == attention
        and r["n"] == n
        and r["k"] == k
        and r.get("mode", "inference") == mode
    ]
    return str(row["max_batch"]) if row["status"] == "ok" else "OOM at b=1"


def test_training_batches_are_the_reference_runs() -> None:
    """docs/training.md: max batch training (table3_train) against inference (table3)."""
    train, infer = _rows("table3_train-v100_16gb-cpu"), _rows("table3-v100_16gb-cpu")
    table = _md_table((ROOT / "docs/training.md").read_text(), "| n | Transformer train b |")
    assert len(table) == 7
    for n, *cells in table:
        want = []
        for attention, k in (("vanilla", None), ("linformer", 128), ("linformer", 256)):
            want += [
                _batch(train, attention, int(n), k, "train"),
                _batch(infer, attention, int(n), k, "inference"),
            ]
        assert cells == want, f"n={n}"


def test_modeled_memory_table_is_the_reference_run_and_the_paper() -> None:
    """docs/measurement.md, "The memory half of Table 3, modeled": max batches from the
    reference Table 3 run, ratios from them, the paper's figures from its CSV."""
    rows = _rows("table3-v100_16gb-cpu")
    with open(ROOT / "attnbench/data/linformer_table3.csv") as f:
        paper = {
            (int(r["n"]), int(r["k"])): float(r["memory_ratio"])
            for r in csv.DictReader(line for line in f if not line.startswith("#"))
        }
    text = (ROOT / "docs/measurement.md").read_text()
    table = _md_table(text, "| n | Transformer b |")
    assert len(table) == 8
    for n, vb, b128, r128, p128, b256, r256, p256 in table:
        n = int(n)
        assert vb == _batch(rows, "vanilla", n, None, "inference"), n
        for k, b, r, p in ((128, b128, r128, p128), (256, b256, r256, p256)):
            assert b == _batch(rows, "linformer", n, k, "inference"), (n, k)
            assert float(p) == paper[n, k], (n, k)
            assert r == ("-" if vb.startswith("OOM") else f"{int(b) / int(vb):.1f}"), (n, k)


@pytest.mark.parametrize(
    ("run", "page", "phrase", "count"),
    [
        ("table3-v100_16gb-cpu", "docs/running.md", "42 cells (40 `ok`, 2 `oom`", None),
        ("table3_train-v100_16gb-cpu", "docs/training.md", "(42 cells: 25 `ok`, 17 `oom`)", None),
        ("zoo-v100_16gb-cpu", "docs/zoo.md", "111 cells", 111),
        ("listops_seeds-cpu-cpu", "docs/quality.md", "10 trainings", 10),
    ],
)
def test_prose_cell_counts_are_the_reference_runs(
    run: str, page: str, phrase: str, count: int | None
) -> None:
    text = " ".join((ROOT / page).read_text().split())
    assert phrase in text, f"{page} no longer says {phrase!r}"
    rows = _rows(run)
    if count is not None:
        assert len(rows) == count
    else:
        total, ok, oom = (int(x) for x in re.findall(r"\d+", phrase))
        statuses = [r["status"] for r in rows]
        assert (len(rows), statuses.count("ok"), statuses.count("oom")) == (total, ok, oom)


# -- links and the index -----------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks or inline code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _heading_anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    out = set()
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):
        h = h.replace("`", "").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", h).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        if not where.exists():
            broken.append(target)
        elif anchor and where.suffix == ".md" and anchor not in _heading_anchors(where):
            broken.append(target)
    assert not broken, broken


def _index() -> list[str]:
    text = README.read_text()
    start = text.index("## Documentation")
    end = text.find("\n## ", start + 1)
    return [t for t in LINK.findall(text[start:end]) if t.startswith("docs/")]


def test_every_page_of_the_index_exists_and_every_page_is_in_it() -> None:
    listed = {t.partition("#")[0] for t in _index()}
    assert listed, "the README lost its index of docs pages"
    for target in listed:
        assert (ROOT / target).is_file(), target
    pages = {_rel(p) for p in PAGES if p != README}
    assert pages <= listed, f"pages missing from the README's index: {sorted(pages - listed)}"


# -- commands shown ----------------------------------------------------------------------


def _shown_commands() -> list[tuple[str, list[str]]]:
    """Every ``attnbench ...`` line of a fenced bash block: (page, argv after attnbench)."""
    out = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                if line.startswith("attnbench "):
                    out.append((_rel(page), shlex.split(line, comments=True)[1:]))
    return out


SHOWN = _shown_commands()
RUNS = [(p, a) for p, a in SHOWN if a[0] == "run" and not {"--help", "-h"} & set(a)]
OTHERS = [(p, a) for p, a in SHOWN if a[0] != "run"]


def test_the_docs_show_commands() -> None:
    assert len(RUNS) >= 20 and OTHERS
    assert {a[0] for _, a in SHOWN} >= {"run", "report", "check"}


@pytest.fixture(scope="module")
def prevalidated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., list]]:
    """prevalidate(ARGS) for the commands shown, each distinct command once (a few are
    shown on two pages), all with one out_dir (nothing is written there: prevalidate only
    probes that it could be) and Hydra composing each distinct config once (and reading
    each config file once): commands that differ in values share their sweep's configs
    (``+sweep=compare n=2048``, ``mode=train``, ``checkpoint=true``)."""
    from attnbench.sweep.config import prevalidate

    out_dir = tmp_path_factory.mktemp("out_dir")
    plans: dict[tuple[str, ...], list] = {}

    def plan(args: list[str]) -> list:
        if tuple(args) not in plans:
            plans[tuple(args)] = prevalidate([*args, f"out_dir={out_dir}"])
        return plans[tuple(args)]

    with files_read_once(), each_composed_once():
        yield plan


@pytest.mark.parametrize(("page", "args"), RUNS, ids=[" ".join(a) for _, a in RUNS])
def test_every_run_command_shown_composes_and_validates(
    page: str, args: list[str], prevalidated: Callable[..., list]
) -> None:
    """Expanded by Hydra's sweeper, composed and validated as `attnbench run` does before
    anything runs; nothing measured (out_dir moved to a temporary directory)."""
    plan = prevalidated(args[1:])
    assert plan, f"{page}: attnbench {' '.join(args)}"


@pytest.mark.parametrize(("page", "args"), OTHERS, ids=[" ".join(a) for _, a in OTHERS])
def test_every_other_command_shown_parses(
    page: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from attnbench.cli import build_parser

    if {"--help", "-h"} & set(args):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(args)
        assert e.value.code == 0 and "usage: attnbench" in capsys.readouterr().out
    else:
        build_parser().parse_args(args)  # argparse exits 2 on a flag it does not know


@pytest.mark.parametrize("command", sorted({a[0] for _, a in SHOWN} - {"run"}))
def test_every_subcommand_shown_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """(`attnbench run --help` is Hydra's: tests/test_run_cli.py::test_help_helps.)"""
    from attnbench.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0 and f"usage: attnbench {command}" in capsys.readouterr().out
