"""Prefill then decode against the full causal forward, at the Table 3 model's full size.

For every mechanism with an incremental form (and the exact ones with kv_heads = 3): a
12-layer, d_model 768 causal model, two sequences of 640 tokens: the first 512 prefilled in
chunks of 128, the last 128 one token at a time; the largest difference from the full causal
forward over all 640 positions, relative to the largest output, in float64 and float32.
docs/serving.md quotes its output. Run: python scripts/decode_exactness.py (about a minute).
"""

from __future__ import annotations

import torch

import attnbench
from attnbench.model import build_model

CASES = [(name, None) for name in attnbench.names() if attnbench.info(name).cannot_decode is None]
CASES += [(name, 3) for name, _ in list(CASES) if attnbench.info(name).gqa]


def main() -> None:
    torch.set_num_threads(1)
    for name, kv in CASES:
        if attnbench.info(name).unavailable:
            print(f"{name}: {attnbench.info(name).unavailable}")
            continue
        errors = []
        for dtype in (torch.float64, torch.float32):
            torch.manual_seed(0)
            model = build_model(name, max_seq_len=1024, causal=True, kv_heads=kv).to(dtype)
            x = torch.randn(2, 640, 768, dtype=dtype)
            with torch.inference_mode():
                full = model(x)
                states = model.new_state(2, 640, dtype, "cpu")
                outs = [model.extend(x[:, s : s + 128], states) for s in range(0, 512, 128)]
                outs += [model.extend(x[:, i : i + 1], states) for i in range(512, 640)]
                got = torch.cat(outs, dim=1)
            errors.append(((got - full).abs().max() / full.abs().max()).item())
        label = name + (f" (kv_heads={kv})" if kv else "")
        print(f"{label:22s} float64 {errors[0]:.1e}   float32 {errors[1]:.1e}")


if __name__ == "__main__":
    main()
