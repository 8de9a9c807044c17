"""Overrides merge deeply: one key changes one key, in ``TrainConfig.load`` and ``GenerateConfig.load`` alike;
sections and tables merge, lists and whole values (a reward spec) replace."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from dit_sp import GenerateConfig, TrainConfig
from dit_sp.io.schema import ConfigError, merge, to_yaml
from dit_sp.rl.metrics import WandbConfig


@dataclass(frozen=True)
class Inner:
    rate: float = 1.0
    kind: str = "a"


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    table: dict[str, float] | None = None
    window: list[int] | None = None
    spec: Any = None


def test_sections_and_tables_merge_key_by_key_and_the_rest_replaces():
    base = {"inner": {"rate": 2.0, "kind": "b"}, "maybe": {"rate": 3.0}, "table": {"x": 1.0, "y": 2.0},
            "window": [0, 2], "spec": {"brightness": 1.0}}  # fmt: skip
    frozen = copy.deepcopy(base)
    over = {"inner": {"rate": 5.0}, "maybe": {"kind": "c"}, "table": {"y": 9.0}, "window": [1], "spec": {"s": 0.5}}
    merged = merge(Outer, base, over)
    assert merged == {"inner": {"rate": 5.0, "kind": "b"}, "maybe": {"rate": 3.0, "kind": "c"},
                      "table": {"x": 1.0, "y": 9.0}, "window": [1], "spec": {"s": 0.5}}  # fmt: skip
    assert base == frozen  # neither input changes
    merged["inner"]["rate"] = 0.0
    assert over["inner"]["rate"] == 5.0


def test_a_dotted_key_sets_one_entry_and_fills_a_null_section():
    assert merge(Outer, {"maybe": None}, {"maybe.rate": 4.0}) == {"maybe": {"rate": 4.0}}
    assert merge(Outer, {"spec": {"a": 1}}, {"spec.b": 2}) == {"spec": {"a": 1, "b": 2}}  # a dotted key adds
    assert merge(Outer, {"inner": {"rate": 2.0}}, {"inner": 3}) == {"inner": 3}  # from_mapping reports it
    with pytest.raises(ConfigError, match=r"^spec: expected a mapping of settings, got 'brightness'$"):
        merge(Outer, {"spec": "brightness"}, {"spec.x": 1})


def test_train_config_override_of_a_section_keeps_the_files_other_keys():
    """The issue's case: ``{"grpo": {"group_size": 4}}`` used to replace the whole ``grpo`` section."""
    file = TrainConfig.load("grpo_toy")
    config = TrainConfig.load("grpo_toy", {"grpo": {"group_size": 4, "sde": {"a": 0.5}}, "lora": {"alpha": 16}})
    assert config.grpo.group_size == 4 and config.grpo.sde.a == 0.5 and config.lora.alpha == 16
    assert config.grpo.sde.kind == file.grpo.sde.kind == "flow"
    assert (config.grpo.steps, config.grpo.kl_coef, config.lora.rank) == (10, 0.1, 8)  # the file's, not defaults
    assert config == TrainConfig.load("grpo_toy", {"grpo.group_size": 4, "grpo.sde.a": 0.5, "lora.alpha": 16})
    assert TrainConfig.load("grpo_toy", {"grpo": {"sde_window": [1, 3]}}).grpo.sde_window == (1, 3)  # replaced
    assert TrainConfig.load("grpo_toy", {"reward": {"saturation": 1.0}}).reward == {"saturation": 1.0}
    assert TrainConfig.load("grpo_toy", {"wandb": {"name": "r1"}}).wandb == WandbConfig(name="r1")
    with pytest.raises(ConfigError, match=r"grpo_toy.grpo: unknown key 'group_sise' \(did you mean 'group_size'\?\)"):
        TrainConfig.load("grpo_toy", {"grpo": {"group_sise": 4}})


def test_generate_config_layers_merge_their_tables(tmp_path):
    """Model defaults, then the file, then overrides: a table entry changes that entry only."""
    config = GenerateConfig.load("wan2.1-t2v-1.3b", {"model": "tiny-wan", "cache_thresholds": {"teacache": 0.2}})
    assert config.cache_thresholds == {"first_block": 0.05, "teacache": 0.2}
    assert config.frames == 81 and len(config.teacache_coefficients) == 5  # the file's, kept
    dotted = GenerateConfig.load("wan2.1-t2v-1.3b", {"model": "tiny-wan", "cache_thresholds.first_block": 0.1})
    assert dotted.cache_thresholds == {"first_block": 0.1, "teacache": 0.08}
    listed = GenerateConfig.load("wan2.1-t2v-1.3b", {"model": "tiny-wan", "teacache_coefficients": [1.0, 0.0]})
    assert listed.teacache_coefficients == [1.0, 0.0]
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: tiny-wan\nsteps: 3\n")
    layered = GenerateConfig.load(mine, {"frames": 5})
    assert (layered.steps, layered.frames, layered.height) == (3, 5, 48)  # file, override, the model's default


def test_printed_configs_load_back_equal(tmp_path):
    """``to_yaml`` (what ``--print-config`` prints) is a config file: tuples, infinities and tables included."""
    train = TrainConfig.load("grpo_toy", {"optim.max_grad_norm": ".inf", "grpo.sde_window": [0, 2]})
    (tmp_path / "train.yaml").write_text(to_yaml(train))
    assert TrainConfig.load(tmp_path / "train.yaml") == train
    generate = GenerateConfig.load("wan2.1-t2v-1.3b", {"model": "tiny-wan"})
    (tmp_path / "generate.yaml").write_text(to_yaml(generate))
    assert GenerateConfig.load(tmp_path / "generate.yaml") == generate
