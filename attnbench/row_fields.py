"""The former address of :mod:`attnbench.row.fields` (``Field``, ``register``): a plugin
that imports ``attnbench.row_fields`` gets that very module, its registries and all, not a
copy. Plugins import :mod:`attnbench.row.fields` (docs/architecture.md, "Add a row field");
no module of attnbench imports this one."""

import sys

from attnbench.row import fields

sys.modules[__name__] = fields
