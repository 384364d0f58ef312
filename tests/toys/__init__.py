"""Toy extensions, each in a file of its own, loaded as plugins (``$ATTNBENCH_PLUGINS``) by
tests/test_extensions.py: what a user adds to attnbench without editing it."""
