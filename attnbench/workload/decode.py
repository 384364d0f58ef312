"""``mode=decode``: serving. A prompt of n tokens is prefilled, then ``decode_tokens`` tokens
are generated one at a time, by the causal model of Table 3 in its decoder form
(:meth:`attnbench.model.Encoder.extend`).

What a step is: one token of each of the b sequences through every layer, reading each
layer's cache or state (:meth:`~attnbench.attention.base.MultiHeadAttention.extend`). The
model has no token embedding or vocabulary head, so the next step's input is the step's own
output: each token depends on the last, as in generation.

**The max batch** (``batch=max``) is serving's: one call of the work is the serving scenario
(b states beside one sequence's prefill, then a step of all b) that the memory model tracks
on meta and a GPU probes, in :mod:`attnbench.workload.decode_memory` with its modeled peak.

**Timing**: the prefill of one sequence (its n tokens, in chunks) is timed apart, the other
slots take a copy of its state, then each of the ``decode_tokens`` steps is timed (the first
two not counted): the row's time is the median step, never including the prefill.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnbench.measure.bandwidth import copy_bytes_per_s
from attnbench.measure.memory import module_bytes
from attnbench.measure.roofline import roofline
from attnbench.measure.timing import Timing, time_parts
from attnbench.registry import Info
from attnbench.settings import Setting, choice, integer
from attnbench.workload import draw
from attnbench.workload.base import DTYPES, MAX_LOOP_STEPS, TooLarge, Work, Workload, setting
from attnbench.workload.decode_memory import (
    ServingScenario,
    prefill_steps,
    state_dtype,
    traced_steps,
)
from attnbench.workload.decode_mix import (
    CONTEXTS,
    WARMUP,
    context,
    mix_label,
    own_figures,
    prompt_len,
    prompts,
    prompts_field,
    timed_tokens,
)
from attnbench.workload.decode_roofline import modeled_fields
from attnbench.workload.draw import DRAW

if TYPE_CHECKING:
    from attnbench.cell import Cell

STATE_DTYPES = ("auto", "fp32", "fp16", "bf16")
_DRAW_NAMES = {s.name for s in DRAW}  # unused with every prompt n
# cells whose prompts a CPU cannot prefill within time_budget_s (Decode.cost_s decides, the
# work reads it): their steps are timed over states filled with random values instead
_NO_PREFILL: set[Cell] = set()


class DecodeWork(ServingScenario):
    """The serving scenario (:class:`~attnbench.workload.decode_memory.ServingScenario`),
    timed: one sequence's prefill, then each decode step of all b."""

    def __init__(self, model: nn.Module, cell: Cell, x: Tensor, device: str) -> None:
        super().__init__(model, cell, x, device)
        self.prefill_timing: Timing | None = None
        self.step_timing: Timing | None = None
        self.steps_timed = 0

    def warm(self) -> None:
        """The prefill as :meth:`time` runs it (or the random fill that stands in for it),
        then three steps: a compiled step's context, static at its first length, is
        symbolic from the second (automatic dynamic shapes), and the third runs that graph."""
        self._new_states()
        if self.cell in _NO_PREFILL and self.device.type == "cpu":
            self._random_fill()
        else:
            self._admit(self.prefill(0, self._prompt()))
        for _ in range(3):
            self.step()
        self.states = self.token = None

    def time(self, device: torch.device, **timing: Any) -> list[Timing]:
        """The prefill of one sequence timed apart (a warm-up and three repeats), the other
        slots then filled with copies of its state, then each decode step timed:
        ``decode_tokens`` steps, the first :data:`WARMUP` not counted: the row's time."""
        with torch.inference_mode():  # states and prompt as in a step: no autograd (and one
            return self._time(device, **timing)  # compiled graph for them, not two)

    def _time(self, device: torch.device, **timing: Any) -> list[Timing]:
        self._new_states()
        prompt = self._prompt()
        slots = itertools.count()
        parts: list[Any] = []

        def prefill_next() -> None:
            parts[:] = self.prefill(next(slots) % self.b, prompt)

        if self.cell in _NO_PREFILL and device.type == "cpu":
            self._random_fill()
        else:  # a few prefills: one sequence's prompt is a long step, its time secondary
            prefill = {**timing, "min_repeats": 3, "min_seconds": 0.0, "patience_s": None}
            self.prefill_timing = time_parts([prefill_next], device, **{**prefill, "warmup": 1})[0]
            self._copy_first(min(next(slots), self.b))
            self._admit(parts)
        steps = self.tokens - WARMUP
        self.steps_timed = steps
        # exactly the decode_tokens steps the cache holds: no sample past its capacity
        timing = {**timing, "min_repeats": min(timing.get("min_repeats", 5), steps)}
        timing.update(warmup=WARMUP, max_repeats=steps, min_seconds=math.inf, patience_s=None)
        out = time_parts([self.step], device, **timing)
        self.states = self.token = None
        self.step_timing = out[-1]
        return out

    def _copy_first(self, start: int) -> None:
        """Slots ``start`` … b − 1 take a copy of slot 0's prefilled state: the same bytes
        as prefilling each (a step reads them alike), without b prefills of n tokens (an
        H100's max batch at n = 131072 is thousands of sequences)."""
        assert self.states is not None
        for state in self.states:
            for value in vars(state).values():
                if isinstance(value, Tensor) and value.shape[0] > start:
                    value[start:] = value[:1]

    def _random_fill(self) -> None:
        """Every slot at position n with random contents in (0, 1) (never zeros, and a
        positive normaliser for the recurrent states), no prefill run: a step's time depends
        on its shapes, not on the values it reads. Slot 0 is drawn, the others copy it."""
        assert self.states is not None
        gen = torch.Generator(device=self.device).manual_seed(2)
        for state in self.states:
            state.seek(self.n)
            for value in vars(state).values():
                if isinstance(value, Tensor) and value.is_floating_point():
                    value[:1].uniform_(0.0, 1.0, generator=gen)
        self._copy_first(1)  # a CPU's generator runs at a fraction of a copy's bandwidth
        self._pad()
        self.token = self._first_token()

    def row_fields(self) -> dict[str, Any]:
        """The prefill's time, tokens per second, and the bytes a step must read (every
        sequence's cache or state at the mean context, and the weights) over its time,
        beside the copy bandwidth of the same device."""
        assert self.step_timing is not None
        itemsize = self.state_dtype.itemsize
        state = self.b * self.model.state_bytes(context(self.cell), itemsize)
        read = state + module_bytes(self.model)
        step = self.step_timing.median
        p = self.prefill_timing
        return {
            "decode": {
                **own_figures(self.model, self.cell, self.b, itemsize),
                "prefill_s": None if p is None else p.median,
                "prefill_iqr_s": None if p is None else p.iqr,
                "prefill_samples_s": None if p is None else list(p.samples),
                "filled_by": "prefill" if p is not None else "random",
                "prefill_chunk": self.chunk,
                "steps": self.steps_timed,
                "context": context(self.cell),
                "tokens_per_s": self.b / step,
                "read_bytes": read,
                "state_read_bytes": state,
                "bytes_per_s": read / step,
                "copy_bytes_per_s": copy_bytes_per_s(self.device),
                "timed_state_dtype": str(self.state_dtype).removeprefix("torch."),
            }
        }


class Decode(Workload):
    name = "decode"
    doc = "serving: prefill a prompt of n tokens, then time each of decode_tokens steps"
    what = "decode step"
    settings = (
        Setting("decode_tokens", 128, "tokens generated after the prompt of n (each step"
                f" timed but the first {WARMUP})", int, timed_tokens),
        Setting("state_dtype", "auto", "the cache's or state's dtype (`auto`: the cell's)",
                str, choice(STATE_DTYPES)),
        Setting("prefill_chunk", 512, "prompt tokens per prefill call (0: the whole prompt at"
                " once)", int, integer(low=0)),
        Setting("contexts", "n", "`n` (every prompt n tokens) or `drawn` (sequence i's prompt"
                " the draw's i-th length, in turn: `lengths` or `distribution`; every cache"
                " allocated for the longest, the others left-padded to it)", str,
                choice(CONTEXTS)),
        *DRAW,
    )  # fmt: skip
    compile_dynamic = None  # the context grows each step: automatic dynamic shapes
    later = ("contexts", *(s.name for s in DRAW))  # every prompt n, before they existed
    replays = False  # its peak is the larger of two serving scenarios (decode_memory.py)
    causal = True  # a decoder is causal whatever the config says
    modeled = staticmethod(modeled_fields)  # a step over the preset's datasheet

    def refuses(self, info: Info) -> str | None:
        return f"cannot decode: {info.cannot_decode}" if info.cannot_decode else None

    def in_use(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Every prompt n (``contexts=n``): no draw is used; a draw: its settings in use."""
        if settings.get("contexts", "n") == "n":
            return {k: v for k, v in settings.items() if k not in _DRAW_NAMES}
        return draw.in_use(settings)

    def check(self, cell: Cell, params: dict[str, Any], usable: int) -> None:
        """A decoder is causal; the weights and one sequence's state at n + decode_tokens
        must fit the memory the cell may use (else only an ``oom`` row could come of it)."""
        if not params.get("causal"):
            raise ValueError(
                f"causal: mode=decode runs the causal model; set causal=true, got "
                f"attention={cell.attention} without it"
            )
        from attnbench.workload.base import encoder

        longest = prompt_len(cell)  # contexts=drawn: the draw checked here, in one line
        model = encoder(cell, params, "meta").to(DTYPES[cell.dtype])
        itemsize = state_dtype(cell, DTYPES[cell.dtype]).itemsize
        tokens = setting(cell, "decode_tokens")
        need = module_bytes(model) + model.state_bytes(longest + tokens, itemsize)
        if need > usable:
            key = "lengths" if setting(cell, "lengths") is not None else "distribution"
            what = (
                f"n: a context of n={cell.n}"
                if prompts(cell) is None
                else f"{key}: the longest prompt, {longest} tokens,"
            )
            raise TooLarge(
                f"{what} plus decode_tokens={tokens} needs "
                f"{need} bytes at batch 1 (weights and one sequence's state), above the "
                f"{usable} bytes {cell.device} leaves usable; allowed: a shorter context"
            )

    def loop_steps(self, cell: Cell, layer: nn.Module) -> tuple[int, str]:
        """What the memory model traces (``decode_memory.traced_steps``)."""
        return traced_steps(layer, cell), "prefill_chunk"

    def label(self, cell: Cell) -> str:
        model = getattr(cell, "model", None)  # a cell's Model, or a row's stored shape
        heads = model.get("kv_heads") if isinstance(model, dict) else getattr(model, "kv_heads", 0)
        kv = f", kv_heads={heads}" if heads else ""
        chosen, tokens = setting(cell, "state_dtype"), setting(cell, "decode_tokens")
        state = f", state={chosen}" if chosen not in (None, "auto") else ""
        return f"decode({tokens} tokens{kv}{state}{mix_label(cell)})"

    def caption(self, row: Any) -> str:
        return f"serving, {self.label(row)} (the paper has no serving table)"

    def input_shape(self, cell: Cell, b: int) -> tuple[int, ...]:
        return (b, 1, cell.model.d_model)  # one token per sequence; each prompt is made in the work

    no_cpu_time = (
        "batch=max is a GPU's batch (its decode step is timed there); a CPU times decode at batch=N"
    )

    def cpu_batch(self, cell: Cell) -> int | None:
        """Decode's cost depends on the batch: a number is timed at that batch; ``max``,
        a device's serving batch (thousands of sequences for a recurrent state), is modeled
        only (its figures are the max batch and the state's bytes)."""
        return cell.batch if isinstance(cell.batch, int) else None

    def work(self, model: nn.Module, cell: Cell, x: Tensor, device: str, *, gpu: bool) -> Work:
        return DecodeWork(model, cell, x, device)

    def flops(self, model: nn.Module, cell: Cell) -> tuple[int, int | None]:
        """Per generated token and sequence, at the mean context of the timed steps."""
        return model.step_flops(1, context(cell)), None

    def describe(self, model: nn.Module, cell: Cell) -> dict[str, Any]:
        """The bytes one sequence keeps at n + decode_tokens, every layer, in the state's
        dtype on the cell's device (``model`` is in the cell's dtype)."""
        itemsize = state_dtype(cell, next(model.parameters()).dtype).itemsize
        return prompts_field(model, cell, itemsize)

    def cost_s(
        self, model: nn.Module, cell: Cell, b: int, flops_per_s: float
    ) -> tuple[float, float]:
        """A step: the roofline of its bytes at the copy bandwidth and its FLOPs at the GEMM
        rate; the timing: every prefill and every step."""
        itemsize = 4  # the CPU times fp32
        weights = sum(p.numel() for p in model.parameters()) * itemsize
        read = b * model.state_bytes(context(cell), itemsize) + weights
        flops = model.step_flops(b, context(cell))
        step = roofline(read, flops, copy_bytes_per_s("cpu"), flops_per_s)["step_s"]
        steps = step * setting(cell, "decode_tokens")
        # a warm-up, 3 timed; then copies. A prefill of more Python steps (its calls, its
        # chunks) than MAX_LOOP_STEPS is not timed either: no FLOP count sees their overhead
        prefills = model.flops(1, prompt_len(cell)) / flops_per_s * 4
        calls = sum(prefill_steps(layer.attn, cell) for layer in model.layers)  # a hybrid's too
        if steps + prefills <= cell.timing.time_budget_s and calls <= MAX_LOOP_STEPS:
            _NO_PREFILL.discard(cell)
            return step, steps + prefills
        _NO_PREFILL.add(cell)  # the steps alone, over random states
        return step, steps


DECODE = Decode()
