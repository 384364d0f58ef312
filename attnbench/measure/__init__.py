"""Measurement: timing, memory, max-batch search and FLOP counts. Knows no mechanism by name."""
