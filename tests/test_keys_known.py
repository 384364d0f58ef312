"""Every key of ``attnbench run`` is known or refused (attnbench/sweep/keys.py): with or
without ``+``, at any depth, one line naming the key and what was probably meant, exit 2,
nothing written. Before, ``+compile_mod=max-autotune`` ran eager without a word and
``kv_heads=3`` got Hydra's advice to add the ``+`` that leads there. In-process:
tests/test_run_cli.py runs a refusal of ``attnbench run`` as a real process."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.sweep import keys


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("+compile_mod=max-autotune",), "compile_mod: unknown key; did you mean compile_mode?"),
        (("+decode_tokenz=8",), "decode_tokenz: unknown key; did you mean decode_tokens?"),
        (("+compile_options=x",), "compile_options: unknown key; did you mean compile_mode?"),
        (("kv_heads=3",), "kv_heads: unknown key; did you mean model.kv_heads?"),
        (("+kv_heads=3",), "kv_heads: unknown key; did you mean model.kv_heads?"),
        (("-m", "kv_heads=3,4"), "kv_heads: unknown key; did you mean model.kv_heads?"),
        (("++model.layer=3",), "model.layer: unknown key; did you mean model.layers?"),
        (("+timing.foo=1",), "timing.foo: unknown key; timing has cpu_batch, flush_l2,"),
        (("+quality.mqar.vocab=8",), "quality.mqar.vocab: unknown key; did you mean quality.mqar"),
        (("+sweep=smoke", "+decode_tokenz=8"), "decode_tokenz: unknown key; did you mean"),
    ],
)
def test_an_unknown_key_is_one_line_with_what_was_meant_and_nothing_written(
    tmp_path: Path, cli_in_process, args: tuple[str, ...], line: str
) -> None:
    out = cli_in_process("run", *args, cwd=tmp_path)
    assert out.returncode == 2, out
    assert out.stderr.startswith(f"attnbench run: error: {line}"), out.stderr
    assert out.stderr.count("\n") == 1 and not out.stdout
    assert not any(tmp_path.iterdir())


def test_a_key_of_a_users_config_dir_is_known(tmp_path: Path) -> None:
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text("# @package _global_\nmy_note: hello\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "wide.yaml").write_text("layers: 2\nd_model: 64\nmy_width: 3\n")
    known = keys.known_keys([tmp_path])
    assert {"my_note", "model.my_width", "model.kv_heads", "timing.min_seconds"} <= known
    assert "my_note" not in keys.known_keys()
