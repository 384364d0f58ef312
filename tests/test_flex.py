"""flex: FlexAttention behind the registry, against softmax attention under the same mask.

Its kernel is compiled (a few seconds per new shape on 2 cores), so every kernel test here
runs at one shape, b = 2, n = 200 (two blocks of 128, the second cut short), d_model 32, 4
heads: every pattern and window shares one compiled graph (the mask's bounds are tensors),
and padding and grouped heads one more each. Four compilations in all (about 30 s on 2
cores with a cold Inductor cache, paid by the first test that needs each: the one marked
slow runs them all).

Tolerances, measured at that shape: the compiled fp32 kernel differs from float64 softmax
attention by at most 3.5e-7 (held to 2e-6) and from vanilla or local in fp32 on the same
weights by at most 2.4e-7 (held to 2e-6; sdpa's was 1.5e-6 at n = 4096); the eager
(unfused) flex_attention in float64 over flex's own block masks, cached and padded, gave
exactly the float64 reference here (held to 1e-10): the mask semantics exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import attnbench
from attnbench.attention import block_masks, flex
from attnbench.attention.flex import FlexConfig

D, H, N, B = 32, 4, 200, 2
FP32_TOL, FP64_TOL = 2e-6, 1e-10
PATTERNS = [  # (pattern, window, causal)
    ("full", 64, False),
    ("causal", 64, False),
    ("full", 64, True),  # the same as pattern=causal
    ("window", 64, False),
    ("window", 64, True),
    ("window", 2, False),  # narrower than a block: partial blocks only
    ("window", 1, True),  # each query sees itself alone
    ("window", 300, False),  # wider than the sequence: every key
]
IDS = [f"{p}-w{w}{'-causal' if c else ''}" for p, w, c in PATTERNS]


def _flex(
    pattern: str, window: int, causal: bool, kv_heads: int | None = None
) -> flex.FlexAttention:
    torch.manual_seed(0)
    m = attnbench.create(
        "flex",
        d_model=D,
        n_heads=H,
        max_seq_len=N,
        pattern=pattern,
        window=window,
        causal=causal,
        kv_heads=kv_heads,
    )
    return m.eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1))
    padded = torch.zeros(B, N, dtype=torch.bool)
    padded[0, 150:] = True  # a sequence cut short
    padded[1, 3::7] = True  # scattered padding
    return x, padded


def allowed_pairs(cfg: FlexConfig, n: int) -> torch.Tensor:
    """(n, n) bool, True where query i sees key j, written out from the pattern's rule."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if cfg.pattern == "window":
        w = cfg.window
        return (j <= i) & (i - j < w) if cfg.is_causal else (i - j).abs() <= w // 2
    return j <= i if cfg.is_causal else torch.ones(n, n, dtype=torch.bool)


def reference_heads(m: flex.FlexAttention, x: torch.Tensor, padded: torch.Tensor | None):
    """Softmax attention over the allowed, unpadded keys in float64 on ``m``'s weights,
    before ``out_proj``: (b, h, n, dh); a query that sees no key gets 0."""
    m64 = copy.deepcopy(m).double()
    x = x.double()
    q, k, v = m64.qkv_heads(x)
    group = m.n_heads // m.kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    seen = allowed_pairs(m.cfg, x.shape[1])[None, None]  # (1, 1, n, n)
    if padded is not None:
        seen = seen & ~padded[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) * m.scale
    probs = scores.masked_fill(~seen, float("-inf")).softmax(-1).nan_to_num(0.0)
    return m64, probs @ v


def reference(m: flex.FlexAttention, x: torch.Tensor, padded: torch.Tensor | None):
    m64, heads = reference_heads(m, x, padded)
    return m64.out_proj(m64.merge_heads(heads))


# -- the compiled kernel against softmax attention ---------------------------------------------


@pytest.mark.slow  # its first cases compile the four graphs every kernel test here shares
@pytest.mark.parametrize(("pattern", "window", "causal"), PATTERNS, ids=IDS)
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "kv2"])
def test_equals_softmax_attention_under_the_same_mask(
    pattern: str, window: int, causal: bool, kv_heads: int | None
) -> None:
    m = _flex(pattern, window, causal, kv_heads)
    x, padded = _inputs()
    with torch.inference_mode():
        for mask in (None, padded):
            got = m(x, mask)
            want = reference(m, x, mask).float()
            torch.testing.assert_close(got, want, atol=FP32_TOL, rtol=0)


@pytest.mark.parametrize(("pattern", "window", "causal"), PATTERNS, ids=IDS)
def test_equals_vanilla_or_local_on_the_same_weights(pattern: str, window: int, causal: bool):
    """Full and causal against vanilla, windows against local: the same band, to fp32."""
    m = _flex(pattern, window, causal)
    if pattern == "window":
        other = attnbench.create(
            "local", d_model=D, n_heads=H, max_seq_len=N, window=window, causal=causal
        )
    else:
        other = attnbench.create(
            "vanilla", d_model=D, n_heads=H, max_seq_len=N, causal=m.cfg.is_causal
        )
    other.load_state_dict(m.state_dict())
    x, padded = _inputs()
    with torch.inference_mode():
        for mask in (None, padded):
            torch.testing.assert_close(m(x, mask), other.eval()(x, mask), atol=FP32_TOL, rtol=0)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(("pattern", "window", "causal"), PATTERNS, ids=IDS)
@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "kv2"])
def test_eager_flex_in_float64_with_its_block_masks_is_exact(
    pattern: str, window: int, causal: bool, kv_heads: int | None
) -> None:
    """The mask semantics exactly: PyTorch's unfused flex_attention (float64, which the
    compiled CPU kernel refuses) over flex's own block masks, cached and padded."""
    m = _flex(pattern, window, causal, kv_heads)
    x, padded = _inputs()
    m64 = copy.deepcopy(m).double()
    with torch.inference_mode():
        for mask in (None, padded):
            q, k, v = m64.qkv_heads(x.double())
            block_mask = block_masks.block_mask(N, m.cfg, x.device, mask)
            got = flex_attention(
                q, k, v, block_mask=block_mask, scale=m.scale, enable_gqa=kv_heads is not None
            )
            _, want = reference_heads(m, x, mask)
            torch.testing.assert_close(got, want, atol=FP64_TOL, rtol=0)


@pytest.mark.parametrize(("pattern", "window"), [("causal", 64), ("window", 64)])
def test_causal_outputs_never_see_a_later_position(pattern: str, window: int) -> None:
    m = _flex(pattern, window, causal=True)
    x, _ = _inputs()
    for t in (13, 127, 128, 170):  # inside, at the end of and at the start of a block
        y = x.clone()
        y[:, t + 1 :] = 10 * torch.randn_like(y[:, t + 1 :])
        with torch.inference_mode():
            torch.testing.assert_close(m(y)[:, : t + 1], m(x)[:, : t + 1], atol=1e-6, rtol=0)


def test_padded_block_mask_is_the_exact_ones_blocks_or_more() -> None:
    """The padded block mask is derived from the cached one without evaluating n × n pairs:
    its full blocks are create_block_mask's, its computed ones a superset (a block whose real
    keys all lie outside the window is computed, its mask_mod hiding them)."""
    gen = torch.Generator().manual_seed(2)
    for n in (100, 128, 300):
        padded = torch.rand(3, n, generator=gen) < 0.3
        padded[1] = False
        padded[2, : n // 2 + 3] = True
        for pattern, window, causal in PATTERNS:
            cfg = FlexConfig(pattern, window, causal)
            allowed = block_masks.mask_mod(cfg, "cpu")
            base = create_block_mask(allowed, None, None, n, n, device="cpu")
            got = block_masks.padded_block_mask(base, allowed, padded)

            def exact(b, h, q, kv, allowed=allowed, padded=padded):
                return allowed(b, h, q, kv) & ~padded[b, kv]

            want = create_block_mask(exact, 3, None, n, n, device="cpu")
            assert torch.equal(got.full_kv_num_blocks, want.full_kv_num_blocks)
            g, w = got.to_dense().bool(), want.to_dense().bool()
            assert torch.equal(g | w, g), (n, pattern, window, causal)


# -- block-sparse FLOPs -------------------------------------------------------------------------


def _blocks_computed(block_mask, n: int) -> int:
    """Query-key pairs in the blocks a real block mask computes (full and partial), each
    block as large as the sequence lets it be."""
    dense = block_mask.to_dense()[0, 0].bool()  # (nq, nkv)
    size = block_mask.BLOCK_SIZE[0]
    extent = torch.tensor([min(n, (t + 1) * size) - t * size for t in range(dense.shape[0])])
    return int((extent[:, None] * extent[None, :])[dense].sum())


@pytest.mark.parametrize(("pattern", "window", "causal"), PATTERNS, ids=IDS)
def test_attention_flops_count_the_blocks_a_real_block_mask_computes(pattern, window, causal):
    for n in (1, 50, 128, 129, 200, 256, 300, 640):
        cfg = FlexConfig(pattern, window, causal)
        m = attnbench.create(
            "flex",
            d_model=D,
            n_heads=H,
            max_seq_len=n,
            pattern=pattern,
            window=window,
            causal=causal,
        )
        real = create_block_mask(block_masks.mask_mod(cfg, "cpu"), None, None, n, n, device="cpu")
        assert m.attention_flops(3, n) == 4 * 3 * D * _blocks_computed(real, n), (n, cfg)
        assert m.dense_attention_flops(3, n) == 4 * 3 * n * n * D
        assert m.attention_flops(3, n) <= m.dense_attention_flops(3, n)


def test_dense_flops_beside_the_block_sparse_count_even_on_meta() -> None:
    n = 640  # five blocks: a causal window of 64 computes 9 of the 25 block pairs
    with torch.device("meta"):
        full = attnbench.build_model("flex", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=n)
        band = attnbench.build_model(
            "flex",
            layers=2,
            d_model=D,
            n_heads=H,
            d_ff=48,
            max_seq_len=n,
            pattern="window",
            window=64,
            causal=True,
        )
        vanilla = attnbench.build_model(
            "vanilla", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=n
        )
    assert full.flops(2, n) == full.dense_flops(2, n) == vanilla.flops(2, n)
    assert band.dense_flops(2, n) == vanilla.flops(2, n)
    sparse = band.dense_flops(2, n) - band.flops(2, n)
    assert sparse == 2 * 4 * 2 * D * (25 - 9) * 128 * 128  # layers · 4·b·d · skipped pairs
    assert vanilla.dense_flops(2, n) == vanilla.flops(2, n)


# -- prepare: the block mask built once, timed apart ---------------------------------------------


def test_prepare_builds_once_and_shares_the_block_mask() -> None:
    n = 136  # a length no other test builds
    model = attnbench.build_model(
        "flex", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=n, pattern="window", window=32
    )
    assert model.prepare(n, "cpu") > 0.0  # the first layer builds it, the second finds it
    assert model.prepare(n, torch.device("cpu")) == 0.0
    again = attnbench.create(
        "flex", d_model=D, n_heads=H, max_seq_len=n, pattern="window", window=32
    )
    assert again.prepare(n, "cpu") == 0.0  # another model, the same mask
    wider = attnbench.create(
        "flex", d_model=D, n_heads=H, max_seq_len=n, pattern="window", window=34
    )
    assert wider.prepare(n, "cpu") > 0.0
    causal = attnbench.create("flex", d_model=D, n_heads=H, max_seq_len=n, pattern="causal")
    assert causal.prepare(n, "cpu") > 0.0
    same = attnbench.create("flex", d_model=D, n_heads=H, max_seq_len=n, causal=True, window=9)
    assert same.prepare(n, "cpu") == 0.0  # full + causal is pattern=causal; window unused
    vanilla = attnbench.build_model("vanilla", layers=2, d_model=D, n_heads=H, max_seq_len=n)
    assert vanilla.prepare(n, "cpu") == 0.0


def test_a_mask_first_built_by_a_forward_serves_a_training_step() -> None:
    """The first GPU run found it: an inference cell built the cached mask under
    inference_mode, and the next training cell failed ("Inference tensors cannot be saved
    for backward"). Built outside it, every tensor of the mask can be saved."""
    n = 144  # a length no other test builds
    layer = attnbench.create("flex", d_model=D, n_heads=H, max_seq_len=n, pattern="window")
    with torch.inference_mode():
        assert layer.prepare(n, "cpu") > 0.0
    mask = block_masks._block_masks[(n, *layer.cfg.key(), "cpu")]
    tensors = [t for t in mask.as_tuple() if isinstance(t, torch.Tensor)]
    assert tensors and not any(t.is_inference() for t in tensors)
    bounds = block_masks.mask_mod(layer.cfg, "cpu").__closure__
    assert not any(
        c.cell_contents.is_inference()
        for c in bounds or ()
        if isinstance(c.cell_contents, torch.Tensor)
    )


def test_on_meta_nothing_is_built_and_no_n_by_n_is_made() -> None:
    n = 4096
    with torch.device("meta"):
        model = attnbench.build_model(
            "flex", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=n, kv_heads=2
        )
    cached = dict(block_masks._block_masks)
    assert model.prepare(n, "meta") == 0.0
    x = torch.empty(3, n, D, device="meta")
    with torch.inference_mode():
        assert model(x).shape == (3, n, D)
        assert model(x, torch.zeros(3, n, dtype=torch.bool, device="meta")).shape == (3, n, D)
    assert block_masks._block_masks == cached


# -- what it refuses, in one line ----------------------------------------------------------------


def test_float64_on_cpu_is_refused_in_one_line() -> None:
    m = _flex("full", 64, False).double()
    with pytest.raises(ValueError, match="float64") as e:
        m(torch.randn(1, 8, D, dtype=torch.float64))
    assert "\n" not in str(e.value) and str(e.value).startswith("dtype:")


def test_a_dispatch_mode_on_real_tensors_is_refused_and_flex_still_runs() -> None:
    """Under a TorchDispatchMode Dynamo runs FlexAttention eagerly, which fails and breaks
    it for the rest of the process: refused before that, so the next call still runs."""
    from torch.utils.flop_counter import FlopCounterMode

    m = _flex("causal", 64, False)
    x, _ = _inputs()
    with torch.inference_mode():
        want = m(x)
        with pytest.raises(RuntimeError, match="TorchDispatchMode") as e:
            with FlopCounterMode(display=False):
                m(x)
        assert "\n" not in str(e.value)
        torch.testing.assert_close(m(x), want, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"pattern": "diagonal"}, "pattern: must be one of full, causal, window"),
        ({"pattern": "window", "window": 0}, "window: must be an integer >= 1"),
        ({"pattern": "window", "window": 7}, "window: must be even when pattern=window"),
        ({"window": "wide"}, "window: must be an integer"),
        ({"causal": "yes"}, "causal:"),
    ],
)
def test_bad_config_is_one_line_naming_the_parameter(params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as e:
        attnbench.create("flex", d_model=D, n_heads=H, max_seq_len=N, **params)
    assert "\n" not in str(e.value)


def test_odd_causal_window_and_window_unused_by_other_patterns_are_allowed() -> None:
    attnbench.create(
        "flex", d_model=D, n_heads=H, max_seq_len=N, pattern="window", window=7, causal=True
    )
    attnbench.create("flex", d_model=D, n_heads=H, max_seq_len=N, pattern="full", window=7)


def test_the_cli_refuses_a_bad_window_in_one_line(tmp_path, cli_in_process) -> None:
    # in this process (the same cli.main, refusing before anything runs): a refusal of
    # `attnbench run` in a fresh process is test_train.py's
    done = cli_in_process(
        "run",
        "attention=flex",
        "attention.params.pattern=window",
        "k=7",
        "n=256",
        f"out_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "window: must be even" in lines[0], done.stderr


def test_registry_says_what_it_does() -> None:
    info = attnbench.info("flex")
    assert (info.compiles, info.gqa, info.causal, info.budget) == (True, True, True, "window")
    assert info.cannot_train is None  # it trains on CUDA
    assert "no backward on CPU" in info.no_cpu_backward
    assert info.cannot_decode is not None and info.limits is None
    assert info.params == {
        "pattern": "full",
        "window": 256,
        "causal": False,
        "gate": "none",
        "sinks": False,
    }
    for other in attnbench.names():
        if other != "flex":
            assert not attnbench.info(other).compiles
            assert attnbench.info(other).no_cpu_backward is None


# -- packed rows: a document block mask ---------------------------------------------------------

PACKED_ROWS = [
    ((100, 28, 200, 1, 171),),  # documents across and inside blocks of 128, one of one token
    ((300, 200), (128, 128, 244)),  # two rows, whole blocks in one document
]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(("pattern", "window", "causal"), PATTERNS, ids=IDS)
@pytest.mark.parametrize("rows", PACKED_ROWS, ids=["one-row", "two-rows"])
def test_a_document_block_mask_keeps_each_document_to_itself(pattern, window, causal, rows):
    """PyTorch's unfused flex_attention over the document block mask, float64: each
    document's output is its own attention alone (the band inside it), and the blocks the
    mask computes are those ``document_pairs`` counts (the FLOPs), no block across two
    documents computed."""
    cfg = FlexConfig(pattern, window, causal)
    m64 = copy.deepcopy(_flex(pattern, window, causal)).double()
    t = sum(rows[0])
    x = torch.randn(len(rows), t, D, dtype=torch.float64)
    mask = block_masks.document_block_mask(rows, cfg, torch.device("cpu"))
    with torch.inference_mode():
        q, k, v = m64.qkv_heads(x)
        got = flex_attention(q, k, v, block_mask=mask, scale=m64.scale)
        for r, row in enumerate(rows):
            start = 0
            for n in row:
                end = start + n
                want = _band_attention(
                    q[r, :, start:end], k[r, :, start:end], v[r, :, start:end], cfg, m64.scale
                )
                torch.testing.assert_close(got[r, :, start:end], want, atol=FP64_TOL, rtol=0)
                start = end
    dense = mask.to_dense().bool()  # (b, 1, nq, nkv)
    size = mask.BLOCK_SIZE[0]
    extent = torch.tensor([min(t, (s + 1) * size) - s * size for s in range(dense.shape[-1])])
    counted = int(sum((extent[:, None] * extent[None, :])[d[0]].sum() for d in dense))
    assert counted == sum(block_masks.document_pairs((row,), cfg) for row in rows)


def _band_attention(q, k, v, cfg: FlexConfig, scale: float) -> torch.Tensor:
    """softmax over the keys in the pattern's band of i − j, (h, n, dh) each."""
    n = q.shape[-2]
    lo, hi = cfg.span()
    d = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~((d >= lo) & (d <= hi)), float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_a_packed_row_peaks_as_the_unpacked_row_does() -> None:
    """The document block mask is all a packed call adds: a packed row's peak on the CPU
    profiler is the unpacked row's plus at most the mask's build (blocks, not pairs: 7.7 kB
    here, 1.3 %, which the memory model leaves out as it does a padded call's mask), and on
    meta the two are one fused call over the row, so the memory model's figure for flex
    (held to the profiler at a base layer in test_memory_model.py) is the packed row's."""
    from attnbench.attention.packing import Packing
    from attnbench.measure.memory import profiled_peak, tracked_peak

    m = _flex("causal", 64, True)
    x = torch.randn(2, N, D)
    packing = Packing.of([(37, 100, 5, 40, 18)] * 2)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        m(x), m(x, packing=packing)  # compiled, once each
        alone = profiled_peak(lambda: m(x))
        packed = profiled_peak(lambda: m(x, packing=packing))
        build = profiled_peak(lambda: block_masks.document_block_mask(packing.rows, m.cfg, cpu))
    assert 0 <= packed - alone <= build, (packed, alone, build)
    meta = copy.deepcopy(m).to("meta")
    y = torch.empty(2, N, D, device="meta")
    with torch.inference_mode():
        assert tracked_peak(lambda: meta(y, packing=packing), 0) == tracked_peak(lambda: meta(y), 0)
