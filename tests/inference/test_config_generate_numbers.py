"""GenerateConfig's numbers: flags (strings), YAML and batch lines are refused up front, in one line naming the
key, when a float is NaN or infinite or an integer is out of its range (seeds included)."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError
from dit_sp.inference import read_batch


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"guidance": "nan"}, r"^settings.guidance: expected a finite number, got 'nan' \(str\)$"),
        ({"guidance": "inf"}, r"^settings.guidance: expected a finite number, got 'inf'"),
        ({"guidance": "-inf"}, r"^settings.guidance: expected a finite number, got '-inf'"),
        ({"embedded_guidance": ".nan"}, r"^settings.embedded_guidance: expected a finite number or null, got '.nan'"),
        ({"guidance_2": "Infinity"}, r"^settings.guidance_2: expected a finite number or null, got 'Infinity'"),
        ({"seed": str(2**64)}, r"^settings: seed must be in \[0, 9223372036854775807\] \(0 to 2\*\*63 - 1\), got 1844"),
        ({"seed": str(2**63)}, r"^settings: seed must be in \[0, 9223372036854775807\]"),
        ({"seed": "-1"}, r"^settings: seed must be in \[0, 9223372036854775807\]"),
        ({"steps": "-1"}, r"^settings: steps must be >= 1, got -1$"),
        ({"frames": "0"}, r"^settings: frames must be >= 1, got 0$"),
        ({"max_sequence_length": "0"}, r"^settings: max_sequence_length must be >= 1, got 0$"),
        ({"dp": "0"}, r"^settings: dp must be >= 1, got 0$"),
        ({"cache": "first_block:nan"}, r"^settings: cache threshold must be a finite number >= 0, got nan$"),
        ({"cache": "teacache:inf"}, r"^settings: cache threshold must be a finite number >= 0, got inf$"),
        ({"cache": "teacache", "teacache_coefficients": [1, ".nan"]},
         r"^settings.teacache_coefficients\[1\]: expected a finite number, got '.nan'"),
        ({"cache_thresholds": {"teacache": ".inf"}}, r"^settings.cache_thresholds.teacache: expected a finite number"),
    ],
)  # fmt: skip
def test_flags_refuse_non_finite_numbers_and_out_of_range_integers(overrides, message):
    """``pipelines.generate`` passes its flags as strings to ``GenerateConfig.load``: these are its paths."""
    with pytest.raises(ConfigError, match=message):
        GenerateConfig.load(overrides=overrides)


def test_yaml_reads_the_same(tmp_path):
    path = tmp_path / "gen.yaml"
    path.write_text("guidance: .inf\n")  # YAML reads .inf as a float
    with pytest.raises(ConfigError, match=rf"^{path}.guidance: expected a finite number, got inf \(float\)$"):
        GenerateConfig.load(path)
    path.write_text("seed: 99999999999999999999\n")
    with pytest.raises(ConfigError, match=rf"^{path}: seed must be in \[0, 9223372036854775807\]"):
        GenerateConfig.load(path)


def test_the_largest_seed_and_finite_numbers_load():
    config = GenerateConfig.load(overrides={"seed": str(2**63 - 1), "guidance": "1e1", "embedded_guidance": "6"})
    assert (config.seed, config.guidance, config.embedded_guidance) == (2**63 - 1, 10.0, 6.0)


def test_a_batch_line_names_its_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b", "guidance": NaN}\n')  # Python's json reads NaN
    with pytest.raises(ConfigError, match=rf"^{prompts}:2.guidance: expected a finite number, got nan"):
        read_batch(GenerateConfig.load(overrides={"prompts": str(prompts)}))
    prompts.write_text('{"prompt": "a", "seed": 18446744073709551616}\n')
    with pytest.raises(ConfigError, match=rf"^{prompts}:1: seed must be in \[0, 9223372036854775807\]"):
        read_batch(GenerateConfig.load(overrides={"prompts": str(prompts)}))


def test_every_scalar_float_setting_refuses_nan_even_when_built_in_python():
    """Range checks are written so that NaN fails them, so ``GenerateConfig(guidance=nan)`` fails too."""
    hints = typing.get_type_hints(GenerateConfig)
    floats = [f.name for f in dataclasses.fields(GenerateConfig) if hints[f.name] in (float, float | None)]
    assert {"guidance", "embedded_guidance", "guidance_2"} <= set(floats)
    for name in floats:
        with pytest.raises(ConfigError, match=rf"^{name} must be a finite number, got nan$"):
            GenerateConfig(**{name: math.nan})
