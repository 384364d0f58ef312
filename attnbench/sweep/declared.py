"""Every declared setting in one list, and what is generated from it: the settings part of
conf/config.yaml and the settings table of docs/running.md.

Each owner declares its own (:mod:`attnbench.settings`, the workloads, the quality tasks);
this module only gathers them, in the order the config and the docs list them. Regenerate
both after changing a declaration with ``python -m attnbench.sweep.declared``; tests hold
the two files equal to what this writes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from attnbench import workload
from attnbench.quality import tasks
from attnbench.settings import COMPILE, MODEL, TIMING, Setting, markdown_table, yaml_block

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "config.yaml"
DOCS = ROOT / "docs" / "running.md"
BEGIN, END = "settings:begin", "settings:end"


def all_settings() -> tuple[Setting, ...]:
    """The model's, each built-in workload's, compiling's, each quality task's, timing's."""
    work = workload.workload_settings(workload.get(name) for name in workload.BUILTINS)
    quality = [s for t in tasks.REGISTRY.values() for s in t.settings]
    return (*MODEL, *work, *COMPILE, *quality, *TIMING)


def config_block() -> str:
    """The part of conf/config.yaml between its ``settings`` markers: every setting but the
    model's (their defaults are the ``model: base`` group's, conf/model/base.yaml)."""
    notes = {"quality": 'each quality task\'s settings (README, "Quality beside cost")'}
    notes.update({f"quality.{t.name}": t.doc for t in tasks.REGISTRY.values()})
    return yaml_block([s for s in all_settings() if s.owner != "model"], notes)


def docs_table() -> str:
    return markdown_table(all_settings())


def region(text: str, comment: str) -> re.Match[str] | None:
    """The generated region of a file whose comments start with ``comment``."""
    pattern = rf"{re.escape(comment)} <{BEGIN}>[^\n]*\n(.*?){re.escape(comment)} <{END}>"
    return re.search(pattern, text, re.S)


def _write(path: Path, comment: str, body: str) -> None:
    text = path.read_text()
    found = region(text, comment)
    if found is None:
        sys.exit(f"{path}: no '{comment} <{BEGIN}>' ... '{comment} <{END}>' region")
    path.write_text(text[: found.start(1)] + body + text[found.end(1) :])


def main(argv: list[str]) -> int:
    """``python -m attnbench.sweep.declared``: both files rewritten, in a source checkout
    only (an installed attnbench ships conf/ as attnbench.conf, and no docs): anywhere else
    one line and exit code 2, nothing written."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m attnbench.sweep.declared",
        description="Regenerate, from the settings' declarations, the settings part of "
        "conf/config.yaml and the settings table of docs/running.md: a developer's step "
        "after changing a declaration, in a source checkout (tests hold both files to it). "
        "Not needed to run attnbench.",
    )
    parser.parse_args(argv)
    missing = next((p for p in (ROOT / "pyproject.toml", CONFIG, DOCS) if not p.is_file()), None)
    if missing is not None:
        print(
            f"{parser.prog}: error: no {missing.relative_to(ROOT)} in {ROOT}: it rewrites "
            "files of a source checkout (git clone), not of an installed attnbench",
            file=sys.stderr,
        )
        return 2
    _write(CONFIG, "#", config_block())
    _write(DOCS, "<!--", docs_table() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
