"""Quality beside cost: the report's tables for quality rows.

Pure functions of rows, like :mod:`attnbench.report.tables`: ``approx`` rows become error
tables (rows mechanism, columns budget k, one table per n and input kind), ``listops`` rows an
accuracy table with the published Long Range Arena figures beside ours (as context, never as
a target), ``spectrum`` rows the Linformer paper's Figure 1 as numbers, and any quality row
that has a cost row of the same mechanism, budget and n in the report (``attnbench report RUN
--also COST_RUN``), or a cost of its own (ListOps' training speed and peak memory), a point of
the quality–cost Pareto plot. The figures are drawn in :mod:`attnbench.report.quality_plots`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from attnbench import cell
from attnbench.report.grid import Grid
from attnbench.report.marks import MISSING
from attnbench.report.ratio import label
from attnbench.row import Row, as_rows

# Long Range Arena (Tay et al. 2021), Table 1, ListOps accuracy (%); Nyströmformer's figure
# is from its own paper (Xiong et al. 2021), as LRA did not run it. Context, not a target.
LRA_LISTOPS = {
    "vanilla": ("Transformer", 36.37),
    "sdpa": ("Transformer", 36.37),
    "linformer": ("Linformer", 35.70),
    "performer": ("Performer", 18.01),
    "reformer": ("Reformer", 37.27),
    "local": ("Local Attention", 15.82),
    "linear": ("Linear Trans.", 16.13),
    "nystromformer": ("Nyströmformer (its own paper)", 37.15),
}
RANDOM_FOOTNOTE = (
    "Random inputs to freshly initialised layers; every mechanism gets the exact layer's "
    "q/k/v/out projections. A learned projection at initialisation (linformer "
    "projection=linear) is itself a random projection: its figure is that of a random "
    "projection, not of a trained Linformer."
)
TRAINED_FOOTNOTE = (
    "Each layer's real input and own attention weights in the vanilla ListOps model "
    "trained by task=listops, averaged over layers; the mechanism's own parameters "
    "(Linformer's E and F, Performer's features) are at initialisation."
)


def task_rows(rows: Iterable[Row | dict[str, Any]], task: str) -> list[Row]:
    return [r for r in as_rows(rows) if r.task == task and r.status == "ok" and r.quality]


def _fmt(v: Any, spec: str = ".3g") -> str:
    return MISSING if v is None else format(v, spec)


def approx_tables(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """One error table per (input kind, n): rows mechanism, columns k; each cell the relative
    Frobenius error, with the cosine similarity and the row error beside it."""
    out = []
    mine = task_rows(rows, "approx")
    for inputs, n in sorted({(r.quality.get("inputs", "random"), r.n) for r in mine}):
        here = [r for r in mine if r.quality.get("inputs", "random") == inputs and r.n == n]
        ks = sorted({r.k for r in here if r.k is not None})
        columns: list[int | None] = [*ks, None] if any(r.k is None for r in here) else ks
        names = list(dict.fromkeys(label(r) for r in here))
        at = {(label(r), r.k): r.quality for r in here}
        body = []
        for name in names:
            cells = [name]
            for k in columns:
                q = at.get((name, k))
                cells.append(
                    MISSING
                    if q is None
                    else f"{_fmt(q['rel_frobenius'])} / {_fmt(q['cosine'], '.4f')} / "
                    f"{_fmt(q.get('row_error'))}"
                )
            body.append(cells)
        uniform = next((r.quality.get("uniform_rel_frobenius") for r in here), None)
        if uniform is not None:
            body.append(["uniform attention (baseline)", *(_fmt(uniform) for _ in columns)])
        head = ["mechanism", *(f"k={k}" if k is not None else "no budget" for k in columns)]
        notes = [
            "Each cell: relative Frobenius error ‖Y − Ŷ‖/‖Y‖ / mean cosine similarity / mean "
            "total-variation distance of the attention rows (- where the mechanism defines "
            "none). k is each mechanism's budget (Linformer's k, Performer's nb_features, "
            "Nyströmformer's landmarks, local's window).",
            RANDOM_FOOTNOTE if inputs == "random" else TRAINED_FOOTNOTE,
            "Uniform attention (each query averages every real value) on the same inputs (on "
            "random inputs against its own seeded exact layer, not each mechanism's weights; "
            "on a trained model's states, the same trained layer): untrained layers on random "
            "inputs attend almost uniformly, so an error above it approximates softmax worse "
            "than ignoring the scores altogether.",
        ]
        if inputs != "random":
            notes.append(_trained_accuracy(here))
        title = f"Approximation error on the same weights, n={n}, {inputs} inputs"
        out.append(Grid(title, head, body, notes))
    return out


def _trained_accuracy(rows: list[Row]) -> str:
    """Which trained model the figures are of: its test accuracy ties them to the
    task=listops row of the same settings."""
    accuracy = {r.quality.get("model_accuracy") for r in rows} - {None}
    shown = ", ".join(f"{100 * a:.2f} %" for a in sorted(accuracy)) or "not recorded"
    return f"The trained vanilla model's ListOps test accuracy: {shown}."


SPECTRUM_AT = (16, 64)  # besides the run's own index: where the curve has risen by then


def spectrum_tables(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Figure 1 as numbers, one table per spectrum row: per layer, the normalised cumulative
    singular value (averaged over heads) at a few indices and at the run's index, with the
    lowest and highest head there. The higher it is, the more of P a rank-``index``
    approximation keeps."""
    out = []
    for r in task_rows(rows, "spectrum"):
        q = r.quality
        inputs, index, n = q.get("inputs", "random"), q["index"], q["n"]
        at = sorted({i for i in SPECTRUM_AT if i < index} | {index})
        head = ["layer", *(f"at {i}" for i in at), f"lowest head at {index}", "highest head"]
        body = []
        for layer, (curve, heads) in enumerate(zip(q["cumulative"], q["at_index"], strict=True)):
            cells = [f"{curve[i - 1]:.3f}" for i in at]
            body.append([str(layer + 1), *cells, f"{min(heads):.3f}", f"{max(heads):.3f}"])
        notes = [
            f"Normalised cumulative singular values Σ_(j≤i) σ_j / Σ_j σ_j of each head's "
            f"P = softmax(QKᵀ/√d), n = {n}, averaged over the batch (and over heads but in the "
            "last two columns). The paper (Figure 1, pretrained RoBERTa, n = 512) finds a "
            "long-tailed spectrum in every layer, more skewed in higher layers; attnbench has "
            "no pretrained weights offline.",
            "A randomly initialised vanilla model." if inputs == "random" else (
                "The vanilla model trained by task=listops, on its test sequences: a sequence "
                "of L real tokens has at most L non-zero singular values, so its curve reaches "
                "1 by L (ListOps lengths run from n/4 to n). " + _trained_accuracy([r])
            ),
        ]  # fmt: skip
        shape = r.model or {}
        model = f"{shape.get('layers')} layers, d_model {shape.get('d_model')}"
        out.append(Grid(f"Spectrum of P, n={n}, {inputs} model ({model})", head, body, notes))
    return out


def listops_table(rows: Iterable[Row | dict[str, Any]]) -> Grid | None:
    """Accuracy after the fixed training budget, with Long Range Arena's beside it."""
    mine = task_rows(rows, "listops")
    if not mine:
        return None
    seeds = len({_seed(r) for r in mine}) > 1  # a column for it only where it tells rows apart
    head = [
        "mechanism", *(["seed"] if seeds else []), "test accuracy", "majority class",
        "LRA Table 1 (n ≤ 2000)", "steps/s", "training peak", "examples (train/test)",
    ]  # fmt: skip
    body = []
    for name, r in zip(_listops_names(mine), mine, strict=True):
        q = r.quality
        lra = LRA_LISTOPS.get(r.attention)
        body.append(
            [
                name,
                *([str(_seed(r))] if seeds else []),
                f"{100 * q['test_accuracy']:.2f} %",
                f"{100 * q['majority_accuracy']:.2f} %",
                MISSING if lra is None else f"{lra[1]:.2f} % ({lra[0]})",
                f"{q['steps_per_s']:.2f}",
                f"{q['peak_bytes'] / 2**20:.1f} MiB",
                f"{q.get('train_examples')}/{q.get('test_examples')}",
            ]
        )
    first = mine[0]
    model = ", ".join(f"{k} {v}" for k, v in (first.model or {}).items())
    notes = [
        f"ListOps generated as Long Range Arena does (operators MAX, MIN, MED, SM; depth and "
        f"arguments as LRA), n = {first.n}, model {model}, trained from scratch on "
        f"{(first.env or {}).get('device_name', 'this CPU')}. LRA's ListOps has sequences up "
        "to 2000 tokens and 96 000 training examples and a larger model: its figures are "
        "context, not a target; ours are far smaller runs.",
        "Training peak: bytes one steady training step allocates on the CPU (profiler).",
    ]
    return Grid("ListOps accuracy", head, body, notes)


def _seed(r: Row) -> int:
    """The seed a ListOps row was trained from (its cell's ``quality.seed``; 0 by default)."""
    return dict((r.cell or {}).get("quality") or ()).get("seed", 0)


def _setup(r: Row) -> tuple[tuple[str, Any], ...]:
    """What a ListOps training run was, but for its seed: n, the model's shape and every
    ``quality.listops`` setting. Rows that differ here are different experiments."""
    settings = dict((r.cell or {}).get("quality") or ())
    settings.pop("seed", None)
    model = {f"model.{k}": v for k, v in (r.model or {}).items()}
    return tuple(sorted({"n": r.n, **model, **settings}.items(), key=lambda kv: kv[0]))


def _listops_names(rows: list[Row]) -> list[str]:
    """Each row's mechanism label, with the setup values that tell it apart from another
    setup of the same mechanism (e.g. ``steps=400``) where the rows hold more than one."""
    base = [label(r) + (f" k={r.k}" if r.k else "") for r in rows]
    setups: dict[str, set[tuple[tuple[str, Any], ...]]] = {}
    for name, r in zip(base, rows, strict=True):
        setups.setdefault(name, set()).add(_setup(r))
    out = []
    for name, r in zip(base, rows, strict=True):
        if len(setups[name]) > 1:
            differ = {k for setup in setups[name] for k, v in setup if (k, v) not in _setup(r)}
            name += " (" + ", ".join(f"{k}={v}" for k, v in _setup(r) if k in differ) + ")"
        out.append(name)
    return out


def listops_seeds_table(rows: Iterable[Row | dict[str, Any]]) -> Grid | None:
    """Accuracy over seeds, per mechanism and setup trained from more than one seed: the
    spread that a difference between mechanisms must exceed before it means anything. A
    row repeated (the same setup and seed, e.g. a run passed twice with ``--also``) counts
    once: training is deterministic, so it is the same measurement."""
    mine = task_rows(rows, "listops")
    by: dict[str, dict[int, Row]] = {}
    repeated = 0
    for name, r in zip(_listops_names(mine), mine, strict=True):
        runs = by.setdefault(name, {})
        if _seed(r) in runs:
            repeated += 1
            continue
        runs[_seed(r)] = r
    many = {name: runs for name, runs in by.items() if len(runs) > 1}
    if not many:
        return None
    head = ["mechanism", "seeds", "mean", "sd", "min – max", "majority class (mean)"]
    body = []
    for name, runs in many.items():
        acc = [100 * r.quality["test_accuracy"] for r in runs.values()]
        majority = [100 * r.quality["majority_accuracy"] for r in runs.values()]
        body.append(
            [
                name,
                ", ".join(str(seed) for seed in sorted(runs)),
                f"{statistics.fmean(acc):.2f} %",
                f"{statistics.stdev(acc):.2f}",
                f"{min(acc):.2f} – {max(acc):.2f} %",
                f"{statistics.fmean(majority):.2f} %",
            ]
        )
    notes = [
        "Test accuracy over training seeds; a seed draws the data (train and test sets) and "
        "the initialisation. sd is the sample standard deviation. A difference between "
        "mechanisms smaller than this spread is not a result."
    ]
    if repeated:
        notes.append(f"{repeated} repeated row(s) (the same setup and seed) counted once.")
    return Grid("ListOps accuracy over seeds", head, body, notes)


def pareto_points(rows: Iterable[Row | dict[str, Any]]) -> list[tuple[str, float, float, str]]:
    """(mechanism, cost, quality, what) pairs: a quality row beside the cost row of the same
    mechanism, parameters, k and n (inference time per sequence), and a ListOps row beside
    its own training time per step."""
    rows = as_rows(rows)
    cost = {
        (r.attention, cell.label(r.attention, r.params), r.k, r.n): r
        for r in rows
        if r.task == "cost" and r.status == "ok" and r.time_per_seq_s and not r.busy
    }
    out = []
    for r in task_rows(rows, "approx"):
        c = cost.get((r.attention, cell.label(r.attention, r.params), r.k, r.n))
        if c is not None and r.quality.get("rel_frobenius") is not None:
            out.append((label(r), c.time_per_seq_s, r.quality["rel_frobenius"], "approx"))
    for r in task_rows(rows, "listops"):
        q = r.quality
        if q.get("steps_per_s"):
            out.append((label(r), 1 / q["steps_per_s"], q["test_accuracy"], "listops"))
    return out


def _front(points: list[tuple[float, float]], better_low: bool) -> list[tuple[float, float]]:
    """The points no other point beats on both cost (lower) and quality, by cost."""
    front, best = [], math.inf if better_low else -math.inf
    for x, y in sorted(points):
        if (y < best) if better_low else (y > best):
            front.append((x, y))
            best = y
    return front
