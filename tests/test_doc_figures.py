"""Figures and lists in the prose of the README and docs/ are the data's: each is computed
here from the committed reference runs (or the table the page quotes from them, which
``test_docs.py`` holds to its report) and the config files, and must appear in the text as
computed. A regenerated run that moves a range or a spread fails here until the sentence is
rewritten, as a quoted table fails ``test_docs.py``.
"""

from __future__ import annotations

import csv
import itertools
import re

from tests.test_docs import ROOT, _md_table, _rows


def _text(page: str) -> str:
    """The page with its line breaks as spaces, as a phrase reads across them."""
    return " ".join((ROOT / page).read_text().split())


def _ok(rows: list[dict], attention: str, n: int, k: int | None) -> int | None:
    """The max batch of the one row of (attention, n, k), None where b = 1 did not fit."""
    (row,) = [r for r in rows if (r["attention"], r["n"], r["k"]) == (attention, n, k)]
    return row["max_batch"] if row["status"] == "ok" else None


def test_the_memory_half_against_the_paper_is_the_reference_runs() -> None:
    """README and docs/measurement.md: Linformer ÷ Transformer max batch, over the paper's,
    at every n up to 16384 (where the Transformer fits b = 1), as a range."""
    rows = _rows("table3-v100_16gb-cpu")
    with open(ROOT / "attnbench/data/linformer_table3.csv") as f:
        paper = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    quotients = []
    for r in paper:
        n, k = int(r["n"]), int(r["k"])
        vanilla, linformer = _ok(rows, "vanilla", n, None), _ok(rows, "linformer", n, k)
        if n <= 16384 and vanilla and linformer:
            quotients.append(linformer / vanilla / float(r["memory_ratio"]))
    span = f"{min(quotients):.2f}–{max(quotients):.2f}"
    assert f"is {span} times the paper's up to n = 16384" in _text("README.md")
    assert f"Up to n = 16384 our ratios are {span} times the paper's" in _text(
        "docs/measurement.md"
    )


def test_training_fits_fewer_sequences_by_the_tables_ratios() -> None:
    """docs/training.md: inference ÷ training max batch over its table's columns; where only
    b = 1 trains the quotient bounds the ratio, so those are said apart."""
    train, infer = _rows("table3_train-v100_16gb-cpu"), _rows("table3-v100_16gb-cpu")
    several, single = [], set()
    for attention, k in (("vanilla", None), ("linformer", 128), ("linformer", 256)):
        for n in sorted({r["n"] for r in train}):
            t, i = _ok(train, attention, n, k), _ok(infer, attention, n, k)
            if t and i and t > 1:
                several.append(i / t)
            elif t and i:
                single.add(round(i / t))
    ones = " and ".join(f"{q}×" for q in sorted(single))
    phrase = (
        f"Training fits {round(min(several))}–{round(max(several))}× fewer sequences than "
        f"inference where more than one trains ({ones} where only b = 1 fits"
    )
    assert phrase in _text("docs/training.md"), phrase


def test_the_seed_spreads_are_the_seed_tables() -> None:
    """docs/quality.md: the spread of MQAR's seeds, from the table it quotes."""
    text = (ROOT / "docs/quality.md").read_text()
    spans = {}
    for config, pairs, _, accuracies, *_ in _md_table(text, "| configuration | pairs | seeds |"):
        acc = [float(a) for a in accuracies.removesuffix("%").split(",")]
        spans[config, int(pairs)] = (min(acc), max(acc))
    lo, hi = spans["vanilla", 16]
    assert f"vanilla's three seeds at 16 pairs span {hi - lo:.2f} points" in _text(
        "docs/quality.md"
    )
    lo, hi = spans["linear", 8]
    assert f"linear's at 8 pairs span {lo:.0f}–{hi:.0f} %" in _text("docs/quality.md")


def test_the_serving_ratios_at_the_longest_context_are_the_tables() -> None:
    """docs/serving.md: how many times vanilla's sequences the states fit at the longest n,
    from the max-batch table it quotes (whole times, as the table's tenths cut)."""
    text = (ROOT / "docs/serving.md").read_text()
    after = text[text.index("| memory ratio: serving, max batch -->") :].splitlines()[1:]
    table = list(itertools.takewhile(lambda line: line.startswith("|"), after))
    header, last = ([c.strip() for c in row.strip("|").split("|")] for row in (table[0], table[-1]))
    cells = dict(zip(header, last, strict=True))
    times = {name: int(float(cells[col].split("x")[0])) for name, col in (
        ("linear", "linear"),
        ("Performer", "performer (kernel=softmax, ortho_features=True)"),
        ("local", "local"),
    )}  # fmt: skip
    phrase = (
        f"At n = {cells['n']} linear fits {times['linear']}× vanilla's sequences, "
        f"Performer {times['Performer']}×, local {times['local']}×."
    )
    assert phrase in _text("docs/serving.md"), phrase


def test_the_groups_listed_are_the_config_files() -> None:
    """docs/running.md's Groups: every file of conf/<group>/ named, and nothing else."""
    text = _text("docs/running.md")
    start = text.index("- **Groups**")
    listing = text[start : text.index("Add your own", start)]
    groups = sorted({p.parent.name for p in (ROOT / "conf").glob("*/*.yaml")})
    marks = [listing.index(f"`{g}/`") for g in groups]
    bounds = [*sorted(zip(marks, groups, strict=True)), (len(listing), "")]
    for (at, group), (end, _) in itertools.pairwise(bounds):
        named = set(re.findall(r"`([a-z0-9_]+)`", listing[at:end]))
        files = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert named == files, (group, sorted(files - named), sorted(named - files))
