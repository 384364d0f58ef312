"""Quality beside cost, drawn: the approximation error against the budget, the Linformer
paper's Figure 1 (the spectrum of P) and the quality–cost Pareto plots; each function
returns the figures its rows hold data for (none for rows of another task)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.report.plots import Plot, _figure, _text
from attnbench.report.quality import (
    RANDOM_FOOTNOTE,
    TRAINED_FOOTNOTE,
    _front,
    pareto_points,
    task_rows,
)
from attnbench.report.ratio import label
from attnbench.row import Row


def approx_vs_budget(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """Relative error against the budget k (log–log), one line per mechanism, per (inputs, n)."""
    out = []
    mine = [r for r in task_rows(rows, "approx") if r.k is not None]
    for inputs, n in sorted({(r.quality.get("inputs", "random"), r.n) for r in mine}):
        here = [r for r in mine if r.quality.get("inputs", "random") == inputs and r.n == n]
        fig, ax = _figure()
        for name in dict.fromkeys(label(r) for r in here):
            pts = sorted((r.k, r.quality["rel_frobenius"]) for r in here if label(r) == name)
            pts = [(k, v) for k, v in pts if v and v > 0]
            if pts:
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.plot(xs, ys, marker="o", ms=3, label=_text(name))
        uniform = next((r.quality.get("uniform_rel_frobenius") for r in here), None)
        if uniform:
            ax.axhline(uniform, color="grey", lw=0.8, ls=":", label="uniform attention")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("budget k")
        ax.set_ylabel("relative error ‖Y − Ŷ‖ / ‖Y‖")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
        ax.set_title(_text(f"error against exact attention, n={n}, {inputs} inputs"), fontsize=9)
        caption = f"Approximation error against the budget, n = {n}, {inputs} inputs. " + (
            RANDOM_FOOTNOTE if inputs == "random" else TRAINED_FOOTNOTE
        )
        out.append(Plot(f"approx-{inputs}-n{n}", fig, caption))
    return out


def spectrum_figures(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """Figure 1 of the Linformer paper: the normalised cumulative spectrum of P per layer
    (left), and the value at the index-th singular value per layer and head (right)."""
    out = []
    for r in task_rows(rows, "spectrum"):
        q = r.quality
        inputs = q.get("inputs", "random")
        what = (
            "a randomly initialised vanilla model"
            if inputs == "random"
            else "the vanilla model trained on ListOps"
        )
        note = (
            f"On {what} (n = {q['n']}). The paper used pretrained RoBERTa; attnbench has no "
            "pretrained weights offline."
        )
        fig, ax = _figure()
        curves = q["cumulative"]
        for i, curve in enumerate(curves):
            ax.plot(range(1, len(curve) + 1), curve, lw=1, label=f"layer {i + 1}")
        ax.axvline(q["index"], color="grey", lw=0.6, ls="--")
        ax.set_xlabel("singular value index")
        ax.set_ylabel("normalised cumulative singular value")
        ax.legend(fontsize=6, ncol=2)
        ax.set_title(_text(f"spectrum of P ({inputs})"), fontsize=9)
        out.append(Plot(f"spectrum-{inputs}-n{q['n']}", fig, "Figure 1 (left). " + note))
        fig, ax = _figure()
        image = ax.imshow(q["at_index"], aspect="auto", cmap="viridis")
        fig.colorbar(image, ax=ax, label=f"cumulative at the {q['index']}th singular value")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(_text(f"cumulative value at index {q['index']} ({inputs})"), fontsize=9)
        out.append(Plot(f"spectrum-at-index-{inputs}-n{q['n']}", fig, "Figure 1 (right). " + note))
    return out


def pareto_figures(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """Quality against cost, one point per mechanism and budget; the front marked."""
    points = pareto_points(rows)
    out = []
    for what, ylabel, better_low in (
        ("listops", "ListOps test accuracy", False),
        ("approx", "relative error against exact attention", True),
    ):
        pts = [p for p in points if p[3] == what]
        if not pts:
            continue
        fig, ax = _figure()
        for name, x, y, _ in pts:
            ax.scatter([x], [y], s=14, label=_text(name))
        front = _front([(x, y) for _, x, y, _ in pts], better_low)
        ax.plot([p[0] for p in front], [p[1] for p in front], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("seconds per training step" if what == "listops" else "time per sequence (s)")
        ax.set_ylabel(ylabel)
        if better_low:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
        ax.set_title(_text(f"quality against cost ({what}); dashed: the Pareto front"), fontsize=9)
        out.append(
            Plot(
                f"pareto-{what}",
                fig,
                f"{ylabel} against cost, per mechanism and budget; the dashed line joins "
                "the mechanisms no other beats on both.",
            )
        )
    return out
