"""``attnbench check``: did this change make any attention slower?

Two versions of the code — the working tree (B) and a git ref checked out in a temporary
worktree (A), or B against samples stored earlier on the same machine — are timed on the
regression suite (``conf/sweep/regression.yaml``). Each version lives in its own worker
process importing its own tree, and the samples are taken interleaved, A B A B ..., in a
shuffled order every round, so that a machine that slows down half-way (another job, a
clock change) slows both versions alike instead of faking a regression. A cell fails only
when its slowdown is both significant (one-sided Mann–Whitney U, p < alpha) and above its
threshold (:func:`attnbench.check.stats.compare`); one failed cell fails the check.

One module per job, in the order a check runs them:

- :mod:`~attnbench.check.suite`: the cells and ``check:`` settings of a suite, validated;
- :mod:`~attnbench.check.versions`: git, the temporary worktree, a version's worker process;
- :mod:`~attnbench.check.worker`: the worker itself (run by path inside a version's tree);
- :mod:`~attnbench.check.sampling`: the interleaved samples;
- :mod:`~attnbench.check.stats`: the rank test, Hodges–Lehmann, the bootstrap, the rule;
- :mod:`~attnbench.check.verdicts`: a verdict per cell, baseline files, the JSON, the table;
- :mod:`~attnbench.check.run`: all of it in order, for ``attnbench check``.

This package imports nothing heavy itself: the CLI imports :class:`Misuse` before it knows
whether a check will run at all.
"""

from __future__ import annotations


class Misuse(ValueError):
    """Bad input from the user: one line, exit code 2, before anything is timed."""
