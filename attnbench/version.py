"""The package's version, in a module of its own so that any module can read it without
the package root's lazy facade."""

__version__ = "0.1.0"
