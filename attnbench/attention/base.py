"""Scaffolding every mechanism shares: the four projections, head reshapes, input checks.

Each mechanism is a whole multi-head layer owning ``q_proj``, ``k_proj``, ``v_proj`` and
``out_proj`` (d_model to d_model, unless ``head_dim`` sets the width), so every mechanism
pays the same projection cost (a fair comparison) and weights port from fairseq / Hugging
Face checkpoints. A subclass only implements :meth:`MultiHeadAttention.attend`.

Grouped-query attention (``kv_heads`` < ``n_heads``, 1 = multi-query) shrinks ``k_proj`` and
``v_proj`` to ``kv_heads`` heads, each shared by ``n_heads / kv_heads`` query heads; only a
mechanism registered with ``gqa=True`` is built with it. The attention's width, ``n_heads ·
head_dim``, is d_model unless ``head_dim`` says otherwise (Qwen3-Next's 16 heads of 256 over
d_model 2048): then ``q_proj`` maps d_model to that width and ``out_proj`` back; only a
mechanism registered with ``head_dim=True`` is built with it.

A mechanism with an incremental (decode) form also implements :meth:`new_state`,
:meth:`extend_attend` and :meth:`state_bytes`: a serving engine's prefill is ``extend`` from an
empty state, its decode step ``extend`` by one token, and every part of attnbench that needs
the bytes a sequence keeps between tokens asks :meth:`state_bytes`.

Every mechanism declares its context memory, :meth:`context_elements`: the elements per
sequence and layer that carry the context at length n (the K/V cache, local's window, the
recurrent state, Linformer's projected keys and values, Nyströmformer's landmarks), and
:meth:`context_bytes`, those in a dtype. For a mechanism that decodes it is its state, so its
``state_bytes`` is computed from it (plus any bookkeeping such as padding flags): one formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnbench.attention import sinks_gate
from attnbench.attention.packing import Packing, each_document
from attnbench.validators import check_int


def check_head_groups(name: str, groups: int, n_heads: int) -> int:
    """``groups`` (of the setting ``name``) divides ``n_heads``: each group serves a whole
    set of heads (grouped-query key/value heads, Mamba-2's B and C groups)."""
    check_int(name, groups)
    if n_heads % groups:
        allowed = [g for g in range(1, n_heads + 1) if n_heads % g == 0]
        raise ValueError(
            f"{name}: must divide n_heads={n_heads} (one of {', '.join(map(str, allowed))}), "
            f"got {groups}"
        )
    return groups


def check_kv_heads(kv_heads: int, n_heads: int) -> int:
    """``kv_heads`` divides ``n_heads``: each key/value head serves a whole group of query
    heads. The one rule, read by the layer and by a cell's validation."""
    return check_head_groups("kv_heads", kv_heads, n_heads)


class MultiHeadAttention(nn.Module):
    """Base of every mechanism: ``forward(x, key_padding_mask=None)``, (b, n, d) -> (b, n, d)."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        max_seq_len: int,
        cfg: Any,
        kv_heads: int | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model)
        check_int("n_heads", n_heads)
        check_int("max_seq_len", max_seq_len)
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"d_model: must be divisible by n_heads={n_heads}, got {d_model}")
        self.d_model, self.n_heads, self.max_seq_len, self.cfg = d_model, n_heads, max_seq_len, cfg
        self.head_dim = d_model // n_heads if head_dim is None else check_int("head_dim", head_dim)
        self.width = n_heads * self.head_dim  # the attention's: d_model unless head_dim is set
        self.kv_heads = n_heads if kv_heads is None else check_kv_heads(kv_heads, n_heads)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        d_kv = self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, self.width)
        self.k_proj = nn.Linear(d_model, d_kv)
        self.v_proj = nn.Linear(d_model, d_kv)
        self.out_proj = nn.Linear(self.width, d_model)
        # a softmax mechanism's sink logits and output gate (attention.sinks_gate), None
        # where its config has them off or has no such option
        self.sinks, self.output_gate = sinks_gate.parameters(cfg, n_heads, d_model, self.width)

    @classmethod
    def build_stack(cls, layers: int, **kwargs: Any) -> list[MultiHeadAttention]:
        """One module per layer. Mechanisms that share state across layers override this."""
        return [cls(**kwargs) for _ in range(layers)]

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, packing: Packing | None = None
    ) -> Tensor:
        """(b, n, d) -> (b, n, d). With ``packing`` each row of x is documents laid end to
        end (:class:`~attnbench.attention.packing.Packing`) and no output sees another
        document: every document's output is what it would be alone."""
        self._check(x, key_padding_mask)
        if packing is None:
            return self.out_proj(self.apply_output_gate(x, self.attend(x, key_padding_mask)))
        packing.check(self, x, key_padding_mask)
        return self.out_proj(self.apply_output_gate(x, self.attend_packed(x, packing)))

    def apply_output_gate(self, x: Tensor, out: Tensor) -> Tensor:
        """The attention's output ``out`` (b, n, d) through the output gate of ``x``, where
        the layer has one (:func:`attnbench.attention.sinks_gate.gated`): applied here, once
        for every form (forward, packed, extend), so no mechanism applies it itself."""
        return sinks_gate.gated(self.output_gate, x, out, self.n_heads)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """:meth:`attend` over packed rows, before ``out_proj``. Here document by document:
        each document's positions through :meth:`attend` alone, so exact by construction
        for any mechanism whose output on a sequence depends on that sequence only. A
        mechanism that keeps documents apart in one pass over the row (a state reset at
        each boundary, a document mask) overrides it."""
        return each_document(self.attend, x, packing)

    # -- what the memory model's trace runs in Python (cell_rules.check_traceable) ----------

    step_chunk: int | None = None  # a chunked causal core's positions per Python step
    packs_in_one_pass = False  # attend_packed is one pass over the row (local, flex)

    def loop_steps(self, n: int) -> int:
        """The Python-level steps one call over rows of n positions takes, each a handful of
        ops the memory model traces on meta one at a time: a causal chunked core's chunks
        (the mixers, causal linear and Performer), else 1 (one pass of tensor ops)."""
        return 1 if (chunk := self._chunk()) is None else -(-n // chunk)

    def packed_loop_steps(self, lengths: tuple[int, ...]) -> int:
        """The same for one packed row of documents of ``lengths`` (a draw's copies run each
        document once for all of them): one pass over the row where the layer packs in one
        (a chunked core resets its state at each start), else each document's own, as
        :meth:`attend_packed` runs here."""
        if self.packs_in_one_pass or self._chunk() is not None:
            return self.loop_steps(sum(lengths))
        return sum(self.loop_steps(n) for n in lengths)

    def _chunk(self) -> int | None:
        return self.step_chunk if getattr(self.cfg, "causal", False) else None

    def refuses(self, dtype: str, gpu: bool) -> str | None:
        """Why this layer, as configured, cannot run a cell in ``dtype`` on a GPU (``gpu``)
        or not: one line naming the key, or None. Most layers run anywhere; a kernel of
        another library refuses what it has no kernel for (the mixers' ``kernel=fla``)."""
        return None

    def prepare(self, n: int, device: torch.device | str) -> float:
        """Build the per-length structures a forward at length ``n`` on ``device`` needs
        (flex's block mask) ahead of the first forward, and return the seconds spent building
        them (0.0 when there are none, when they were built already, and on meta). The runner
        calls it before compiling or timing, so that the build is recorded apart; a forward
        that finds them unbuilt builds them itself."""
        return 0.0

    # -- the incremental form (mechanisms registered with cannot_decode=None) -----------------

    def new_state(self, b: int, capacity: int, dtype: torch.dtype, device: torch.device) -> Any:
        """An empty state for ``b`` sequences of up to ``capacity`` tokens, kept in ``dtype``.

        A state has ``slot(i)``: sequence i's part, emptied, as a state of batch 1 whose
        tensors are views of the whole's (a serving engine prefills one new sequence into
        its slot while the others stay resident), ``admit(part)``: once every slot is
        filled, the whole takes the part's position, and ``seek(length)``: the whole at
        ``length`` tokens as if filled (the memory model's shortcut on meta tensors)."""
        raise NotImplementedError(f"{type(self).__name__} has no incremental form")

    def extend(self, x: Tensor, state: Any, key_padding_mask: Tensor | None = None) -> Tensor:
        """The next c tokens ``x`` (b, c, d) of every sequence, given ``state`` (the tokens
        before them), which is updated in place: (b, c, d) -> (b, c, d), each output seeing
        its own and earlier tokens only. Prefill is ``extend`` from an empty state (whole or
        in chunks), a decode step ``extend`` by one token; both equal the causal forward over
        the whole sequence. ``key_padding_mask`` (b, c), True = padding: attnbench pads
        prompts of different lengths on the left, so that every sequence's next token is at
        the same position. Only a layer built with ``causal=true`` extends: its forward is
        what the incremental form equals."""
        if not getattr(self.cfg, "causal", False):
            raise ValueError(f"{type(self).__name__}: extend needs a layer built with causal=true")
        self._check(x, key_padding_mask)
        return self.out_proj(
            self.apply_output_gate(x, self.extend_attend(x, state, key_padding_mask))
        )

    def extend_attend(self, x: Tensor, state: Any, key_padding_mask: Tensor | None) -> Tensor:
        """:meth:`extend` before ``out_proj``."""
        raise NotImplementedError(f"{type(self).__name__} has no incremental form")

    def state_bytes(self, n: int, itemsize: int) -> int:
        """Bytes one sequence keeps in this layer between tokens at context ``n``, its state
        in a dtype of ``itemsize`` bytes: the one formula of serving's memory (the max batch,
        the report, the achieved bandwidth), checked against the meta model and the CPU
        profiler. A mechanism computes it from :meth:`context_bytes` (its state is its
        context memory) plus its bookkeeping, so the two cannot disagree."""
        raise NotImplementedError(f"{type(self).__name__} has no incremental form")

    # -- the context memory (every mechanism) -------------------------------------------------

    def context_elements(self, n: int) -> int:
        """Elements one sequence keeps in this layer that carry its context at length ``n``:
        what an output is read from besides the token's own query, as this mechanism keeps it
        (the K/V cache at n, local's min(w, n) keys and values, linear attention's S and z,
        Linformer's projected keys and values, Nyströmformer's landmarks). The one formula per
        mechanism: for one that decodes it is the decode state less bookkeeping, and its
        :meth:`state_bytes` is computed from it. Bookkeeping that no output reads as context
        (a cache's padding flags) is not counted."""
        raise NotImplementedError(f"{type(self).__name__} declares no context memory")

    def context_bytes(self, n: int, itemsize: int) -> int:
        """:meth:`context_elements` in a dtype of ``itemsize`` bytes."""
        return self.context_elements(n) * itemsize

    def step_flops(self, b: int, n: int) -> int:
        """Matmul FLOPs of one decode step of b sequences whose new token sees ``n`` tokens
        (itself included): the four projections of one token (and the output gate's) plus
        :meth:`step_attention_flops`. The analytic twin of FlopCounterMode's count."""
        return self.projection_flops(b, 1) + self.gate_flops(b, 1) + self.step_attention_flops(b, n)

    def projection_flops(self, b: int, n: int) -> int:
        """The four projections over b·n positions: Q and the output d_model × width, K and
        V d_model × kv_heads·head_dim, 2 FLOPs per multiply-add."""
        return 2 * 2 * b * n * self.d_model * (self.width + self.kv_heads * self.head_dim)

    def gate_flops(self, b: int, n: int) -> int:
        """The output gate's projection over b·n positions, 2·d·width (0 without a gate): a
        projection like the four, counted with them."""
        return 2 * b * n * self.d_model * sinks_gate.gate_width(self.cfg, self.n_heads, self.width)

    def step_attention_flops(self, b: int, n: int) -> int:
        """One query against n keys: QKᵀ and P·V, 2·n·width each (grouped heads alike)."""
        return 4 * b * n * self.width

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """(b, n, d_model) -> (b, n, width), before ``out_proj``."""
        raise NotImplementedError

    def flops(self, b: int, n: int) -> int:
        """Matmul FLOPs (2 per multiply-add) of one forward without a padding mask.

        The analytic twin of ``FlopCounterMode``'s count, which the tests check it against;
        the runner uses it for achieved FLOP/s without tracing a forward. The four
        projections (K and V to ``kv_heads`` heads), the output gate's
        (:meth:`gate_flops`), plus :meth:`attention_flops`.
        """
        return self.projection_flops(b, n) + self.gate_flops(b, n) + self.attention_flops(b, n)

    def packed_flops(self, packing: Packing) -> int:
        """Matmul FLOPs of one forward over packed rows: the projections over every position
        of the b rows of T (as :meth:`flops`) and :meth:`packed_attention_flops`."""
        b, t = packing.batch, packing.width
        return self.flops(b, t) - self.attention_flops(b, t) + self.packed_attention_flops(packing)

    def packed_attention_flops(self, packing: Packing) -> int:
        """The attention's FLOPs over packed rows as :meth:`attend_packed` computes them:
        here each document's alone, Σ :meth:`attention_flops` (1, l). A mechanism that packs
        in one pass over the row overrides both."""
        return sum(self.attention_flops(1, n) for n in packing.lengths)

    def packed_flops_backward(self, packing: Packing) -> int:
        """Matmul FLOPs of one backward over packed rows, the twin of :meth:`flops_backward`:
        here twice the projections over every position of the b rows of T, and each
        document's attention backward alone (its :meth:`flops_backward` less twice its own
        projections). A mechanism that packs in one pass over the row overrides it."""
        b, t = packing.batch, packing.width
        own = sum(
            self.flops_backward(1, n) - 2 * self._projection_flops(1, n) for n in packing.lengths
        )
        return 2 * self._projection_flops(b, t) + own

    def _projection_flops(self, b: int, n: int) -> int:
        """:meth:`flops` less :meth:`attention_flops`: what sees every position once."""
        return self.flops(b, n) - self.attention_flops(b, n)

    def flops_backward(self, b: int, n: int) -> int:
        """Matmul FLOPs of one backward, the analytic twin of FlopCounterMode's count: every
        matmul's two gradients cost twice its forward, less :meth:`frozen_flops`, plus
        :meth:`recomputed_flops`."""
        return 2 * self.flops(b, n) - self.frozen_flops(b, n) + self.recomputed_flops(b, n)

    def recomputed_flops(self, b: int, n: int) -> int:
        """What a fused kernel's backward computes again: flash and memory-efficient
        attention keep no n × n scores, so they recompute QKᵀ (2·n·n·d). None here."""
        return 0

    def frozen_flops(self, b: int, n: int) -> int:
        """Forward FLOPs of matmuls with one operand that needs no gradient (a fixed
        buffer): their backward costs one matmul, not two. None in a plain layer."""
        return 0

    def attention_flops(self, b: int, n: int) -> int:
        """FLOPs between the projections, as this mechanism computes them; here the dense
        count, :meth:`dense_attention_flops`."""
        return self.dense_attention_flops(b, n)

    def dense_attention_flops(self, b: int, n: int) -> int:
        """Dense softmax(QKᵀ)V at this shape, 2 matmuls of 2·n·n·width each (grouped heads
        alike), whatever the mechanism computes: the count beside a sparse or approximate
        :meth:`attention_flops` (flex's block-sparse one)."""
        return 4 * b * n * n * self.width

    def dense_flops(self, b: int, n: int) -> int:
        """Matmul FLOPs of a dense layer of this shape: the four projections (K and V to
        ``kv_heads`` heads) and the output gate's plus :meth:`dense_attention_flops`, i.e.
        vanilla's :meth:`flops` with the same options, the count beside this mechanism's own."""
        dense = self.dense_attention_flops(b, n)
        return self.projection_flops(b, n) + self.gate_flops(b, n) + dense

    def split_heads(self, t: Tensor) -> Tensor:
        """(b, n, heads·dh) -> (b, heads, n, dh), for queries (n_heads) or keys (kv_heads)."""
        b, n, _ = t.shape
        return t.view(b, n, -1, self.head_dim).transpose(1, 2)  # (b, h, n, dh)

    def merge_heads(self, t: Tensor) -> Tensor:
        b, _, n, _ = t.shape  # (b, h, n, dh)
        return t.transpose(1, 2).reshape(b, n, self.width)  # (b, n, h*dh)

    def qkv_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as (b, h, n, dh) each."""
        return (
            self.split_heads(self.q_proj(x)),
            self.split_heads(self.k_proj(x)),
            self.split_heads(self.v_proj(x)),
        )

    def _check(self, x: Tensor, mask: Tensor | None) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: must be (batch, n >= 1, {self.d_model}), got {tuple(x.shape)}")
        weight = self.q_proj.weight
        if x.dtype != weight.dtype or x.device != weight.device:
            raise ValueError(
                f"x: is {x.dtype} on {x.device} but the module is {weight.dtype} on "
                f"{weight.device}; move one with .to()"
            )
        if mask is not None and (
            mask.dtype != torch.bool or mask.shape != x.shape[:2] or mask.device != x.device
        ):
            raise ValueError(
                f"key_padding_mask: must be bool of shape {tuple(x.shape[:2])} on {x.device} "
                f"(True = padding), got {mask.dtype} {tuple(mask.shape)} on {mask.device}"
            )

    def extra_repr(self) -> str:
        kv = f", kv_heads={self.kv_heads}" if self.kv_heads != self.n_heads else ""
        dh = f", head_dim={self.head_dim}" if self.width != self.d_model else ""
        return f"d_model={self.d_model}, n_heads={self.n_heads}{kv}{dh}, cfg={self.cfg}"


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with its index (``cuda`` is the current GPU): torch.cuda's memory calls
    (``set_per_process_memory_fraction``, ``mem_get_info``) refuse a bare ``cuda``, and a
    cache keyed by device needs one key per GPU."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def declare(name: str, **capabilities: Any) -> Callable[[type], type]:
    """Class decorator of a built-in mechanism: what :func:`attnbench.registry.register` will
    be called with, kept on the class. The registry imports the built-ins at its top and
    registers each (:data:`attnbench.registry.BUILTINS`), so no mechanism module imports the
    registry: no import cycle. A plugin's mechanism calls ``register`` itself."""

    def keep(cls: type) -> type:
        cls.declared = (name, capabilities)  # type: ignore[attr-defined]
        return cls

    return keep
