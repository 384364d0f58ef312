"""Hostile ``cells.jsonl``: every field of real rows replaced in turn by hostile values.

Each case must end one of two ways (docs/reliability.md, "Hostile rows"):

* refused: ``attnbench report`` exits 2 with one line on stderr and no traceback, and
  writes nothing; :func:`attnbench.load` raises a one-line ``ValueError``;
* read tolerantly (free text: a device, a reason, a parameter's value): exit 0, and every
  output file holds the value escaped for its format, never as markup, a line break or a
  table cell of its own.

The fuzz calls the CLI's ``main`` in-process (its exit code, its stderr, the files it
writes); one subprocess per kind of outcome checks the same through a real process.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import attnbench
from attnbench import cli
from attnbench.quality import tasks
from attnbench.report import files
from attnbench.report.text import latex, markdown
from attnbench.row import nested as row_nested
from attnbench.row import printable, shown
from tests.conftest import run_cli

ROOT = Path(__file__).parent.parent
REFERENCE = ROOT / "results/reference/table3-v100_16gb-cpu/cells.jsonl"
LINES = REFERENCE.read_text().splitlines()
# the baseline at n=512 and linformer at n=512, k=128 and k=256: a whole (small) Table 3
BASE = [json.loads(LINES[i]) for i in (0, 8, 9)]

LATEX_PAYLOAD = "x\n\\input{/etc/hostname}"
HTML_PAYLOAD = "<script>alert(1)</script>"
LONG = "L" * 100_000
HOSTILE: dict[str, Any] = {
    # wrong types
    "str": "hostile",
    "list": [1, "a"],
    "dict": {"a": 1},
    "bool": True,
    "null": None,
    # numbers that parse but are impossible
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "-1": -1,
    "zero": 0,
    "float": 0.5,
    "10**400": 10**400,
    "2**63": 2**63,
    # strings that are markup, line breaks or terminal control somewhere
    "newline": "a\nb",
    "cr": "a\rb",
    "nul": "a\x00b",
    "esc": "\x1b[31mred\x1b]0;title\x07",
    "latex": LATEX_PAYLOAD,
    "tex-specials": "\\ { } $ & # ^ _ % ~ $$\\frac{1}{0}$$",
    "html": HTML_PAYLOAD,
    "markdown": "| a | [x](javascript:alert(1)) `c` *d* &lt;",
    "csv": 'a,"b"\n=1+1',
    "rtl": "abc\u202edcba\u2066",
    "surrogate": "\ud800",
    "line-separator": "a\u2028b\u0085c",
    "long": LONG,
}
# a report's cells are a ratio, a mark, or one of the paper's signs: nothing else, ever
CELL = re.compile(r"^(-|n/m|OOM|\d+\.\d+x?)([⁰¹²³⁴⁵⁶⁷⁸⁹]+(,[⁰¹²³⁴⁵⁶⁷⁸⁹]+)*)?$")  # marks.py
# what a LaTeX line of a table may hold: booktabs, \times, and the escapes of tables.LATEX
TEX_COMMANDS = {
    "begin",
    "end",
    "toprule",
    "midrule",
    "bottomrule",
    "times",
    "text",
    "textbackslash",
    "textless",
    "textgreater",
    "textbar",
    *"\\{}$&#^_%~",
}
HTML_TAGS = {
    *"html head meta title style script body h1 h2 p div table caption thead tbody".split(),
    *"tr th td br figure img figcaption a".split(),
}


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory where there is one (/dev/shm): the fuzz writes some 5000
    small reports, and on a shared disk their opens and fsyncs are most of its time."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="attnbench-hostile-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _targets() -> Iterator[tuple[int, tuple[str, ...]]]:
    """(row, path) for every field of the baseline's and a mechanism's row, every key of
    their nested objects and a key they do not have."""
    for i in (0, 1):
        for name, value in BASE[i].items():
            yield i, (name,)
            if isinstance(value, dict):
                for key in [*value, "extra"]:
                    yield i, (name, key)


def _key_targets() -> Iterator[tuple[int, str]]:
    for i in (0, 1):
        for name in ("params", "model", "env", "cell"):
            yield i, name


def _write(run: Path, rows: list[dict[str, Any]]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _report(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``attnbench report RUN --out OUT --no-plots --quiet`` in this process."""
    capsys.readouterr()
    code = cli.main(["report", str(run), "--out", str(out), "--no-plots", "--quiet"])
    return code, capsys.readouterr().err


def _finite(constant: str) -> None:
    raise AssertionError(f"report.json holds {constant}")


def check_outputs(out: Path, documents: tuple[str, ...] = ("table3",)) -> None:
    """Every file of a report holds a row's text escaped for its format; ``documents``: the
    Markdown and LaTeX documents it must have written (``table3``, ``packed``, ``serving``)."""
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {
        "index.html",
        "report.json",
        *(f"{d}.{x}" for d in documents for x in "md tex".split()),
    } <= names
    for name in names:
        assert re.fullmatch(
            r"[a-z0-9-]+-(time|memory)\.csv|[a-z0-9]+\.(md|tex)|index\.html|report\.json|"
            r"plots/[a-z0-9-]+\.(png|svg)",
            name,
        ), name
        assert len(name) < 130, name
        if name.endswith(".png"):
            continue
        text = (out / name).read_bytes().decode("utf-8")  # strict: no lone surrogate
        if not text.replace("\n", "").isprintable():  # no CR, NUL, ESC, RTL override, ...
            raise AssertionError((name, {c for c in text if c != "\n" and not c.isprintable()}))
    report = json.loads((out / "report.json").read_text(), parse_constant=_finite)
    for table in report["tables"]:
        for c in table["cells"]:
            assert CELL.match(c["text"]), c  # hostile data never becomes a cell
            assert c["value"] is None or math.isfinite(c["value"])
    tex = [line for d in documents for line in (out / f"{d}.tex").read_text().splitlines()]
    for line in tex:
        if line.startswith("%") or not line:
            continue  # a comment: inert up to the line's end, which nothing can put early
        commands = set(re.findall(r"\\([A-Za-z]+|.)", line))
        assert commands <= TEX_COMMANDS, (line, commands - TEX_COMMANDS)
        assert re.fullmatch(r"\\(begin|end)\{tabular\}(\{r+\})?|\\[a-z]+rule|.* \\\\", line), line
    md = "\n\n".join((out / f"{d}.md").read_text() for d in documents)
    assert not re.search(r"(?<!\\)[<>&\[\]`]", md), "unescaped Markdown markup"
    for block in md.split("\n\n"):  # each table (the efficiency lengths, each ratio table)
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        pipes = {len(re.findall(r"(?<!\\)\|", ln)) for ln in rows}
        assert len(pipes) <= 1, "a Markdown table row broken"
    for name in names:
        if name.endswith(".csv"):
            table = list(csv.reader(io.StringIO((out / name).read_text())))
            assert len({len(r) for r in table}) == 1 and table[0][0] == "n", name
    page = (out / "index.html").read_text()
    tags = set(re.findall(r"</?([A-Za-z][A-Za-z0-9]*)", page))
    assert tags <= HTML_TAGS and page.count("<script") == 1, tags - HTML_TAGS


def _case(
    tmp: Path,
    capsys: pytest.CaptureFixture[str],
    rows: list[dict[str, Any]],
    what: str,
    documents: tuple[str, ...] = ("table3",),
) -> str:
    """One hostile file through report and load: 'refused' or 'tolerated'."""
    run, out = tmp / "run", tmp / "out"
    try:
        _write(run, rows)
    except ValueError:  # a value json cannot write (never here; the guard keeps it honest)
        return "skipped"
    code, err = _report(run, out, capsys)
    try:
        attnbench.load(run)
        loaded = None
    except ValueError as e:
        loaded = str(e)
    if code == 2:
        assert err.startswith("attnbench report: error: "), (what, err)
        assert err.count("\n") == 1 and len(err) < 2000, (what, err[:300])
        assert not out.exists(), what
        assert not [p for p in tmp.iterdir() if p.name.startswith(".out")], what
        if loaded is not None:
            assert "\n" not in loaded and len(loaded) < 2000, (what, loaded[:300])
        return "refused"
    assert code == 0, (what, code, err[:300])
    for line in err.splitlines():  # a row no table can use is named, in one short line
        assert " is in no table: " in line and len(line) < 2100, (what, line[:300])
    assert loaded is None, (what, loaded)  # a row a report takes, load takes too
    check_outputs(out, documents)
    for p in sorted(out.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    out.rmdir()
    return "tolerated"


def _set(row: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    if len(path) == 2 and not isinstance(row.get(path[0]), dict):
        row[path[0]] = {}
    target = row if len(path) == 1 else row[path[0]]
    if value is _DELETE:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("row", "path"), list(_targets()), ids=lambda x: x if isinstance(x, int) else ".".join(x)
)
def test_every_field_replaced_by_hostile_values(
    row: int, path: tuple[str, ...], scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcomes = {}
    for name, value in [*HOSTILE.items(), ("deleted", _DELETE)]:
        rows = json.loads(json.dumps(BASE))
        _set(rows[row], path, value)
        outcomes[name] = _case(scratch, capsys, rows, f"row {row} {'.'.join(path)}={name}")
    # the figures a table is made of refuse whatever is not a figure
    figures = {"n", "k", "max_batch", "time_per_seq_s", "ceiling_bytes", "status"}
    if path[0] in figures and len(path) == 1:
        for name in ("str", "list", "dict", "bool", "nan", "inf", "-inf", "-1", "10**400"):
            assert outcomes[name] == "refused", (path, name)
    if path[0] in ("n", "attention", "dtype", "device") and len(path) == 1:
        assert outcomes["deleted"] == "refused"
    if path[0] in ("params", "model", "env") and len(path) == 1:
        for name in ("str", "list", "bool", "null", "nan", "-1"):
            assert outcomes[name] == "refused", (path, name)


@pytest.mark.parametrize(("row", "nested"), list(_key_targets()))
def test_hostile_key_names_in_nested_objects(
    row: int, nested: str, scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A parameter or model field is a Python name; env and cell keys are kept as found."""
    for name, key in HOSTILE.items():
        if not isinstance(key, str):
            continue
        rows = json.loads(json.dumps(BASE))
        _set(rows[row], (nested, key), 1)
        outcome = _case(scratch, capsys, rows, f"row {row} {nested}[{name!r}]")
        if nested in ("params", "model") and not key.isidentifier():
            assert outcome == "refused", (nested, name)


def _reference(run: str, picks: tuple[int, ...]) -> list[dict[str, Any]]:
    lines = (ROOT / "results/reference" / run / "cells.jsonl").read_text().splitlines()
    return [json.loads(lines[i]) for i in picks]


# a whole (small) table of each workload and quality task with nested figures: vanilla and
# sdpa padded and packed on one draw; vanilla and linear at b=1, every prompt n and a drawn
# mix; each task's baseline and a mechanism (approx: on random inputs and trained ones)
NESTED_BASE = {
    "packed": _reference("packed-v100_16gb-cpu", (0, 2, 12, 14)),
    "serving": _reference("serving_mix-v100_16gb-cpu", (0, 3, 18, 21)),
    "approx": _reference("approx-cpu-cpu", (0, 1, 32, 33)),
    "spectrum": _reference("spectrum-cpu-cpu", (0, 1)),
    "listops": _reference("listops-cpu-cpu", (0, 2)),
    "recall": _reference("recall-cpu-cpu", (0, 3)),
}
DOCUMENTS = {"packed": ("packed",), "serving": ("serving",)}  # else ("quality",)
# (run, row, field): the baseline's row and a mechanism's, in each nested object they have
NESTED_TARGETS = [
    *(("packed", i, "packed") for i in (0, 3)),
    *(("serving", i, field) for i in (1, 3) for field in ("prompts", "decode")),
    ("serving", 2, "decode"),
    *(("approx", i, "quality") for i in (1, 3)),
    *((run, i, "quality") for run in ("spectrum", "listops", "recall") for i in (0, 1)),
    *((run, 1, "cell") for run in ("listops", "recall")),
]


def _nested_targets() -> Iterator[tuple[str, int, tuple[str, str]]]:
    """(run, row, path) for every key of each target's nested object and a key it lacks."""
    for run, i, field in NESTED_TARGETS:
        for key in [*NESTED_BASE[run][i][field], "extra"]:
            yield run, i, (field, key)


def _required(run: str, row: int, field: str) -> dict[str, str]:
    """The keys of a nested object a report reads, each with its kind: every row holding
    the object has them (:data:`attnbench.row.nested.NESTED`, a task's figures)."""
    if field == "quality":
        task = tasks.REGISTRY[NESTED_BASE[run][row]["task"]]
        return {f.name: f.kind for f in task.figures if not f.optional}
    if field == "cell":
        return {}
    return dict.fromkeys(row_nested.NESTED[field].required, "number")


@pytest.mark.parametrize(
    ("run", "row", "path"),
    list(_nested_targets()),
    ids=lambda x: ".".join(x) if isinstance(x, tuple) else str(x),
)
def test_every_nested_figure_replaced_by_hostile_values(
    run: str,
    row: int,
    path: tuple[str, str],
    scratch: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The draw, FLOPs and serving figures inside ``packed``, ``prompts`` and ``decode``, a
    quality task's figures and the settings a report reads from a row's stored ``cell``: a
    key a report reads (:func:`_required`) refuses whatever is not its figure, deleted too;
    any other is refused or read tolerantly, never a traceback."""
    outcomes = {}
    for name, value in [*HOSTILE.items(), ("deleted", _DELETE)]:
        rows = json.loads(json.dumps(NESTED_BASE[run]))
        _set(rows[row], path, value)
        what = f"{run} row {row} {'.'.join(path)}={name}"
        outcomes[name] = _case(scratch, capsys, rows, what, DOCUMENTS.get(run, ("quality",)))
    kind = _required(run, row, path[0]).get(path[1])
    wrong = {
        "number": ("str", "list", "dict", "bool", "nan", "inf", "10**400"),
        "count": ("str", "list", "dict", "bool", "-1", "float", "2**63"),
    }.get(kind or "", ())
    below = () if path[1] == "flops_wasted_share" else ("-1",)  # < 0: packing beats each alone
    if kind is not None:
        for name in (*wrong, *(below if path[0] != "quality" else ()), "null", "deleted"):
            assert outcomes[name] == "refused", (path, name)


@pytest.mark.parametrize(
    ("run", "row", "path", "value", "needle"),
    [
        ("packed", 2, ("packed", "real_tokens"), _DELETE, "packed.real_tokens: missing"),
        ("packed", 0, ("packed", "real_tokens"), 0, "packed.real_tokens: must be an integer >= 1"),
        ("packed", 0, ("packed", "lengths"), [], "packed.lengths: must be a non-empty list"),
        ("packed", 0, ("packed", "padding_share"), True, "packed.padding_share: must be a number"
         " in [0, 1], got True"),
        ("packed", 0, ("packed", "flops_wasted_share"), None, "packed.flops_wasted_share: must"
         " be a number <= 1, got None"),
        ("serving", 3, ("prompts", "own_state_bytes"), _DELETE, "prompts.own_state_bytes: missing"),
        ("serving", 3, ("decode", "bytes_per_s"), "fast", "decode.bytes_per_s: must be a number"),
        ("approx", 1, ("quality", "rel_frobenius"), _DELETE, "quality.rel_frobenius: missing"
         " (every task=approx row holds it)"),
        ("listops", 0, ("quality", "test_accuracy"), None, "quality.test_accuracy: must not be"
         " null"),
        ("approx", 1, ("quality", "cosine"), 10**400, "quality.cosine: must be a number"),
        ("approx", 1, ("quality", "inputs"), "trained", "quality.inputs: must be one of random,"
         " listops"),
        ("spectrum", 0, ("quality", "index"), 513, "quality.index: must be in [1, 512] (the"
         " curves), got 513"),
        ("spectrum", 0, ("quality", "at_index"), [[0.5]], "quality.at_index: must have a row per"
         " layer of cumulative (12)"),
        ("recall", 1, ("cell", "quality"), [["seed", "x"]], "cell.quality.seed: must be an"
         " integer >= 0, got 'x'"),
        ("listops", 1, ("cell", "quality"), [["steps", [1]]], "cell.quality.steps: must be an"
         " integer >= 0, got [1]"),
        ("listops", 1, ("cell", "quality"), "seed", "cell.quality: must be a list of [setting,"
         " value] pairs"),
    ],
)  # fmt: skip
def test_a_nested_figure_refused_names_the_file_the_line_and_the_key(
    run: str,
    row: int,
    path: tuple[str, str],
    value: Any,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = json.loads(json.dumps(NESTED_BASE[run]))
    _set(rows[row], path, value)
    _write(tmp_path / "run", rows)
    code, err = _report(tmp_path / "run", tmp_path / "out", capsys)
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists(), err
    assert f"cells.jsonl:{row + 1}: {needle}" in err, err
    with pytest.raises(ValueError, match=re.escape(f"cells.jsonl:{row + 1}: {needle}")):
        attnbench.load(tmp_path / "run")


@pytest.mark.parametrize(
    ("row", "field", "value", "needle"),
    [
        (1, "n", "512", "n: must be an integer >= 1, got '512'"),
        (1, "n", None, "n: must be an integer >= 1, got None"),
        (1, "k", "128", "k: must be an integer >= 1, got '128'"),
        (1, "time_per_seq_s", "fast", "time_per_seq_s: must be a number >= 0, got 'fast'"),
        (1, "time_per_seq_s", math.nan, "time_per_seq_s: must be a number >= 0, got nan"),
        (1, "time_per_seq_s", -math.inf, "time_per_seq_s: must be a number >= 0, got -inf"),
        (1, "time_per_seq_s", 10**400, "time_per_seq_s: must be a number >= 0 that a float"),
        (1, "max_batch", "12", "max_batch: must be an integer >= 0, got '12'"),
        (1, "max_batch", 10**400, "max_batch: must be an integer below 2**63"),
        (1, "n", 0, "n: must be an integer >= 1, got 0"),
        (1, "status", 1, "status: must be one of ok, oom, skipped, error; got 1"),
        (1, "params", [], "params: must be an object, got []"),
        (1, "params", {"a b": 1}, "params: a parameter name must be an identifier, got 'a b'"),
        (1, "model", {"layers": [12]}, "model.layers: must be an integer >= 1, got [12]"),
        (1, "env", "cpu", "env: must be an object, got 'cpu'"),
        (1, "env", {"device_name": ["x"]}, "env.device_name: must be a string, got ['x']"),
        (1, "attention", "a\nb", "attention: must be an identifier (a name like linformer)"),
        (1, "budget", "k=1", "budget: must be an identifier"),
        (1, "dtype", "fp8", "dtype: must be one of fp32, fp16, bf16; got 'fp8'"),
        (1, "finished_at", 2**63, "finished_at: must be a number in [0, 2.53402e+11]"),
    ],
)
def test_refusals_name_the_file_the_line_and_the_field(
    row: int,
    field: str,
    value: Any,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = json.loads(json.dumps(BASE))
    rows[row][field] = value
    if field == "budget":  # a schema 1 row's budget is the registry's, never the stored one
        rows[row]["schema"] = 2
    run, out = tmp_path / "run", tmp_path / "out"
    _write(run, rows)
    code, err = _report(run, out, capsys)
    assert code == 2 and err.count("\n") == 1 and not out.exists(), err
    assert f"cells.jsonl:{row + 1}: {needle}" in err, err
    with pytest.raises(ValueError) as e:
        attnbench.load(run)
    assert f"cells.jsonl:{row + 1}: {needle}" in str(e.value) and "\n" not in str(e.value)


def test_a_long_hostile_value_is_quoted_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = json.loads(json.dumps(BASE))
    rows[1]["n"] = "\n" * 10 + LONG
    _write(tmp_path / "run", rows)
    code, err = _report(tmp_path / "run", tmp_path / "out", capsys)
    assert code == 2 and err.count("\n") == 1 and len(err) < 500, err
    assert "n: must be an integer >= 1, got '\\n\\n" in err
    assert re.search(r"L… \(\d+ characters in all\)$", err.rstrip()), err  # cut, and said


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"n": "\xff"}\n', "cells.jsonl:2: not UTF-8"),
        (b"[1, 2]\n", "cells.jsonl:2: not a JSON row"),
        (b'{"n": ' + b"9" * 5000 + b"}\n", "cells.jsonl:2: not a JSON row"),
        (b"[" * 100_000 + b"\n", "cells.jsonl:2: not a JSON row"),
        (b"{}\n", "cells.jsonl:2: attention: missing"),
        (b'{"schema": 9}\n', "cells.jsonl:2: schema: this attnbench reads schemas 1, 2, 3"),
    ],
)
def test_lines_that_are_not_rows(
    content: bytes, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cells.jsonl").write_bytes(LINES[0].encode() + b"\n" + content)
    code, err = _report(run, tmp_path / "out", capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=re.escape(needle)):
        attnbench.load(run)


def _hostile_run(run: Path) -> str:
    """The reference rows with every kind of free text hostile: what a report must show,
    escaped. Returns the value put in a parameter of the mechanism's rows."""
    value = f"{LATEX_PAYLOAD} {HTML_PAYLOAD} | [l](javascript:x) \u202e \x1b[2J [/bold]"
    rows = [json.loads(line) for line in LINES]
    for r in rows:
        if r["attention"] == "linformer":
            r["params"]["kernel"] = value
        r["device"] = "dev\n\\input{/etc/passwd}<b>"
        r["env"]["device_name"] = "gpu\r\n# heading\n<i>"
        if r["status"] != "ok":
            r["reason"] = "reason\n\\input{/etc/shadow}"
    _write(run, rows)
    return value


def test_hostile_free_text_is_escaped_in_every_format(tmp_path: Path) -> None:
    value = _hostile_run(tmp_path / "run")
    label = f"linformer (kernel={value}, projection=linear, sharing=layerwise)"
    out = files.write(files.render(files.build(tmp_path / "run"), with_plots=False), tmp_path / "o")
    check_outputs(out)
    tex = (out / "table3.tex").read_text()
    assert latex(label) in tex  # the label, escaped, in the comment under each table
    assert not [ln for ln in tex.splitlines() if "input{" in ln and not ln.startswith("%")]
    md = (out / "table3.md").read_text()
    assert f"**time ratio: {markdown(label)}**" in md
    assert markdown("preset dev\n\\input{/etc/passwd}<b>") in md
    page = (out / "index.html").read_text()
    assert html.escape(printable(label)) in page and HTML_PAYLOAD not in page
    assert html.escape(printable("gpu\r\n# heading\n<i>")) in page
    csvs = sorted(out.glob("*.csv"))
    assert len(csvs) == 2 and all(len(p.name) < 130 for p in csvs)


def test_hostile_free_text_in_plots_and_the_terminal(
    tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """Through the CLI (in this process), with the rich tables printed and the plots drawn:
    a ``$`` pair would be mathtext to matplotlib, an ESC a command to the terminal."""
    _hostile_run(tmp_path / "run")
    done = cli_in_process("report", "run", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not {c for c in done.stdout if c != "\n" and not c.isprintable()}
    assert "\\x1b[2J" in done.stdout and "\\u202e" in done.stdout
    assert "[/bold]" in done.stdout  # shown, not read as rich markup (which raised)
    check_outputs(tmp_path / "out")
    if files.plots.available() is None:
        assert len(list((tmp_path / "out" / "plots").glob("*.png"))) == 3


def test_a_refused_row_through_a_real_process(tmp_path: Path) -> None:
    rows = json.loads(json.dumps(BASE))
    rows[2]["time_per_seq_s"] = "NaN"
    _write(tmp_path / "run", rows)
    done = run_cli("report", "run", "--out", "out", "--no-plots", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "attnbench report: error: run/cells.jsonl:3: time_per_seq_s: must be a number >= 0,"
        " got 'NaN'\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _bad_run_dirs(tmp_path: Path) -> dict[str, str]:
    """Run directories that are not: name -> the line that says so."""
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "dir-of-rows" / "cells.jsonl").mkdir(parents=True)
    (tmp_path / "loop-of-rows").mkdir()
    (tmp_path / "loop-of-rows" / "cells.jsonl").symlink_to("cells.jsonl")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "cells.jsonl")  # reading it would block for ever
    return {
        "loop": "run dir: loop/cells.jsonl is a symlink loop",
        "a-file": "run dir: a-file is a file, not a run directory",
        "dir-of-rows": "run dir: dir-of-rows/cells.jsonl is not a regular file of rows",
        "loop-of-rows": "run dir: loop-of-rows/cells.jsonl is a symlink loop",
        "fifo": "run dir: fifo/cells.jsonl is not a regular file of rows",
        "missing": "run dir: no cells.jsonl in missing",
    }


def test_run_dirs_that_are_not(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    cli_in_process: Callable[..., subprocess.CompletedProcess],
) -> None:
    monkeypatch.chdir(tmp_path)
    for run, line in _bad_run_dirs(tmp_path).items():
        code, err = _report(Path(run), Path("out"), capsys)
        assert code == 2 and err.startswith(f"attnbench report: error: {line}"), (run, err)
        assert err.count("\n") == 1, err
        with pytest.raises(ValueError) as e:
            attnbench.load(run)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
    # and through the CLI's main, the one that crashed (RuntimeError) before (a crash would
    # raise here; the real process of a refused report: test_a_refused_row_through_...)
    done = cli_in_process("report", "loop", "--no-plots", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "attnbench report: error: run dir: loop/cells.jsonl is a symlink loop\n"


def test_out_that_cannot_be(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write(run, BASE)
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a-file").write_text("x")
    cases = {
        tmp_path / "loop": "--out: {} is a symlink loop",
        tmp_path / "loop" / "x": "--out: {} is a symlink loop",
        tmp_path / "a-file" / "x": f"--out: {tmp_path / 'a-file'} is a file, not a directory",
        tmp_path / "a-file": "--out: {} exists and is not an attnbench report",
    }
    for out, line in cases.items():
        code, err = _report(run, out, capsys)
        assert code == 2 and line.format(out) in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "loop", "run"]
    assert (tmp_path / "a-file").read_text() == "x"


def test_a_run_dir_named_with_a_newline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run\n\\input{x}<b>"
    _write(run, BASE)
    code, err = _report(run, tmp_path / "out", capsys)
    assert code == 0, err
    check_outputs(tmp_path / "out")
    assert "run\\n\\input{x}<b>/cells.jsonl" in (tmp_path / "out/table3.tex").read_text()
    code, err = _report(tmp_path / "missing\nline", tmp_path / "out2", capsys)
    assert code == 2 and err.count("\n") == 1 and "missing\\nline" in err


def test_labels_that_slug_alike_get_files_of_their_own(tmp_path: Path) -> None:
    """``kernel=Eager`` and ``kernel=eager`` are two mechanisms, and two CSVs each."""
    rows = json.loads(json.dumps(BASE))
    twin = json.loads(json.dumps(rows[1]))
    twin["params"]["kernel"] = "Eager"
    rows.append(twin)
    _write(tmp_path / "run", rows)
    rendered = files.render(files.build(tmp_path / "run"), with_plots=False)
    assert len([n for n in rendered if n.endswith(".csv")]) == 4


def test_a_ratio_beyond_a_float_is_no_cell(tmp_path: Path) -> None:
    rows = json.loads(json.dumps(BASE))
    rows[1]["time_per_seq_s"] = 5e-324  # baseline's 0.85 s over it: inf
    _write(tmp_path / "run", rows)
    report = files.build(tmp_path / "run")
    time = report.tables[0]
    assert time.value[(512, 128)] is None and time.text[(512, 128)] == "n/m¹"
    assert "time ratio beyond a float's range" in time.footnotes[0]


def _rows_of(run: str, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    lines = (ROOT / "results/reference" / run / "cells.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if keep(r)]


def _failed(row: dict[str, Any], value: str, status: str = "error") -> None:
    row.update(status=status, reason=value, time_per_seq_s=None, max_batch=None, quality=None)


def _at_512(r: dict[str, Any]) -> bool:
    return r["n"] == 512


def _long_in(shape: str, value: str) -> list[dict[str, Any]]:
    """A small real run with ``value`` where ``shape`` says: a reason (a footnote), a
    parameter (a label: titles, headings, legends), a machine's name (the line under each
    table), why a time was busy; in rows of each workload and of a quality task."""
    rows = json.loads(json.dumps(BASE))
    if shape == "table3 error":
        _failed(rows[0], value)  # the baseline's: every ratio at n=512 footnotes it
    elif shape == "table3 skipped":
        _failed(rows[1], value, "skipped")
    elif shape == "table3 parameter":
        rows[1]["params"]["kernel"] = value
    elif shape == "table3 device_name":
        for r in rows:
            r["env"]["device_name"] = value
    elif shape == "table3 busy":
        rows[1]["contention"] = {"busy": True, "why": value}
    elif shape == "train error":
        rows = _rows_of("table3_train-v100_16gb-cpu", _at_512)
        _failed(rows[-1], value)
    elif shape.startswith("serving"):
        rows = _rows_of("serving-v100_16gb-cpu", _at_512)
        linear = next(r for r in rows if r["attention"] == "linear")
        if shape == "serving error":
            _failed(linear, value)
        else:
            linear["params"]["feature_map"] = value
    elif shape == "compiled error":
        rows = _rows_of("compiled-v100_16gb-cpu", _at_512)
        _failed(next(r for r in rows if r["compile"] and r["attention"] != "vanilla"), value)
    elif shape == "quality error":
        rows = _rows_of("approx-cpu-cpu", lambda r: r["k"] in (None, 64))
        _failed(rows[-1], value)
    return rows


def _as_read(text: str) -> str:
    """What a report shows of a value ``L…L`` cut short, less how much of it: the mark's
    count has more digits for a longer value, and as many fewer ``L`` are kept."""
    return re.sub(r"L*… \(\d+ characters in all\)", "…", text)


@pytest.mark.parametrize(
    "shape",
    [
        *("table3 error", "table3 skipped", "table3 parameter", "table3 device_name"),
        *("table3 busy", "train error", "serving error", "serving parameter"),
        *("compiled error", "quality error"),
    ],
)
def test_a_long_value_is_shown_cut_and_the_report_is_no_longer(
    shape: str, tmp_path: Path, cli_in_process: Callable[..., subprocess.CompletedProcess]
) -> None:
    """Through the CLI (in this process) with the tables printed: what stderr and the
    Markdown, LaTeX and HTML files show is the same for a value of 5 kB and of 100 kB but
    for the count in the mark that says it was cut, and the terminal's tables as long, so
    the report's cost does not grow with the value (a terminal wraps a long word in time
    that grows with its square: 40 kB took a minute). The data keeps it whole."""
    shown = {}
    for size in (5_000, 100_000):
        value = "L" * size
        _write(tmp_path / str(size) / "run", _long_in(shape, value))
        done = cli_in_process(
            "report", "run", "--out", "out", "--no-plots", cwd=tmp_path / str(size)
        )
        assert done.returncode == 0, done.stderr[:300]
        out = tmp_path / str(size) / "out"
        documents = sorted(p for p in out.iterdir() if p.suffix in (".md", ".tex", ".html"))
        shown[size] = [done.stdout, _as_read(done.stderr)]
        shown[size] += [_as_read(p.read_text()) for p in documents]
        counts = re.findall(r"\((\d+) characters in all\)", done.stdout + done.stderr)
        assert counts and max(map(int, counts)) >= size, shape  # shown, cut, and said so
        if shape == "table3 error":  # report.json is data: the footnote quotes it whole
            assert value in (out / "report.json").read_text()
    # the terminal lays out the mark's two more digits as its columns allow: its length held
    (terminal, *rest), (terminal_long, *rest_long) = shown[5_000], shown[100_000]
    assert len(terminal_long) < 1.1 * len(terminal) and rest == rest_long


def test_shown_is_one_line_cut_and_marked() -> None:
    assert shown("a\nb") == "a\\nb" and shown("x" * 100, 100) == "x" * 100
    cut = shown("\n" * 5000, 100)  # escaped, then cut: at most the limit, mark included
    assert len(cut) == 100 and cut.startswith("\\n\\n") and cut.endswith("(5000 characters in all)")
