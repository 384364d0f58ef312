"""Quality beside cost: how far an efficient attention is from softmax attention, and what
it scores on a task.

:mod:`attnbench.quality.tasks` is the registry of quality tasks (their settings, figures,
rules and runs; :mod:`attnbench.quality.runs` adapts a cell to the libraries below).
:mod:`attnbench.quality.approx` measures a mechanism's approximation error against exact
softmax attention on the same q/k/v/out projections (random inputs to a fresh layer, or the
hidden states of a trained model, layer by layer). :mod:`attnbench.quality.spectrum` computes
the singular-value spectrum of a vanilla model's context matrices P = softmax(QKᵀ/√d_h), the
Linformer paper's Figure 1. :mod:`attnbench.quality.listops` generates Long Range Arena's
ListOps from a seed; :mod:`attnbench.quality.mqar` generates Zoology's multi-query associative
recall from a seed; :mod:`attnbench.quality.classify` is the classifier over any mechanism
(a label per sequence, or per position) and ListOps' training run,
:mod:`attnbench.quality.recall` MQAR's (task=mqar: the short convolution, causal or not, the
best of a few learning rates), :mod:`attnbench.quality.training` the fixed-budget training both
share. All but the registry are plain library code.
"""
