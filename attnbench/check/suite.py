"""The regression suite: which cells the gate times, and its ``check:`` settings.

A suite is an ordinary sweep file (``conf/sweep/regression.yaml``) with a ``check:`` block.
Its cells — mechanisms, their parameters, n, k, batch, dtype — are expanded by the same code
as ``attnbench run``'s sweeps (:mod:`attnbench.sweep.config`), so a suite cannot mean one
thing to the gate and another to a sweep. What the gate does with a cell differs: it times
one attention layer of the model's width (d_model, n_heads) in a worker process with
``check.threads`` threads, not the whole encoder as ``attnbench run`` does. The gate adds
cells of its own per mechanism: a training cell (its backward alone) at each n of
``check.train_n``, and a decode cell (one decode step of the causal layer at context n,
:func:`attnbench.check.worker._decode`) at each n of ``check.decode_n``; a mechanism that
cannot train or decode has that cell listed as skipped, with its reason. With
``check.compile``, each forward cell also gets a compiled twin (``… compiled``): the same
layer under ``torch.compile``, compiled before the first sample (:mod:`attnbench.check.worker`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnbench.cell import label
from attnbench.check import Misuse
from attnbench.check.stats import min_samples
from attnbench.validators import check_bool, check_choice, check_int, check_number

# what the gate does when cells stay busy (docs/gate.md, "A busy machine"): take their
# samples again after a pause, a bounded number of times, then fail (exit 3) or pass (0)
ON_BUSY = ("fail", "pass")
BUSY_DEFAULTS = {"busy_retries": 2, "busy_pause_s": 30.0, "on_busy": "fail"}


@dataclass(frozen=True)
class SuiteCell:
    """One timed cell: a mechanism with its parameters at (n, batch), as one layer."""

    attention: str
    params: dict[str, Any]
    n: int
    batch: int
    d_model: int
    n_heads: int
    threshold: float
    # or "train": the layer's backward; "decode": one decode step at context n (worker._timer)
    mode: str = "inference"
    # the layer under torch.compile, compiled before the first sample (forward cells only)
    compiled: bool = False

    @property
    def name(self) -> str:
        """``linformer (k=128, sharing=layerwise) n=256 b=1``: the mechanism's one label
        (:func:`attnbench.cell.label`, as in reports) with the shape, and ``backward`` for a
        training cell, ``decode`` for a decode cell, ``compiled`` for a compiled one.
        Samples, stored baselines and the result JSON are keyed by it."""
        suffix = {"train": " backward", "decode": " decode"}.get(self.mode, "")
        suffix += " compiled" if self.compiled else ""
        return f"{label(self.attention, self.params)} n={self.n} b={self.batch}{suffix}"


@dataclass(frozen=True)
class Suite:
    """The cells to time, those that cannot run here, and the validated ``check:`` block."""

    cells: list[SuiteCell]
    skipped: list[tuple[str, str]]  # (cell, why it cannot run here)
    settings: dict[str, Any]


def load_suite(
    name: str = "regression", config_dir: str | None = None, overrides: dict[str, Any] | None = None
) -> Suite:
    """The suite's cells, expanded and validated by the same code as ``attnbench run``'s
    sweeps; ``overrides`` (None values ignored) replace ``check:`` settings before they are
    validated. Mechanisms that cannot run here (xformers without CUDA) are listed as
    skipped; a suite with nothing left to time is a :class:`Misuse`."""
    from attnbench.cell_rules import left_out
    from attnbench.sweep.cells import cell_from_cfg
    from attnbench.sweep.config import expand_jobs

    # Hydra ignores a search path that does not exist: the suite would silently come from
    # the shipped configs, or be "unknown", instead of naming the real mistake
    if config_dir is not None and not Path(config_dir).is_dir():
        raise Misuse(f"--config-dir: no such directory: {config_dir}")
    try:
        jobs, multirun = expand_jobs([f"+sweep={name}"], config_dir)
    except ValueError as e:
        raise Misuse(f"--suite: {e}") from None
    settings = _settings(name, jobs, overrides)
    cells: list[SuiteCell] = []
    skipped: list[tuple[str, str]] = []
    for cfg in jobs:
        try:
            cell = causal_form(cell_from_cfg(cfg, multirun))  # k as a sweep keeps it
        except ValueError as e:
            raise Misuse(f"--suite {name}: {e}") from None
        if left_out(cell) is not None:
            continue  # as a sweep leaves it out: Linformer at k >= n
        try:
            check_int("batch", cell.batch)
        except ValueError as e:
            raise Misuse(f"--suite {name}: {e}; a check suite times a fixed batch") from None
        for sc in _timed_cells(cell, settings):
            if any(c.name == sc.name for c in cells) or any(c == sc.name for c, _ in skipped):
                continue  # e.g. vanilla in a suite that sweeps k: one cell, not several
            if (why := _why_not_here(sc, settings["device"])) is not None:
                skipped.append((sc.name, why))
            else:
                cells.append(sc)
    if not cells:
        why = "; ".join(f"{c}: {w}" for c, w in skipped) or "it has no cells"
        raise Misuse(f"--suite {name}: empty suite, no cell can run here ({why})")
    return Suite(cells, skipped, settings)


def causal_form(cell: Any) -> Any:
    """A causal-only mechanism's cell in its causal form, its only one: the gate times every
    mechanism of its suite, where a sweep without ``causal=true`` leaves such a cell out
    (:func:`attnbench.cell_rules.left_out`). Any other cell as it is."""
    from attnbench.cell_rules import runs_causally
    from attnbench.registry import info

    if not info(cell.attention).causal_only or runs_causally(cell):
        return cell
    return replace(cell, params=tuple(sorted((*cell.params, ("causal", True)))))


def _settings(name: str, jobs: list[Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The suite's ``check:`` block with ``overrides`` applied, validated: apart from the
    cells because a settings error is the user's one line (``check.KEY: ...``) before any
    cell is expanded, and the cells read the settings (thresholds, compile, train_n ...)."""
    from omegaconf import DictConfig, OmegaConf

    if not jobs or not isinstance(jobs[0].get("check"), DictConfig):
        raise Misuse(
            f"--suite: sweep {name!r} has no 'check:' settings; see conf/sweep/regression.yaml"
        )
    settings = OmegaConf.to_container(jobs[0].check, resolve=True)
    settings.setdefault("compile", False)  # a suite from before compiled cells: eager only
    for key, value in BUSY_DEFAULTS.items():  # a suite from before the busy policy
        settings.setdefault(key, value)
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        check_settings(settings)
    except ValueError as e:  # the one place a settings error becomes the user's line
        raise Misuse(f"check.{e}") from None
    return settings


def _timed_cells(cell: Any, settings: dict[str, Any]) -> list[SuiteCell]:
    """What the gate times of one sweep cell: its forward as one layer, then with
    ``check.compile`` the forward's compiled twin; a training cell too (the layer's
    backward) at the n that ``check.train_n`` names, and a decode cell (one decode step of
    a causal layer) at each n of ``check.decode_n``. Those two stay eager (docs/gate.md).
    Apart from :func:`load_suite` because this is the gate's own rule, the rest a sweep's."""
    from attnbench.cell_rules import left_out

    params = cell.mechanism_params()
    base = SuiteCell(
        cell.attention,
        params,
        cell.n,
        cell.batch,
        cell.model.d_model,
        cell.model.n_heads,
        threshold_for(settings, cell.attention, cell.n, params),
    )
    extra = []
    if settings["compile"]:
        twin = threshold_for(settings, cell.attention, cell.n, params, compiled=True)
        extra.append(replace(base, compiled=True, threshold=twin))
    extra += [replace(base, mode="train")] if cell.n in settings.get("train_n", []) else []
    extra += [
        replace(
            base,
            n=n,
            mode="decode",
            threshold=threshold_for(settings, cell.attention, n, params),
        )
        for n in settings.get("decode_n", [])
        if left_out(replace(cell, n=n)) is None  # Linformer at k >= n, as a sweep
    ]
    return [base, *extra]


def _why_not_here(sc: SuiteCell, device: str) -> str | None:
    """Why ``sc`` cannot run on ``device`` here (the mechanism unavailable, not on that
    device, or its workload refusing the cell's mode), or None: such a cell is listed as
    skipped, with this reason, rather than timed."""
    from attnbench.registry import info
    from attnbench.workload import refuses

    info_ = info(sc.attention)
    why = info_.unavailable
    if why is None and device not in info_.devices:
        why = f"runs on {', '.join(info_.devices)}, not {device}"
    if why is None:
        why = refuses(sc.mode, sc.attention)
    return why


def check_settings(s: dict[str, Any]) -> None:
    """The ``check:`` block, in the project's validator style: one ``ValueError`` line
    ``KEY: must be ..., got ...`` (the caller adds ``check.``). Everything is checked before
    anything is timed, so a typo never costs the minutes of a check."""
    check_int("rounds", s.get("rounds"), low=2)
    check_number("sample_s", s.get("sample_s"), low=0, open_low=True)
    check_int("warmup", s.get("warmup"), low=0)
    check_int("threads", s.get("threads"), low=1)
    check_bool("compile", s.get("compile", False))
    check_number("threshold", s.get("threshold"), low=0, open_low=True)
    check_number("alpha", s.get("alpha"), low=0, high=1, open_low=True, open_high=True)
    fewest = min_samples(s["alpha"])
    if s["rounds"] < fewest:  # the rank test could never fire: a blind gate
        raise ValueError(
            f"rounds: must be at least {fewest} for alpha={s['alpha']:g}, got {s['rounds']}"
        )
    for key in ("train_n", "decode_n"):
        ns = s.get(key, [])
        if not isinstance(ns, list):
            raise ValueError(f"{key}: must be a list of n, got {ns!r}")
        for n in ns:
            check_int(key, n)
    paths = s.get("pythonpath")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise ValueError(f"pythonpath: must be a list of paths, got {paths!r}")
    for entry in s.get("thresholds") or []:
        try:
            check_number(
                "threshold",
                entry.get("threshold") if isinstance(entry, dict) else None,
                low=0,
                open_low=True,
            )
        except ValueError:
            raise ValueError(
                f"thresholds: each entry needs a threshold > 0 (a fraction, 0.2 = 20 %), "
                f"got {entry!r}"
            ) from None
    check_int("busy_retries", s.get("busy_retries"), low=0)
    check_number("busy_pause_s", s.get("busy_pause_s"), low=0)
    check_choice("on_busy", s.get("on_busy"), ON_BUSY)
    check_choice("device", s.get("device"), ("cpu", "cuda"))
    if s["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device: cuda asked for, but torch sees no CUDA device here")


def threshold_for(
    settings: dict[str, Any], attention: str, n: int, params: dict, compiled: bool = False
) -> float:
    """A cell's threshold: the last matching entry of ``check.thresholds`` wins (an entry
    matches on ``attention``, ``n``, ``compiled`` and any of the mechanism's parameters it
    names), else ``check.threshold``."""
    chosen = float(settings["threshold"])
    this = {"attention": attention, "n": n, "compiled": compiled}
    for entry in settings.get("thresholds") or []:
        sel = {k: v for k, v in entry.items() if k != "threshold"}
        if all(this.get(k, params.get(k)) == v for k, v in sel.items()):
            chosen = float(entry["threshold"])
    return chosen
