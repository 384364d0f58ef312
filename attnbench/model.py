"""The encoder stack of Table 3: a RoBERTa-base-shaped Transformer over float embeddings.

RoBERTa's layer is post-LN: ``x = LN(x + Attn(x)); x = LN(x + FFN(x))`` with a GELU FFN.
There is no token embedding: the input is already ``(batch, n, d_model)`` floats, so a sweep
measures the encoder alone. The model owns what is shared across layers (Linformer's
layerwise E, per-layer k) by asking the mechanism class to build its whole stack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnbench.attention.base import MultiHeadAttention
from attnbench.attention.packing import Packing
from attnbench.registry import built, make_config, mechanism_class, shape_kwargs
from attnbench.schedule import Layer, layers_of
from attnbench.validators import check_int


class EncoderLayer(nn.Module):
    def __init__(self, attn: nn.Module, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.attn = attn
        self.norm1 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def ffn_flops(self, b: int, n: int) -> int:
        """The FFN's two matmuls, d → d_ff → d: 2 · 2·b·n·d·d_ff."""
        return 2 * 2 * b * n * self.fc1.in_features * self.fc1.out_features

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        state: Any = None,
        packing: Packing | None = None,
    ) -> Tensor:
        """The layer over x; with a ``state`` its incremental form (``attn.extend``).

        The attention's output is a temporary, freed once added: a name bound to it would
        keep b·n·d more elements alive through the FFN, where the layer peaks whenever the
        attention itself is cheap (8 % of Linformer k = 128's max batch), a cost that
        neither RoBERTa's layer nor any mechanism has."""
        x = self.norm1(x + self._attend(x, key_padding_mask, state, packing))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))  # (b, n, d)

    def _attend(
        self, x: Tensor, key_padding_mask: Tensor | None, state: Any, packing: Packing | None
    ) -> Tensor:
        if state is None:
            return self.attn(x, key_padding_mask, packing)
        return self.attn.extend(x, state, key_padding_mask)


class Encoder(nn.Module):
    """``layers`` encoder layers; ``forward(x, key_padding_mask=None)``, (b, n, d) -> (b, n, d)."""

    def __init__(self, attentions: list[nn.Module], d_model: int, d_ff: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(a, d_model, d_ff) for a in attentions)
        # activation checkpointing per layer (mode=train checkpoint=true): each layer keeps
        # only its input and runs again in the backward. ``recompute_context`` is entered
        # around that second run (the memory model's emulated autocast; torch.autocast
        # itself is restored by torch.utils.checkpoint).
        self.checkpoint = False
        self.recompute_context: Callable[[], AbstractContextManager[Any]] = nullcontext

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, packing: Packing | None = None
    ) -> Tensor:
        """The layers over x; with ``packing``, rows of documents laid end to end, each
        document's output what it would be alone (every other op is per position)."""
        for layer in self.layers:
            if self.checkpoint and torch.is_grad_enabled():
                x = checkpoint(
                    layer,
                    x,
                    key_padding_mask,
                    None,
                    packing,
                    use_reentrant=False,
                    context_fn=lambda: (nullcontext(), self.recompute_context()),
                )
            else:
                x = layer(x, key_padding_mask, None, packing)
        return x

    # -- the decoder form: a serving engine's prefill and decode steps --------------------------

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device | str
    ) -> list[Any]:
        """Every layer's empty state for b sequences of up to ``capacity`` tokens."""
        device = torch.device(device)
        return [layer.attn.new_state(b, capacity, dtype, device) for layer in self.layers]

    def extend(
        self, x: Tensor, states: list[Any], key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """The next c tokens (b, c, d) of every sequence through every layer, each layer's
        state updated in place: a prefill (from empty states) or a decode step (c = 1).
        Prompts of different lengths are padded on the left (True = padding)."""
        for layer, state in zip(self.layers, states, strict=True):
            x = layer(x, key_padding_mask, state)
        return x

    def state_bytes(self, n: int, itemsize: int) -> int:
        """Bytes one sequence keeps between tokens at context n, over every layer."""
        return sum(layer.attn.state_bytes(n, itemsize) for layer in self.layers)

    # -- the context memory (any mechanism, decoding or not) ------------------------------------

    def layer_context_elements(self, n: int) -> list[int]:
        """Each layer's context memory at length n, elements per sequence
        (``attn.context_elements``). The layers agree unless the mechanism sizes them apart
        (Linformer's k_decay or a list k); sharing across layers does not merge them
        (Linformer's layerwise E is one matrix, but every layer projects its own K and V)."""
        return [layer.attn.context_elements(n) for layer in self.layers]

    def layer_context_bytes(self, n: int, itemsize: int) -> list[int]:
        """:meth:`layer_context_elements` in a dtype of ``itemsize`` bytes."""
        return [layer.attn.context_bytes(n, itemsize) for layer in self.layers]

    def context_elements(self, n: int) -> int:
        """The context memory of one sequence at length n over every layer (as
        :meth:`state_bytes`, which for a decoder is these bytes plus its bookkeeping)."""
        return sum(self.layer_context_elements(n))

    def context_bytes(self, n: int, itemsize: int) -> int:
        """:meth:`context_elements` in a dtype of ``itemsize`` bytes."""
        return sum(self.layer_context_bytes(n, itemsize))

    def attention_params(self) -> int:
        """Parameters of every layer's attention (the four projections and the mechanism's
        own weights: gates, decays, convolutions, norms, Linformer's E and F), a weight
        shared by several layers counted once: what a reader weighs a mechanism's cost
        against, beside vanilla's 4·d·(d + 1) per layer. Countable on meta."""
        seen = {id(p): p for layer in self.layers for p in layer.attn.parameters()}
        return sum(p.numel() for p in seen.values())

    def step_flops(self, b: int, n: int) -> int:
        """Matmul FLOPs of one decode step (one token of b sequences seeing n tokens)."""
        return sum(layer.attn.step_flops(b, n) + layer.ffn_flops(b, 1) for layer in self.layers)

    def flops(self, b: int, n: int) -> int:
        """Matmul FLOPs of one forward: each layer's attention plus its two FFN matmuls."""
        return sum(layer.attn.flops(b, n) + layer.ffn_flops(b, n) for layer in self.layers)

    def packed_flops(self, packing: Packing) -> int:
        """Matmul FLOPs of one forward over packed rows (``attn.packed_flops``; the FFN sees
        every position of the b rows of T)."""
        b, t = packing.batch, packing.width
        layers = self.layers
        return sum(layer.attn.packed_flops(packing) + layer.ffn_flops(b, t) for layer in layers)

    def packed_flops_backward(self, packing: Packing) -> int:
        """Matmul FLOPs of one backward over packed rows (``attn.packed_flops_backward``; the
        FFN's two gradients of each matmul over every position); with checkpointing, one
        more packed forward."""
        b, t = packing.batch, packing.width
        own = sum(
            layer.attn.packed_flops_backward(packing) + 2 * layer.ffn_flops(b, t)
            for layer in self.layers
        )
        return own + (self.packed_flops(packing) if self.checkpoint else 0)

    def dense_flops(self, b: int, n: int) -> int:
        """:meth:`flops` with every layer's attention counted dense (``dense_attention_flops``:
        what softmax attention over all n × n pairs computes), beside a block-sparse count."""
        return sum(layer.attn.dense_flops(b, n) + layer.ffn_flops(b, n) for layer in self.layers)

    def prepare(self, n: int, device: torch.device | str) -> float:
        """Every layer's per-length structures built ahead of the first forward at length n
        (``attn.prepare``): the seconds spent (layers share what they build, so only the
        first builds; 0.0 when nothing needs building)."""
        return sum(layer.attn.prepare(n, device) for layer in self.layers)

    def flops_backward(self, b: int, n: int) -> int:
        """Matmul FLOPs of one backward: each attention's own count, the FFN's two gradients
        of each matmul; with checkpointing, one more forward (each layer runs again)."""
        own = sum(
            layer.attn.flops_backward(b, n) + 2 * layer.ffn_flops(b, n) for layer in self.layers
        )
        return own + (self.flops(b, n) if self.checkpoint else 0)


def build_model(
    attention: str,
    *,
    layers: int = 12,
    d_model: int = 768,
    n_heads: int = 12,
    d_ff: int = 3072,
    max_seq_len: int,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    schedule: Sequence[Layer] | None = None,
    **params: Any,
) -> Encoder:
    """A RoBERTa-base-shaped encoder using mechanism ``attention`` in every layer, in eval mode.

    ``params`` are the mechanism's own (e.g. Linformer's ``k``, ``sharing``); bad ones raise
    ``ValueError`` naming the parameter. ``kv_heads``: grouped-query attention's key/value
    heads (None: as many as ``n_heads``), for the mechanisms registered with ``gqa``;
    ``head_dim``: each head's width (None: d_model / n_heads), for those with ``head_dim``.
    ``schedule``: one :class:`~attnbench.schedule.Layer` per layer (a hybrid), in place of
    ``attention`` and its parameters in every layer.
    """
    check_int("layers", layers)
    check_int("d_ff", d_ff)
    if schedule is None:
        own = (attention, tuple(sorted(params.items())), n_heads, kv_heads, head_dim)
        schedule = [Layer("attention", *own)] * layers
    stacks: dict[str, list[MultiHeadAttention]] = {}
    for kind in {k.kind: k for k in schedule}.values():  # each kind's layers one stack: what
        count = sum(k.kind == kind.kind for k in schedule)  # a mechanism shares across layers
        stacks[kind.kind] = _stack(kind, count, d_model, max_seq_len)  # stays in its kind
    return Encoder([stacks[k.kind].pop(0) for k in schedule], d_model, d_ff).eval()


def _stack(kind: Layer, count: int, d_model: int, max_seq_len: int) -> list[MultiHeadAttention]:
    """``count`` layers of one kind, a plugin's watched as they run (:func:`built`)."""
    cfg = make_config(kind.attention, dict(kind.params))
    shape = shape_kwargs(kind.attention, kind.n_heads, kind.kv_heads, kind.head_dim)
    return built(  # a plugin's layers: their outputs checked as they run
        kind.attention,
        lambda: mechanism_class(kind.attention).build_stack(
            count, d_model=d_model, n_heads=kind.n_heads, max_seq_len=max_seq_len, cfg=cfg, **shape
        ),
    )


def cell_encoder(cell: Any, params: dict[str, Any], device: str) -> Encoder:
    """The encoder of a cell (anything with its ``attention``, ``layers``, ``d_model``,
    ``n_heads``, ``d_ff``, ``n`` and ``kv_heads``) with the mechanism's resolved ``params``,
    from a fixed seed; on meta when ``device`` is meta, else on the CPU (the caller moves
    it). One builder for the workloads' steps and the quality tasks' estimates alike."""
    torch.manual_seed(0)
    with torch.device("meta" if device == "meta" else "cpu"):
        return build_model(
            cell.attention,
            layers=cell.model.layers,
            d_model=cell.model.d_model,
            n_heads=cell.model.n_heads,
            d_ff=cell.model.d_ff,
            max_seq_len=cell.n,
            kv_heads=cell.model.kv_heads,
            head_dim=cell.model.head_dim,
            schedule=layers_of(cell, params) if cell.model.schedule is not None else None,
            **params,
        )
