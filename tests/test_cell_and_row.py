"""The cell's rules and the row's schema (attnbench/cell.py, attnbench/row/), each checked
against something outside them: the keys and rows the committed reference run stored."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from attnbench import row as rows
from attnbench import workload
from attnbench.cell import Cell, Part, Shape, TimingSpec, budget_of, label
from attnbench.cell_key import cell_of, key
from attnbench.cell_rules import check_k, complete, kept_k, left_out, resolve_ceiling
from attnbench.env import environment
from attnbench.measure import presets
from attnbench.plan import label as plan_label
from attnbench.plan import validate
from attnbench.row import Row
from attnbench.row.fields import FIELDS
from attnbench.store import CorruptLine
from attnbench.validators import check_limit, check_number

REFERENCE = Path(__file__).parent.parent / "results/reference/table3-v100_16gb-cpu/cells.jsonl"


def _reference() -> list[dict]:
    return [json.loads(line) for line in REFERENCE.read_text().splitlines()]


def test_keys_are_those_the_reference_run_stored_so_old_runs_resume() -> None:
    v100 = presets.load("v100_16gb")
    for stored in _reference()[:6]:
        params = tuple(sorted((k, v) for k, v in stored["params"].items()))
        cell = Cell(stored["attention"], n=stored["n"], k=stored["k"], params=params)
        assert key(cell, v100) == stored["key"], stored["attention"]
    train = Cell(
        "vanilla",
        n=512,
        workload=Part("train"),
    )  # a new mode is a new key
    assert key(train, v100) != key(Cell("vanilla", n=512), v100)


def test_a_setting_added_with_a_default_leaves_every_key_as_it_was(monkeypatch) -> None:
    """Key version 2's promise: a workload's setting (or a task's) declared with a default
    moves no key, so no stored run stops resuming. Every committed row's cell, keyed before
    and after ``packed``, ``train``, ``decode`` and MQAR each gain a setting."""
    from attnbench import workload
    from attnbench.cell_key import stored_cell
    from attnbench.quality import tasks
    from attnbench.settings import Setting, integer
    from tests.test_reference_runs import REFERENCE, RUNS
    from tests.test_reference_runs import rows as stored

    cells = [stored_cell(r.to_dict(), r.key_version or 1) for run in RUNS for r in stored(run)]
    before = [key(c, p) for c, p in cells]
    extra = Setting("toy_split", 2, "a toy setting", int, integer())
    for name in ("packed", "packed_train", "train", "decode"):
        work = workload.get(name)
        monkeypatch.setattr(work, "settings", (*work.settings, extra.owned(f"mode={name}")))
    mqar = tasks.REGISTRY["mqar"]
    monkeypatch.setitem(tasks.REGISTRY, "mqar", dataclasses.replace(
        mqar, settings=(*mqar.settings, extra)))  # fmt: skip
    again = [cell_of(c.to_dict()) for c, _ in cells]  # defaults filled anew
    assert all(("toy_split", 2) in c.workload.settings for c in again if c.mode == "train")
    assert [key(c, p) for c, (_, p) in zip(again, cells, strict=True)] == before
    assert REFERENCE.is_dir() and len(before) > 1000
    # the setting at another value is another cell
    train = Cell(
        "vanilla",
        512,
        workload=Part("train", {"toy_split": 3}),
    )
    assert key(train, cells[0][1]) != key(
        Cell(
            "vanilla",
            512,
            workload=Part("train"),
        ),
        cells[0][1],
    )


def test_a_setting_in_no_use_does_not_split_a_cell() -> None:
    """Which settings a cell uses is its workload's one answer (``Workload.in_use``), asked by
    the key and by reports: decode's draw with every prompt n, the distribution's settings
    beside explicit lengths, packed's ``bucket_tokens`` outside ``layout=bucketed``."""
    v100 = presets.load("v100_16gb")

    def same(mode: str, a: dict, b: dict) -> bool:
        one = Cell(
            "vanilla",
            512,
            params=(("causal", True),),
            workload=Part(mode, a),
        )
        two = Cell(
            "vanilla",
            512,
            params=(("causal", True),),
            workload=Part(mode, b),
        )
        return key(one, v100) == key(two, v100)

    assert same("decode", {}, {"length_seed": 7})  # contexts=n: no draw
    assert not same("decode", {"contexts": "drawn"}, {"contexts": "drawn", "length_seed": 7})
    given = {"contexts": "drawn", "lengths": (64, 128)}
    assert same("decode", given, {**given, "length_seed": 7})
    assert same("packed", {"layout": "padded"}, {"layout": "padded", "bucket_tokens": 8192})
    bucketed = {"layout": "bucketed"}
    assert not same("packed", bucketed, {**bucketed, "bucket_tokens": 8192})


def test_a_settings_null_is_its_default() -> None:
    """A row stored before one of its workload's settings was declared (``Workload.later``),
    or holding null for it, measured the default (``attnbench.row.upgrade.later_settings``):
    sound only while no setting takes null for another value, which every declared setting
    is held to here."""
    from attnbench import workload
    from attnbench.quality import tasks

    declared = [s for m in workload.names() for s in workload.get(m).settings]
    declared += [s for t in tasks.REGISTRY.values() for s in t.settings if not s.carried]
    for s in declared:
        if s.check is not None and s.default is not None:
            with pytest.raises(ValueError):
                s.check(s.name, None)


def test_one_label_for_reports_the_gate_and_progress() -> None:
    assert label("vanilla", {}) == "vanilla"
    assert label("linformer", {"sharing": "kv", "kernel": "eager"}) == (
        "linformer (kernel=eager, sharing=kv)"
    )
    cell = Cell("linformer", n=512, k=128, params=(("sharing", "kv"),))
    assert plan_label(cell) == "linformer (sharing=kv) n=512 k=128"


def test_k_against_n_one_rule_two_strictnesses() -> None:
    check_k("linformer", 512, 512)  # a single cell may project onto all n
    with pytest.raises(ValueError, match="k: must be at most n=512, got 513"):
        check_k("linformer", 512, 513)
    with pytest.raises(ValueError, match="k: must be an integer >= 1, got 0"):
        check_k("vanilla", 512, 0)  # even where the mechanism has no budget
    assert left_out(Cell("linformer", 512, k=512)) == "k=512 >= n=512"  # a sweep leaves it out
    assert left_out(Cell("linformer", 512, k=256)) is None
    assert left_out(Cell("performer", 64, k=256)) is None  # nb_features is free
    assert left_out(Cell("vanilla", 64)) is None
    # the budget set among the mechanism's own parameters counts the same
    assert left_out(Cell("linformer", 256, params=(("k", 256),))) == "k=256 >= n=256"
    # causal=true for a mechanism with no causal form: left out of a sweep, refused alone
    assert left_out(Cell("linformer", 512, k=64, params=(("causal", True),))) == (
        "has no causal form"
    )


def test_k_sets_a_budget_only_where_the_mechanism_uses_it() -> None:
    """FlexAttention's window is its budget under pattern=window alone: with full or causal
    a k would label a row with a window the run never used, so a single cell refuses it and
    a sweep drops it; k and the budget's own parameter at odds are refused too."""
    window = (("pattern", "window"),)
    assert budget_of("flex", dict(window)) == "window"
    assert budget_of("flex", {}) is None and budget_of("flex", {"pattern": "causal"}) is None
    assert kept_k("flex", 32, in_sweep=True) is None
    assert kept_k("flex", 32, in_sweep=True, params=dict(window)) == 32
    with pytest.raises(ValueError, match=r"^k: attention=flex uses k \(its window\) only with "):
        validate(Cell("flex", 128, k=32, dtype="fp32", device="cpu"))
    assert Cell("flex", 128, k=32, params=window).budget == "window"
    both = (*window, ("window", 64))
    with pytest.raises(ValueError, match=r"^k: sets attention=flex's window, which attention"):
        validate(Cell("flex", 128, k=32, params=both, dtype="fp32", device="cpu"))


@pytest.mark.parametrize("task", ["cost", "approx", "listops"])
def test_k_without_a_budget_one_rule_for_every_task(task: str) -> None:
    """A single cell refuses k for a mechanism without a budget, whatever its task; a sweep
    drops it, so that the mechanism is one cell, measured once, at every k."""
    assert kept_k("vanilla", 64, in_sweep=False) == 64
    assert kept_k("vanilla", 64, in_sweep=True) is None
    assert kept_k("linformer", 64, in_sweep=True) == 64
    with pytest.raises(ValueError, match=r"^k: attention=vanilla has no budget: k must be null"):
        validate(Cell("vanilla", 64, k=32, task=Part(task), dtype="fp32", device="cpu"))


def test_the_ceiling_is_resolved_in_one_place() -> None:
    v100 = presets.load("v100_16gb")
    assert resolve_ceiling(None, v100) == v100.total_bytes
    assert resolve_ceiling(2 * 10**9, v100) == 2 * 10**9
    with pytest.raises(ValueError, match=r"ceiling: .* above v100_16gb"):
        resolve_ceiling(v100.total_bytes + 1, v100)
    with pytest.raises(ValueError, match="leave nothing after v100_16gb's fixed overhead"):
        resolve_ceiling(v100.overhead_bytes, v100)
    res = validate(Cell("vanilla", n=64, ceiling_bytes=2 * 10**9))
    assert res.usable == 2 * 10**9 - v100.overhead_bytes
    allowed = "inference, train, decode, packed, packed_train"
    with pytest.raises(ValueError, match=f"mode: must be one of {allowed}; got"):
        validate(
            Cell(
                "vanilla",
                n=64,
                workload=Part("fly"),
            )
        )


def test_a_new_row_round_trips_through_its_stored_form() -> None:
    cell = Cell("linformer", n=256, k=64, batch=3, params=(("sharing", "kv"),))
    row = Row.new(cell, 10**9, 5, environment())
    row.update(status="ok", time_median_s=0.5, time_iqr_s=0.01, key="abc")
    stored = json.loads(row.to_json())
    assert stored["schema"] == rows.SCHEMA == 3 and next(iter(stored)) == "schema"
    assert stored["batch_asked"] == 3 and stored["batch"] is None  # asked vs used: a figure
    assert stored["budget"] == "k" and stored["mode"] == "inference"  # no spec: stored whole
    assert Row.from_dict(stored) == row
    with pytest.raises(KeyError, match="no field 'max_batc'"):
        row.update(max_batc=3)  # a typo is not a new key


def test_a_stored_row_holds_its_spec_once_and_reads_back_whole(tmp_path: Path) -> None:
    """Schema 3: what the spec (``cell``) gives — the mechanism, n, the workload and its
    settings, the ceiling, the model — is stored there alone, and no other workload's
    setting is stored as a null; the store's readers (the key index, the progress table)
    and the row's reading see the same flat row as before."""
    from attnbench.plan import spec
    from attnbench.store import RunStore, read_rows

    cell = complete(
        Cell(
            "vanilla",
            512,
            workload=Part("train", {"checkpoint": True}),
        )
    )
    preset = presets.load("v100_16gb")
    row = Row.new(cell, preset.total_bytes, preset.overhead_bytes, environment())
    row = row.replaced(status="ok", key="abc", cell=spec(cell, preset))
    RunStore(tmp_path).append(row)
    (line,) = (tmp_path / "cells.jsonl").read_text().splitlines()
    stored = json.loads(line)
    given = ("attention", "n", "dtype", "device", "mode", "checkpoint", "optimizer",
             "ceiling_bytes", "model", "batch_asked", "params", "k")  # fmt: skip
    assert not set(given) & set(stored) and stored["cell"]["mode_settings"]
    assert not {s.name for s in workload.get("decode").settings} & set(stored)
    whole = Row.from_dict(json.loads(json.dumps(row.to_dict())))  # every field, as JSON holds it
    assert Row.from_dict(stored) == whole == rows.read(tmp_path / "cells.jsonl")[0]
    (flat,) = read_rows(tmp_path / "cells.jsonl")
    assert flat["attention"] == "vanilla" and flat["checkpoint"] is True and flat["n"] == 512
    assert len(line) < len(json.dumps(row.to_dict())) * 0.9  # the copy and others' settings out


def test_schema_1_rows_are_upgraded_on_reading() -> None:
    read = rows.read(REFERENCE)
    assert len(read) == 42 and {r.schema for r in read} == {rows.SCHEMA}
    vanilla = next(r for r in read if r.attention == "vanilla")
    linformer = next(r for r in read if r.attention == "linformer")
    assert vanilla.budget is None and linformer.budget == "k"
    assert {r.batch_asked for r in read} == {"max"}
    assert linformer.batch == linformer.max_batch  # the batch used, as schema 1 stored it


GOOD = {"schema": 2, "attention": "vanilla", "n": 512, "dtype": "fp16", "device": "v100_16gb"}


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("n", "512", "n: must be an integer >= 1, got '512'"),
        ("n", 0, "n: must be an integer >= 1, got 0"),
        ("n", None, "n: must be an integer >= 1, got None"),
        ("n", 10**400, "n: must be an integer below 2**63"),
        ("k", "x", "k: must be an integer >= 1"),
        ("time_per_seq_s", math.nan, "time_per_seq_s: must be a number >= 0, got nan"),
        ("time_per_seq_s", -1.0, "time_per_seq_s: must be a number >= 0, got -1.0"),
        ("time_per_seq_s", "fast", "time_per_seq_s: must be a number >= 0"),
        ("max_batch", "12", "max_batch: must be an integer >= 0"),
        ("status", 5, "status: must be one of ok, oom, skipped, error; got 5"),
        ("status", "fine", "status: must be one of ok, oom, skipped, error; got 'fine'"),
        ("params", [], "params: must be an object, got []"),
        ("env", "cpu", "env: must be an object, got 'cpu'"),
        ("model", None, "model: must be an object, got None"),
        ("attention", 3, "attention: must be a string, got 3"),
        ("batch_asked", "many", "batch_asked: must be an integer >= 1, got 'many'"),
        ("memory_source", "guessed", "memory_source: must be one of measured, modeled"),
        ("schema", 4, "schema: this attnbench reads schemas 1, 2, 3, got 4"),
        ("schema", True, "schema: this attnbench reads schemas 1, 2, 3, got True"),
    ],
)
def test_an_impossible_field_is_one_line_naming_it(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        Row.from_dict({**GOOD, field: value})
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("missing", ["attention", "n", "dtype", "device"])
def test_a_missing_identity_field_is_named(missing: str) -> None:
    data = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ValueError, match=f"^{missing}: missing$"):
        Row.from_dict(data)


def test_a_figure_not_stored_reads_as_unknown_and_unknown_keys_are_ignored() -> None:
    row = Row.from_dict({**GOOD, "from_the_future": 1})
    assert row.status is None and row.repeats is None and row.max_batch is None
    assert "from_the_future" not in row.to_dict()


def test_reading_names_the_file_the_line_and_the_field(tmp_path: Path) -> None:
    lines = REFERENCE.read_text().splitlines()
    bad = json.loads(lines[4])
    bad["time_per_seq_s"] = -0.5
    path = tmp_path / "cells.jsonl"
    path.write_text("\n".join([*lines[:4], json.dumps(bad), *lines[5:]]) + "\n")
    with pytest.raises(rows.BadRow, match=r"cells.jsonl:5: time_per_seq_s: must be a number"):
        rows.read(path)
    path.write_bytes(lines[0].encode() + b'\n{"n": "\xff"}\n')
    with pytest.raises(CorruptLine, match=r"cells.jsonl:2: not UTF-8"):
        rows.read(path)
    with pytest.raises(ValueError, match="no such file"):
        rows.read(tmp_path / "nowhere.jsonl")


def test_check_number_says_what_is_allowed() -> None:
    assert check_number("x", 3) == 3.0
    with pytest.raises(ValueError, match=r"^x: must be a number in \(0, 1\), got 1$"):
        check_number("x", 1, low=0, high=1, open_low=True, open_high=True)
    with pytest.raises(ValueError, match="x: must be a number >= 0, got True"):
        check_number("x", True, low=0)


def test_a_time_limit_of_0_or_null_is_no_limit() -> None:
    """One rule for cell_timeout_s: 0 (the config's spelling) and null both mean none."""
    assert check_limit("t", 0) is None and check_limit("t", None) is None
    assert check_limit("t", 5) == 5.0
    with pytest.raises(ValueError, match=r"^t: must be a number of seconds >= 0 \(0 or null: no"):
        check_limit("t", -1)


def test_the_row_record_is_the_schema_table() -> None:
    fields = dataclasses.fields(Row)
    assert [(f.name, f.type) for f in fields] == [(f.name, f.type) for f in FIELDS]
    row = Row(attention="vanilla", n=8, dtype="fp32", device="cpu")
    assert next(iter(row.to_dict())) == "schema" and set(row.to_dict()) == {f.name for f in FIELDS}
    assert row.params == {} and row.params is not Row(**GOOD).params  # no shared default


def test_a_declared_quality_figure_of_the_wrong_kind_is_refused() -> None:
    approx = {**GOOD, "task": "approx"}
    with pytest.raises(ValueError, match=r"^quality.rel_frobenius: must be a number, got 'low'$"):
        Row.from_dict({**approx, "quality": {"rel_frobenius": "low"}})
    with pytest.raises(ValueError, match=r"^quality.peak_bytes: must be a count, got -1$"):
        Row.from_dict({**GOOD, "task": "listops", "quality": {"peak_bytes": -1}})
    with pytest.raises(ValueError, match=r"^quality.cosine: must be a finite number, got nan$"):
        Row.from_dict({**approx, "quality": {"cosine": math.nan}})
    # every figure a report reads is there; an optional one undefined (None) and an
    # undeclared one are kept as they are
    stored = json.loads((REFERENCE.parent.parent / "approx-cpu-cpu/cells.jsonl").open().readline())
    figures = {**stored["quality"], "row_error": None, "later": [1, "x"]}
    assert Row.from_dict({**approx, "quality": figures}).quality == figures
    with pytest.raises(ValueError, match=r"^quality.cosine: missing \(every task=approx row"):
        Row.from_dict({**approx, "quality": {k: v for k, v in figures.items() if k != "cosine"}})


def test_a_row_refuses_a_name_no_field_has() -> None:
    """A misspelt field used to be set and then silently lost by to_dict (no slots)."""
    from attnbench.row import Row

    row = Row(attention="vanilla", n=4, dtype="fp32", device="cpu")
    row.mask_build_s = 1.0
    with pytest.raises(AttributeError, match="mask_buld_s"):
        row.mask_buld_s = 1.0  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match="mask_buld_s"):
        row.update(mask_buld_s=1.0)
    assert row.to_dict()["mask_build_s"] == 1.0


def test_a_row_is_assembled_from_its_steps_results() -> None:
    """The one place a row is made of measured values: each result's figures land in their
    fields, derived ones (per sequence, the rate, % of peak) from the timing result."""
    from attnbench.measure.timing import StepTiming, Timing
    from attnbench.runner.found import Compiled, Flops, Found, MaxBatch, Memory, assemble

    cell = Cell("flex", n=256, k=64, params=(("pattern", "window"),), dtype="fp32", device="cpu")
    found = Found(threads=(2, 4), flops=Flops(100, None, 160), recompiled=0)
    found = found.add(max_batch=MaxBatch(predicted=9, probed=8, probes=2, allocated=10))
    found = found.add(memory=Memory("measured", 8, 1000, 2000, 0.25))
    found = found.add(mask_build_s=0.5, compiled=Compiled("kernel", 3.0, 2))
    whole = Timing((2.0, 4.0, 6.0), "perf_counter", 3)
    found = found.add(timing=StepTiming(whole, {}, 8, "cpu", "fp32", flops=800, peak_flops=1600.0))
    found = found.add(workload={"state_bytes": 7})
    row = assemble(cell, validate(cell), environment(), found)
    assert (row.status, row.reason, row.flops, row.flops_dense) == ("ok", None, 100, 160)
    assert (row.max_batch, row.predicted_max_batch, row.probes, row.model_error) == (8, 9, 2, 1)
    assert (row.batch, row.peak_bytes, row.peak_reserved_bytes) == (8, 1000, 2000)
    assert (row.allocated_max_batch, row.fragmentation) == (10, 0.25)
    assert (row.compiled, row.compile_s, row.compilations, row.mask_build_s) == (
        "kernel", 3.0, 2, 0.5,
    )  # fmt: skip
    assert (row.time_median_s, row.time_per_seq_s, row.flops_per_s) == (4.0, 0.5, 200.0)
    assert row.pct_of_peak == 12.5 and row.time_samples_s == [2.0, 4.0, 6.0]
    assert row.env["threads"] == 3 and row.env["cpus"] == 4 and row.state_bytes == 7
    with pytest.raises(TypeError, match="memroy"):  # a misspelt figure is never set
        found.add(memroy=None)
    with pytest.raises(AttributeError, match="memory"):  # a figure is handed back, not set
        found.memory = None  # type: ignore[misc]
    assert found.stopped("oom", "b=1 does not fit").status == "oom" and found.status == "ok"


def test_a_step_that_fails_leaves_the_figures_before_it(monkeypatch) -> None:
    """A failing step is the row's status and reason; the steps before it keep their figures
    (here: the FLOPs and the memory's source and batch, not its peak nor any time)."""
    from attnbench.runner import run

    def boom(self, b):
        raise RuntimeError("no peak here")

    monkeypatch.setattr(run.MemoryModel, "peak", boom)
    cell = Cell(
        "vanilla",
        n=64,
        batch=3,
        dtype="fp32",
        device="cpu",
        model=Shape(layers=2, d_model=32, n_heads=2, d_ff=64),
    )
    row = run.run_cell(cell)
    assert row.status == "error" and row.reason == "RuntimeError: no peak here"
    assert row.flops > 0 and row.memory_source == "modeled" and row.batch == 3
    assert row.peak_bytes is None and row.time_median_s is None and row.max_batch is None


FIGURES = ("flops", "memory_source", "peak_bytes", "eager_peak_bytes", "time_median_s")


@pytest.mark.parametrize(
    ("failing", "compile", "kept"),
    [
        # the timing's cost estimated: after the modeled memory
        ("attnbench.measure.gemm.cpu_matmul_rate", False, {"flops", "memory_source", "peak_bytes"}),
        # a compiled cell's: after the eager step's peak, before the compiled one's
        ("attnbench.runner.prepare.compile_step", True, {"flops", "eager_peak_bytes"}),
        ("attnbench.runner.prepare.time_step", False, {"flops", "memory_source", "peak_bytes"}),
        # the workload's own figures, read after the step was timed
        (
            "attnbench.workload.base.Work.row_fields",
            False,
            {"flops", "memory_source", "peak_bytes", "time_median_s"},
        ),
    ],
    ids=lambda v: v.rpartition(".")[2] if isinstance(v, str) else None,
)
def test_a_step_that_fails_inside_the_timing_leaves_the_figures_before_it(
    monkeypatch, failing: str, compile: bool, kept: set[str]
) -> None:
    """The timing's steps, called inside the runner's, add their figures in turn: one that
    raises there leaves every figure found before it in the row, the callers' and its own."""
    from attnbench.runner import run

    name = failing.rpartition(".")[2]

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{name} failed")

    monkeypatch.setattr(failing, boom)
    cell = Cell(
        "vanilla",
        n=64,
        batch=3,
        dtype="fp32",
        device="cpu",
        model=Shape(layers=2, d_model=32, n_heads=2, d_ff=64),
        timing=TimingSpec(min_repeats=2, min_seconds=0.0),
        compile=compile,
    )
    row = run.run_cell(cell)
    assert (row.status, row.reason) == ("error", f"RuntimeError: {name} failed")
    assert {f for f in FIGURES if getattr(row, f) is not None} == kept


def test_version_1s_rule_kept_for_reading_reproduces_every_committed_key() -> None:
    """``cell_key._key_v1`` is version 1's rule, frozen: it decides whether a version-1 row's
    ceiling was the machine's. Held to every committed version-1 row's stored key (those of
    the cpu preset from before ``machine`` keys, with the RAM's bytes)."""
    from attnbench.cell_key import _key_v1, _preset
    from tests.test_reference_runs import REFERENCE

    rows = [json.loads(line) for f in sorted(REFERENCE.glob("*/cells.jsonl"))
            for line in f.read_text().splitlines()]  # fmt: skip
    rows = [r for r in rows if r.get("key_version", 1) == 1]  # rows stored since: today's rule
    assert len(rows) > 1000
    for r in rows:
        assert _key_v1(cell_of(r["cell"]), _preset(r["cell"]["device"])) == r["key"]


def test_a_version_1_row_of_the_machines_memory_is_found_whatever_the_ram() -> None:
    """A cpu-preset row keyed as ``machine`` by version 1, on a machine whose RAM is a whole
    number of MiB (which the older heuristic takes for a ceiling typed by hand), is found by
    today's cell at the default ceiling; one whose ceiling was given is not."""
    from attnbench.cell_key import _key_v1, stored_key

    cpu = presets.load("cpu")
    cell = Cell("vanilla", 64, dtype="fp32", device="cpu")
    spec = {**cell.to_dict(), "ceiling_bytes": 16 << 30}  # 16 GiB: whole MiB
    row = {"key": _key_v1(cell, cpu), "cell": spec, "memory_source": "modeled"}
    assert stored_key(row) == key(cell, cpu)
    given = dataclasses.replace(cell, ceiling_bytes=16 << 30)
    typed = {"key": _key_v1(given, cpu), "cell": spec, "memory_source": "modeled"}
    assert stored_key(typed) == key(given, cpu) != key(cell, cpu)


def test_a_gpu_presets_modeled_row_from_before_the_replay_is_measured_again() -> None:
    """Its max batch is live bytes' alone: a resume must not take it for today's replayed
    cell. Rows the allocator does not enter (decode, the cpu preset, measured) still resume."""
    from attnbench.cell_key import stored_key
    from tests.test_reference_runs import REFERENCE

    def first(run: str) -> dict:
        return json.loads((REFERENCE / run / "cells.jsonl").read_text().splitlines()[0])

    remade = first("table3-v100_16gb-cpu")  # remade under the replay: allocator recorded
    replay = ("allocator", "allocated_max_batch", "fragmentation", "peak_reserved_bytes")
    old = {f: v for f, v in remade.items() if f not in replay}  # as stored before the replay
    assert old["memory_source"] == "modeled"
    v100 = presets.load("v100_16gb")
    assert stored_key(old) != key(cell_of(old["cell"]), v100)
    assert stored_key(remade) == key(cell_of(remade["cell"]), v100)
    serving = first("serving-v100_16gb-cpu")  # decode: allocation-only as ever
    assert serving.get("allocator") is None
    assert stored_key(serving) == key(cell_of(serving["cell"]), v100)


def test_the_public_helpers_take_a_cell_not_yet_planned() -> None:
    """``build``, ``make_input`` and ``MemoryModel`` fill in the workload's defaults of a cell
    built in Python, as the plan does: a packed or training cell naming none of its settings
    is modeled as the command line's would be."""
    import torch

    from attnbench.runner import MemoryModel, build, make_input

    train = Cell(
        "vanilla",
        64,
        device="cpu",
        dtype="fp32",
        workload=Part("train"),
        model=Shape(layers=1, d_model=32, n_heads=2, d_ff=64),
    )
    res = validate(train)
    assert train.settings == {} and build(train, res, "meta", torch.float32) is not None
    assert MemoryModel(train, res).peak(2) == MemoryModel(res.cell, res).peak(2)
    packed = dataclasses.replace(train, workload=Part("packed", {"lengths": [8, 16]}))
    assert make_input(1, packed, "meta", torch.float32).shape[-1] == 32


def test_stored_and_spec_values_are_one_value_only_as_one_json_type() -> None:
    from attnbench.row.record import _same

    assert _same((1, 2), [1, 2]) and _same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not _same(True, 1) and not _same(1, 1.0) and not _same(None, 0)
