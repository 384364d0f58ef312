"""The built-in mechanisms, one module each. Each declares its mechanism
(:func:`attnbench.attention.base.declare`); :mod:`attnbench.registry` imports them at its top
and registers them in the order of ``attnbench.names()`` (its ``BUILTINS``), and everything
else asks the registry.
"""
