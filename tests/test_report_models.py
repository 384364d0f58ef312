"""The models section of a report (arch= rows, +sweep=hybrid): each named model against its
twin by hand, from injected rows; its marks (a model that does not fit, one that has no
row); batch 1's time from the same row's roofline; the cache by layer kind; named rows kept
out of the serving and Table 3 sections; and one real `attnbench run +sweep=hybrid` whose
report holds the tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.report import models
from attnbench.report.sections import cost_row
from attnbench.report.serving import applies as serving_applies
from attnbench.row import Row
from tests.conftest import run_cli

SHAPE = {"layers": 4, "d_model": 64, "n_heads": 4, "d_ff": 128}
GiB = 1 << 30


def _row(name: str, n: int, mb: int | None, *, per_token: float | None = None,
         status: str = "ok", by_kind: dict | None = None, device: str = "h200_141gb",
         t: float | None = None, batch: int | str = "max") -> Row:  # fmt: skip
    """A named model's decode row as the workload stores it: its max batch and the step
    modeled at it (``per_token``), or a step timed at a fixed batch (``t``)."""
    step = None
    if per_token is not None and mb:
        state = sum(e["bytes"] for e in (by_kind or {}).values()) * mb
        step = {"batch": mb, "context": n, "read_bytes": state + 1000, "state_read_bytes": state,
                "weight_bytes": 1000, "flops": 2 * mb, "bandwidth_bytes_per_s": 1e9,
                "peak_flops_per_s": 1e12, "memory_s": per_token * mb, "compute_s": 0.0,
                "step_s": per_token * mb, "bound": "memory", "per_token_s": per_token,
                "how": "roofline", "state_by_kind": by_kind or {}}  # fmt: skip
    return Row(
        attention="sdpa", n=n, dtype="fp16", device=device, params={"causal": True},
        mode="decode", decode_tokens=128, state_dtype="auto", prefill_chunk=512, contexts="n",
        batch_asked=batch, ceiling_bytes=150 * GiB, model={**SHAPE, "name": name},
        status=status, max_batch=mb, batch=mb if batch == "max" else batch,
        memory_source="modeled", time_per_seq_s=t, modeled_step=step,
    )  # fmt: skip


KINDS = {"linear": {"mechanism": "gated_deltanet", "layers": 3, "bytes": 100},
         "attention": {"mechanism": "sdpa", "layers": 1, "bytes": 300}}  # fmt: skip
TWIN = {"attention": {"mechanism": "sdpa", "layers": 4, "bytes": 1200}}


def _rows() -> list[Row]:
    return [
        _row("m", 4096, 40, per_token=1e-3, by_kind=KINDS),
        _row("m_twin", 4096, 10, per_token=4e-3, by_kind=TWIN),
        _row("m", 1 << 20, 2, per_token=1e-2, by_kind=KINDS),
        _row("m_twin", 1 << 20, 0, status="oom"),
        _row("other", 4096, 0, status="oom"),
    ]


def test_fit_and_time_against_the_twin_by_hand() -> None:
    fit, at_max, at_one = models.fit_and_time(_rows())
    assert fit.head == ["context", "m", "other"]
    assert fit.body == [["4K", "40 (4.00x)", "OOM"], ["1M", "2 (twin: OOM)", "-"]]
    assert at_max.body[0] == ["4K", "1.00 ms (4.00x)", "OOM"]  # twin 4 ms / 1 ms
    # batch 1: 1000 weight bytes + one sequence's 400 state bytes over 1 GB/s, 2 FLOPs at 1e12
    assert at_one.body[0][1] == "1.40 us (1.57x)"  # the twin's (1000 + 1200) / 1e9: 2.2 us
    assert "lower bound" in " ".join(at_max.notes) and at_one.title.startswith("Time per token")
    assert "Weights each step reads, GB: m 0.00000100, m_twin 0.00000100." in fit.notes


def test_rows_that_differ_in_their_work_are_never_one_cell() -> None:
    """A second run of m with other decode tokens is a table of its own (titled apart), and
    m prefilled in two chunk sizes is two columns, each against its twin in the same."""
    other = [_row("m", 4096, 20, per_token=1e-3, by_kind=KINDS)]
    other[0] = Row.from_dict({**other[0].to_dict(), "decode_tokens": 1024})
    titles = [g.title for g in models.fit_and_time([*_rows(), *other])]
    assert sum(t.startswith("Sequences that fit") for t in titles) == 2
    assert (
        "Sequences that fit, h200_141gb, fp16, ceiling 150.0 GiB, 1024 decode tokens, state auto"
        in titles
    )
    chunked = [Row.from_dict({**r.to_dict(), "prefill_chunk": 64}) for r in _rows()[:2]]
    fit = models.fit_and_time([*_rows(), *chunked])[0]
    assert fit.head == ["context", "m (prefill_chunk=64)", "m (prefill_chunk=512)", "other"]
    assert fit.body[0][1:3] == ["40 (4.00x)", "40 (4.00x)"]


def test_the_cache_by_kind_against_the_twins_whole() -> None:
    (grid,) = models.cache_by_kind(_rows())
    assert grid.title == "Cache per sequence by layer kind, fp16"
    assert grid.head == ["model: kind", "4K", "1M"]
    assert grid.body == [
        ["m: attention (sdpa x1)", "0.000286 MiB (25.0% of the twin's)", "0.000286 MiB"],
        ["m: linear (gated_deltanet x3)", "0.0000954 MiB (8.3% of the twin's)", "0.0000954 MiB"],
    ]


def test_measured_rows_get_their_own_table_and_named_rows_no_other_section() -> None:
    timed = [_row("s", 4096, None, t=2e-3, batch=1, device="cpu"),
             _row("s_twin", 4096, None, t=5e-3, batch=1, device="cpu")]  # fmt: skip
    (grid,) = models.fit_and_time(timed)
    assert grid.title.startswith("Time per token measured at batch 1, cpu")
    assert grid.body == [["4K", "2.00 ms (2.50x)"]]
    for r in [*timed, *_rows()]:
        assert models.applies(r) and not serving_applies(r) and not cost_row(r)
    assert models.fit_and_time([]) == [] and models.cache_by_kind([]) == []


@pytest.mark.parametrize(
    ("n", "label"), [(4096, "4K"), (131072, "128K"), (1 << 20, "1M"), (1000, "1000")]
)
def test_contexts_are_labelled_as_the_field_names_them(n: int, label: str) -> None:
    assert models.context_label(n) == label


def test_a_real_hybrid_sweep_reports_each_model_against_its_twin(tmp_path: Path) -> None:
    """Jamba's small variant and its twin on the H200 preset, modeled on meta (no timing)."""
    out = run_cli("run", "+sweep=hybrid", "arch=jamba_small,jamba_small_twin", "n=4096",
                  "device=h200_141gb", f"out_dir={tmp_path}", "progress=false")  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "hybrid" / "presets" / "report" / "models.md").read_text()
    assert "**Sequences that fit, h200_141gb, fp16" in report
    line = next(x for x in report.splitlines() if x.startswith("| 4K |"))
    assert "x)" in line  # a ratio against the twin
    assert not (tmp_path / "hybrid" / "presets" / "report" / "serving.md").exists()
