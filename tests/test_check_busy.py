"""The gate's policy for a busy machine (docs/gate.md, "A busy machine"): cells too
contended to judge are timed again after a pause, a bounded number of times, and then
``check.on_busy`` decides between exit 3 and exit 0 with the no-verdict line printed. Driven
through :func:`attnbench.check.run.run` with injected samples (the sampling is the only
part replaced), so each verdict is deterministic whether or not this machine is busy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from attnbench.check import Misuse, busy, sampling, suite, verdicts
from attnbench.check import run as gate
from attnbench.env import fingerprint


@pytest.fixture(scope="module")
def regression() -> suite.Suite:
    return suite.load_suite("regression")


def samples(
    the_suite: suite.Suite, cells: set[str] | None, *, slow: str = "", busy: str = ""
) -> sampling.Samples:
    """B's samples of ``cells`` (all: None), 1 ms +- 1 % each round; ``slow``'s 30 % slower;
    every round of ``busy`` contended (past the share the verdicts forgive)."""
    rng = random.Random(len(cells or ()))
    got = sampling.Samples(versions={"B": {}})
    for c in the_suite.cells:
        if cells is None or c.name in cells:
            scale = 1.3 if c.name == slow else 1.0
            rounds = the_suite.settings["rounds"]
            got.versions["B"][c.name] = [
                scale * rng.uniform(0.99e-3, 1.01e-3) for _ in range(rounds)
            ]
            got.reps[c.name] = 10
            if c.name == busy:
                got.contended.setdefault("B", {})[c.name] = list(range(rounds))
    return got


@pytest.fixture
def stored(tmp_path: Path, regression: suite.Suite) -> Path:
    """A baseline of the regression suite, every cell at 1 ms, as --write-baseline stores."""
    path = tmp_path / "baseline.json"
    s = regression.settings
    base = samples(regression, None)
    verdicts.write_baseline(
        path, regression, base.versions["B"], base.reps, fingerprint(s["device"], s["threads"])
    )
    return path


def check(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    stored: Path,
    answers: list[sampling.Samples],
    **options: object,
) -> tuple[int, list[set[str]], list[float]]:
    """``attnbench check --baseline STORED`` whose samplings answer ``answers`` in turn:
    (exit status, the cells each sampling was asked for, the pauses taken)."""
    asked: list[set[str]] = []
    pauses: list[float] = []

    def fake_sample(trees: object, the_suite: suite.Suite, **kw: object) -> sampling.Samples:
        asked.append({c.name for c in the_suite.cells})
        return answers[len(asked) - 1]

    monkeypatch.setattr(sampling, "sample", fake_sample)
    monkeypatch.setattr(busy.time, "sleep", pauses.append)
    code = gate.run(baseline=stored, json_path=tmp_path / "out.json", quiet=True, **options)
    return code, asked, pauses


def test_a_busy_cell_is_timed_again_after_a_pause_and_judged_on_its_clean_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stored: Path, regression: suite.Suite,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    cell = regression.cells[0].name
    first = samples(regression, None, busy=cell)
    code, asked, pauses = check(monkeypatch, tmp_path, stored, [first, samples(regression, {cell})])
    assert code == 0, capsys.readouterr()
    assert asked == [{c.name for c in regression.cells}, {cell}]  # only the busy cell again
    assert pauses == [30.0]  # check.busy_pause_s, once
    assert "attnbench check: passed" in capsys.readouterr().out


@pytest.mark.parametrize(("on_busy", "code"), [("fail", gate.BUSY), ("pass", 0)])
def test_a_cell_busy_after_every_retry_is_what_on_busy_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stored: Path, regression: suite.Suite,
    capsys: pytest.CaptureFixture[str], on_busy: str, code: int,
) -> None:  # fmt: skip
    cell = regression.cells[-1].name
    busy_again = [samples(regression, {cell}, busy=cell) for _ in range(2)]
    answers = [samples(regression, None, busy=cell), *busy_again]
    got, asked, pauses = check(monkeypatch, tmp_path, stored, answers, on_busy=on_busy)
    assert got == code
    assert len(asked) == 3 and pauses == [30.0, 30.0]  # check.busy_retries = 2: bounded
    out = capsys.readouterr().out
    assert "no verdict: machine busy (1 cells timed on a contended CPU)" in out
    assert ("check.on_busy=pass" in out) == (on_busy == "pass")


@pytest.mark.parametrize("on_busy", ["fail", "pass"])
def test_a_regression_on_clean_samples_fails_whatever_on_busy_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stored: Path, regression: suite.Suite,
    on_busy: str,
) -> None:  # fmt: skip
    slow, busy = regression.cells[0].name, regression.cells[1].name
    answers = [samples(regression, None, slow=slow, busy=busy)]
    code, asked, pauses = check(monkeypatch, tmp_path, stored, answers, on_busy=on_busy)
    assert code == 1
    assert len(asked) == 1 and not pauses  # a failure needs no wait for the busy cell


def test_the_retries_replace_only_the_busy_cells_samples() -> None:
    got = sampling.Samples(
        versions={"A": {"x": [1.0], "y": [2.0]}, "B": {"x": [1.5], "y": [2.5]}},
        reps={"x": 3, "y": 4},
        contended={"A": {"x": [0]}, "B": {"x": [0], "y": [0]}},
        retried=2,
    )
    again = sampling.Samples(
        versions={"A": {"y": [9.0]}, "B": {"y": [9.5]}}, reps={"y": 7}, retried=1
    )
    busy.replace_cells(got, again, {"y"})
    assert got.versions == {"A": {"x": [1.0], "y": [9.0]}, "B": {"x": [1.5], "y": [9.5]}}
    assert got.reps == {"x": 3, "y": 7}
    assert got.contended == {"A": {"x": [0]}, "B": {"x": [0]}}  # y's old rounds gone
    assert got.retried == 3


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ({"on_busy": "maybe"}, "check.on_busy: must be one of fail, pass; got 'maybe'"),
        ({"busy_retries": -1}, "check.busy_retries: must be an integer >= 0, got -1"),
        ({"busy_pause_s": -5}, "check.busy_pause_s: must be a number >= 0"),
    ],
)
def test_the_busy_settings_are_checked_before_anything_is_timed(override: dict, line: str) -> None:
    with pytest.raises(Misuse) as e:
        suite.load_suite("regression", overrides=override)
    assert str(e.value).startswith(line), str(e.value)
