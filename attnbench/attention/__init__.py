"""One file per attention mechanism; each registers itself with :mod:`attnbench.registry`."""
