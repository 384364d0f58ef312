"""Quality beside cost: how far an efficient attention is from softmax attention.

:mod:`attnbench.quality.approx` measures a mechanism's approximation error against exact
softmax attention on the same q/k/v/out projections (random inputs to a fresh layer, or the
hidden states of a trained model, layer by layer). :mod:`attnbench.quality.spectrum` computes
the singular-value spectrum of a vanilla model's context matrices P = softmax(QKᵀ/√d_h), the
Linformer paper's Figure 1. Both are plain library code: the sweeps and reports call them.
"""
