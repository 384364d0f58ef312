"""Multi-query associative recall (MQAR) as a trained quality: task=mqar's training run.

The model is the ListOps classifier's (:class:`attnbench.quality.classify.Classifier`: token
and learned position embeddings, :func:`attnbench.build_model` with the mechanism under
test) with its head over every position (``per_position``), predicting a token of the
vocabulary; it trains as ListOps' does (:mod:`attnbench.quality.training`: AdamW, warmup and
decay, clipped steps, the profiled peak) on :mod:`attnbench.quality.mqar`'s sequences, whose
labels are the bound value at each query position and
:data:`~attnbench.quality.training.IGNORE` elsewhere: the loss and the accuracy count the
query positions only.

* **Causal or not.** A mechanism with a causal form (the registry's ``info().causal``)
  trains causally, as Zoology's language models do; one without (Linformer, Nyströmformer)
  trains bidirectionally. Both are fair on this data: a value never appears after its query
  (mqar's docstring), so looking right shows a bidirectional model only keys and fillers.
  The row's ``causal`` figure says which.
* **Short convolution** (``short_conv``, a kernel size; 0 = none): a depthwise causal
  convolution over the sequence on the attention's input, in every layer (:class:`ShortConv`,
  Zoology's ``ShortConvolution``). It gives every mechanism the same cheap access to the
  previous tokens (a key beside its value), so what is left to the attention is the recall
  itself. It is this module's, not the encoder's: the Table 3 encoder has none.
* **A schedule** (``schedule``: the cell's ``model.schedule``, one
  :class:`~attnbench.schedule.Layer` per layer from :func:`attnbench.schedule.layers_of`, as
  the cost model builds it): each layer its kind's mechanism, each trained causally where it
  has a causal form (:func:`trained_causally`), so a hybrid's recall stands beside its
  mechanisms' own. Its context memory is its layers' summed, per layer as every row's.
* **Learning rates** (``lrs``): Zoology trains each cell at four learning rates and keeps the
  best; the run trains once per rate from the same initial weights and data, and keeps the
  best test accuracy (selected on the test set, as Zoology selects), recording the rate
  chosen and every rate's accuracy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from attnbench import registry
from attnbench.quality import classify, mqar, training
from attnbench.schedule import Layer, frozen
from attnbench.validators import check_choice, check_int, check_number

# Zoology's kernel size: the short convolution it puts before each mixer in its recall-against-
# state-size figure (Based's Figure 2), ``conv_mixer`` ("kernel_size": 3, zoology/experiments/
# paper_configs/arxiv24_based_figure2/configs.py, line 53 at commit dbcb60d; also BaseConv's
# default, zoology/mixers/base_conv.py). On by default because that figure, the one this task
# stands beside, gives it to every mixer (attention, sliding window, Nyströmformer …) "for fair
# comparison", and because a model that has it need not spend its attention (or a whole layer)
# on finding the token before each one, which a CPU's step budget can ill afford. Zoology's
# own Figure 2 (iclr24_zoology_figure2) trains attention without one: short_conv=0.
SHORT_CONV = 3

# The defaults of a single run: Zoology's smallest Figure 2 model is 2 layers of width 64
# (conf/model/mqar.yaml) trained on 100 000 examples for 64 epochs at batch 512, far more than a
# CPU trains; Zoology sweeps four rates, two of them here, each a whole training run. The
# reference sweep's calibration (V = 128, 1500 steps, lr 3e-3 alone) is conf/sweep/recall.yaml's,
# with its measurements in docs/quality.md.
DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in mqar.DEFAULTS.items() if k != "n"},  # n is the cell's
    "steps": 2000,
    "batch": 64,
    "lrs": (1e-3, 3e-3),
    "warmup": 100,
    "weight_decay": 0.01,  # AdamW's default, which Zoology's zoology/train.py leaves as is
    "eval_every": 500,
    "short_conv": SHORT_CONV,
}
TRAINING = ("steps", "batch", "lrs", "warmup", "weight_decay", "eval_every", "short_conv")
DATA = tuple(k for k in mqar.DEFAULTS if k != "n")
# the training runs in fp32 (AdamW's master weights and activations): context bytes count
# elements of that size
ITEMSIZE = 4


class ShortConv(nn.Module):
    """(b, n, d) -> (b, n, d): a depthwise convolution over the sequence, each channel its own
    ``kernel`` taps, padded by ``kernel - 1`` and cut back to n from the left, so position i
    reads i - kernel + 1 .. i and never a later one. Zoology's ``ShortConvolution``
    (zoology/mixers/convolution.py): ``nn.Conv1d(d, d, kernel, groups=d, padding=kernel - 1)``
    and the first n outputs."""

    def __init__(self, d_model: int, kernel: int) -> None:
        super().__init__()
        check_int("short_conv", kernel)
        self.conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model, padding=kernel - 1)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        return self.conv(x.transpose(1, 2))[..., :n].transpose(1, 2)

    def before(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A forward pre-hook: the attention's input convolved, its other arguments kept."""
        return (self(args[0]), *args[1:])


def add_short_conv(model: classify.Classifier, kernel: int) -> None:
    """A :class:`ShortConv` on the input of each layer's attention (``kernel`` 0: none). The
    convolutions are the model's (``model.short_convs``: trained, saved and counted with it);
    each runs as a forward pre-hook of its layer's attention, so the encoder and the
    mechanism stay exactly what the cost rows measure."""
    check_int("short_conv", kernel, low=0)
    if kernel == 0:
        return
    layers = model.encoder.layers
    d_model = model.positions.embedding_dim
    model.short_convs = nn.ModuleList(ShortConv(d_model, kernel) for _ in layers)
    for conv, layer in zip(model.short_convs, layers, strict=True):
        layer.attn.register_forward_pre_hook(conv.before)


def check_settings(n: int, *, prefix: str = "", **s: Any) -> None:
    """One line for the first bad setting of an MQAR training run at ``n``, named ``prefix`` +
    its name: the data's (:func:`attnbench.quality.mqar.check_settings`: n, pairs, vocabulary,
    power_a, sizes, seed), then the training's. :func:`train` checks its arguments with it;
    task=mqar checks a cell's ``quality.mqar`` block with it before any cell runs."""
    mqar.check_settings(n, prefix=prefix, **{k: s[k] for k in DATA})
    check_int(f"{prefix}steps", s["steps"])
    check_int(f"{prefix}batch", s["batch"])
    lrs = s["lrs"]
    if not isinstance(lrs, (list, tuple)) or not lrs:
        raise ValueError(
            f"{prefix}lrs: must be a list of learning rates > 0 (e.g. [0.001,0.003]), got {lrs!r}"
        )
    for lr in lrs:
        check_number(f"{prefix}lrs", lr, low=0, open_low=True)
    check_int(f"{prefix}warmup", s["warmup"], low=0)
    check_number(f"{prefix}weight_decay", s["weight_decay"], low=0)
    check_int(f"{prefix}eval_every", s["eval_every"])
    if check_int(f"{prefix}short_conv", s["short_conv"], low=0) > n:
        raise ValueError(
            f"{prefix}short_conv: must be at most n={n} (taps beyond the sequence read only "
            f"its padding), got {s['short_conv']}"
        )


def check_fits(n: int, d_model: int, *, prefix: str = "", **s: Any) -> None:
    """What an MQAR run's settings make grow, held to this machine's memory
    (:func:`attnbench.quality.training.check_fits`): the vocabulary's embedding and head
    (``vocab_size`` × (2·d_model + 1) parameters, each with AdamW's copies) and one step's
    logits and their gradient (batch × n × vocab_size), then the sequences, inputs and labels
    in int64. The rest of the model does not depend on these settings."""
    vocab, itemsize = s["vocab_size"], 8  # int64 tokens and labels
    table = vocab * (2 * d_model + 1) * ITEMSIZE * training.ADAMW_COPIES
    logits = 2 * s["batch"] * n * vocab * ITEMSIZE
    need = {f"{prefix}vocab_size": table + logits}
    for key in ("train_examples", "test_examples"):
        need[f"{prefix}{key}"] = 2 * s[key] * n * itemsize
    training.check_fits(need)


def causal(attention: str) -> bool:
    """Whether ``attention`` trains causally here: whenever it has a causal form."""
    return registry.info(attention).causal


def trained_causally(schedule: Sequence[Layer], layers: int) -> list[Layer]:
    """The ``layers`` layers of a schedule as MQAR trains them: ``causal`` (:func:`causal`)
    set in each whose mechanism takes it. A kind inherits the cell's own ``causal``
    (:func:`attnbench.schedule.layers_of`), false unless given, and this task trains every
    mechanism with a causal form causally whatever the cell says."""
    if len(schedule) != layers:
        raise ValueError(
            f"schedule: must be one layer per model layer (layers={layers}), got {len(schedule)}"
        )
    out = []
    for layer in schedule:
        params = dict(layer.params)
        if "causal" in registry.info(layer.attention).params:
            params["causal"] = causal(layer.attention)
        out.append(layer._replace(params=frozen(params)))
    return out


def context_memory(model: classify.Classifier, n: int) -> tuple[int, int]:
    """(elements, bytes in fp32) of one layer's context memory per sequence at n: what carries
    the context (the K/V cache at n for exact attention, a window, a state, projected keys and
    values, landmarks), from the one formula per mechanism that serving uses too
    (:meth:`attnbench.model.Encoder.context_elements`), summed over every layer, each its
    own mechanism's (a schedule's Gated DeltaNet layer its state and convolution window, its
    attention layer its K/V cache), and divided by the layers: exact where the layers agree,
    else their mean, rounded (a schedule; Linformer's k_decay). Per layer, so that a hybrid
    and a pure model of as many layers stand on one axis: the model's whole context memory
    is this times the layers."""
    encoder, layers = model.encoder, len(model.encoder.layers)
    elements = encoder.context_elements(n)
    return round(elements / layers), round(encoder.context_bytes(n, ITEMSIZE) / layers)


def train(
    attention: str,
    params: dict[str, Any] | None = None,
    *,
    n: int = mqar.DEFAULTS["n"],
    num_kv_pairs: int = DEFAULTS["num_kv_pairs"],
    vocab_size: int = DEFAULTS["vocab_size"],
    power_a: float = DEFAULTS["power_a"],
    train_examples: int = DEFAULTS["train_examples"],
    test_examples: int = DEFAULTS["test_examples"],
    seed: int = DEFAULTS["seed"],
    steps: int = DEFAULTS["steps"],
    batch: int = DEFAULTS["batch"],
    lrs: Sequence[float] = DEFAULTS["lrs"],
    warmup: int = DEFAULTS["warmup"],
    weight_decay: float = DEFAULTS["weight_decay"],
    eval_every: int = DEFAULTS["eval_every"],
    short_conv: int = DEFAULTS["short_conv"],
    schedule: Sequence[Layer] | None = None,
    layers: int = 2,
    d_model: int = 64,
    n_heads: int = 1,
    d_ff: int = 128,
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Train the per-position classifier on MQAR from scratch once per learning rate of
    ``lrs``; the best run's figures, every rate's accuracy and the best model.

    The data (:func:`attnbench.quality.mqar.splits`: training from the stream ``2·seed``,
    test from ``2·seed + 1``, no example in both), the initial weights and the batch order
    come from ``seed`` and are the same for every rate.

    Returns ``test_accuracy`` (the best rate's, after its last step: correct argmax
    predictions over the query positions), ``chance`` (1/num_kv_pairs: guessing one of the
    example's own values), ``lr`` (the rate chosen; the first of equals), ``lr_accuracy``
    ([rate, test accuracy] for each rate), ``curve`` ([step, test accuracy] of the chosen
    run, every ``eval_every`` steps and at the end), ``steps_per_s`` and ``peak_bytes`` (the
    chosen run's, as ListOps' training measures them), ``causal``, ``short_conv``,
    ``context_elements`` and ``context_bytes`` (one layer's, fp32: :func:`context_memory`),
    ``train_examples``, ``test_examples``, ``seconds`` (the whole call) and the object
    ``model`` (the chosen run's, in eval mode; not a figure). ``schedule``: one
    :class:`~attnbench.schedule.Layer` per layer (:func:`trained_causally`), in place of
    ``attention`` and ``params``; ``causal`` then true where every layer is."""
    started = time.perf_counter()
    check_choice("attention", attention, registry.names(), "a registered mechanism")
    data = {
        "num_kv_pairs": num_kv_pairs, "vocab_size": vocab_size, "power_a": power_a,
        "train_examples": train_examples, "test_examples": test_examples, "seed": seed,
    }  # fmt: skip
    fit = {
        "steps": steps, "batch": batch, "warmup": warmup, "weight_decay": weight_decay,
        "eval_every": eval_every,
    }  # fmt: skip
    check_settings(n, **data, **fit, lrs=lrs, short_conv=short_conv)
    check_fits(n, d_model, **data, batch=batch)
    sets = mqar.splits(n, **data)
    params = {**(params or {}), "causal": causal(attention)}
    shape = {"layers": layers, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff}
    if schedule is not None:
        shape["schedule"] = trained_causally(schedule, layers)
    is_causal = all(causal(x.attention) for x in schedule) if schedule else params["causal"]
    model = _model(attention, vocab_size, n, short_conv, shape, params)
    train_set, test = (sets.x_train, None, sets.y_train), (sets.x_test, None, sets.y_test)
    run = functools.partial(training.fit, model, train_set, test, seed=seed, **fit)
    runs = [(float(lr), *run(lr=lr, progress=progress)) for lr in lrs]
    return _chosen(runs, n, sets, is_causal, short_conv, started)


def _model(
    attention: str, vocab: int, n: int, short_conv: int, shape: dict, params: dict
) -> Callable[[], classify.Classifier]:
    """The model MQAR trains, as a factory for :func:`attnbench.quality.training.fit` (which
    draws its weights under the run's seed): the classifier labelling every position over
    the vocabulary, no token a padding, with :func:`add_short_conv`'s convolutions drawn
    after its own weights."""

    def build() -> classify.Classifier:
        net = classify.Classifier(
            attention, vocab=vocab, n=n, n_classes=vocab, per_position=True, padding_idx=None,
            **shape, **params,
        )  # fmt: skip
        add_short_conv(net, short_conv)
        return net

    return build


def _chosen(
    runs: list[tuple[float, dict[str, Any], classify.Classifier]],
    n: int,
    sets: mqar.Splits,
    is_causal: bool,
    short_conv: int,
    started: float,
) -> dict[str, Any]:
    """What :func:`train` returns of its ``runs`` (rate, figures, model): the best rate's
    run (by its last test accuracy; the first of equals) with its model in eval mode and
    its context memory, beside every rate's accuracy; ``seconds`` since ``started``."""
    lr, best, model = max(runs, key=lambda r: r[1]["curve"][-1][1])  # the first of equals
    elements, nbytes = context_memory(model, n)
    model.eval()
    return {
        "test_accuracy": best["curve"][-1][1],
        "chance": sets.chance,
        "lr": lr,
        "lr_accuracy": [[r, f["curve"][-1][1]] for r, f, _ in runs],
        "curve": best["curve"],
        "steps_per_s": best["steps_per_s"],
        "peak_bytes": best["peak_bytes"],
        "causal": is_causal,
        "short_conv": short_conv,
        "context_elements": elements,
        "context_bytes": nbytes,
        "train_examples": sets.train_size,
        "test_examples": sets.test_size,
        "seconds": time.perf_counter() - started,
        "model": model,
    }
