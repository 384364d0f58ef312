"""The registry: names, info, strict configs, user registration, one-line errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import attnbench
from attnbench import registry
from attnbench.attention.base import MultiHeadAttention

BUILTINS = {
    "vanilla",
    "sdpa",
    "xformers",
    "linformer",
    "performer",
    "nystromformer",
    "linear",
    "local",
    "reformer",
}


def test_builtins_registered() -> None:
    assert BUILTINS <= set(attnbench.names())


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_info_is_complete(name: str) -> None:
    i = attnbench.info(name)
    assert i.name == name and i.summary
    assert set(i.devices) <= {"cpu", "cuda"} and i.devices
    assert set(i.dtypes) <= {"fp32", "fp16", "bf16"} and i.dtypes
    assert i.unavailable is None or (i.unavailable and "\n" not in i.unavailable)
    if i.budget is not None:
        assert i.budget in i.params


def test_capabilities_as_documented() -> None:
    lin = attnbench.info("linformer")
    assert (lin.causal, lin.fixed_max_len, lin.budget) == (False, True, "k")
    assert attnbench.info("performer").budget == "nb_features"
    assert attnbench.info("vanilla").causal and not attnbench.info("vanilla").fixed_max_len


def test_xformers_says_why_on_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: xformers may be usable")
    assert (
        "CUDA" in attnbench.info("xformers").unavailable
        or "not installed" in attnbench.info("xformers").unavailable
    )


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("nope", {}, "attention: unknown mechanism 'nope'"),
        ("vanilla", {"caussal": True}, "unknown parameter 'caussal'"),
        ("linformer", {"sharing": "rows"}, "sharing: must be one of none, headwise, kv, layerwise"),
        ("linformer", {"projection": "fft"}, "projection: must be one of linear, random"),
        ("linformer", {"k": 0}, "k: must be an integer >= 1"),
        ("linformer", {"k": 129}, "k: must be an integer in [1, 128]"),
        ("linformer", {"k": 48, "projection": "conv"}, "k must divide max_seq_len=128"),
        ("linformer", {"causal": True}, "causal: Linformer cannot be causal"),
        ("linformer", {"k_decay": 1.5}, "k_decay: must be a number in (0, 1]"),
        ("sdpa", {"backend": "tensorcore"}, "backend: must be one of auto, math"),
        ("vanilla", {"causal": "yes"}, "causal: must be true or false"),
    ],
)
def test_bad_parameters_raise_one_clear_line(name: str, params: dict, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        attnbench.create(name, d_model=64, n_heads=4, max_seq_len=128, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ({"d_model": 66, "n_heads": 4}, "d_model: must be divisible by n_heads=4, got 66"),
        ({"d_model": 64, "n_heads": 0}, "n_heads: must be an integer >= 1"),
        ({"d_model": 64, "n_heads": 4, "max_seq_len": -1}, "max_seq_len: must be an integer >= 1"),
    ],
)
def test_bad_shapes_raise(shape: dict, needle: str) -> None:
    shape = {"max_seq_len": 16} | shape
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        attnbench.create("vanilla", **shape)


def test_user_mechanism_shows_up_and_duplicates_are_refused() -> None:
    @dataclass
    class EchoConfig:
        scale: float = 1.0

    @attnbench.register("echo_test", config=EchoConfig, causal=False, summary="returns V")
    class Echo(MultiHeadAttention):
        def attend(self, x, key_padding_mask):
            return self.v_proj(x) * self.cfg.scale

    try:
        assert "echo_test" in attnbench.names()
        m = attnbench.create("echo_test", d_model=8, n_heads=2, max_seq_len=4, scale=2.0)
        assert m(torch.randn(1, 4, 8)).shape == (1, 4, 8)
        model = attnbench.build_model(
            "echo_test", layers=2, d_model=8, n_heads=2, d_ff=16, max_seq_len=4
        )
        assert model(torch.randn(1, 4, 8)).shape == (1, 4, 8)
        with pytest.raises(ValueError, match="already registered"):
            attnbench.register("echo_test", config=EchoConfig, causal=False, summary="x")(Echo)
    finally:
        registry._REGISTRY.pop("echo_test", None)


def test_registration_refuses_non_mechanisms() -> None:
    @dataclass
    class C:
        k: int = 1

    with pytest.raises(TypeError, match="not a MultiHeadAttention"):
        attnbench.register("bad_test", config=C, causal=False, summary="x")(torch.nn.Linear)
    with pytest.raises(TypeError, match="must be a dataclass"):
        attnbench.register("bad_test", config=dict, causal=False, summary="x")
    with pytest.raises(ValueError, match="budget 'z' is not a config field"):
        attnbench.register("bad_test", config=C, causal=False, summary="x", budget="z")
    assert "bad_test" not in attnbench.names()


def test_plugin_module_from_environment(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_plugin_mod.py").write_text(
        "from dataclasses import dataclass\n"
        "import attnbench\n"
        "from attnbench.attention.base import MultiHeadAttention\n"
        "@dataclass\nclass Cfg:\n    pass\n"
        "@attnbench.register('plugin_test', config=Cfg, causal=False, summary='p')\n"
        "class P(MultiHeadAttention):\n"
        "    def attend(self, x, key_padding_mask):\n        return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PLUGIN_ENV, "my_plugin_mod")
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "plugin_test" in attnbench.names()
    finally:
        registry._REGISTRY.pop("plugin_test", None)
    monkeypatch.setenv(registry.PLUGIN_ENV, "no_such_plugin_mod")
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.raises(ImportError, match="ATTNBENCH_PLUGINS: cannot import 'no_such_plugin_mod'"):
        attnbench.names()


def test_bad_input_tensors() -> None:
    m = attnbench.create("vanilla", d_model=16, n_heads=2, max_seq_len=8)
    with pytest.raises(ValueError, match=r"x: must be \(batch, n >= 1, 16\)"):
        m(torch.randn(2, 8, 12))
    with pytest.raises(ValueError, match="key_padding_mask: must be bool"):
        m(torch.randn(2, 8, 16), torch.zeros(2, 8))


def test_info_params_cannot_be_changed_by_a_caller() -> None:
    attnbench.info("linformer").params["k"] = 1
    assert attnbench.info("linformer").params["k"] == 256


def test_integral_types_are_integers_and_floats_are_not() -> None:
    import numpy as np

    layer = attnbench.create(
        "linformer", d_model=np.int64(32), n_heads=4, max_seq_len=64, k=np.int32(8)
    )
    assert layer.k == 8 and isinstance(layer.k, int)
    with pytest.raises(ValueError, match=r"k: must be an integer >= 1, got 8\.0"):
        attnbench.create("linformer", d_model=32, n_heads=4, max_seq_len=64, k=8.0)
    with pytest.raises(ValueError, match="attention: unknown mechanism"):
        attnbench.create(["vanilla"], d_model=32, n_heads=4, max_seq_len=64)


def test_input_on_another_dtype_is_one_clear_line() -> None:
    m = attnbench.create("vanilla", d_model=16, n_heads=2, max_seq_len=8)
    with pytest.raises(ValueError, match=r"x: is torch.float16 on cpu but the module is"):
        m(torch.randn(1, 8, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"x: must be \(batch, n >= 1, 16\)"):
        m(torch.randn(1, 0, 16))


def test_a_broken_plugin_is_reported_every_time(monkeypatch) -> None:
    monkeypatch.setenv(registry.PLUGIN_ENV, "no_such_plugin_mod")
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    for _ in range(2):
        with pytest.raises(ImportError, match="no_such_plugin_mod"):
            attnbench.names()
