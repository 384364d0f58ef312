"""The max batch a card fits, as its caching allocator decides (#45): the search over replayed
traces (attnbench/measure/fit.py), the runner's modeled rows, and the ``allocator`` setting.

The allocator's rules themselves are held rule by rule in ``test_allocator.py``, and the
replay against a real card's rows in ``test_allocator_check.py``.
"""

from __future__ import annotations

import pytest

from attnbench.cell import Cell
from attnbench.cell_key import key
from attnbench.cell_rules import check_allocator
from attnbench.measure import fit, presets
from attnbench.measure.allocator import replay
from attnbench.measure.allocator_rules import AllocatorConfig, from_setting
from attnbench.plan import validate
from attnbench.runner import MemoryModel, run_cell

MiB = 1 << 20
SMALL = dict(layers=2, d_model=64, n_heads=4, d_ff=128, min_repeats=1, min_seconds=0.0)


def _steps(b: int) -> list[tuple]:
    """A step that fragments: two held 1-MiB weights, then per sequence a 5-MiB transient
    and an 8-MiB block kept. Requests of 1-10 MiB are served from 20-MiB segments, so two
    kept blocks leave 4 MiB of a segment that neither request size can use: live bytes fit
    7 sequences under 64 MiB, the allocator (replayed) 5."""
    events: list[tuple] = [("alloc", 0, MiB), ("alloc", 1, MiB)]
    for i in range(b):
        events += [("alloc", 10 + 2 * i, 5 * MiB), ("alloc", 11 + 2 * i, 8 * MiB)]
        events += [("free", 10 + 2 * i)]
    return events


def test_affine_interpolates_a_trace_and_refuses_one_that_is_not() -> None:
    same = [("alloc", 0, 100), ("alloc", 1, 8), ("free", 1)]
    double = [("alloc", 0, 100), ("alloc", 1, 24), ("free", 1)]  # 8 bytes a sequence more
    at = fit.affine(same, 1, double, 3)
    assert at is not None and at(10) == [("alloc", 0, 100), ("alloc", 1, 80), ("free", 1)]
    assert fit.affine(same, 1, double[:2], 3) is None  # another number of calls
    assert fit.affine(same, 1, [*double[:2], ("free", 0)], 3) is None  # another order
    assert fit.affine(same, 1, [("alloc", 0, 100), ("alloc", 1, 25), ("free", 1)], 3) is None
    assert fit.affine(same, 2, double, 2) is None


def test_the_replayed_max_batch_is_the_largest_whose_replay_fits_below_the_allocated_one() -> None:
    """The replay's answer is the largest b whose replay does not run out (5), below the
    allocation-only one (7), found from it; each searched b is one traced call."""
    cap = 64 * MiB
    asked: list[int] = []

    def trace_of(b: int) -> list[tuple]:
        asked.append(b)
        return _steps(b)

    live = [b for b in range(1, 40) if fit.live_peak(_steps(b)) <= cap]
    allocated = max(live)
    fits = [b for b in range(1, 40) if replay(_steps(b), cap, AllocatorConfig()).fits]
    got = fit.replayed_max_batch(trace_of, cap, AllocatorConfig(), allocated)
    assert (allocated, got, max(fits)) == (7, 5, 5)  # fragmentation costs two sequences
    assert len(set(asked)) <= 5  # b = 2, the allocated answer, then about two real traces


def test_a_modeled_gpu_row_is_replayed_and_a_cpu_row_is_not() -> None:
    """On a GPU preset the modeled max batch is the replay's, at most the allocation-only one
    beside it, with the replayed reserved peak and its fragmentation at that batch; the cpu
    preset has no caching allocator: allocation-only, nothing reserved."""
    gpu = run_cell(Cell.of("sdpa", 512, model_only=True))
    assert gpu.status == "ok" and gpu.allocator == "default"
    assert 0 < gpu.max_batch == gpu.predicted_max_batch <= gpu.allocated_max_batch
    assert gpu.peak_reserved_bytes >= gpu.peak_bytes and gpu.fragmentation >= 0
    cpu = run_cell(Cell.of("sdpa", 64, dtype="fp32", device="cpu", ceiling_bytes=64 * MiB, **SMALL))
    assert cpu.max_batch == cpu.allocated_max_batch and cpu.peak_reserved_bytes is None


def test_a_gpu_presets_trace_is_its_cards_own() -> None:
    """A GPU preset's step is traced as its card's kernels allocate (cuda_layouts.py): after
    SDPA, merging the heads is a view of the fused kernel's (b, n, h, dh) output, where on
    meta it copies; cuBLAS's workspace (8 MiB + 128 KiB on a V100, 32 MiB on an H100, and
    cuBLASLt's 1 MiB where torch keeps it apart) is held before the step.
    ``capability=None`` is meta's own trace, and decode (no replay) and the cpu preset have
    no card."""
    cell = Cell.of("sdpa", 512, **SMALL)
    res = validate(cell)
    cell = res.cell  # planned: its workload's settings complete
    card, plain = MemoryModel(cell, res), MemoryModel(cell, res, capability=None)
    assert card.capability == (7, 0) and plain.capability is None
    ws = card.workspaces
    assert ws[0] == 8 * MiB + 128 * 1024 and ws[1:] in ((), (MiB,))  # cuBLASLt's: its own?
    assert card.held == [*plain.held, *ws] and card.fixed == plain.fixed + sum(ws)
    merged = 4 * 512 * 64 * 2  # b = 4: one (b, n, d) fp16 block, the merge's copy on meta

    def sizes(model: MemoryModel) -> list[int]:
        return sorted(e[2] for e in model.trace(4)[len(model.held) + 1 :] if e[0] == "alloc")

    copies = sizes(plain).count(merged) - sizes(card).count(merged)
    assert copies == SMALL["layers"]  # one a layer: the merge after each layer's SDPA
    h100 = validate(Cell.of("sdpa", 512, **SMALL, device="h100_80gb"))
    assert MemoryModel(cell, h100).workspaces[0] == 32 * MiB
    decode = Cell.of("sdpa", 512, mode="decode", params=(("causal", True),), **SMALL)
    assert MemoryModel(decode, validate(decode)).capability is None
    on_cpu = Cell.of("sdpa", 64, dtype="fp32", device="cpu", **SMALL)
    assert MemoryModel(on_cpu, validate(on_cpu)).capability is None


def test_expandable_segments_fit_at_least_what_the_default_allocator_fits() -> None:
    """The same step's calls, replayed with expandable segments: one growing segment per
    pool, so a freed block's space serves the next request of another size."""
    cell = Cell.of("linformer", 512, k=128, **SMALL, ceiling_bytes=2 << 30)
    res = validate(cell)
    cell = res.cell  # planned: its workload's settings complete
    model = MemoryModel(cell, res)
    from attnbench.measure.search import solve_affine

    allocated, _ = solve_affine(model.peak, res.ceiling, model.fixed)
    default = model.replayed_max_batch(allocated, res.usable, "default")
    expandable = model.replayed_max_batch(allocated, res.usable, "expandable")
    assert 0 < default <= expandable <= allocated


def test_the_allocator_setting_is_checked_keyed_only_when_set_and_refused_where_it_cannot_be() -> (
    None
):
    v100 = presets.load("v100_16gb")
    assert key(Cell.of("vanilla", 512, allocator="default"), v100) == key(
        Cell.of("vanilla", 512), v100
    )
    assert key(Cell.of("vanilla", 512, allocator="expandable"), v100) != key(
        Cell.of("vanilla", 512), v100
    )
    assert from_setting("expandable").expandable_segments
    assert from_setting("max_split_size_mb:256").max_split_size == 256 * MiB
    with pytest.raises(ValueError, match=r"^allocator: PYTORCH_CUDA_ALLOC_CONF key 'nope'"):
        validate(Cell.of("vanilla", 512, allocator="nope"))
    with pytest.raises(ValueError, match=r"^allocator: device=cpu has no CUDA caching allocator"):
        validate(Cell.of("vanilla", 64, dtype="fp32", device="cpu", allocator="expandable"))


def test_a_gpu_cell_refuses_an_environment_that_sets_another_allocator(monkeypatch) -> None:
    """Where this process runs the cell on its GPU, the environment's allocator is the one
    measured: one that differs from the cell's setting is one line, not a mislabelled row."""
    cell = Cell.of("vanilla", 512, allocator="default")
    v100 = presets.load("v100_16gb")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    check_allocator(cell, v100, gpu=False)  # modeled: the environment plays no part
    with pytest.raises(ValueError, match=r"^allocator: PYTORCH_CUDA_ALLOC_CONF=expandable_"):
        check_allocator(cell, v100, gpu=True)
    check_allocator(Cell.of("vanilla", 512, allocator="expandable"), v100, gpu=True)
    # the same settings in another spelling are the same allocator; torch's other name too
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:True")
    mine = Cell.of("vanilla", 512, allocator="expandable_segments:True,max_split_size_mb:64")
    check_allocator(mine, v100, gpu=True)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(ValueError, match=r"^allocator: PYTORCH_ALLOC_CONF=expandable_segments"):
        check_allocator(cell, v100, gpu=True)


def test_a_row_stored_before_the_replay_reads_as_allocation_only() -> None:
    from attnbench.row import Row

    old = Row.from_dict({"attention": "vanilla", "n": 512, "dtype": "fp16",
                         "device": "v100_16gb", "max_batch": 897})  # fmt: skip
    assert old.allocator is None and old.allocated_max_batch is None and old.max_batch == 897


def test_a_bad_allocator_is_one_line_and_exit_2(cli_in_process, tmp_path) -> None:
    done = cli_in_process("run", "attention=vanilla", "n=64", "allocator=max_split_size_mb:1",
                          f"out_dir={tmp_path}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("attnbench run: error: allocator: PYTORCH_CUDA_ALLOC_CONF")
    assert not any(tmp_path.iterdir())


def test_a_gpu_cell_with_its_own_allocator_runs_in_a_process_that_sets_it(monkeypatch) -> None:
    """PYTORCH_CUDA_ALLOC_CONF is read once, when CUDA starts: a GPU cell whose setting is not
    the default is measured in a fresh process with it set; without the GPU it is modeled
    here, replayed under the setting."""
    import dataclasses
    import subprocess

    from attnbench.sweep import job

    cell, v100 = Cell.of("vanilla", 512, allocator="expandable"), presets.load("v100_16gb")
    res = validate(cell, v100)  # the process's one answer for this cell (memoized)
    assert job._allocator_env(res) is None  # no GPU here
    monkeypatch.setattr(res, "on_gpu", True)  # as on a machine with the preset's GPU
    assert job._allocator_env(res) == "expandable_segments:True"
    plain = dataclasses.replace(res, cell=dataclasses.replace(cell, allocator="default"))
    assert job._allocator_env(plain) is None
    seen = {}

    def started(argv, **kw):  # the cell's process, as job.measure starts it
        seen.update(kw.get("env") or {})
        return subprocess.CompletedProcess(argv, 1, "", "stopped here\n")

    monkeypatch.setattr(job.subprocess, "run", started)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")  # not passed on
    row = job.measure(res, None, isolate=False)
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in seen
    assert row.status == "error" and row.reason == "stopped here"
