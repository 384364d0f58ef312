"""Sizes: a module of attnbench/ holds at most 300 lines and a function at most 60, or
docs/architecture.md lists it with why it is longer; the two lists are held to the code both
ways, so they stay true.

Counted from the source alone (``ast``, nothing imported): a module's lines as ``wc -l``
counts them; a function's from its ``def`` line to its last (``end_lineno - lineno + 1``:
the signature and docstring count, decorators do not), every ``def`` counted, methods and
nested functions too, each named by its ``__qualname__`` (``Class.method``,
``outer.<locals>.inner``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "attnbench"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MODULE_LIMIT = 300
FUNCTION_LIMIT = 60
# a row of the lists: | `attnbench/x.py` | 312 | why | or | `attnbench/x.py:f` | 75 | why |
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<lines>\d+) \| (?P<why>.*\S.*) \|$")


def functions(source: str) -> dict[str, int]:
    """{qualname: lines} of every function defined in ``source``, at any depth."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found[name] = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:  # an if, a with, a try: what it defines is still the enclosing scope's
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def measured() -> tuple[dict[str, int], dict[str, int]]:
    """({module: lines} over :data:`MODULE_LIMIT`, {module:qualname: lines} over
    :data:`FUNCTION_LIMIT`) of the package as it stands."""
    modules, funcs = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel, source = path.relative_to(ROOT).as_posix(), path.read_text()
        if (lines := len(source.splitlines())) > MODULE_LIMIT:
            modules[rel] = lines
        for name, lines in functions(source).items():
            if lines > FUNCTION_LIMIT:
                funcs[f"{rel}:{name}"] = lines
    return modules, funcs


def documented(marker: str) -> dict[str, int]:
    """{name: lines as documented} of docs/architecture.md's ``marker`` table; every row of
    the table must parse, so that a malformed one is not silently an absent one."""
    block = re.search(
        rf"<!-- {marker}:begin -->\n(.*?)\n<!-- {marker}:end -->", ARCHITECTURE.read_text(), re.S
    )
    assert block, f"docs/architecture.md lost its <!-- {marker}:begin/end --> markers"
    rows = [line for line in block.group(1).splitlines() if line.startswith("|")][2:]
    bad = [line for line in rows if not ROW.match(line)]
    assert not bad, f"docs/architecture.md's {marker} table: not | `name` | lines | why |: {bad}"
    return {m["name"]: int(m["lines"]) for m in map(ROW.match, rows) if m}


def differences(
    what: str, limit: int, over: dict[str, int], listed: dict[str, int], marker: str
) -> list[str]:
    """One line per disagreement between what is over ``limit`` and the ``marker`` list:
    each names the file (and function), its count, the limit and what to do."""
    wrong = [
        f"{name}: {lines} lines, over the limit of {limit} for a {what}: split it along a "
        f"seam, or add the row | `{name}` | {lines} | why it is longer | to "
        f"docs/architecture.md's {marker} table"
        for name, lines in over.items()
        if name not in listed
    ]
    for name, then in listed.items():
        if name not in over:
            now = _now(name)
            state = "gone" if now is None else f"now {now} lines"
            wrong.append(
                f"{name}: listed in docs/architecture.md's {marker} table ({then} lines then), "
                f"but {state}, within the limit of {limit} for a {what}: remove its row"
            )
    return wrong


def _now(name: str) -> int | None:
    """The lines of a module (``path``) or function (``path:qualname``) now; None if gone."""
    path, _, qualname = name.partition(":")
    if not (ROOT / path).is_file():
        return None
    source = (ROOT / path).read_text()
    return functions(source).get(qualname) if qualname else len(source.splitlines())


def test_every_module_over_300_lines_is_listed_with_why_and_only_those() -> None:
    modules, _ = measured()
    wrong = differences("module", MODULE_LIMIT, modules, documented("long-modules"), "long-modules")
    assert not wrong, "\n".join(wrong)


def test_every_function_over_60_lines_is_listed_with_why_and_only_those() -> None:
    _, funcs = measured()
    listed = documented("long-functions")
    wrong = differences("function", FUNCTION_LIMIT, funcs, listed, "long-functions")
    assert not wrong, "\n".join(wrong)


def test_a_function_counts_from_its_def_to_its_last_line_at_any_depth() -> None:
    source = (
        "@decorator\n"
        "def f(\n    x,\n):\n    def inner():\n        return 1\n    return inner\n"
        "class C:\n    if True:\n        def m(self):\n            pass\n"
    )
    assert functions(source) == {"f": 6, "f.<locals>.inner": 2, "C.m": 2}


def test_a_stale_or_missing_entry_is_named_with_its_count_and_the_limit() -> None:
    over, listed = {"attnbench/a.py": 301}, {"attnbench/cli.py": 400}
    wrong = differences("module", MODULE_LIMIT, over, listed, "long-modules")
    assert wrong[0].startswith("attnbench/a.py: 301 lines, over the limit of 300 for a module")
    assert "| `attnbench/a.py` | 301 | why it is longer |" in wrong[0]
    assert re.match(r"attnbench/cli.py: listed .* \(400 lines then\), but now \d+ lines", wrong[1])
    assert wrong[1].endswith("within the limit of 300 for a module: remove its row")
