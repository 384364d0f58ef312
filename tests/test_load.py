"""attnbench.load: run directories as one tidy DataFrame (real files on disk, no mocks)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import attnbench
from attnbench.results import ENV

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path("results/reference/table3-v100_16gb-cpu")  # relative: run from ROOT
FIXTURE = ROOT / "tests/data/cells_fixture.jsonl"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture
def reference(_at_root: None) -> pd.DataFrame:
    return attnbench.load(REFERENCE)


def _json_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(got: object, want: object) -> bool:
    if want is None:
        return got is None or bool(pd.isna(got))
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=0, abs_tol=0)
    return got == want


def test_reference_run_is_42_rows_with_tidy_columns(reference: pd.DataFrame) -> None:
    df = attnbench.load(REFERENCE)
    assert len(df) == 42 and df.index.equals(pd.RangeIndex(42))
    for column in (
        "attention",
        "n",
        "k",
        "status",
        "max_batch",
        "time_per_seq_s",
        "time_samples_s",
        "model.layers",
        "model.d_model",
        "model.n_heads",
        "model.d_ff",
        "params.sharing",
        "params.kernel",
        "env.device_name",
        "env.torch",
        "env.threads",
        "cell.min_repeats",
        "cell.time_budget_s",
        "run_dir",
    ):
        assert column in df.columns, column
    for gone in ("cell", "params", "model", "env", "schema", "cell.n", "cell.batch"):
        assert gone not in df.columns, gone
    assert df.columns[-1] == "run_dir"
    assert set(df.run_dir) == {str(REFERENCE)}
    assert (df["model.d_model"] == 768).all()
    assert (df["env.device_name"] == "AMD EPYC").all()
    assert set(df.loc[df.attention == "linformer", "params.sharing"]) == {"layerwise"}
    assert df.loc[df.attention == "vanilla", "params.sharing"].isna().all()
    # the same rows whatever the path: the run directory, its file, a directory of runs
    assert df.drop(columns="run_dir").equals(reference.drop(columns="run_dir"))
    by_file = attnbench.load(REFERENCE / "cells.jsonl")
    assert by_file.equals(df)
    # a directory of runs: the inference and training Table 3 runs, the zoo and quality runs
    both = attnbench.load("results/reference")
    # + the approximation-error run (32 rows on random inputs, 30 on the trained ListOps
    # model's states), ListOps (8, and 10 over five seeds), the spectrum (a random model
    # and the trained one), serving (189 cells and 27 of linear with an fp32 state) and the
    # compiled run (10 mechanisms at 7 n, eager and compiled, Linformer's k=256 not at 256)
    # and the recall run (30 MQAR cells, 2 without the short convolution, 4 more seeds, 15
    # of the recurrent mixers); +sweep=mixers (108 cells and the 25 of the chunk curve) and
    # the mixers' serving run (135 cells, vanilla's and linear's 54 beside them); the packed run
    # (128 cells: 11 mechanisms, 3 layouts but Reformer's packed, 2 draws, forward and training)
    # and serving a mix of prompts (60 cells: 10 decoders, every prompt n or drawn, 3 batches);
    # the recall run's 7 hybrids (two mixers beside vanilla, a seed more) and the hybrid run
    # (105 published models and twins modeled on GPU presets, 30 small ones timed here)
    assert len(both) == (
        42 + 42 + 111 + 32 + 30 + 8 + 10 + 2 + 216 + 138 + 128 + 51 + 7 + 133 + 189 + 60 + 135
    )
    assert set(both["mode"]) == {"inference", "train", "decode", "packed", "packed_train"}
    tasks = both.task.value_counts().to_dict()
    assert tasks == {
        "cost": 195 + 216 + 138 + 128 + 133 + 189 + 60 + 135, "approx": 62, "listops": 18,
        "spectrum": 2, "mqar": 51 + 7,
    }  # fmt: skip
    assert both["compile"].sum() == 69 and (both.compiled == "kernel").sum() == 7
    ours = both[both.run_dir == str(REFERENCE)]
    assert ours.key.tolist() == df.key.tolist()
    assert ours.max_batch.tolist() == df.max_batch.tolist()


def test_reference_run_dtypes(reference: pd.DataFrame) -> None:
    df = reference
    for column in (
        "n",
        "k",
        "max_batch",
        "batch",
        "time_batch",
        "peak_bytes",
        "flops",
        "repeats",
        "probes",
        "model_error",
        "ceiling_bytes",
        "model.d_model",
        "env.threads",
        "cell.min_repeats",
    ):
        assert df[column].dtype == "Int64", column
    for column in ("time_per_seq_s", "time_median_s", "flops_per_s", "pct_of_peak", "wall_s"):
        assert df[column].dtype == "float64", column
    assert isinstance(df.status.dtype, pd.CategoricalDtype)
    assert list(df.status.cat.categories) == ["ok", "oom", "skipped", "error"]
    assert isinstance(df.memory_source.dtype, pd.CategoricalDtype)
    assert list(df.memory_source.cat.categories) == ["measured", "modeled", "profiled"]
    for column in ("attention", "dtype", "device", "mode", "time_device"):
        assert isinstance(df[column].dtype, pd.CategoricalDtype), column
    assert list(df.attention.cat.categories) == ["vanilla", "linformer"]  # the sweep's order
    for column in ("batch_asked", "reason", "key", "params.sharing", "env.torch", "run_dir"):
        assert isinstance(df[column].dtype, pd.StringDtype), column
    assert df["cell.flush_l2"].dtype == "boolean"
    assert df.time_samples_s.dtype == object
    assert set(df.batch_asked) == {"max"}
    assert df.status.value_counts().to_dict() == {"ok": 40, "oom": 2, "skipped": 0, "error": 0}
    # integers with gaps stay integers: vanilla has no k, untimed cells no time_batch
    assert df.k.isna().sum() == 8 and df.k.dropna().tolist()[:2] == [128, 256]
    assert df.time_batch.isna().any() and not df.time_batch.isna().all()


def test_reference_values_equal_the_json(reference: pd.DataFrame) -> None:
    rows = _json_rows(ROOT / REFERENCE / "cells.jsonl")
    assert len(rows) == len(reference)
    for i, stored in enumerate(rows):
        got = reference.iloc[i]
        for name, want in stored.items():
            if name in ("schema", "cell"):
                continue
            if isinstance(want, dict):
                for key, v in want.items():
                    assert _same(got[f"{name}.{key}"], v), (i, name, key)
            elif name == "time_samples_s":
                assert got[name] == want, i
            else:
                assert _same(got[name], want), (i, name, got[name], want)
        for key in ("min_repeats", "min_seconds", "cpu_batch", "time_budget_s", "flush_l2"):
            assert _same(got[f"cell.{key}"], stored["cell"][key]), (i, key)
        assert got.batch_asked == str(stored["cell"]["batch"])
    first = reference.iloc[0]
    assert (first.attention, first.n, first.max_batch) == ("vanilla", 512, 896)
    assert first.time_per_seq_s == 0.5996142460007832
    assert first.time_samples_s == rows[0]["time_samples_s"]
    missing = reference.time_samples_s[[r.get("time_samples_s") is None for r in rows]]
    assert len(missing) == 28 and missing.isna().all()
    linformer = reference[reference.attention == "linformer"].iloc[0]
    assert (linformer.k, linformer.budget, linformer["params.sharing"]) == (128, "k", "layerwise")
    assert linformer["mode"] == "inference"


def _run_dir(tmp_path: Path, name: str, source: Path) -> Path:
    run = tmp_path / name
    run.mkdir(parents=True)
    shutil.copy(source, run / "cells.jsonl")
    return run


def test_several_paths_concatenate_with_gaps(tmp_path: Path, reference: pd.DataFrame) -> None:
    gpu = _run_dir(tmp_path, "fixture-gpu", FIXTURE)
    df = attnbench.load(REFERENCE, gpu)
    assert len(df) == 42 + 8
    assert df.equals(attnbench.load([REFERENCE, gpu]))
    assert df.run_dir.tolist() == [str(REFERENCE)] * 42 + [str(gpu)] * 8
    ours = df[df.run_dir == str(gpu)]
    assert ours.n.tolist() == [r["n"] for r in _json_rows(FIXTURE)]
    assert ours.time_per_seq_s.tolist()[:2] == [0.01, 0.04]
    assert set(ours["env.device_name"]) == {"Tesla V100-SXM2-16GB"}
    # fields the fixture's rows do not hold read <NA> / NaN / None there, nothing invented
    for column in ("env.torch", "env.threads", "flops", "key", "cell.min_repeats", "peak_bytes"):
        assert ours[column].isna().all(), column
        assert not df.loc[df.run_dir == str(REFERENCE), column].isna().all(), column
    assert ours.time_median_s.isna().all() and ours.time_samples_s.isna().all()
    assert ours.loc[ours.attention == "linformer", "params.kernel"].isna().all()
    assert ours.loc[ours.attention == "linformer", "params.sharing"].eq("layerwise").all()
    # the types survive the gaps
    assert df.n.dtype == "Int64" and df["env.threads"].dtype == "Int64"
    assert df.time_per_seq_s.dtype == "float64"
    assert list(df.status.cat.categories) == ["ok", "oom", "skipped", "error"]
    assert df.status.value_counts()["oom"] == 2 + 2
    sources = [r["memory_source"] for r in _json_rows(FIXTURE)]
    assert df.memory_source.value_counts().to_dict() == {
        "measured": sources.count("measured"),
        "modeled": 42 + sources.count("modeled"),
        "profiled": 0,  # a category of the schema's, none of these rows
    }
    assert (
        df.drop(columns="run_dir")
        .iloc[:42]
        .equals(reference.drop(columns="run_dir").astype(df.drop(columns="run_dir").dtypes))
    )


def test_a_directory_of_runs_is_read_at_any_depth_each_file_once(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "runs" / "table3", "v100_16gb-cpu", ROOT / REFERENCE / "cells.jsonl")
    b = _run_dir(tmp_path / "runs", "fixture-gpu", FIXTURE)
    (b / "report").mkdir()  # a run's report/ holds no rows
    df = attnbench.load(tmp_path / "runs")
    assert df.run_dir.value_counts().to_dict() == {str(a): 42, str(b): 8}
    assert df.run_dir.iloc[0] == str(b)  # in path order
    assert len(attnbench.load(tmp_path / "runs", a, a / "cells.jsonl")) == 50  # each once
    # a file of rows under any name is read as it is: the directory it is in is its run_dir
    fixture = attnbench.load(FIXTURE)
    assert len(fixture) == 8 and set(fixture.run_dir) == {str(FIXTURE.parent)}


def test_an_empty_run_is_an_empty_frame_with_the_same_columns(
    tmp_path: Path, reference: pd.DataFrame
) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    (run / "cells.jsonl").write_text("")
    df = attnbench.load(run)
    assert len(df) == 0
    fixed = [c for c in reference.columns if not c.startswith("params.")]
    assert list(df.columns) == fixed  # the parameters' columns come from the rows
    for column in fixed:  # categoricals of the values found have none to find
        want = reference[column].dtype
        if isinstance(want, pd.CategoricalDtype) and column not in ("status", "memory_source"):
            assert isinstance(df[column].dtype, pd.CategoricalDtype), column
        else:
            assert df[column].dtype == want, column


def _broken(tmp_path: Path, line_no: int, edit) -> Path:
    run = _run_dir(tmp_path, "run", ROOT / REFERENCE / "cells.jsonl")
    lines = (run / "cells.jsonl").read_text().splitlines(keepends=True)
    lines[line_no - 1] = edit(lines[line_no - 1])
    (run / "cells.jsonl").write_text("".join(lines))
    return run


def test_a_corrupt_line_names_the_file_and_line(tmp_path: Path) -> None:
    run = _broken(tmp_path, 7, lambda line: line[: len(line) // 2] + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{run / 'cells.jsonl'}:7: ")) as e:
        attnbench.load(run)
    assert "\n" not in str(e.value)


def test_an_invalid_field_names_the_line_and_the_field(tmp_path: Path) -> None:
    def n_as_text(line: str) -> str:
        row = json.loads(line)
        row["n"] = "512"
        return json.dumps(row) + "\n"

    run = _broken(tmp_path, 3, n_as_text)
    with pytest.raises(ValueError, match=r"cells\.jsonl:3: n: .*'512'") as e:
        attnbench.load(tmp_path)  # through a directory of runs too
    assert str(e.value).startswith(str(run / "cells.jsonl"))
    assert "\n" not in str(e.value)


def test_a_last_half_line_is_left_out_only_when_not_strict(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "run", ROOT / REFERENCE / "cells.jsonl")
    with open(run / "cells.jsonl", "a") as f:
        f.write('{"schema": 1, "attention": "vanil')  # a writer killed mid-line
    with pytest.raises(ValueError, match=r"cells\.jsonl:43: "):
        attnbench.load(run)
    assert len(attnbench.load(run, strict=False)) == 42


def test_a_path_without_rows_is_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-run"
    with pytest.raises(ValueError, match=re.escape(str(missing))) as e:
        attnbench.load(REFERENCE, missing)
    assert "\n" not in str(e.value)
    empty = tmp_path / "not-a-run"
    (empty / "report").mkdir(parents=True)
    with pytest.raises(ValueError, match=re.escape(f"{empty}: holds no cells.jsonl")) as e:
        attnbench.load(empty)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no path given"):
        attnbench.load()
    with pytest.raises(ValueError, match="no path given"):
        attnbench.load([])


def test_readme_results_in_pandas_example_runs(reference: pd.DataFrame) -> None:
    """docs/reports.md's block, run as it stands on the committed reference run."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = (ROOT / "docs" / "reports.md").read_text()
    start = text.index("## Results in pandas")
    section = text[start : text.find("\n## ", start + 1)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    try:
        exec(compile(code, "docs/reports.md:results-in-pandas", "exec"), scope)
        ax = scope["ratio"].plot(logx=True)  # the block's last line drew the same figure
        assert len(ax.get_lines()) == len(scope["ratio"].columns)
    finally:
        plt.close("all")
    assert scope["df"].equals(reference)
    ratio = scope["ratio"]
    # the ratio is computed from the rows: vanilla's time ÷ linformer's, per n and k
    rows = _json_rows(ROOT / REFERENCE / "cells.jsonl")
    t = {(r["attention"], r["n"], r["k"]): r["time_per_seq_s"] for r in rows}
    assert list(ratio.index) == [512, 1024, 2048]
    for (attention, n, k), seconds in t.items():
        if attention == "linformer" and seconds is not None and t["vanilla", n, None]:
            assert ratio.loc[n, k] == pytest.approx(t["vanilla", n, None] / seconds)
    # and agrees with docs/running.md's table of the reference run
    assert ratio.round(2).loc[512, 128] == 1.27 and ratio.round(2).loc[2048, 1024] == 1.63


def test_env_columns_are_what_a_row_records() -> None:
    from attnbench.env import environment

    assert list(ENV) == list(environment())


def test_import_attnbench_does_not_import_pandas() -> None:
    """pandas costs ~0.2 s to import: load() pays it, not every `import attnbench`."""
    code = "import sys, attnbench; assert 'pandas' not in sys.modules, 'pandas imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
