"""``attnbench run``: Hydra sweeps, one cell per Hydra job, the results store, progress.

The flow, one module per step:

* :mod:`.config` — before Hydra starts, every job of the command is composed (Hydra's
  own expansion, behind :mod:`.hydra_api`) and its cell validated, so a typo ends with one
  line and exit code 2 and nothing on disk. The result is the command's plan: the
  (run directory, cell key) pairs it will fill.
* :mod:`.claims` — the plan and this command's claims on cells, shared with every job (also
  in launcher subprocesses) through the environment and files in the temp directory; swept
  when the command ends, and stale ones of killed commands on the next start.
* :mod:`.job` — Hydra's task function: one cell, skipped if stored (resume), measured in this
  process under a time limit or, under joblib, in a fresh process, and its row appended.
* :mod:`.progress` — a Hydra callback: the live progress bar watching ``cells.jsonl`` (so it
  works under every launcher), and at the end the summary and the sweep's report.
"""
