"""attnbench: is this efficient attention really faster and leaner than the Transformer's?

The public surface: :func:`names`, :func:`info`, :func:`create`, :func:`register` and
:func:`build_model`. Importing the package registers the built-in mechanisms.
"""

from attnbench.registry import Info, create, info, names, register  # noqa: I001 (order matters)
from attnbench.attention import vanilla, sdpa, xformers, linformer, performer  # noqa: F401
# (importing a mechanism's module registers it; this order is the order of names())

from attnbench.model import build_model

__version__ = "0.1.0"
__all__ = ["Info", "__version__", "build_model", "create", "info", "names", "register"]
