"""The built-in mechanisms, one module each; importing a module registers its mechanism.

:data:`BUILTINS` is the one list of them: ``import attnbench`` imports them in this order
(the order of ``attnbench.names()``), and everything else asks the registry.
"""

BUILTINS = (
    "vanilla",
    "sdpa",
    "xformers",
    "linformer",
    "performer",
    "nystromformer",
    "linear",
    "local",
    "reformer",
    "flex",
)
