"""What a quality task brings (conf/task/): its own model, device, dtype, batch and n, unless
the command line names them; a shipped sweep composes as it did; docs/quality.md's table is
the composed one. Composed in this process, as ``attnbench run`` composes before it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from attnbench.quality import tasks
from attnbench.sweep.config import expand_jobs

ROOT = Path(__file__).parent.parent


def _composed(*overrides: str) -> list:
    jobs, _ = expand_jobs(list(overrides))
    return [OmegaConf.to_container(job, resolve=True) for job in jobs]


def _model(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))


def test_a_quality_task_brings_its_own_model_device_dtype_batch_and_n() -> None:
    """``task=mqar attention=linformer k=16`` as a new user types it trains the recall model
    on the CPU, not the config's 12-layer base model at n=512 (hours); whatever the command
    line names wins."""
    (job,) = _composed("task=mqar", "attention=linformer", "k=16")
    assert job["model"] == _model("mqar") != _model("base")
    assert (job["device"]["name"], job["dtype"], job["batch"], job["n"]) == ("cpu", "fp32", 1, 64)
    (job,) = _composed("task=mqar", "attention=linformer", "k=16", "model=tiny", "n=128")
    assert job["model"] == _model("tiny") and job["n"] == 128
    (job,) = _composed("task=listops", "device=a100_80gb", "dtype=bf16", "batch=4")
    assert job["model"] == _model("listops") and job["n"] == 256
    assert (job["device"]["name"], job["dtype"], job["batch"]) == ("a100_80gb", "bf16", 4)
    (job,) = _composed("attention=linformer", "k=16")  # task=cost: the config's, as before
    assert job["model"] == _model("base") and job["task"] == "cost"
    assert (job["device"]["name"], job["dtype"], job["batch"], job["n"]) == (
        "v100_16gb", "fp16", "max", 512
    )  # fmt: skip


STORED_RAM = 25_276_502_016  # the reference runs' machine: what its kernel said it had


@pytest.mark.parametrize("ram", [STORED_RAM, STORED_RAM + 8192, STORED_RAM - 3 * 4096, 2**35])
@pytest.mark.parametrize("sweep", ["approx", "spectrum", "listops", "recall"])
def test_a_quality_sweep_plans_the_cells_its_reference_run_stored(
    sweep: str, ram: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cell a shipped quality sweep plans is one its committed reference run stored,
    under the key the stored row answers to (so that run resumes): the sweep composes as it
    did, on a machine whose RAM is the reference machine's, a few kB off it (another
    machine of its kind; a reboot) or another size. The ``cpu`` preset's ceiling is the
    machine's memory, which no key holds to the byte."""
    from attnbench.cell_key import stored_key
    from attnbench.measure import presets
    from attnbench.sweep.config import prevalidate

    monkeypatch.setattr(presets, "host_memory_bytes", lambda: ram)
    plan = prevalidate([f"+sweep={sweep}", f"out_dir={tmp_path}"])
    stored = ROOT / "results" / "reference" / f"{sweep}-cpu-cpu" / "cells.jsonl"
    rows = [json.loads(line) for line in stored.read_text().splitlines()]
    # the machine's memory as each row stored it (schema 3 in its cell): the reference
    # machine's, or another of its kind a few kB apart (the recall run's later rows)
    ceilings = {r.get("ceiling_bytes") or r["cell"]["ceiling_bytes"] for r in rows}
    assert STORED_RAM in ceilings and all(abs(c - STORED_RAM) < 1 << 20 for c in ceilings)
    assert {Path(d).name for d, _ in plan} == {"cpu-cpu"}
    assert plan and {key for _, key in plan} <= {stored_key(r) for r in rows}
    assert not any(tmp_path.iterdir()), "planning writes nothing"


def test_a_reference_run_resumes_on_a_machine_with_other_ram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process
) -> None:
    """The committed spectrum run, copied, resumed by ``attnbench run`` on a machine whose
    RAM is 8 kB off the reference machine's and whose CPU has another name: every cell done
    before, none measured, the file as it was; its report made from the stored rows."""
    import shutil

    from attnbench import env
    from attnbench.measure import presets

    monkeypatch.setattr(presets, "host_memory_bytes", lambda: STORED_RAM + 8192)
    monkeypatch.setattr(env, "cpu_name", lambda: "Another CPU of the same kind")
    env.machine.cache_clear()
    run = tmp_path / "spectrum" / "cpu-cpu"
    shutil.copytree(ROOT / "results" / "reference" / "spectrum-cpu-cpu", run)
    before = (run / "cells.jsonl").read_bytes()
    out = cli_in_process(
        "run", "+sweep=spectrum", f"out_dir={tmp_path}", "progress=false", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    # the sweep's one cell (the run's other row is of its listops inputs' command)
    assert "attnbench: 0 of 1 cell to measure" in out.stdout
    assert out.stdout.count("done before") == 1
    assert (run / "cells.jsonl").read_bytes() == before


def test_the_documented_task_defaults_are_the_composed_ones() -> None:
    """docs/quality.md's table of what each task brings, against Hydra's composition."""
    doc = (ROOT / "docs" / "quality.md").read_text()
    head = "| `task=` | model | device | dtype | batch | n |\n| --- |"
    table = {}
    for line in doc.split(head)[1].splitlines()[1:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]  # `name` (why) -> name
        table[cells[0].split("`")[1]] = [c.split("`")[1] if "`" in c else c for c in cells[1:]]
    assert set(table) == set(tasks.TASKS)  # cost and every built-in task
    for task, (model, device, dtype, batch, n) in table.items():
        (job,) = _composed(f"task={task}")
        assert job["model"] == _model(model), task
        assert [job["device"]["name"], job["dtype"], str(job["batch"]), str(job["n"])] == [
            device, dtype, batch, n
        ], task  # fmt: skip
