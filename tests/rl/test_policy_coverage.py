"""Every pipeline of every registered family (what the README table's pipelines column lists: the diffusers
pipelines of its transformers, its built-in models' and its Modular Diffusers pipelines) is either trained by GRPO
(``ModelFamily.pipelines`` with a ``policy``) or refused with its one-line reason (``ModelFamily.policy_refused``),
never neither and never both: a pipeline a new diffusers adds for a supported transformer fails here until it is
given one or the other."""

from __future__ import annotations

import pytest

from dit_sp.errors import ConfigError
from dit_sp.families import FAMILIES, policy_for
from dit_sp.zoo.table import family_pipelines


def test_every_pipeline_is_trained_or_refused_with_a_reason():
    trained, refused, missing = [], [], []
    for family in FAMILIES:
        names = family_pipelines(family)
        assert set(family.pipelines) <= set(names), (family.name, family.pipelines)  # no stale entries
        assert set(family.policy_refused) <= set(names), (family.name, sorted(family.policy_refused))
        for name in names:
            trains = family.policy is not None and name in family.pipelines
            why = family.policy_refused.get(name)
            assert not (trains and why), f"{name} ({family.name}) is both trained and refused"
            if not trains and why is None:
                missing.append(f"{name} ({family.name})")
                continue
            pipe = type(name, (), {})()  # policy_for reads the pipeline's class names alone
            if trains:
                trained.append(name)
                assert policy_for(pipe) is family.policy
                continue
            refused.append(name)
            assert "\n" not in why and len(why) > 40 and why == why.strip(), (name, why)
            with pytest.raises(ConfigError, match=f"^GRPO does not train {name}: ") as err:
                policy_for(pipe)
            assert str(err.value) == f"GRPO does not train {name}: {why}"
    assert not missing, f"pipelines neither trained by GRPO nor refused with a reason: {missing}"
    assert len(trained) == len(set(trained)) and len(refused) == len(set(refused))  # one family each
    assert {
        "SanaImageToVideoPipeline",
        "SkyReelsV2ImageToVideoPipeline",
        "HunyuanSkyreelsImageToVideoPipeline",
        "Kandinsky5I2VPipeline",
        "LTX2ImageToVideoPipeline",
        "LTX2ConditionPipeline",
        "EasyAnimateInpaintPipeline",
        "MotifVideoImage2VideoPipeline",
        "Kandinsky5T2IPipeline",
        "SkyReelsV2DiffusionForcingPipeline",
        "SkyReelsV2DiffusionForcingImageToVideoPipeline",
        "Cosmos3OmniPipeline",
        "Kandinsky5I2IPipeline",
    } <= set(trained)
    assert {"AnyFlowPipeline", "SanaWMPipeline", "HunyuanVideoImageToVideoPipeline"} <= set(refused)
    print(f"{len(trained)} pipelines trained, {len(refused)} refused with a reason")


def test_a_refused_pipeline_is_refused_before_loading(tmp_path):
    """The trainer's preflight (no weights, no workers) refuses a pipeline GRPO does not train, with its reason; a
    trained one passes."""
    from grpo_checks import tiny_config

    from dit_sp.rl.preflight import check_before_loading

    for model, name in (
        ("tiny-anyflow", "AnyFlowPipeline"),
        ("tiny-hunyuanvideo-framepack", "HunyuanVideoFramepackPipeline"),
        ("tiny-hunyuanvideo-i2v", "HunyuanVideoImageToVideoPipeline"),
    ):
        with pytest.raises(ConfigError, match=f"^GRPO does not train {name}: its? ") as err:
            check_before_loading(tiny_config(model=model, frames=5, height=32, width=32), 1)
        assert "\n" not in str(err.value)
    check_before_loading(tiny_config(model="tiny-sana-video", frames=5, height=32, width=32), 1)
