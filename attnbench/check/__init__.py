"""attnbench check: the CI regression gate (interleaved A/B timing, noise-aware verdicts)."""
