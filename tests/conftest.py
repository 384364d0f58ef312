"""Shared fixtures. Everything runs on CPU; GPU-only tests skip themselves with a reason."""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench.cell import Part, Shape
from tests.fla_fixtures import calls, interpreted  # noqa: F401 (the kernel=fla tests' fixtures)


def runnable_here() -> list[str]:
    """Mechanisms that can run on this machine (CPU), per the registry's own info()."""
    return [
        n
        for n in attnbench.names()
        if attnbench.info(n).unavailable is None and "cpu" in attnbench.info(n).devices
    ]


def mechanism_variants(*linformer: tuple[tuple[str, object], ...]) -> list[tuple[str, tuple]]:
    """(name, params) for every mechanism that runs here at its defaults, Linformer with
    each sharing, and Linformer with each of ``linformer``'s parameter sets: what the
    memory-model tests hold against the profiler."""
    sharings = [(("sharing", s),) for s in ("layerwise", "headwise", "kv", "none")]
    return [(name, own_defaults(name)) for name in runnable_here() if name != "linformer"] + [
        ("linformer", params) for params in (*sharings, *linformer)
    ]


def own_defaults(name: str) -> tuple[tuple[str, object], ...]:
    """The parameters a cell of ``name`` needs at its defaults: ``causal=true`` for a
    causal-only mechanism (a cell without it is refused), none otherwise."""
    return (("causal", True),) if attnbench.info(name).causal_only else ()


def param_ids(v: object) -> str:
    """A test id for a (key, value) tuple of parameters: ``sharing=kv``."""
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        return "-".join(f"{k}={x}" for k, x in v)
    return str(v)


def assert_peaks_match_the_profiler(attention: str, **params: object) -> None:
    """``attention`` with ``params`` in a 2-layer d128 encoder at n = 256, b = 2: the modeled
    peak (meta) of a forward and of a training step against the CPU profiler's, within 1 %.
    For variants the generic memory tests (run at each mechanism's defaults) do not reach,
    such as the causal prefix-sum loops of linear and performer."""
    from attnbench.cell import Cell
    from attnbench.measure.memory import module_bytes, profiled_peak, rounded
    from attnbench.plan import validate
    from attnbench.runner import MemoryModel, build, make_input, modeled_peak
    from attnbench.workload.train import train_step

    def cell(mode: str) -> Cell:
        return Cell(
            attention,
            n=256,
            k=None,
            dtype="fp32",
            device="cpu",
            workload=Part(mode),
            model=Shape(layers=2, d_model=128, n_heads=4, d_ff=512),
            params=tuple(params.items()),
        )

    c = cell("inference")
    res = validate(c)
    c = res.cell  # planned: its workload's settings complete
    model, meta = build(c, res, "cpu", torch.float32), build(c, res, "meta", torch.float32)
    x = torch.randn(2, 256, 128)
    with torch.inference_mode():
        model(x)
        real = profiled_peak(lambda: model(x))
    modeled = modeled_peak(meta, c, 2, overhead=0) - module_bytes(meta) - rounded(x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, ("inference", modeled, real)

    c = cell("train")
    res = validate(c)
    c = res.cell  # planned: its workload's settings complete
    memory, model = MemoryModel(c, res), build(c, res, "cpu", torch.float32)
    step = train_step(model, c, make_input(2, c, "cpu", torch.float32), "cpu", gpu=False)
    step()
    step()
    real = profiled_peak(step)
    modeled = memory.peak(2) - memory.fixed - rounded(step.x.nbytes)
    assert abs(modeled - real) <= 0.01 * real, ("train", modeled, real)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# the installed console script beside this interpreter, as a user types `attnbench`: not
# `python -m attnbench.cli` from the repo root, which finds the checkout's conf/ on the path
# where an installed attnbench has only its own package data
CLI = (str(Path(sys.executable).with_name("attnbench")),)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``attnbench ARGS`` in a fresh process (the console script, :data:`CLI`), as a user runs it:
    the end-to-end tests' one way to call the CLI. ``env`` is added to this environment;
    ``preexec_fn`` runs in the child first (to pin it to CPUs, say)."""
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )


@pytest.fixture
def cli_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``attnbench ARGS`` in this process (:func:`attnbench.cli.main`), for a test whose
    property is not the process's: a refusal's line and exit code, say (a fresh Python is
    seconds of imports; :func:`run_cli` keeps one real process per path a user takes).
    Returns what :func:`run_cli` does. Run in ``cwd``; the signal handlers, environment and
    ``sys.argv`` a command sets are put back, and glibc's malloc is left as it is here."""
    import signal

    from attnbench import cli

    def call(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("ATTNBENCH_MALLOC_FIX", "0")  # mallopt would stay in pytest
        monkeypatch.setattr(sys, "argv", list(sys.argv))
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        env = dict(os.environ)
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse's refusals exit, as the process would
            code = e.code if isinstance(e.code, int) else 1
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            os.environ.clear()
            os.environ.update(env)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["attnbench", *args], code, out.out, out.err)

    return call


def processes_with(needle: str) -> list[int]:
    """Live processes whose environment holds ``needle`` (a command's and its workers')."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# A test waits for what it waits for (a file, a row, a process's end), never for a time that a
# busy machine can cross (a fresh clone's suite took 45 min at load 4-6 on 2 cores, where a
# 300 s subprocess timeout and a 10 s wait for processes to go were crossed). The one
# wall-clock bound left is this guard against a true hang, so large that no load comes near
# it: every wait it guards takes seconds on any machine, quiet or loaded.
HANG_S = 30 * 60


def wait_for(done: Callable[[], object], what: str, alive: subprocess.Popen | None = None) -> None:
    """Wait until ``done()`` is true, however long load makes that. ``alive``, the process
    that should bring it about, ending first fails the wait at once (unless it did); only a
    true hang meets :data:`HANG_S`."""
    guard = time.monotonic() + HANG_S
    while not done():
        if alive is not None and alive.poll() is not None:
            assert done(), f"the process ended (exit {alive.returncode}) before {what}"
            return
        assert time.monotonic() < guard, f"still waiting after {HANG_S} s, a hang: {what}"
        time.sleep(0.1)


def reaped(needle: str) -> list[int]:
    """The processes carrying ``needle`` (a command's marker in the environment, which its
    reaper inherits) still alive once the command's reaper has ended: [] when the command
    took all of its processes with it. Its end is when to look, not a time: after its
    command's end the reaper ends by its own clock (it looks every 0.5 s, gives resource
    trackers 3 s, gives up on a process that will not die 2 s later), and only once its last
    look found none of the command's processes, or one that would not die. A 10 s bound was
    crossed on 2 loaded cores, the reaper finishing all the same."""

    def reaper_alive() -> bool:
        for pid in processes_with(needle):
            try:  # boot code in its command line: attnbench.sweep.claims.start_reaper
                if b"attnbench_reaper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:  # gone meanwhile
                continue
        return False

    wait_for(lambda: not reaper_alive(), f"the reaper of {needle} ends")
    return processes_with(needle)


# -- `pytest -n N` (pytest-xdist): each worker on CPUs of its own ---------------------------
def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n N``, worker i keeps every N-th of the CPUs the run was given, and
    torch uses that many threads, as attnbench's own default does (``timing.threads: null``
    is the CPUs given). Without it, N workers each run torch's threads over all the CPUs:
    on 2 cores, 2 workers of 2 spinning OpenMP threads each took 15 min 45 s, barely less
    than one worker's 17 min 55 s. The processes a test starts inherit the share, so a
    timing test is never beside another worker's test on its own CPU."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    share = cpus[int(worker[2:]) % len(cpus) :: count] or cpus
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))


# -- slow tests: `pytest -m "not slow"` is the daily loop, `.ci/run` runs everything ---------
# Every test that starts a process (:func:`_spawns`); whole modules of end-to-end runs (a
# scheduler, the gate's interleaved versions, the speed benchmarks); single tests that take
# seconds in-process (measured with --durations). Matched as node-id prefixes.
SLOW = (
    "tests/benchmarks/",
    "tests/test_check_gate.py",
    "tests/test_interrupts.py",
    "tests/test_processes.py",
    "tests/test_quality_cli.py",
    "tests/test_report_writers.py",
    "tests/test_run_cli.py",
    "tests/test_slurm.py",
    "tests/test_compile.py::test_a_sweep_leaves_flex_training_out_on_a_cpu_and_goes_on",
    "tests/test_compile.py::test_a_compiled_row_says_what_ran_and_what_compiling_cost",
    "tests/test_compile.py::test_a_compiled_layer_around_flex_computes_what_flex_alone_does",
    "tests/test_contention.py::test_a_cell_timed_beside_a_busy_loop_is_stored_busy_and_said_last",
    "tests/test_contention.py::test_a_cell_times_on_the_cpus_it_was_given_and_says_so",
    "tests/test_contention.py::test_a_timing_beside_a_busy_loop_on_its_cpu_is_busy_and_one_",
    "tests/test_decode_workload.py::test_decode_end_to_end_through_the_cli",
    "tests/test_decode_workload.py::test_the_gpu_branch_driven_on_cpu",
    "tests/test_docs.py::test_every_run_command_shown_composes_and_validates",
    "tests/test_edges_run.py::test_a_disk_that_fills_during_a_sweep_is_one_line",
    "tests/test_gpu_check.py::test_gpu_check_script_runs_its_cpu_smoke",
    "tests/test_memory_model.py::test_modeled_peak_equals_the_profilers[flex-",
    "tests/test_memory_model.py::test_modeled_peak_equals_the_profilers[linformer-",
    "tests/test_readme_and_cli.py::test_readme_measurement_example_runs",
    "tests/test_readme_and_cli.py::test_cli_demo_runs_one_cell",
    "tests/test_report_files.py::test_out_never_deletes_what_is_not_a_report",
    "tests/test_scale.py::test_every_shipped_sweep_expands_as_hydra_composes_it",
    "tests/test_train.py::test_train_mode_end_to_end_through_the_cli",
    "tests/test_train.py::test_checkpointing_fits_a_larger_batch_for_one_more_forward",
    "tests/test_recall.py::test_the_task_end_to_end",
    "tests/test_report_serving.py::test_report_command_writes_the_serving_sections",
    "tests/test_robustness.py::test_half_precision_on_cpu_is_finite_and_close[flex-",
    "tests/test_measure.py::test_affine_solve_finds_the_searchs_answer_in_four_meta_forwards",
    "tests/test_gpu_check.py::test_gpu_check_lists_its_gpu_serving_cells_and_refuses_without_a_gpu",
    "tests/test_gpu_check.py::test_the_plan_says_the_gpu_order_and_its_seconds_without_a_gpu",
    "tests/test_scale.py::test_a_thousand_jobs_compose_a_handful_of_times",
    "tests/test_scale.py::test_every_cell_of_a_large_sweep_is_still_validated",
    "tests/test_hostile.py::test_hostile_free_text_in_plots_and_the_terminal",
    "tests/test_report_files.py::test_report_command_writes_every_format",
    "tests/test_report_compiled.py::test_report_writes_the_compiled_document",
    "tests/test_memory_model.py::test_the_profiler_leaves_stderr_quiet",
    "tests/test_train.py::test_mixed_precision_keeps_fp32_weights_and_state_and_casts_activations",
    "tests/test_decode_workload.py::test_the_max_batch_is_serving_s_kv_caches_fall_like_one_over_n",
    "tests/test_compile.py::test_compiled_layers_compute_what_the_eager_ones_do",
    "tests/test_measure.py::test_max_batch_search_finds_the_exact_boundary_in_log_probes",
    "tests/test_measure.py::test_the_gpu_branch_driven_on_cpu",
    "tests/test_memory_model.py::test_modeled_peak_equals_the_profilers[reformer-()-encoder12]",
    "tests/test_memory_model.py::test_modeled_peak_equals_the_profilers[nystromformer-()-encoder12]",
    "tests/test_memory_model.py::test_modeled_peak_equals_the_profilers[performer-()-encoder12]",
    "tests/test_scale.py::test_composing_once_per_choice_of_groups_gives_hydras_configs",
    "tests/test_scale.py::test_a_users_config_dir_groups_and_options",
    "tests/test_report_files.py::test_plots_are_real_images_of_the_stated_size",
    "tests/test_listops.py::test_label_distribution",
    "tests/test_compile.py::test_a_recompilation_while_timing_raises_and_none_is_counted_otherwise",
    "tests/test_compile.py::test_a_compiler_failure_is_the_cells_error_row",
    "tests/test_decode_workload.py::test_grouped_query_heads_in_the_forward_and_training_modes[train-",
)


SPAWNS = ("run_cli(", "subprocess.", "Popen(", "CLI,")  # a new Python: ~3 s of imports each


@functools.cache
def _spawns(function: Callable[..., object]) -> bool:
    """Whether a test starts a process, itself or through a helper of its module (one level):
    every real subprocess of the CLI is slow, whatever it checks."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    if any(s in source for s in SPAWNS):
        return True
    module = sys.modules.get(function.__module__)
    helpers = [
        f for name, f in vars(module).items()
        if inspect.isfunction(f) and not name.startswith("test") and f"{name}(" in source
    ] if module else []  # fmt: skip
    return any(any(s in inspect.getsource(f) for s in SPAWNS) for f in helpers)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if item.nodeid.startswith(SLOW) or (function is not None and _spawns(function)):
            item.add_marker(pytest.mark.slow)
