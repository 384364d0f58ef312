"""attnbench: is this efficient attention really faster and leaner than the Transformer's?

The public surface: :func:`names`, :func:`info`, :func:`create`, :func:`register`,
:func:`build_model` and :func:`load`. Each is imported on first use, so that ``import
attnbench`` (and ``attnbench --help``, or a typo's one line) does not pay for torch; the
registry registers the built-in mechanisms when it is first imported.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnbench.version import __version__

_WHERE = {
    "Info": "attnbench.registry",
    "create": "attnbench.registry",
    "info": "attnbench.registry",
    "names": "attnbench.registry",
    "register": "attnbench.registry",
    "build_model": "attnbench.model",
    "load": "attnbench.results",
}
__all__ = ["Info", "__version__", "build_model", "create", "info", "load", "names", "register"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'attnbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
