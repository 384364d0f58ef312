"""Quality beside cost, drawn: the approximation error against the budget, the Linformer
paper's Figure 1 (the spectrum of P), the quality–cost Pareto plots and MQAR's recall–memory
Pareto plot; each function returns the figures its rows hold data for (none for rows of
another task)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.report.plots import DPI, SIZE_IN, Plot, literal_text, new_figure
from attnbench.report.quality import (
    RANDOM_FOOTNOTE,
    TRAINED_FOOTNOTE,
    _front,
    pareto_points,
    task_rows,
)
from attnbench.report.ratio import label
from attnbench.report.recall_setups import Setup, scheduled, setups
from attnbench.row import Row


def approx_vs_budget(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """Relative error against the budget k (log–log), one line per mechanism, per (inputs, n)."""
    out = []
    mine = [r for r in task_rows(rows, "approx") if r.k is not None]
    for inputs, n in sorted({(r.quality.get("inputs", "random"), r.n) for r in mine}):
        here = [r for r in mine if r.quality.get("inputs", "random") == inputs and r.n == n]
        fig, ax = new_figure()
        for name in dict.fromkeys(label(r) for r in here):
            pts = sorted((r.k, r.quality["rel_frobenius"]) for r in here if label(r) == name)
            pts = [(k, v) for k, v in pts if v and v > 0]
            if pts:
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.plot(xs, ys, marker="o", ms=3, label=literal_text(name))
        uniform = next((r.quality.get("uniform_rel_frobenius") for r in here), None)
        if uniform:
            ax.axhline(uniform, color="grey", lw=0.8, ls=":", label="uniform attention")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("budget k")
        ax.set_ylabel("relative error ‖Y − Ŷ‖ / ‖Y‖")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
        ax.set_title(
            literal_text(f"error against exact attention, n={n}, {inputs} inputs"), fontsize=9
        )
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
        fig, ax = new_figure()
        curves = q["cumulative"]
        for i, curve in enumerate(curves):
            ax.plot(range(1, len(curve) + 1), curve, lw=1, label=f"layer {i + 1}")
        ax.axvline(q["index"], color="grey", lw=0.6, ls="--")
        ax.set_xlabel("singular value index")
        ax.set_ylabel("normalised cumulative singular value")
        ax.legend(fontsize=6, ncol=2)
        ax.set_title(literal_text(f"spectrum of P ({inputs})"), fontsize=9)
        out.append(Plot(f"spectrum-{inputs}-n{q['n']}", fig, "Figure 1 (left). " + note))
        fig, ax = new_figure()
        image = ax.imshow(q["at_index"], aspect="auto", cmap="viridis")
        fig.colorbar(image, ax=ax, label=f"cumulative at the {q['index']}th singular value")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(literal_text(f"cumulative value at index {q['index']} ({inputs})"), fontsize=9)
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
        fig, ax = new_figure()
        for name, x, y, _ in pts:
            ax.scatter([x], [y], s=14, label=literal_text(name))
        front = _front([(x, y) for _, x, y, _ in pts], better_low)
        ax.plot([p[0] for p in front], [p[1] for p in front], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("seconds per training step" if what == "listops" else "time per sequence (s)")
        ax.set_ylabel(ylabel)
        if better_low:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
        ax.set_title(
            literal_text(f"quality against cost ({what}); dashed: the Pareto front"), fontsize=9
        )
        out.append(
            Plot(
                f"pareto-{what}",
                fig,
                f"{ylabel} against cost, per mechanism and budget; the dashed line joins "
                "the mechanisms no other beats on both.",
            )
        )
    return out


def _recall_panel(ax: Any, setup: Setup, pairs: int, colours: dict[str, Any], keys: bool) -> None:
    """One ``num_kv_pairs`` of a setup: accuracy (%) against context bytes per layer (log x),
    a colour per mechanism, each mechanism's budgets joined in budget order (so Linformer's
    line shows what each k buys; ``keys``: its points say their k), sd bars over seeds, a
    short_conv variant hollow and dotted, a layer schedule (a hybrid) a diamond, as colours
    repeat past ten mechanisms; chance dashed."""
    here = [p for p in setup.points if p.pairs == pairs and p.figure("context_bytes")]
    lines: dict[tuple[str, bool], list] = {}
    for p in here:
        lines.setdefault((p.mechanism, p.variant), []).append(p)
    for (mechanism, variant), points in lines.items():
        points.sort(key=lambda p: p.budget)
        xs = [p.figure("context_bytes") for p in points]
        ys = [p.mean for p in points]
        colour = colours[mechanism]
        name = mechanism + (" (" + points[0].config.rsplit(" ", 1)[-1] + ")" if variant else "")
        marker = "D" if scheduled(next(iter(points[0].runs.values()))) else "o"
        ax.errorbar(
            xs, ys, yerr=[p.sd or 0 for p in points], color=colour, marker=marker, ms=4,
            mfc="none" if variant else colour, ls=":" if variant else "-", lw=1, capsize=2,
            label=literal_text(name),
        )  # fmt: skip
        if keys and mechanism.startswith("linformer"):
            for p, x, y in zip(points, xs, ys, strict=True):
                ax.annotate(f"k={p.budget}", (x, y), xytext=(5, -10), textcoords="offset points",
                            fontsize=6, color=colour)  # fmt: skip
    if (chance := setup.chance(pairs)) is not None:
        ax.axhline(100 * chance, color="grey", lw=0.8, ls="--", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-2, 102)
    ax.margins(x=0.08)
    ax.grid(True, alpha=0.3)


def mqar_pareto(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """The recall–memory Pareto plot of each MQAR setup: test accuracy against context
    memory per layer and sequence (log x), at the largest ``num_kv_pairs`` (where the
    mechanisms part), and every ``num_kv_pairs`` as small multiples where there are several."""
    from matplotlib.figure import Figure

    out = []
    found = setups(rows)
    for i, setup in enumerate(found):
        mechanisms = dict.fromkeys(p.mechanism for p in setup.points)
        colours = {m: f"C{j % 10}" for j, m in enumerate(mechanisms)}
        suffix = f"-{i + 1}" if len(found) > 1 else ""
        top = max(setup.pairs)
        fig, ax = new_figure()
        _recall_panel(ax, setup, top, colours, keys=True)
        ax.set_xlabel("context memory per layer per sequence (bytes, fp32)")
        ax.set_ylabel("test accuracy over queries (%)")
        ax.legend(fontsize=6, loc="best")
        title = f"MQAR recall against context memory: {setup.title}, {top} pairs"
        ax.set_title(literal_text(title), fontsize=9)
        caption = (
            f"MQAR test accuracy against the context memory one sequence needs per layer, "
            f"{setup.title}, {top} key-value pairs; a colour per mechanism, its budgets joined "
            "(Linformer's points name their k), bars: sd over seeds; dashed: chance."
        )
        out.append(Plot(f"mqar-pareto{suffix}", fig, caption))
        if len(setup.pairs) < 2:
            continue
        fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
        count = len(setup.pairs)
        columns = min(3, count)
        axes = fig.subplots(-(-count // columns), columns, sharex=True, sharey=True, squeeze=False)
        for ax, pairs in zip(axes.flat, setup.pairs, strict=False):
            _recall_panel(ax, setup, pairs, colours, keys=False)
            ax.set_title(f"{pairs} pairs", fontsize=8)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[count:]:
            ax.set_visible(False)
        legend: dict[str, Any] = {}  # every panel's entries, once (not every one has all)
        for ax in axes.flat:
            for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(name, handle)
        fig.legend(legend.values(), legend.keys(), fontsize=5, loc="outside right upper")
        fig.supxlabel("context memory per layer per sequence (bytes)", fontsize=7)
        fig.supylabel("test accuracy (%)", fontsize=7)
        fig.suptitle(literal_text(f"MQAR recall against context memory: {setup.title}"), fontsize=9)
        out.append(
            Plot(
                f"mqar-pareto-pairs{suffix}",
                fig,
                f"The same at every number of pairs, {setup.title}: a panel per num_kv_pairs.",
            )
        )
    return out
