"""The serving scenario of ``mode=decode``: what one call of the decode work runs, and the
peak the memory model gives it on meta without tracing a prefill per batch.

**The max batch** (``batch=max``) is serving's: the largest b whose weights, the caches or
states of all b sequences at n + ``decode_tokens`` (preallocated, as engines do), and the
larger of two transients fit the ceiling: a decode step of all b, or the prefill of one
sequence into its slot while the other b − 1 stay resident. Engines admit a new sequence by
prefilling it alone (or in chunks of ``prefill_chunk`` tokens) beside the running ones; a
prefill of the whole batch at once would make exact attention look prefill-bound (its n × n
scores) where serving is bound by its cache. One :class:`ServingScenario` call is that
scenario: the memory model tracks it on meta, and on a GPU it is the real probe. How its
steps are timed is :class:`attnbench.workload.decode.DecodeWork`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnbench.measure.memory import tracked_peak
from attnbench.workload.base import DTYPES, Work, setting
from attnbench.workload.decode_mix import left_pads, prompt_len

if TYPE_CHECKING:
    from attnbench.cell import Cell


def state_dtype(cell: Cell, compute: torch.dtype) -> torch.dtype:
    """The cache's or state's dtype: ``state_dtype``, or the compute dtype for ``auto``."""
    chosen = setting(cell, "state_dtype")
    return compute if chosen == "auto" else DTYPES[chosen]


def prefill_steps(layer: nn.Module, cell: Cell) -> int:
    """The Python-level steps of one sequence's prefill in ``layer``: each call's
    (``prefill_chunk`` tokens, the last one shorter); 0 for a plugin's layer that does not
    count them. What a CPU's time estimate cannot see (``Decode.cost_s``)."""
    if not hasattr(layer, "loop_steps"):
        return 0
    chunk = setting(cell, "prefill_chunk") or cell.n
    whole, rest = divmod(prompt_len(cell), chunk)
    return whole * layer.loop_steps(chunk) + (layer.loop_steps(rest) if rest else 0)


def traced_steps(layer: nn.Module, cell: Cell) -> int:
    """What the memory model traces of them (:meth:`ServingScenario._traced_prefill`): three
    calls of ``prefill_chunk`` tokens and one step of a token."""
    call = min(setting(cell, "prefill_chunk") or cell.n, prompt_len(cell))
    return 3 * layer.loop_steps(call) + layer.loop_steps(1)


class ServingScenario(Work):
    """The serving scenario at the batch of ``x`` (b, 1, d), the tokens of one step: b
    states resident, one sequence's prompt prefilled into its slot, one step of all b."""

    def __init__(self, model: nn.Module, cell: Cell, x: Tensor, device: str) -> None:
        super().__init__(model, x)
        self.cell = cell
        self.n, self.tokens = prompt_len(cell), setting(cell, "decode_tokens")
        self.chunk = setting(cell, "prefill_chunk") or cell.n
        self.device = torch.device(device)
        self.state_dtype = state_dtype(cell, x.dtype)
        self.states: list[Any] | None = None
        self.token: Tensor | None = None
        self._prefill_transient: int | None = None

    @property
    def b(self) -> int:
        """The batch: the runner feeds a new ``x`` for each batch it probes."""
        return self.x.shape[0]

    def _new_states(self) -> None:
        self.states = None  # the last ones go first
        self.states = self.model.new_state(self.b, self.capacity, self.state_dtype, self.device)

    @property
    def capacity(self) -> int:
        """Tokens a state holds: the prompt and every generated token; a compiled step's one
        more: a cache filled to the last slot is one contiguous block, which a compiled
        graph guards on (it would recompile for the last step)."""
        return self.n + self.tokens + int(self.cell.compile)

    def _prompt(self) -> Tensor:
        """One sequence's prompt, (1, n, d), random from a fixed seed (never zeros)."""
        shape, dtype = (1, self.n, self.x.shape[-1]), self.x.dtype
        if self.device.type == "meta":
            return torch.empty(shape, device="meta", dtype=dtype)
        gen = torch.Generator(device=self.device).manual_seed(1)
        return torch.randn(shape, generator=gen, device=self.device, dtype=dtype)

    def prefill(self, i: int, prompt: Tensor) -> list[Any]:
        """Sequence i's prompt into its slot, ``prefill_chunk`` tokens per call; returns the
        slot's states (views), which the whole takes the position of once all are filled."""
        assert self.states is not None
        parts = [state.slot(i) for state in self.states]
        for start in range(0, self.n, self.chunk):
            self.model.extend(prompt[:, start : start + self.chunk], parts)
        return parts

    def _admit(self, parts: list[Any]) -> None:
        assert self.states is not None
        for state, part in zip(self.states, parts, strict=True):
            state.admit(part)
        self._pad()
        self.token = self._first_token()

    def _pad(self) -> None:
        """With a mix of contexts, each sequence's own: every slot holds the longest prompt's
        state, and its first (longest − own) positions are marked as left padding, what a
        left-padded prefill of its own prompt leaves (a step's time and memory depend on the
        masks and shapes, not on the values)."""
        pads = left_pads(self.cell, self.b)
        if pads is not None and any(pads):
            assert self.states is not None
            for state in self.states:
                state.pad_left(pads)

    def _first_token(self) -> Tensor:
        """The first step's input: ``x`` as an inference tensor, like every later step's (a
        compiled step would otherwise compile once more for a tensor autograd can see)."""
        with torch.inference_mode():
            return self.x.clone()

    def step(self) -> Tensor:
        """One decode step of every sequence; its output is the next step's input."""
        assert self.states is not None and self.token is not None
        self.token = self.model.extend(self.token, self.states)
        return self.token

    def __call__(self) -> Tensor:
        self._new_states()
        prompt = self._prompt()
        parts = self.prefill(0, prompt)  # the others' slots hold the same bytes
        del prompt
        self._admit(parts)
        out = self.step()
        self.release()  # nothing of the probe outlives it
        return out

    def release(self) -> None:
        """The states and the token: a finished call drops them, and so does the runner
        after a call that stopped midway (out of memory) and left them set."""
        self.states = self.token = None

    def modeled_peak(self, base: int) -> int:
        """What one call of this work peaks at, without tracing a prefill per batch: the
        larger of a decode step of all b (their states at n, the step's transient) and the
        states of all b beside one sequence's prefill transient, which does not depend on b
        and is traced once (a prefill of 131072 tokens in 256 chunks traces 12 · 256
        ``extend`` calls)."""
        if self._prefill_transient is None:
            self._prefill_transient = self._traced_prefill()
        b, cap, dtype = self.b, self.capacity, self.state_dtype

        def decode_step() -> Tensor:
            self.states = self.model.new_state(b, cap, dtype, self.device)
            for state in self.states:
                state.seek(self.n)
            self._pad()
            self.token = self._first_token()  # as a real step's: its copy of x counted
            out = self.step()
            self.states = self.token = None
            return out

        def states() -> list[Any]:
            return self.model.new_state(b, cap, dtype, self.device)

        resident = tracked_peak(states, 0)  # the states of all b, as allocated
        return max(tracked_peak(decode_step, base), base + resident + self._prefill_transient)

    def _traced_prefill(self) -> int:
        """One sequence's prefill into its slot: its peak above its own state's bytes.

        Traced at the chunks where it peaks, not all of them: the first (from an empty
        state), the last and the last whole one. Between them a chunk's transient does not
        fall as the position grows (exact attention's c × L scores grow with L; a recurrent
        state, a ring and a chunk's activations stay the same size), so no other chunk
        peaks higher; ``tests/test_decode_workload.py`` holds this against tracing every
        chunk."""
        cap, dtype, c = self.capacity, self.state_dtype, self.chunk
        last = (self.n - 1) // c * c
        starts = {0, last, last if self.n - last == c else max(last - c, 0)}

        def alone() -> list[Any]:
            return self.model.new_state(1, cap, dtype, self.device)

        def chunk_at(start: int) -> None:
            whole = self.model.new_state(1, cap, dtype, self.device)
            prompt = self._prompt()
            parts = [state.slot(0) for state in whole]
            for part in parts:
                part.seek(start)
            self.model.extend(prompt[:, start : start + c], parts)
            del prompt, whole, parts

        own = tracked_peak(alone, 0)
        return max(tracked_peak(lambda s=s: chunk_at(s), 0) for s in sorted(starts)) - own
