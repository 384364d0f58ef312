"""attnbench: is this efficient attention really faster and leaner than the Transformer's?

The public surface: :func:`names`, :func:`info`, :func:`create`, :func:`register` and
:func:`build_model`. Importing the package registers the built-in mechanisms.
"""

import importlib

from attnbench.attention import BUILTINS
from attnbench.registry import Info, create, info, names, register

for _name in BUILTINS:  # importing a mechanism's module registers it, in this order
    importlib.import_module(f"attnbench.attention.{_name}")

from attnbench.model import build_model  # noqa: E402 (after the mechanisms it builds)
from attnbench.results import load  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Info", "__version__", "build_model", "create", "info", "load", "names", "register"]
