"""What the five recurrent mixers (``retnet``, ``gla``, ``mamba2``, ``deltanet``,
``gated_deltanet``) share as layers: the short causal convolution, the normalised and gated
output, the decode state, and the dispatch of a call to its core's chunked form (a forward, a
training step, a prefill) or its decode step. Not a mechanism; registers nothing. What they
take and declare alike (the causal-only rule among it) is
:mod:`attnbench.attention.mixer_config`; the recurrences themselves are
:mod:`attnbench.attention.gated_scan` and :mod:`attnbench.attention.delta_scan`.

Choices every mixer makes alike, and why:

* Heads of d_model / n_heads for queries, keys and values, as every other mechanism here:
  the projections ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` keep their shapes (but
  Mamba-2's C and B, ``q_proj`` and ``k_proj``, of groups·d_state: its state is N per
  channel), so a row's cost difference is the mixer's, not a wider layer's. A mixer's own
  weights (gates, decays, convolution, norms) are parameters of its own, counted in its row.
* FLOPs are matmul FLOPs, as FlopCounterMode counts them and as every mechanism here counts
  them: the linear layers and the cores' matmuls. The short convolution is K multiply-adds
  per channel and token, written as K shifted products rather than ``conv1d``: elementwise
  work, counted by no instrument as softmax's exp is not (FlopCounterMode counts a depthwise
  conv1d's weight gradient as if it were dense, C times too many).
* Padding: a padded token's input is replaced by 0 (``torch.where``: a NaN there reaches
  nothing), its convolution input too, and the cores carry the state across it unchanged.
  attnbench pads prompts on the left, so a padded prompt equals the prompt cut short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention import fla_kernels
from attnbench.attention.base import MultiHeadAttention
from attnbench.attention.conv import short_conv
from attnbench.attention.delta_scan import delta_chunked, delta_step
from attnbench.attention.gated_scan import gated_chunked, gated_step
from attnbench.attention.packing import Packing, Positions

NORM_EPS = 1e-6

Recurred = tuple[Tensor, Tensor]  # a recurrence's outputs and its last state


def wide(t: Tensor) -> Tensor:
    """t in the accumulation dtype: fp32 at least, fp64 stays fp64 (gates and decays are
    computed there whatever the layer's dtype: exp and softplus of fp16 lose the decay)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass
class MixerState:
    """One layer's decode state: S (b, h, dk, dv) and the convolution's window, the last K − 1
    inputs (b, K − 1, C), or None without a convolution. Its size is fixed whatever the
    context: :meth:`RecurrentMixer.context_elements`."""

    s: Tensor
    conv: Tensor | None

    def slot(self, i: int) -> MixerState:
        """Sequence i's state as an empty one of its own (views of this one's tensors)."""
        self.s[i].zero_()
        if self.conv is not None:
            self.conv[i].zero_()
        return MixerState(self.s[i : i + 1], None if self.conv is None else self.conv[i : i + 1])

    def seek(self, length: int) -> None:
        """A recurrent state has no position: nothing to set."""

    def admit(self, part: MixerState) -> None:
        """After every slot was filled: nothing to take, a recurrent state has no position."""

    def pad_left(self, pads: Sequence[int]) -> None:
        """Left padding leaves no trace in a recurrent state (padded tokens add nothing to
        it) and a step reads the same bytes whatever the context: nothing to mark."""


class RecurrentMixer(MultiHeadAttention):
    """Base of the five mixers: a subclass builds its own weights, sets :attr:`conv_channels`
    (the channels its short convolution sees, 0 without one) and :attr:`state_shape`
    (dk, dv), and implements :meth:`mix`."""

    conv_channels: int = 0
    state_shape: tuple[int, int] = (0, 0)

    @property
    def state_heads(self) -> int:
        """The heads the core runs over and S is kept for: n_heads, but (Gated) DeltaNet's
        value heads where it has more of them than key heads."""
        return self.n_heads

    @property
    def conv_size(self) -> int:
        """The short convolution's kernel size K, ``cfg.conv``; 0 for a mixer without one."""
        return getattr(self.cfg, "conv", 0)

    def conv_weights(self, channels: int) -> None:
        """The short convolution's (channels, K) weights, initialised as ``conv1d``'s, or
        none when the kernel is 0."""
        self.conv_channels = channels if self.conv_size else 0
        if self.conv_channels:
            bound = 1.0 / self.conv_size**0.5  # conv1d's default for a depthwise kernel
            self.conv = nn.Parameter(torch.empty(channels, self.conv_size).uniform_(-bound, bound))

    def convolve(self, u: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        """SiLU of the short convolution of u (b, n, C), padded inputs zeroed first, none
        read across a packed document's start; a decode state's window is read and then
        advanced. Without a convolution: SiLU alone."""
        if at.real is not None:
            u = torch.where(at.real[..., None], u, 0.0)
        if self.conv_channels:
            window = None if state is None else state.conv
            u, window = short_conv(u, self.conv, window, at.offsets)
            if state is not None and state.conv is not None:
                state.conv.copy_(window)
        return F.silu(u)

    def inputs(self, x: Tensor, at: Positions) -> Tensor:
        """x with padded tokens replaced by 0."""
        return x if at.real is None else torch.where(at.real[..., None], x, 0.0)

    def gated(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, at: Positions,
        state: MixerState | None, scale: float,
    ) -> Tensor:  # fmt: skip
        """The gated recurrence over (b, h, n, ·) inputs: chunked from zeros (a forward, a
        training step), chunked from the decode state (a prefill), or one step (decode); on
        flash-linear-attention's kernels with ``kernel=fla`` (the modeled peak on meta is
        ours: theirs cannot trace there)."""
        if self.cfg.kernel == "fla" and q.device.type != "meta":
            return self._fla(fla_kernels.gated, at, state, q, k, v, g, scale)
        return self._recur(gated_chunked, gated_step, at, state, (q, k, v, g), (), scale=scale)

    def delta(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
        at: Positions, state: MixerState | None,
    ) -> Tensor:  # fmt: skip
        """The delta rule over (b, h, n, ·) inputs, beta and g (b, h, n): dispatched as
        :meth:`gated`."""
        if self.cfg.kernel == "fla" and q.device.type != "meta":
            return self._fla(fla_kernels.delta, at, state, q, k, v, beta, g)
        return self._recur(delta_chunked, delta_step, at, state, (q, k, v), (beta, g))

    def _recur(
        self, chunked: Callable[..., Recurred], step: Callable[..., Recurred], at: Positions,
        state: MixerState | None, tokens: tuple[Tensor, ...],
        per_token: tuple[Tensor | None, ...], **kw: Any,
    ) -> Tensor:  # fmt: skip
        """One of our recurrences over ``tokens`` (b, h, n, ·) and ``per_token`` (b, h, n) or
        None: chunked from zeros without a decode state, one step for one token, else
        chunked from the state's S, which then holds the last one. The one dispatch both
        :meth:`gated` and :meth:`delta` take, so a form added here serves both."""
        real = at.real
        if state is None:
            chunk = self.cfg.chunk
            return chunked(*tokens, *per_token, chunk=chunk, mask=real, starts=at.starts, **kw)[0]
        if tokens[0].shape[-2] == 1:
            row = None if real is None else real[:, 0]
            now = (None if t is None else t[..., 0] for t in per_token)
            o, s = step(*(t[..., 0, :] for t in tokens), *now, state.s, mask=row, **kw)
            o = o[..., None, :]
        else:
            chunk = self.cfg.chunk
            o, s = chunked(*tokens, *per_token, chunk=chunk, mask=real, initial_state=state.s, **kw)
        state.s.copy_(s)
        return o

    def _fla(self, core: Callable[..., tuple[Tensor, Tensor | None]], at: Positions,
             state: MixerState | None, *inputs: Tensor | float | None) -> Tensor:  # fmt: skip
        """``core`` of :mod:`fla_kernels` on ``inputs``, from the decode state's S if any."""
        s_0 = None if state is None else state.s
        o, s = core(*inputs, at.real, s_0, self.dtype, self.cfg.chunk, at.lengths)
        if state is not None:
            state.s.copy_(s)
        return o

    def normed(self, o: Tensor, weight: Tensor, gate: Tensor | None, like: Tensor) -> Tensor:
        """RMSNorm of each head's output o (b, h, n, dv) with ``weight`` (dv), times SiLU of
        ``gate`` (b, n, d) when given, as (b, n, d) in ``like``'s dtype."""
        o = F.rms_norm(o, (o.shape[-1],), weight.to(o.dtype), NORM_EPS)
        o = self.merge_heads(o)
        if gate is not None:
            o = o * F.silu(gate.to(o.dtype))
        return o.to(like.dtype)

    @property
    def dtype(self) -> torch.dtype:
        """The layer's dtype (its projections'): ``kernel=fla``'s outside autocast."""
        return self.out_proj.weight.dtype

    def mix(self, x: Tensor, at: Positions, state: MixerState | None) -> Tensor:
        """(b, n, d) -> (b, n, d) before ``out_proj``, from the state's tokens on when a
        decode state is given (updated in place), from none otherwise; ``at``: the padding
        or the packed documents' starts."""
        raise NotImplementedError

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        return self.mix(x, Positions.of(key_padding_mask, None, x.device), None)

    def attend_packed(self, x: Tensor, packing: Packing) -> Tensor:
        """One pass over the packed rows: the state starts from zeros at each document's
        first token and the short convolution reads nothing before it (``kernel=fla``: one
        call over every document, their ``cu_seqlens``)."""
        return self.mix(x, Positions.of(None, packing, x.device), None)

    def refuses(self, dtype: str, gpu: bool) -> str | None:
        """``kernel=fla``: what flash-linear-attention's ops have no kernel for."""
        fla = self.cfg.kernel == "fla"
        return fla_kernels.refuses(self.declared[0], dtype, gpu) if fla else None

    def extend_attend(
        self, x: Tensor, state: MixerState, key_padding_mask: Tensor | None
    ) -> Tensor:
        return self.mix(x, Positions.of(key_padding_mask, None, x.device), state)

    def new_state(
        self, b: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> MixerState:
        dk, dv = self.state_shape
        s = torch.zeros(b, self.state_heads, dk, dv, dtype=dtype, device=device)
        conv = None
        if self.conv_channels:
            size = (b, self.conv_size - 1, self.conv_channels)
            conv = torch.zeros(size, dtype=dtype, device=device)
        return MixerState(s, conv)

    def context_elements(self, n: int) -> int:
        """S per head (:attr:`state_heads`), h·dk·dv, and the convolution's window,
        (K − 1)·C: whatever n."""
        dk, dv = self.state_shape
        window = (self.conv_size - 1) * self.conv_channels if self.conv_channels else 0
        return self.state_heads * dk * dv + window

    def state_bytes(self, n: int, itemsize: int) -> int:
        """The state is the context memory, nothing else."""
        return self.context_bytes(n, itemsize)

    def linear_flops_per_token(self) -> int:
        """2·in·out for every linear layer: each sees every token once."""
        return sum(
            2 * m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear)
        )

    def flops(self, b: int, n: int) -> int:
        """Every linear layer (the four projections and the mixer's own) plus the core's
        :meth:`attention_flops`."""
        return b * n * self.linear_flops_per_token() + self.attention_flops(b, n)

    @property
    def step_chunk(self) -> int:  # the chunked core's: one Python step each (past n: one)
        return self.cfg.chunk

    def packed_attention_flops(self, packing: Packing) -> int:
        """One chunked pass over each row of T, the resets costing no matmul."""
        return self.attention_flops(packing.batch, packing.width)

    def flops_backward(self, b: int, n: int) -> int:
        """Twice the forward's matmuls, plus what the core's backward adds or skips per
        (sequence, head the core runs over): :meth:`core_backward_flops`."""
        return 2 * self.flops(b, n) + b * self.state_heads * self.core_backward_flops(n)

    def packed_flops_backward(self, packing: Packing) -> int:
        """One chunked pass over each row of T, backward as forward: the row's own count (a
        reset is a decay, no matmul of its own)."""
        return self.flops_backward(packing.batch, packing.width)

    def core_backward_flops(self, n: int) -> int:
        """The core's backward less twice its forward's matmuls, per (sequence, head)."""
        raise NotImplementedError

    def step_flops(self, b: int, n: int) -> int:
        return b * self.linear_flops_per_token() + self.step_attention_flops(b, n)
