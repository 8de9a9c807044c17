"""The real Cosmos-Predict2 / 2.5 and SkyReels-V2 14B checkpoints: the memory planner knows their architectures at
their published sizes, and plans sampling from their bundled generate configs (the config's name is the
architecture's, as ``python -m pipelines.plan --generate --config NAME`` reads it)."""

from __future__ import annotations

import pytest

from dit_sp.inference.config import GenerateConfig
from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
from dit_sp.memory.sampling import SamplingSettings, plan_sampling

# name: (low, high, blocks, heads, video tokens of its config), published sizes. Cosmos: 93 frames of 704 x 1280 ->
# 24 x 88 x 160 latents, patch 1 x 2 x 2; SkyReels 720p: 121 frames of 720 x 1280 -> 31 x 90 x 160 latents.
CHECKPOINTS = {
    "cosmos-predict2-2b-video2world": (1.9e9, 2.05e9, 28, 16, 84480),  # published: 2B
    "cosmos-predict2-14b-video2world": (13.5e9, 14.8e9, 36, 40, 84480),  # published: 14B
    "cosmos-predict2.5-2b": (1.95e9, 2.15e9, 28, 16, 84480),  # published: 2B (with its 100352 -> 1024 text projection)
    "skyreels-v2-t2v-14b-720p": (13.5e9, 14.8e9, 40, 40, 111600),  # Wan 2.1 T2V 14B
    "skyreels-v2-i2v-14b-720p": (16.0e9, 16.7e9, 40, 40, 111600),  # published "14B": Wan 2.1 I2V 14B's 16.4B
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_the_planner_knows_the_checkpoint_at_its_published_size_and_plans_its_config(name):
    low, high, blocks, heads, video_tokens = CHECKPOINTS[name]
    class_name, config = ARCHITECTURES[name]["transformers"]["transformer"]
    shape = TransformerShape.of(class_name, config)
    assert low <= shape.params <= high, shape.params
    assert shape.layers == blocks and config["num_attention_heads"] == heads
    generate = GenerateConfig.load(name)
    assert architecture_name(name) == name and generate.dtype == "bfloat16"
    assert heads % generate.ulysses == 0  # the config's Ulysses degree splits the heads evenly
    settings = SamplingSettings(name, frames=generate.frames, height=generate.height, width=generate.width,
                                dtype=generate.dtype, ring=generate.ring, ulysses=generate.ulysses,
                                guidance=generate.guidance > 1)  # fmt: skip
    plan = plan_sampling(settings, 8, 80.0)
    per_rank = f"{video_tokens // generate.ulysses} tokens)"  # cross-attention only: no text tokens in the sequence
    assert any(part.endswith(per_rank) for part in plan.phases["denoising"]), list(plan.phases["denoising"])


@pytest.mark.parametrize("model", ["tiny-cosmos2-v2w", "tiny-motif-video"])
def test_cfg_parallelism_of_the_cosmos_and_motif_pipelines_is_refused_in_one_line(model):
    """Cosmos computes with the conditional prediction before its unconditional call; Motif-Video guides inside its
    guider: ``parallelize`` refuses cfg=2 with the family's reason, before any hook or collective."""
    import dataclasses

    from dit_sp import ParallelConfig, parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.parallel import single_process_state
    from dit_sp.zoo import build_tiny

    pipe = build_tiny(model)
    parallel = dataclasses.replace(single_process_state(), config=ParallelConfig(cfg=2))
    with pytest.raises(ConfigError, match=r"^cfg parallelism \(cfg=2\) for \w+Pipeline: .*; use cfg=1$") as error:
        parallelize(pipe, parallel)
    assert "\n" not in str(error.value)
    processors = [type(getattr(m, "processor", None)).__name__ for m in pipe.transformer.modules()]
    assert not any(name.startswith("SequenceParallel") for name in processors)  # nothing left installed


def test_wan_and_skyreels_image_to_video_plans_count_the_clip_image_encoder():
    """Wan 2.1 I2V's CLIP ViT-H/14 vision tower (SkyReels-V2 I2V's too): the planner's count is the model diffusers'
    Wan conversion saves (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's vision config, counted on meta), and it is in the
    GRPO and the sampling plans, whole and kept."""
    import torch
    import transformers

    from dit_sp import TrainConfig
    from dit_sp.families.wan import CLIP_VIT_H
    from dit_sp.memory.planner import plan_training

    vision = transformers.CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                           num_attention_heads=16, patch_size=14, image_size=224,
                                           projection_dim=1024)  # fmt: skip
    with torch.device("meta"):
        params = sum(p.numel() for p in transformers.CLIPVisionModelWithProjection(vision).parameters())
    assert abs(params - CLIP_VIT_H) < 1e5, params
    assert architecture_name("/m/Wan2.1-I2V-14B-480P-Diffusers") == "wan2.1-i2v-14b"
    for arch in ("skyreels-v2-i2v-14b-720p", "wan2.1-i2v-14b"):
        assert ARCHITECTURES[arch]["image_encoder"] == CLIP_VIT_H
        plan = plan_sampling(SamplingSettings(arch, 33, 480, 832), 8, 80.0)
        assert plan.phases["denoising"]["image encoder (bfloat16, whole)"] == int(CLIP_VIT_H * 2)
    grpo = plan_training(TrainConfig.load("grpo_skyreels_v2_i2v_14b"), 32, 80)
    assert grpo.components["image encoder (bf16, whole, kept)"] == int(CLIP_VIT_H * 2) and grpo.fits
    assert "image_encoder" not in ARCHITECTURES["skyreels-v2-t2v-14b-720p"]
