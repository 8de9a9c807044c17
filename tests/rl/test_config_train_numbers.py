"""TrainConfig's numbers: every float setting of the tree refuses NaN and infinities (YAML, ``--set`` values,
Python) naming its dotted key, unless the field opts in to infinity; integers and seeds are range-checked."""

from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest

from dit_sp import TrainConfig
from dit_sp.errors import ConfigError
from dit_sp.io.schema import ALLOW_INF
from dit_sp.rl.rewards import check_reward


def _float_settings(cls: type, prefix: str = "") -> list[tuple[str, bool, typing.Any]]:
    """``(dotted key, opts in to infinity, a NaN of the field's shape)`` for every float setting under ``cls``."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, key = hints[f.name], prefix + f.name
        options = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
        for option in options:
            origin = typing.get_origin(option)
            if dataclasses.is_dataclass(option):
                found += _float_settings(option, key + ".")
            elif option is float:
                found.append((key, bool(f.metadata.get(ALLOW_INF)), math.nan))
            elif origin in (list, tuple) and float in typing.get_args(option):
                found.append((key, False, [math.nan]))
            elif origin is dict and float in typing.get_args(option):
                found.append((key, False, {"x": math.nan}))
    return found


SETTINGS = _float_settings(TrainConfig)


def test_the_float_settings_found_are_the_whole_tree():
    keys = {key for key, _, _ in SETTINGS}
    assert {"sample.guidance", "sample.embedded_guidance", "optim.lr", "optim.weight_decay", "optim.max_grad_norm",
            "lora.alpha", "grpo.shift", "grpo.clip_range", "grpo.kl_coef", "grpo.adv_clip", "grpo.train_fraction",
            "grpo.sde.eta", "grpo.sde.a", "ema_decay"} <= keys  # fmt: skip
    assert {key for key, opted, _ in SETTINGS if opted} == {"optim.max_grad_norm", "grpo.adv_clip"}


@pytest.mark.parametrize(("key", "opted", "nan"), SETTINGS, ids=[s[0] for s in SETTINGS])
def test_every_float_setting_refuses_nan_and_infinity(key, opted, nan):
    """``--set KEY=.nan`` and ``KEY: .nan`` in YAML both arrive as a float NaN; ``nan`` as the string 'nan'."""
    expected = "a number, not NaN" if opted else "a finite number"
    for value in [nan] + ([".nan", "nan"] if isinstance(nan, float) else []):
        with pytest.raises(ConfigError, match=rf"^config\.{key}(\[0\]|\.x)?: expected {expected}"):
            TrainConfig.load(None, {key: value})
    if isinstance(nan, float) and not opted:
        for value in (math.inf, -math.inf, "inf"):
            with pytest.raises(ConfigError, match=rf"^config\.{key}: expected a finite number"):
                TrainConfig.load(None, {key: value})


def test_where_infinity_means_no_limit_it_loads():
    config = TrainConfig.load(None, {"optim.max_grad_norm": ".inf", "grpo.adv_clip": math.inf})
    assert config.optim.max_grad_norm == math.inf and config.grpo.adv_clip == math.inf
    with pytest.raises(ConfigError, match=r"^config.optim: max_grad_norm must be > 0, got -inf$"):
        TrainConfig.load(None, {"optim.max_grad_norm": "-.inf"})


def test_yaml_nan_is_refused_before_anything_runs(tmp_path):
    """The audit's cases: ``lr: .nan`` and ``clip_range: .nan`` passed validation and failed in training."""
    path = tmp_path / "run.yaml"
    path.write_text("optim: {lr: .nan}\n")
    with pytest.raises(ConfigError, match=rf"^{path}.optim.lr: expected a finite number, got nan \(float\)$"):
        TrainConfig.load(path)
    path.write_text("grpo:\n  clip_range: .nan\n")
    with pytest.raises(ConfigError, match=rf"^{path}.grpo.clip_range: expected a finite number, got nan"):
        TrainConfig.load(path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("seed", 2**64, r"^config: seed must be in \[0, 9223372036854775807\] \(0 to 2\*\*63 - 1\), got 184467"),
        ("seed", 2**63, r"^config: seed must be in \[0, 9223372036854775807\]"),
        ("seed", -1, r"^config: seed must be in \[0, 9223372036854775807\]"),
        ("max_steps", -1, r"^config: max_steps must be >= 0, got -1$"),
        ("eval_prompts", 0, r"^config: eval_prompts must be >= 1, got 0$"),
        ("dp", 0, r"^config: dp must be >= 1, got 0$"),
        ("sample.frames", 0, r"^config.sample: frames must be >= 1, got 0$"),
        ("optim.warmup_steps", -1, r"^config.optim: warmup_steps must be >= 0, got -1$"),
        ("optim.lr", 0, r"^config.optim: lr must be > 0, got 0.0$"),
        ("lora.rank", -1, r"^config.lora: rank must be >= 0 \(0: full fine-tuning\), got -1$"),
        ("lora.alpha", 0, r"^config.lora: alpha must be > 0, got 0.0$"),
        ("grpo.steps", -1, r"^config.grpo: steps must be >= 1, got -1$"),
        ("grpo.group_size", 0, r"^config.grpo: group_size must be >= 1, got 0$"),
        ("grpo.stat_tracking", -1, r"^config.grpo: stat_tracking must be >= 0 \(iterations; 0: off\), got -1$"),
        ("grpo.sliding_window", {"size": 0}, r"^config.grpo.sliding_window: size must be >= 1, got 0$"),
        ("grpo.sde.eta", -0.1, r"^config.grpo.sde: noise levels must be finite and >= 0, got eta=-0.1"),
        ("ema_decay", 1, r"^config: ema_decay must be in \[0, 1\) \(0: no EMA\), got 1.0$"),
    ],
)  # fmt: skip
def test_integers_and_seeds_are_range_checked(key, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.load(None, {key: value})


def test_the_largest_seed_loads():
    assert TrainConfig.load(None, {"seed": 2**63 - 1}).seed == 2**63 - 1


def test_scalar_float_settings_refuse_nan_when_built_in_python():
    """The range checks themselves refuse NaN, for configs built without the loader."""
    for key, _, nan in SETTINGS:
        if not isinstance(nan, float):
            continue
        *sections, name = key.split(".")
        cls = TrainConfig
        for section in sections:
            cls = typing.get_type_hints(cls)[section]
        with pytest.raises(ValueError, match=r"must be .*\bnan\b"):
            cls(**{name: nan})


@pytest.mark.parametrize("weight", [math.nan, math.inf, -math.inf, 10**400])
def test_reward_weights_are_finite(weight):
    with pytest.raises(ConfigError, match=r"^reward 'brightness': weight must be a finite number, got "):
        check_reward({"brightness": weight})
    check_reward({"brightness": 0.5})
