"""One self-contained HTML page: tables, the paper beside them, and the plots inlined.

Pure: strings and bytes in, a string out. Nothing is fetched (no CDN, no fonts, images as
``data:`` URIs), so the page can be mailed, attached to a CI run or opened offline years later
and still show what was measured; the plots' PNG and SVG files are linked beside it.
"""

from __future__ import annotations

import base64
import html

from attnbench.report.grid import Grid
from attnbench.report.paper import Beside
from attnbench.report.tables import RatioTable, heading
from attnbench.row import shown

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 1.5em 0.5em 0; font-size: 0.9em; }
th, td { padding: 0.2em 0.7em; text-align: right; border-bottom: 1px solid #ddd; }
thead th { border-bottom: 2px solid #444; } caption { text-align: left; font-weight: 600; }
.side { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 1em; }
.side > div { flex: 1 1 28%; min-width: 22em; }
.notes { font-size: 0.8em; color: #555; margin: 0.2em 0 0 0; }
figure { display: inline-block; margin: 0.5em; } figcaption { font-size: 0.8em; }
img { width: 640px; height: auto; border: 1px solid #eee; }
"""

# the test that opens the page in Chromium reads this attribute back from the DOM: it
# counts the images the browser actually decoded, not the <img> tags written
COUNT_IMAGES = """
window.addEventListener("load", () => {
  const ok = [...document.images].filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.imagesDecoded = String(ok);
});
"""


def escape(text: str) -> str:
    """``text`` in the page as itself: cut short (:func:`attnbench.row.shown`), escaped."""
    return html.escape(shown(text))


def _caption(text: str, above: str) -> str:
    """A table's caption, or none where it would repeat the heading right ``above`` it."""
    return "" if text == above else f"<caption>{escape(text)}</caption>"


def table_html(t: RatioTable, caption: str | None = None, above: str = "") -> str:
    """A ratio table with its footnotes and context under it."""
    head = "".join(f"<th>{escape(heading(t, k))}</th>" for k in t.ks)
    body = "".join(
        f"<tr><th>{n}</th>" + "".join(f"<td>{escape(t.text[(n, k)])}</td>" for k in t.ks) + "</tr>"
        for n in t.ns
    )
    notes = "<br>".join(escape(f) for f in (*t.footnotes, t.context) if f)
    return (
        f"<div><table>{_caption(caption or f'{t.kind} ratio: {t.mechanism}', above)}"
        f"<thead><tr><th>n</th>{head}</tr></thead><tbody>{body}</tbody></table>"
        f'<p class="notes">{notes}</p></div>'
    )


def grid_html(g: Grid, above: str = "") -> str:
    """A table of text (the efficiency lengths, a quality table): first column a heading
    per row."""
    body = "".join(
        f"<tr><th>{escape(r[0])}</th>" + "".join(f"<td>{escape(c)}</td>" for c in r[1:]) + "</tr>"
        for r in g.body
    )
    return (
        f"<div><table>{_caption(g.title, above)}<thead><tr>"
        + "".join(f"<th>{escape(h)}</th>" for h in g.head)
        + f"</tr></thead><tbody>{body}</tbody></table>"
        f'<p class="notes">{"<br>".join(map(escape, g.notes))}</p></div>'
    )


def part_html(body: Grid | RatioTable | Beside, above: str = "") -> str:
    """A section's table on the page, under the heading ``above``; the paper's beside a
    measured (or modeled: the table's source) one, side by side."""
    if isinstance(body, Grid):
        return grid_html(body, above)
    if isinstance(body, Beside):
        mine = body.measured.source
        return (
            '<div class="side">'
            + table_html(body.measured, mine)
            + table_html(body.paper, "paper (Wang et al. 2020, Table 3)")
            + table_html(body.quotient, f"{mine} ÷ paper")
            + "</div>"
        )
    return table_html(body, above=above)


def figure_html(name: str, svg: bytes, caption: str) -> str:
    """The SVG shown inline (sharp at any zoom, the page alone shows every plot), its PNG
    and SVG files linked where the report writes them beside the page (``plots/``): one
    copy of each figure in the page, not three (a report of 44 plots was 8 MB)."""
    svg64 = base64.b64encode(svg).decode()
    return (
        f'<figure><img alt="{escape(caption)}" src="data:image/svg+xml;base64,{svg64}">'
        f"<figcaption>{escape(caption)} "
        f'(<a href="plots/{name}.png">PNG</a>, <a href="plots/{name}.svg">SVG</a>)'
        "</figcaption></figure>"
    )


def page(title: str, intro: list[str], sections: list[tuple[str, list[str]]]) -> str:
    """The whole document: ``sections`` are (heading, blocks of HTML) in order."""
    parts = [f"<h1>{escape(title)}</h1>", *(f"<p>{escape(p)}</p>" for p in intro)]
    for section, blocks in sections:
        parts.append(f"<h2>{escape(section)}</h2>")
        parts.extend(blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style><script>{COUNT_IMAGES}</script>"
        "</head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )
