"""Every file, or part of a file, generated from a declaration or a committed file, and the
one command that rewrites them: ``python -m attnbench.mirrors`` (``--check``: write nothing,
exit 1 naming each stale one; tests/test_mirrors.py runs it).

Each generator is a pure function of its owner's module; this module only says which text
goes where (:func:`mirrors`: a file, a region of it, its generator) and writes:

* conf/config.yaml's settings part and docs/running.md's settings table
  (:mod:`attnbench.sweep.declared`, from every setting's declaration);
* attnbench/row/static.py, the row typed for a type checker, and docs/architecture.md's
  row-schema table (:mod:`attnbench.row.fields`, from ``FIELDS``);
* docs/architecture.md's quality-tasks table (:mod:`attnbench.quality.tasks`);
* README.md's mechanism table (:mod:`attnbench.listing`, from ``info()``: built-ins only,
  as no plugin is loaded here);
* every table the README and docs/ quote from a committed report or benchmark summary,
  between ``<!-- quote: SRC | TITLE | OPTIONS -->`` and ``<!-- /quote -->``
  (:func:`quoted`: ``TITLE`` is the table's bold title, ``**TITLE**``, or the text of the
  line above it; ``rows=a,b`` keeps the rows whose first cell is listed, ``notes`` adds the
  footnotes under the table, ``head`` the title line), or, where ``SRC`` is a Python file and
  ``TITLE`` is ``code``, that file after its docstring as a Python block (:func:`quoted_code`:
  a worked example in the docs is the tested file itself, never a second copy).

Only a source checkout has these files: an installed attnbench refuses in one line.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnbench import listing
from attnbench.quality import tasks
from attnbench.row import fields as row_fields
from attnbench.sweep import declared

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m attnbench.mirrors"

QUOTE = re.compile(
    r"<!-- quote: (?P<src>\S+) \| (?P<title>.+?)(?: \| (?P<opts>[^|]*?))? -->\n"
    r"(?P<body>.*?)<!-- /quote -->",
    re.S,
)
WHOLE = re.compile(r"\A(?P<body>.*)\Z", re.S)


class MirrorError(ValueError):
    """A region that cannot be generated (markers lost, a quoted table gone): one line."""


@dataclass(frozen=True)
class Region:
    """Where a generator's text goes: ``pattern``'s ``body`` group, replaced by ``make`` of
    the match; ``every``: each match (quotes), else exactly one (``what`` names it)."""

    what: str
    pattern: re.Pattern[str]
    make: Callable[[re.Match[str]], str]
    every: bool = False


def between(begin: str, end: str, make: Callable[[], str]) -> Region:
    """The lines after the one starting with ``begin`` (the rest of it is free text) up to
    the one starting with ``end``."""
    pattern = re.compile(rf"^{re.escape(begin)}[^\n]*\n(?P<body>.*?)^{re.escape(end)}", re.S | re.M)
    return Region(f"{begin} ... {end}", pattern, lambda _: make())


def markdown(name: str, make: Callable[[], str]) -> Region:
    """A Markdown table between ``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->``."""
    return between(f"<!-- {name}:begin", f"<!-- {name}:end", lambda: make() + "\n")


def quoted(text: str, title: str, opts: str = "") -> str:
    """The table titled ``title`` in the Markdown ``text`` of a committed file, as a quote
    of it shows it (the module's docstring says what ``opts`` does)."""
    lines = text.splitlines()
    heads = [
        i
        for i, line in enumerate(lines)
        if not line.startswith("|") and (line.startswith(f"**{title}**") or line == title)
    ]
    if len(heads) != 1:
        raise MirrorError(f"{len(heads)} tables titled {title!r}, need one")
    start = next(i for i in range(heads[0] + 1, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]
    words = opts.split()
    keep = {w.removeprefix("rows=") for w in words if w.startswith("rows=")}
    if keep:
        wanted = set(",".join(keep).split(","))
        body = [r for r in rows[2:] if r.split("|")[1].strip() in wanted]
        if len(body) != len(wanted):
            raise MirrorError(f"the table titled {title!r} lacks some of the rows {sorted(wanted)}")
        rows = rows[:2] + body
    out = [lines[heads[0]], ""] if "head" in words else []
    out += rows
    if "notes" in words:
        notes = []
        for line in lines[end + 1 :]:
            if not line.strip():
                break
            notes.append(line)
        out += ["", *notes]
    return "\n".join(out) + "\n"


def quoted_code(text: str, title: str) -> str:
    """The Python source ``text`` from the line after its module docstring, in a ``python``
    block: the whole file, so that what the docs show is what its tests run. ``title`` says
    so (``code``); a part of a file is not quoted, as it would not run alone."""
    if title != "code":
        raise MirrorError(f"a Python file is quoted whole, after its docstring: TITLE "
                          f"must be 'code', got {title!r}")  # fmt: skip
    tree = ast.parse(text)
    doc = tree.body[0] if tree.body and ast.get_docstring(tree) is not None else None
    lines = text.splitlines()[doc.end_lineno if doc is not None else 0 :]
    while lines and not lines[0].strip():
        lines.pop(0)
    return "```python\n" + "\n".join(lines) + "\n```\n"


def quotes(root: Path) -> Region:
    """Each quote block, from the file it names (relative to the checkout)."""

    def make(m: re.Match[str]) -> str:
        src = root / m["src"]
        if not src.is_file():
            raise MirrorError(f"quote of {m['src']}: no such file")
        try:
            if src.suffix == ".py":
                return quoted_code(src.read_text(), m["title"])
            return quoted(src.read_text(), m["title"], m["opts"] or "")
        except MirrorError as e:
            raise MirrorError(f"quote of {m['src']}: {e}") from None

    return Region("<!-- quote: SRC | TITLE -->", QUOTE, make, every=True)


def pages(root: Path) -> list[str]:
    """The README and every page of docs/: where quotes may be."""
    return ["README.md", *sorted(f"docs/{p.name}" for p in (root / "docs").glob("*.md"))]


def mirrors(root: Path = ROOT) -> dict[str, list[Region]]:
    """{file relative to ``root``: its generated regions}, in the order they are filled."""
    found = {
        "conf/config.yaml": [
            between("# <settings:begin>", "# <settings:end>", declared.config_block)
        ],
        "docs/running.md": [markdown("settings", declared.docs_table)],
        "docs/architecture.md": [
            markdown("row-schema", row_fields.markdown_table),
            markdown("quality-tasks", tasks.markdown_table),
        ],
        "README.md": [markdown("mechanisms", listing.markdown_table)],
        "attnbench/row/static.py": [
            Region("the file", WHOLE, lambda _: row_fields.static_source())
        ],
    }
    for page in pages(root):
        found.setdefault(page, []).append(quotes(root))
    return found


def fill(text: str, region: Region) -> str:
    """``text`` with ``region``'s body (each, or the one) made again."""
    matches = list(region.pattern.finditer(text))
    if not region.every and len(matches) != 1:
        raise MirrorError(f"{len(matches)} regions {region.what}, need one")
    out, at = [], 0
    for m in matches:
        out += [text[at : m.start("body")], region.make(m)]
        at = m.end("body")
    return "".join(out) + text[at:]


def generated(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """{file: (its text now, the text its generators make)}; :class:`MirrorError` names the
    file when a region cannot be made."""
    out = {}
    for rel, regions in mirrors(root).items():
        path = root / rel
        now = path.read_text() if path.is_file() else ""
        new = now
        for region in regions:
            try:
                new = fill(new, region)
            except MirrorError as e:
                raise MirrorError(f"{rel}: {e}") from None
        out[rel] = (now, new)
    return out


def stale(root: Path = ROOT) -> list[str]:
    """The files whose generated regions are not what their generators make now."""
    return [rel for rel, (now, new) in generated(root).items() if now != new]


def main(argv: list[str]) -> int:
    """Rewrite every stale mirror (``--check``: none, exit 1 naming each); a region that
    cannot be made, or a tree that is not a source checkout: one line, exit 2, nothing
    written."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Regenerate every mirror of a source checkout from its declaration or "
        "committed file: conf/config.yaml's settings, attnbench/row/static.py, the tables of "
        "docs/running.md and docs/architecture.md, the README's mechanisms and the tables and "
        "toy files the README and docs/ quote. A developer's step after changing a declaration "
        "or a committed report (tests/test_mirrors.py holds every file to it); not needed to "
        "run attnbench.",
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    missing = next((p for p in ("pyproject.toml", "docs") if not (ROOT / p).exists()), None)
    if missing is not None:
        print(
            f"{PROG}: error: no {missing} in {ROOT}: it rewrites files of a source checkout "
            "(git clone), not of an installed attnbench",
            file=sys.stderr,
        )
        return 2
    try:
        texts = generated(ROOT)
    except MirrorError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    changed = [rel for rel, (now, new) in texts.items() if now != new]
    for rel in changed:
        if args.check:
            print(f"{rel} is stale: run {PROG}")
        else:
            (ROOT / rel).write_text(texts[rel][1])
            print(f"rewrote {rel}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
