"""The published shapes as model presets (conf/model/{qwen3_next,kimi_linear,gpt_oss,jamba,
deepseek_v3}.yaml and their ``_small`` variants): each composes through Hydra with the
attention its comment pairs it with and validates; each layer's cache per token is counted
here by hand from the published configuration, and the figures the papers publish are held
against the model's own: Jamba's 4 GiB against Mixtral's 32 GiB at 256K tokens, Kimi
Linear's share of cache saved at 1M tokens, DeepSeek-V3's latent cache against its
multi-head equivalent, Qwen3-Next's and gpt-oss's against their all-attention twins. Each
small variant runs one real forward on the CPU.

The full presets are built on meta (no memory, no time); the hand counts are elements per
sequence, bytes in bf16 (2 a number)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch

from attnbench.model import Encoder
from attnbench.plan import Resolved, validate
from attnbench.runner import build
from attnbench.schedule import layers_of, tiled
from attnbench.sweep.cells import cell_from_cfg
from attnbench.sweep.config import expand_jobs

# this checkout's conf/, searched first: the presets are composed from the files under test
CONF = str(Path(__file__).resolve().parents[1] / "conf")
K128, M1, K256 = 128 * 1024, 1024 * 1024, 256 * 1024
BF16 = 2
GiB = 1 << 30

# each preset as served: conf/arch/NAME.yaml composes the model with its attention pairing,
# and NAME_twin.yaml its all-attention (DeepSeek-V3: multi-head) twin; one home for both
NAMES = ["qwen3_next", "kimi_linear", "gpt_oss", "jamba", "deepseek_v3"]
ARCHS = NAMES + [f"{name}_small" for name in NAMES]
FULL = NAMES


def composed_job(name: str, *extra: str, dtype: str = "bf16", n: int = 1024) -> Resolved:
    """``arch=NAME`` composed as ``attnbench run`` composes it, validated."""
    args = [f"arch={name}", "device=cpu", f"dtype={dtype}", f"n={n}", *extra]
    (job,), _ = expand_jobs(args, config_dir=CONF)
    return validate(cell_from_cfg(job))


@cache
def composed(name: str, *extra: str) -> Encoder:
    """``arch=NAME`` with ``extra`` overrides, validated and built on meta (bf16; every
    preset is causal: it decodes)."""
    res = composed_job(name, *extra)
    return build(res.cell, res, "meta", torch.bfloat16)


def twin(name: str) -> Encoder:
    """The twin: ``arch=NAME_twin``."""
    return composed(f"{name}_twin")


# -- hand counts, from each configuration's keys (the preset files cite them) ------------


def kv(heads: int, head_dim: int, n: int) -> int:
    """A softmax attention's keys and values: 2 · kv_heads · head_dim a token."""
    return 2 * heads * head_dim * n


def delta_state(heads: int, d_model: int, conv: int = 4, v_heads: int | None = None) -> int:
    """Gated DeltaNet's and KDA's state as ours keeps it: a (d/h)² matrix per value head
    (``v_heads``, the h key heads where None) plus the convolution's last conv − 1 inputs of
    q and k (d channels each) and v (v_heads·d/h)."""
    dh, v_heads = d_model // heads, v_heads or heads
    return v_heads * dh * dh + (conv - 1) * (2 * d_model + v_heads * dh)


def hand_layers(name: str, n: int) -> list[int]:
    """Each layer's context elements at n, written from the published configuration."""
    if name == "qwen3_next":  # 48 layers, full attention where (i + 1) % 4 == 0
        # GDN 16 key heads of 128 and 32 value heads (conv_dim 2·2048 + 4096); GQA 2 x 256
        lin, full = delta_state(16, 2048, v_heads=32), kv(2, 256, n)
        assert lin == 32 * 128 * 128 + 3 * (2 * 2048 + 4096) == 548_864
        return [full if (i + 1) % 4 == 0 else lin for i in range(48)]
    if name == "kimi_linear":  # MLA at the 1-based layers 4, 8, ..., 24, 27
        mla, kda = (512 + 64) * n, delta_state(18, 2304)  # kv_lora_rank + qk_rope_head_dim
        return [mla if i + 1 in (4, 8, 12, 16, 20, 24, 27) else kda for i in range(27)]
    if name == "gpt_oss":  # 36 layers, sliding where (i + 1) % 2 (layer 0), window 128
        sliding, full = kv(8, 64, min(128, n)), kv(8, 64, n)  # both GQA 8 x 64
        return [sliding if (i + 1) % 2 else full for i in range(36)]
    if name == "jamba":  # 32 layers, attention where i % 8 == 4
        mamba = 32 * 16 * 128 + (4 - 1) * (4096 + 2 * 16)  # h·d_state·P + (K − 1)(d + 2N)
        return [kv(8, 128, n) if i % 8 == 4 else mamba for i in range(32)]
    if name == "deepseek_v3":  # 61 layers of MLA
        return [(512 + 64) * n] * 61
    raise KeyError(name)


@pytest.mark.parametrize("name", ARCHS)
def test_every_preset_composes_and_validates_with_its_pairing(name: str) -> None:
    """Named, causal; its twin the same model without a schedule (DeepSeek-V3's: sdpa over
    the same heads); its small variant the same pattern of kinds (Kimi Linear's cut to 7
    layers: 3 KDA, MLA, 2 KDA, MLA, as the published model ends) and mechanisms."""
    model, cell, pair = composed(name), composed_job(name).cell, composed_job(f"{name}_twin").cell
    assert model.layer_context_elements(8)  # built, every layer counted
    assert cell.model.name == name and pair.model.name == f"{name}_twin"
    assert dict(cell.params)["causal"] and pair.model.schedule is None
    assert (
        (pair.attention == "sdpa") if name.startswith("deepseek") else pair.model.schedule is None
    )
    assert pair.model.layers == cell.model.layers and pair.model.d_model == cell.model.d_model
    if name.endswith("_small"):
        big, small = composed(name.removesuffix("_small")), model
        mechanisms = {type(layer.attn).__name__ for layer in big.layers}
        assert {type(layer.attn).__name__ for layer in small.layers} == mechanisms


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("n", [1, K128, M1])
def test_each_layers_cache_is_the_hand_count_from_the_config(name: str, n: int) -> None:
    assert composed(name).layer_context_elements(n) == hand_layers(name, n)


def test_jamba_at_256k_is_4_gib_against_its_mixtral_shaped_twins_32() -> None:
    """The Jamba paper's table 1: 4 GB of KV cache at 256K tokens against Mixtral's 32 GB.
    Four attention layers of 2·8·128 a token in bf16: 4 · 4096 B · 262 144 = 2³² B exactly;
    the twin's 32 layers 2³⁵ B. The 28 Mamba layers add their constant state (4.2 MiB)."""
    model, mixtral = composed("jamba"), twin("jamba")
    attention = [b for b in model.layer_context_bytes(K256, BF16) if b > 1 << 20]
    assert len(attention) == 4 and sum(attention) == 4 * GiB == 4_294_967_296
    assert mixtral.context_bytes(K256, BF16) == 32 * GiB == 34_359_738_368
    mamba = 28 * (32 * 16 * 128 + 3 * (4096 + 32)) * BF16
    assert model.context_bytes(K256, BF16) == 4 * GiB + mamba == 4_299_330_816


def test_kimi_linears_cache_saved_at_1m_is_the_published_up_to_75_percent() -> None:
    """The Kimi Linear report: up to 75 % less KV cache than full MLA at 1M tokens. Seven
    MLA layers in 27 bound the saving at 1 − 7/27 = 74.07 % (75 % is the 3:1 ratio's
    limit); the KDA states take 0.03 % off that."""
    hybrid, mla = composed("kimi_linear").context_elements(M1), twin("kimi_linear")
    assert mla.context_elements(M1) == 27 * 576 * M1 == 16_307_453_952
    assert hybrid == 7 * 576 * M1 + 20 * delta_state(18, 2304) == 4_234_171_392
    saved = 1 - hybrid / mla.context_elements(M1)
    assert 0.7400 < saved < 1 - 7 / 27 < 0.75, saved  # 74.04 %


def test_deepseek_v3s_latent_cache_against_its_multi_head_equivalent() -> None:
    """576 elements a token and layer (kv_lora_rank 512 + qk_rope_head_dim 64), 35 136 over
    61 layers, against 2 · 128 heads · 128 = 32 768 a layer for multi-head attention of the
    same heads (DeepSeek-V2's comparison, 2·n_h·d_h·l): 1.76 %, 56.9x less."""
    mla, mha = composed("deepseek_v3"), twin("deepseek_v3")
    assert mla.context_elements(1) == 61 * 576 == 35_136
    assert mha.context_elements(1) == 61 * 2 * 128 * 128 == 1_998_848


def test_qwen3_next_and_gpt_oss_against_their_twins() -> None:
    """Per sequence at 128K: Qwen3-Next keeps 12 of 48 layers' K/V (2·2·256 a token) and 36
    fixed states (32 value heads of 128 × 128 and the window), 25.3 % of its all-attention
    twin; gpt-oss keeps 18 full layers and 18 windows of 128 (of its 8 key/value heads, as
    published: 131 072 elements a layer, 0.1 % of the model's cache at 128K), 50.05 % of its
    twin."""
    qwen, qwen_twin = composed("qwen3_next"), twin("qwen3_next")
    assert qwen.context_elements(K128) == 12 * 1024 * K128 + 36 * 548_864 == 1_630_371_840
    assert qwen_twin.context_elements(K128) == 48 * 1024 * K128 == 6_442_450_944
    gpt, gpt_twin = composed("gpt_oss"), twin("gpt_oss")
    assert gpt.context_elements(K128) == 18 * 1024 * K128 + 18 * 131_072 == 2_418_278_400
    assert gpt_twin.context_elements(K128) == 36 * 1024 * K128 == 4_831_838_208
    windows = 18 * 131_072 / gpt.context_elements(K128)
    assert 0.0009 < windows < 0.001


@pytest.mark.parametrize("name", [name for name in ARCHS if name.endswith("_small")])
def test_each_small_variant_serves_its_forward_on_the_cpu(name: str) -> None:
    """One real forward (fp32, b = 1, 32 tokens): finite, of the input's shape, each layer
    the kind its pattern says; and in float64 a prefill of 12 tokens then one token at a time
    over every layer's own state (KV cache, window, latent, recurrent state) is the forward."""
    res = composed_job(name, dtype="fp32", n=32)
    kinds = [layer.kind for layer in layers_of(res.cell)]
    if res.cell.model.schedule is not None:
        assert kinds == tiled(res.cell.model.schedule, res.cell.model.layers)
    torch.manual_seed(0)
    model = build(res.cell, res, "cpu", torch.float32)
    x = torch.randn(1, 32, res.cell.model.d_model)
    with torch.no_grad():
        y = model(x)
        assert y.shape == x.shape and torch.isfinite(y).all()
        model, x = model.double(), x.double()
        states = model.new_state(1, 32, torch.float64, "cpu")
        steps = [model.extend(x[:, :12], states)]
        steps += [model.extend(x[:, t : t + 1], states) for t in range(12, 32)]
    assert (torch.cat(steps, dim=1) - model(x)).abs().max() < 1e-10
