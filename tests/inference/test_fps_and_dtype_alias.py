"""``GenerateConfig``'s frame rate (``fps``: the model's by default, a checkpoint family's for a checkpoint) and
the short dtype names (``bf16`` for ``bfloat16``, as ``--dtype bf16`` gives them)."""

from __future__ import annotations

import json

import pytest

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError


@pytest.mark.parametrize(("short", "name"), [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_short_dtype_names(short, name):
    assert GenerateConfig.load(overrides={"model": "tiny-wan", "dtype": short}).dtype == name
    assert GenerateConfig(dtype=short).dtype == name  # built in Python too


def test_a_bad_dtype_lists_the_names():
    with pytest.raises(ConfigError, match=r"dtype: expected one of 'float32', 'bfloat16', 'float16', 'fp32', 'bf16'"):
        GenerateConfig.load(overrides={"dtype": "float8"})


def test_fps_defaults_to_the_models(tmp_path):
    assert GenerateConfig.load(overrides={"model": "tiny-wan"}).fps == 8.0
    assert GenerateConfig.load(overrides={"model": "tiny-wan", "fps": "24"}).fps == 24.0  # a flag: a string
    for pipeline, fps in (("WanPipeline", 16), ("HunyuanVideoPipeline", 15), ("CogVideoXPipeline", 8)):
        (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
        assert GenerateConfig.load(overrides={"model": str(tmp_path)}).fps == fps
    for bad, message in (("0", "fps must be > 0, got 0"), ("nan", "fps: expected a finite number")):
        with pytest.raises(ConfigError, match=message):
            GenerateConfig.load(overrides={"model": "tiny-wan", "fps": bad})
