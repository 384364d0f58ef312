import time, torch, attnbench, statistics as st, sys
torch.set_num_threads(1); torch.manual_seed(0)
m = attnbench.create("vanilla", d_model=768, n_heads=12, max_seq_len=512).eval()
x = torch.randn(1, 512, 768)
with torch.inference_mode():
    for _ in range(2): m(x)
    s = []
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(3): m(x)
        s.append((time.perf_counter() - t) / 3)
print(f"{st.median(s)*1e3:.1f}")
