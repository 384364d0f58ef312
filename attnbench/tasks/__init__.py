"""Tasks that put a number on quality beside cost: a model trained from scratch per mechanism.

* :mod:`attnbench.tasks.listops` — Long Range Arena's ListOps, generated here from a seed
  (no download): the expressions, their labels, the vocabulary and the encoding to tensors.
* :mod:`attnbench.tasks.classify` — the classifier (embedding, ``build_model`` with any
  registered attention, mean-pool, linear) and its fixed-budget training loop.

Library code only: the ``task`` key of ``attnbench run`` lives in the sweep, which calls these.
"""
