"""The benchmarks time in the pytest process: steady glibc malloc thresholds first, as every
attnbench command that times does (attnbench.env.fix_malloc; docs/measurement.md, "Quieter
timings")."""

from attnbench.env import fix_malloc

fix_malloc()
