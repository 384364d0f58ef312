"""A row's free text as a reader sees it: on one line, shown as stored, cut short.

A row's free text (``device``, ``reason``, the strings of ``env`` and ``params``, ...) is
read as it is, newlines, markup and all; whatever shows it (an error line, a terminal, a
page, a plot) passes it through :func:`shown` first, and a report's writers escape what is
special to their format after that (:mod:`attnbench.report.text`).
"""

from __future__ import annotations

from attnbench.row.checks import shorten


def printable(text: str) -> str:
    """``text`` on one line and shown as stored: every character ``str.isprintable``
    refuses (newline, CR, tab, NUL, ESC, bidi overrides like U+202E, lone surrogates) as its
    Python escape (``\\n``, ``\\x00``, ``\\u202e``). A row's free text is read as it is;
    whatever shows it (an error line, a report) passes it through this first, so no value
    can start a line of its own, drive a terminal or reorder what is around it."""
    if text.isprintable():  # nearly always: no copy
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# the most of one piece of text a report shows (a cell, a heading, a footnote, a line under
# a table): over twice the longest the report writes itself, so only a row's value is cut
SHOWN_CHARS = 1000


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as a reader sees it: :func:`printable`, and past ``limit`` characters cut
    with a mark that says so (:func:`shorten`). Whatever shows a row's text (a terminal, a
    page, a Markdown or LaTeX line, a plot, a line on stderr) passes it through this: a
    value can be megabytes, and a terminal wraps a long word in time that grows with its
    square. The data (``cells.jsonl``, :func:`attnbench.load`, ``report.json``, the CSV
    files) keeps it whole. Only the first ``limit + 1`` characters are read: the cost is
    bounded whatever the value's length."""
    head = printable(text[: limit + 1])
    if len(text) <= limit and len(head) <= limit:
        return head
    return shorten(head, limit, whole=len(text))
