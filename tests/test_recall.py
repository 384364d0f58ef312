"""task=mqar's training (attnbench/quality/recall.py) and the classifier pieces it shares with
ListOps: the per-position loss and accuracy by hand, causal or bidirectional training as the
registry says, the short convolution's causality, the learning rates, and the task end to
end through the CLI. The generator itself is tested in tests/test_mqar.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnbench.cell import Cell, Part
from attnbench.quality import mqar, recall, tasks, training
from attnbench.quality.classify import Classifier
from attnbench.quality.training import IGNORE, accuracy, loss
from attnbench.row import Row
from attnbench.store import read_rows

TINY = {
    "n": 32, "num_kv_pairs": 4, "vocab_size": 64, "train_examples": 128, "test_examples": 32,
    "steps": 4, "batch": 8, "lrs": (1e-3, 3e-3), "warmup": 1, "eval_every": 2, "layers": 2,
    "d_model": 16, "n_heads": 2, "d_ff": 32,
}  # fmt: skip


def test_the_loss_counts_query_positions_only() -> None:
    """A hand case: of three positions only the middle one is labelled; the loss is that
    position's cross-entropy whatever the logits elsewhere, and a sequence's single label
    (ListOps) is the plain cross-entropy."""
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 5)
    labels = torch.tensor([[IGNORE, 2, IGNORE]])
    want = F.cross_entropy(logits[0, 1:2], torch.tensor([2]))
    assert torch.equal(loss(logits, labels), want)
    other = logits.clone()
    other[0, 0] += 10.0
    other[0, 2] -= 3.0
    assert torch.equal(loss(other, labels), want)
    per_sequence = torch.randn(4, 5)
    y = torch.tensor([0, 4, 1, 1])
    assert torch.equal(loss(per_sequence, y), F.cross_entropy(per_sequence, y))


class _Fixed(nn.Module):
    """A model whose logits are given, whatever its input: one-hot on ``predict``."""

    def __init__(self, predict: torch.Tensor, classes: int) -> None:
        super().__init__()
        self.logits = F.one_hot(predict, classes).float()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits


def test_accuracy_counts_query_positions_only() -> None:
    """Two sequences, three labelled positions: two right, one wrong; every unlabelled
    position is predicted wrong and does not count."""
    predict = torch.tensor([[9, 5, 9, 9], [9, 9, 7, 6]])  # 9: never a label
    labels = torch.tensor([[IGNORE, 5, IGNORE, IGNORE], [IGNORE, IGNORE, 7, 4]])
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert accuracy(_Fixed(predict, 10), ids, None, labels) == pytest.approx(2 / 3)
    # a sequence label per row (ListOps) is counted as before: every row
    assert accuracy(_Fixed(torch.tensor([3, 1]), 10), ids, None, torch.tensor([3, 2])) == 0.5


def test_the_head_runs_at_the_labelled_positions_alone() -> None:
    """A per-position model's logits where labels are wanted are its full logits there, and
    the loss and accuracy over them are those over every position with the others ignored."""
    torch.manual_seed(0)
    model = Classifier("vanilla", vocab=64, n=32, layers=1, d_model=16, n_heads=2, d_ff=32,
                       n_classes=64, per_position=True, padding_idx=None).eval()  # fmt: skip
    ids, labels = mqar.generate(3, seed=1, n=32, num_kv_pairs=4, vocab_size=64)
    at = labels != IGNORE
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(model(ids, None, at), full[at])
        logits, y = training.labelled(model, ids, None, labels)
        torch.testing.assert_close(loss(logits, y), loss(full, labels))
    right = (full.argmax(-1) == labels)[at].float().mean().item()
    assert accuracy(model, ids, None, labels) == pytest.approx(right)


def test_causal_as_the_registry_says_and_the_short_conv_never_reads_right() -> None:
    """Vanilla (a causal form) trains causally, its short convolution included: a later token
    changed leaves every earlier position's logits as they were. Linformer and Nyströmformer
    (none) train bidirectionally: the change reaches earlier positions."""
    assert recall.causal("vanilla") and recall.causal("linear") and recall.causal("local")
    assert not recall.causal("linformer") and not recall.causal("nystromformer")
    ids, _ = mqar.generate(2, seed=3, n=32, num_kv_pairs=4, vocab_size=64)
    later = ids.clone()
    later[:, 20] = 7
    for attention, params in (("vanilla", {}), ("linformer", {"k": 8})):
        r = recall.train(attention, params, **TINY)
        model = r["model"]
        assert r["causal"] == (attention == "vanilla") and r["short_conv"] == recall.SHORT_CONV
        assert len(model.short_convs) == 2
        with torch.no_grad():
            a, b = model(ids), model(later)
        assert a.shape == (2, 32, 64)
        if r["causal"]:
            torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=0)
        else:
            assert not torch.allclose(a[:, :20], b[:, :20])
        assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_the_short_conv_is_zoologys_left_padded_depthwise_convolution() -> None:
    torch.manual_seed(0)
    conv = recall.ShortConv(6, 3)
    x = torch.randn(2, 10, 6)
    want = F.conv1d(F.pad(x.transpose(1, 2), (2, 0)), conv.conv.weight, conv.conv.bias, groups=6)
    torch.testing.assert_close(conv(x), want.transpose(1, 2))
    y = x.clone()
    y[:, 7] += 1.0
    with torch.no_grad():
        assert torch.equal(conv(x)[:, :7], conv(y)[:, :7])  # never reads right
        for i in (7, 8, 9):  # reads itself and kernel - 1 = 2 back
            assert not torch.allclose(conv(x)[:, i], conv(y)[:, i])


def test_short_conv_zero_leaves_the_classifier_as_it_is() -> None:
    """short_conv=0: no module and no hook, the weights drawn as for ListOps' classifier."""
    shape = {"vocab": 64, "n": 32, "layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32}
    torch.manual_seed(0)
    plain = Classifier("vanilla", **shape)
    torch.manual_seed(0)
    model = Classifier("vanilla", **shape)
    recall.add_short_conv(model, 0)
    assert not hasattr(model, "short_convs")
    assert all(not layer.attn._forward_pre_hooks for layer in model.encoder.layers)
    for (k, a), (_, b) in zip(plain.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    recall.add_short_conv(model, 4)  # the convolutions come after: the base weights the same
    assert {k for k in model.state_dict() if "short_convs" in k} == {
        f"short_convs.{i}.conv.{p}" for i in (0, 1) for p in ("weight", "bias")
    }


def test_every_learning_rate_is_trained_and_the_best_kept() -> None:
    r = recall.train("vanilla", {}, seed=1, **{**TINY, "lrs": (1e-4, 1e-2, 3e-3)})
    assert [lr for lr, _ in r["lr_accuracy"]] == [1e-4, 1e-2, 3e-3]
    best = max(acc for _, acc in r["lr_accuracy"])
    assert r["test_accuracy"] == best == r["curve"][-1][1]
    assert r["lr"] == next(lr for lr, acc in r["lr_accuracy"] if acc == best)
    assert r["chance"] == 1 / 4 and (r["train_examples"], r["test_examples"]) == (128, 32)
    assert r["steps_per_s"] > 0 and r["peak_bytes"] > 0 and [s for s, _ in r["curve"]] == [2, 4]
    # one lr alone is that run: the same data, weights and order (deterministic)
    (lr, acc), *_ = [p for p in r["lr_accuracy"] if p[0] == 3e-3]
    alone = recall.train("vanilla", {}, seed=1, **{**TINY, "lrs": [3e-3]})
    assert alone["lr_accuracy"] == [[lr, acc]]


def test_context_memory_is_the_encoders_per_layer() -> None:
    r = recall.train("vanilla", {}, **{**TINY, "lrs": [1e-3]})
    assert r["context_elements"] == 2 * 32 * 16  # vanilla: K and V at n, d_model wide
    assert r["context_bytes"] == 4 * r["context_elements"]
    r = recall.train("linformer", {"k": 8}, **{**TINY, "lrs": [1e-3]})
    assert r["context_elements"] == 2 * 8 * 16  # k projected keys and values


def test_bad_settings_are_one_line_naming_the_key() -> None:
    s = {**recall.DEFAULTS}
    for change, says in (
        ({"lrs": 0.001}, "quality.mqar.lrs: must be a list of learning rates > 0"),
        ({"lrs": []}, "quality.mqar.lrs: must be a list"),
        ({"lrs": [0.001, 0]}, "quality.mqar.lrs: must be a number > 0"),
        ({"short_conv": -1}, "quality.mqar.short_conv: must be an integer >= 0"),
        ({"num_kv_pairs": 17}, "quality.mqar.num_kv_pairs: must be at most n/4 = 16"),
    ):
        with pytest.raises(ValueError, match=f"^{says}"):
            recall.check_settings(64, prefix="quality.mqar.", **{**s, **change})


def test_a_stored_cell_with_list_settings_is_hashable_again() -> None:
    """A cell goes to an isolated worker as JSON: its lists (``lrs``; a carried listops block)
    come back as tuples, so the worker's validation can hash it."""
    cell = Cell(
        "vanilla",
        n=64,
        k=None,
        task=Part("mqar", (("lrs", (0.001, 0.003)),)),
    )
    back = Cell.from_dict(json.loads(json.dumps(cell.to_dict())))
    assert back == cell and hash(back) == hash(cell)


def test_the_registry_and_the_library_agree() -> None:
    task = tasks.REGISTRY["mqar"]
    defaults = task.defaults()
    assert {**defaults, "lrs": tuple(defaults["lrs"])} == recall.DEFAULTS
    assert set(recall.DATA) | set(recall.TRAINING) == set(defaults)
    import inspect

    params = inspect.signature(recall.train).parameters
    assert all(params[k].default == v for k, v in recall.DEFAULTS.items())
    with pytest.raises(ValueError, match=r"^quality\.causal: must be a flag"):
        tasks.check_figures("mqar", {"causal": "yes"})
    assert training.IGNORE == mqar.IGNORE


CPU = ("device=cpu", "dtype=fp32", "batch=1", "progress=false")
TINY_CLI = (
    "model=tiny", "model.d_model=16", "model.d_ff=32", "n=32", "quality.mqar.num_kv_pairs=4",
    "quality.mqar.vocab_size=64", "quality.mqar.train_examples=64",
    "quality.mqar.test_examples=16", "quality.mqar.steps=4", "quality.mqar.batch=8",
    "quality.mqar.eval_every=2", "quality.mqar.warmup=1", "quality.mqar.lrs=[0.001,0.003]",
)  # fmt: skip


def test_the_task_end_to_end(tmp_path: Path, cli_in_process) -> None:
    """``attnbench run task=mqar`` in this process (cli.main, as the command line calls it):
    a quality task's real process is tests/test_quality_cli.py's. Its rows are read here; the
    recall report is tests/test_report_recall.py's."""
    out = cli_in_process(
        "run", "-m", "task=mqar", "attention=vanilla,linformer", "k=8", "sweep_name=rc",
        "report=false", *TINY_CLI, *CPU, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (cells,) = tmp_path.glob("results/rc/*/cells.jsonl")
    rows = {r.attention: r for r in (Row.from_dict(d) for d in read_rows(cells))}
    assert sorted(rows) == ["linformer", "vanilla"]
    for name, r in rows.items():
        q = r.quality
        assert r.status == "ok" and r.task == "mqar", r.error
        assert 0 <= q["test_accuracy"] <= 1 and q["chance"] == 0.25
        assert q["lr"] in (0.001, 0.003) and [lr for lr, _ in q["lr_accuracy"]] == [0.001, 0.003]
        assert [s for s, _ in q["curve"]] == [2, 4] and q["steps_per_s"] > 0
        assert q["peak_bytes"] > 0 and q["short_conv"] == 3
        assert q["causal"] is (name == "vanilla")
        assert (q["train_examples"], q["test_examples"]) == (64, 16)
        assert q["context_bytes"] == 4 * q["context_elements"] > 0
    assert rows["linformer"].k == 8 and rows["vanilla"].k is None
    assert rows["vanilla"].quality["context_elements"] == 2 * 32 * 16  # K and V at n, d 16
    assert rows["linformer"].quality["context_elements"] == 2 * 8 * 16  # k keys and values


def test_what_the_settings_grow_is_held_to_the_machines_memory() -> None:
    """The vocabulary's share of the rule against the real model (two vocabularies differ by
    vocab × (2·d_model + 1) parameters: the embedding and the head), and the rule itself on
    injected sizes: the key of the largest share is named, before anything is allocated."""
    shape = {"n": 64, "layers": 1, "d_model": 16, "n_heads": 1, "d_ff": 32}
    count = [
        sum(p.numel() for p in Classifier("vanilla", vocab=v, n_classes=v, per_position=True,
                                          padding_idx=None, **shape).parameters())
        for v in (128, 256)
    ]  # fmt: skip
    assert count[1] - count[0] == 128 * (2 * 16 + 1)
    training.check_fits({"q.a": 10, "q.b": 30}, have=40)
    with pytest.raises(ValueError, match=r"^q\.b: the training needs about 41 bytes \(a 10, b 30"):
        training.check_fits({"q.a": 10, "q.b": 30, "q.c": 1}, have=40)
