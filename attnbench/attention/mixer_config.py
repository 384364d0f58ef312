"""What the five recurrent mixers (``retnet``, ``gla``, ``mamba2``, ``deltanet``,
``gated_deltanet``) take and declare alike: the settings every one's config starts with
(:class:`MixerConfig`) and its declaration (:func:`declare_mixer`). Their layers' shared
code is :mod:`attnbench.attention.mixer`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from attnbench.attention import fla_kernels, gated_scan
from attnbench.attention.base import declare
from attnbench.validators import check_bool, check_choice, check_int

# why a non-causal cell of a mixer is refused: the registry's causal_only reason
CAUSAL_ONLY = "a recurrence over positions in order, so no output can see a later one"
# how every mixer keeps packed documents apart (the registry's ``packs``)
PACKS = (
    "one pass: the state reset to zeros at each document's start (a short convolution cut there)"
)
DEFAULT_CONV = 4  # the short convolution's kernel in Mamba-2, DeltaNet and Gated DeltaNet
MAX_CONV = 64  # a short one: K elementwise passes no time estimate counts (docs/mechanisms.md)
KERNELS = ("torch", "fla")  # our chunked cores, or flash-linear-attention's (CUDA)


@dataclass
class MixerConfig:
    """The settings every mixer's config starts with; a subclass adds its own after them.
    ``causal`` must stay true (:data:`CAUSAL_ONLY`); ``chunk``: positions per chunk of the
    chunked form (64: flash-linear-attention's; past n, one chunk of n; a small one's cost is
    :func:`attnbench.cell_rules.check_traceable`'s); ``kernel``: torch (ours) or fla
    (flash-linear-attention's Triton kernels: only where they can run, CUDA with the package
    installed, and at a chunk their op takes, :func:`fla_kernels.check_chunk`). A subclass's
    ``conv``, the short convolution's kernel (0 = none), is checked here: at most
    :data:`MAX_CONV`."""

    mechanism: ClassVar[str]  # the mixer's name: its declaration's and its errors'
    causal: bool = True
    chunk: int = gated_scan.DEFAULT_CHUNK
    kernel: str = "torch"

    def __post_init__(self) -> None:
        check_bool("causal", self.causal)
        if not self.causal:
            raise ValueError(f"causal: {self.mechanism} is causal only ({CAUSAL_ONLY}); got false")
        check_int("chunk", self.chunk)
        check_int("conv", getattr(self, "conv", 0), low=0, high=MAX_CONV)
        check_choice("kernel", self.kernel, KERNELS)
        if self.kernel == "fla":
            if why := fla_kernels.why_unavailable():
                raise ValueError(f"kernel: fla cannot run here: {why}; use kernel=torch")
            fla_kernels.check_chunk(self.mechanism, self.chunk)


def declare_mixer(config: type[MixerConfig], summary: str) -> Callable[[type], type]:
    """:func:`declare` of ``config``'s mixer with what every mixer declares alike."""
    alike = {"causal": True, "causal_only": CAUSAL_ONLY, "packs": PACKS, "padding_mask": True}
    return declare(
        config.mechanism, config=config, summary=summary, budget=None, cannot_decode=None, **alike
    )
