"""A built-in mechanism's module, as it would sit under ``attnbench/attention/``: its class
declared with :func:`attnbench.attention.base.declare`, which only keeps the declaration on
the class (importing it registers nothing). ``attnbench/registry.py`` registers a built-in
(``BUILTINS``); tests/test_builtins.py shows what else it needs, and that the tests name each
thing missing.

The toy is "each output is its own value": no token sees another, so nothing carries context.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnbench.attention.base import MultiHeadAttention, declare


@dataclass
class ValuesConfig:
    pass


@declare("toy_builtin", config=ValuesConfig, causal=False, summary="each output is its own value")
class ValuesAttention(MultiHeadAttention):
    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        return self.v_proj(x)  # (b, n, d): position i from x_i alone

    def context_elements(self, n: int) -> int:
        """No token sees another: no context is kept."""
        return 0
