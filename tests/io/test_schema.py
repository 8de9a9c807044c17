"""Typed configs: every YAML value and flag is checked against its field before anything heavy starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from dit_sp import GenerateConfig, TrainConfig
from dit_sp.io.bundled import CONFIG_DIR, asset_path, config_path
from dit_sp.io.schema import ConfigError, from_mapping, load_yaml


@dataclass(frozen=True)
class Inner:
    rate: float = 1.0
    kind: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    count: int = 1
    flag: bool = False
    name: str = "x"
    window: tuple[int, int] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")


def test_values_are_coerced_to_their_field_types():
    config = from_mapping(Outer, {"count": "3", "flag": "true", "window": [0, 2], "inner": {"rate": "1e-4"}})
    assert config == Outer(count=3, flag=True, window=(0, 2), inner=Inner(rate=1e-4))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"cout": 2}, r"config: unknown key 'cout' \(did you mean 'count'\?\); valid keys: count, flag"),
        ({"count": 2.0}, r"config.count: expected an integer, got 2.0 \(float\)"),
        ({"count": True}, r"config.count: expected an integer, got True"),
        ({"flag": "yes"}, r"config.flag: expected true or false, got 'yes'"),
        ({"name": 3}, r"config.name: expected a string, got 3"),
        ({"window": [1]}, r"config.window: expected a list of 2 values or null, got \[1\]"),
        ({"inner": {"kind": "c"}}, r"config.inner.kind: expected one of 'a', 'b', got 'c'"),
        ({"inner": 3}, r"config.inner: expected a mapping of Inner settings, got 3"),
        ({"inner": {"rate": "fast"}}, r"config.inner.rate: expected a number, got 'fast'"),
        ({"count": 0}, r"config: count must be >= 1, got 0"),
    ],
)
def test_bad_values_name_the_key_and_what_is_valid(values, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(Outer, values)


def test_yaml_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml is not valid YAML at line 2"):
        load_yaml(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of settings, got list"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "none.yaml")


def test_bundled_files_are_found_by_name_from_anywhere():
    assert config_path("grpo_toy") == config_path("grpo_toy.yaml") == config_path("configs/grpo_toy.yaml")
    assert config_path("grpo_toy").parent == CONFIG_DIR
    assert asset_path("toy-wan").is_dir() and asset_path("assets/toy_prompts_train.txt").is_file()
    assert asset_path("no-such-asset") is None
    with pytest.raises(FileNotFoundError, match="no bundled config of that name .*grpo_toy"):
        config_path("grpo_nope")


def test_shipped_configs_are_valid():
    """Every bundled YAML config parses with the config class it is for (paths to real checkpoints aside)."""
    paths = sorted(CONFIG_DIR.glob("*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        if path.name.startswith("grpo_"):
            assert TrainConfig.load(path).max_steps > 0, path
        else:
            assert GenerateConfig.load(path, {"model": "tiny-wan"}).steps > 0, path


def test_train_config_errors_name_the_nested_key(tmp_path):
    with pytest.raises(ConfigError, match="GRPO needs a stochastic sampler"):
        TrainConfig.load(None, {"grpo.sde.kind": "ode"})
    with pytest.raises(
        ConfigError, match=r"config.grpo.sde.kind: expected one of 'dance', 'flow', 'cps', 'ode', got 'sdee'"
    ):
        TrainConfig.load(None, {"grpo.sde.kind": "sdee"})
    with pytest.raises(ConfigError, match=r"config.grpo.adv_std: expected one of 'group', 'global'"):
        TrainConfig.load(None, {"grpo.adv_std": "batch"})
    with pytest.raises(ConfigError, match=r"config.ulysses: expected an integer, got 2.0"):
        TrainConfig.load(None, {"ulysses": 2.0})
    with pytest.raises(ConfigError, match=r"config.mixed_precision: expected one of 'bfloat16', 'float16' or null"):
        TrainConfig.load(None, {"mixed_precision": "fp8"})
    with pytest.raises(ConfigError, match=r"^config.optim: lr must be > 0, got -1.0$"):
        TrainConfig.load(None, {"optim.lr": -1})
    assert TrainConfig.load(None, {"optim.lr": "1e-4"}).optim.lr == 1e-4  # YAML 1.1 reads 1e-4 as a string
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_step: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'max_step' \(did you mean 'max_steps'\?\); valid keys: "):
        TrainConfig.load(bad)
    with pytest.raises(FileNotFoundError, match="no such file, and no bundled config"):
        TrainConfig.load(tmp_path / "missing.yaml")


def test_generate_config_takes_the_models_defaults_then_overrides():
    toy = GenerateConfig.load()
    assert (toy.model, toy.frames, toy.height, toy.steps) == ("toy-wan", 9, 32, 20)
    assert GenerateConfig.load(overrides={"model": "tiny-wan", "steps": "3"}).steps == 3
    with pytest.raises(ConfigError, match="cfg_parallel runs the two guidance branches in parallel"):
        GenerateConfig.load(overrides={"cfg_parallel": True, "guidance": 1})
