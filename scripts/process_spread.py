"""The same layer timed in one fresh process: run it several times to see how much the
*process* alone moves a timing (the reason attnbench check fixes glibc's malloc thresholds).

    for i in 1 2 3 4 5 6; do python scripts/process_spread.py; done
    for i in 1 2 3 4 5 6; do MALLOC_MMAP_THRESHOLD_=33554432 \
        MALLOC_TRIM_THRESHOLD_=4294967296 python scripts/process_spread.py; done
    for i in 1 2 3 4 5 6; do python scripts/process_spread.py --fix; done

``--fix`` fixes the thresholds from inside the process, after torch is imported, as every
attnbench command that times does (:func:`attnbench.env.fix_malloc`): it must steady the
timings as the variables do.

Prints the median of 20 samples (3 forwards each) of vanilla attention, n = 512, d_model
768, 12 heads, fp32, one thread, in ms.
"""

import statistics as st
import sys
import time

import torch

import attnbench
from attnbench.env import fix_malloc

if "--fix" in sys.argv[1:]:
    fix_malloc()

torch.set_num_threads(1)
torch.manual_seed(0)
m = attnbench.create("vanilla", d_model=768, n_heads=12, max_seq_len=512).eval()
x = torch.randn(1, 512, 768)
with torch.inference_mode():
    for _ in range(2):
        m(x)
    s = []
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(3):
            m(x)
        s.append((time.perf_counter() - t) / 3)
print(f"{st.median(s) * 1e3:.1f}")
