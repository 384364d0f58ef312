"""The former address of :mod:`attnbench.row.checks` (``seconds``, ``count``, ...): a
plugin that imports ``attnbench.row_checks`` gets that very module. Plugins import
:mod:`attnbench.row.checks` (docs/architecture.md, "Add a row field"); no module of
attnbench imports this one."""

import sys

from attnbench.row import checks

sys.modules[__name__] = checks
