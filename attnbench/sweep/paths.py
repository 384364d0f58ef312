"""Where ``attnbench run`` writes: its run directory (:func:`run_dir`) and Hydra's own output
directories, which stay under ``out_dir`` (:func:`check_hydra_dirs`), so that the run's
pre-checks have tested every place a command writes before it writes anything."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from attnbench.sweep.cells import setting
from attnbench.validators import check_fits, check_name


def run_dir(cfg: DictConfig) -> Path:
    """``<out_dir>/<sweep_name>/<run>``; run ``auto`` names the device and where it runs, so
    the same command resumes in the same place. ``run`` and ``sweep_name`` are names (one
    path component), so a run never writes outside ``out_dir``; an empty ``out_dir`` would
    silently mean the current directory."""
    out_dir = setting(cfg, "out_dir")  # removed (~out_dir): one line, as for any key
    if isinstance(out_dir, int) and not isinstance(out_dir, bool):
        out_dir = str(out_dir)
    if not isinstance(out_dir, str) or not out_dir.strip():
        raise ValueError(f"out_dir: must be a directory path, got {out_dir!r}")
    sweep = check_name("sweep_name", setting(cfg, "sweep_name"))
    run = check_name("run", setting(cfg, "run"))
    if run == "auto":
        here = "cuda" if torch.cuda.is_available() and cfg.device.gpu else "cpu"
        run = check_name("run", f"{cfg.device.name}-{here}")
    check_fits(out_dir, {"sweep_name": sweep, "run": run})
    return Path(out_dir) / sweep / run


HYDRA_DIRS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")


def check_hydra_dirs(overrides: list[str]) -> list[tuple[str, str]]:
    """Hydra's own output directories stay under ``out_dir`` (``<out_dir>/<sweep_name>/
    .hydra``), where the run's pre-checks test that they can be written: one set elsewhere
    would create directories and files wherever it pointed, unchecked. A value under
    ``${out_dir}`` is taken; moving the results moves Hydra's files with them. Returns each
    (key, the path under out_dir up to its first interpolation), checked writable later."""
    under = []
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key not in HYDRA_DIRS:
            continue
        inside = value.startswith("${out_dir}/") if key != "hydra.sweep.subdir" else True
        if not inside or ".." in Path(value).parts or (key.endswith("subdir") and value[:1] == "/"):
            raise ValueError(
                f"{key}: Hydra's files stay under out_dir (a path starting ${{out_dir}}/, "
                f"without '..'); set out_dir=DIR to write elsewhere, got {value!r}"
            )
        if key != "hydra.sweep.subdir":
            under.append((key, value.removeprefix("${out_dir}/").split("${")[0]))
    return under
