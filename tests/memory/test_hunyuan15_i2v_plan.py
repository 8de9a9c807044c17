"""HunyuanVideo-1.5 image-to-video's plan counts what its transformer attends: the tiny pipeline's real joint sequence
(video, SigLIP image, ByT5 and Qwen2.5-VL tokens, read at its first block in a policy forward) is the plan's token
count, and the real config's includes the 729 SigLIP tokens and the image encoder's weights. Text-to-video: the 729
all-masked image tokens its pipeline passes (one in the GRPO policy) are counted as its blocks carry them."""

from __future__ import annotations

import re

import numpy as np
import torch
from PIL import Image

from dit_sp import TrainConfig
from dit_sp.families import policy_for
from dit_sp.memory import planner
from dit_sp.memory.sampling import SamplingSettings, plan_sampling
from dit_sp.zoo import build_tiny
from tests.support.grpo_checks import tiny_config


def _plan_tokens(plan: planner.Plan) -> int:
    (label,) = [name for name in plan.components if name.startswith("activations")]
    return int(re.search(r"x (\d+) tokens", label)[1])


@torch.no_grad()
def test_plan_counts_the_tiny_image_to_video_pipelines_joint_sequence(tmp_path, monkeypatch):
    pipe = build_tiny("tiny-hunyuanvideo15-i2v")
    size = {"frames": 5, "height": 36, "width": 28, "guidance": 3.0, "max_sequence_length": 32}
    policy = policy_for(pipe)(pipe, pipe.transformer, **size)
    image = tmp_path / "a.png"  # 40x30 pixels: the pipeline's bucket at target_size 32 is 36x28
    Image.fromarray((np.random.RandomState(0).rand(40, 30, 3) * 255).astype("uint8")).save(image)
    cond = policy.encode(["a red circle"], [str(image)])
    seen = []

    def joint(module, args, kwargs) -> None:  # the block's video (B, S, D) and conditioning (B, L, D) tokens
        values = dict(zip(("hidden_states", "encoder_hidden_states"), args)) | kwargs
        seen.append(values["hidden_states"].shape[1] + values["encoder_hidden_states"].shape[1])

    hook = pipe.transformer.transformer_blocks[0].register_forward_pre_hook(joint, with_kwargs=True)
    policy.velocity(torch.randn(1, *policy.latent_shape()), 0.5, cond)
    hook.remove()
    vision = pipe.image_encoder.config
    spec = {"transformers": {"transformer": (type(pipe.transformer).__name__, dict(pipe.transformer.config))},
            "text_encoders": 1e3, "vae": 1e3, "compression": (2, 4), "joint": True,
            "text_tokens": pipe.tokenizer_max_length, "text_tokens_2": pipe.tokenizer_2_max_length,
            "image_tokens": (vision.image_size // vision.patch_size) ** 2, "image_encoder": 1e3}  # fmt: skip
    monkeypatch.setitem(planner.ARCHITECTURES, "tiny-hunyuanvideo15-i2v", spec)
    config = tiny_config(model="tiny-hunyuanvideo15-i2v", **{"sample.max_sequence_length": 32}, frames=5, height=36,
                         width=28, guidance=3.0)  # fmt: skip
    plan = planner.plan_training(config, 1, 80, arch="tiny-hunyuanvideo15-i2v")
    assert seen and set(seen) == {_plan_tokens(plan)}, (
        seen,
        plan.report(),
    )  # 3 x 9 x 7 video + 16 SigLIP + 32 ByT5 + 32 Qwen


def test_real_config_counts_the_siglip_tokens_and_encoder():
    config = TrainConfig.load("grpo_hunyuanvideo15_i2v")
    assert planner.architecture_name(config.model) == "hunyuanvideo-1.5-480p_i2v"
    plan = planner.plan_training(config, 8, 80)
    assert _plan_tokens(plan) == 16 * 22 * 39 + 1000 + 256 + 729  # video, Qwen2.5-VL, ByT5, SigLIP
    encoder = int(0.43e9 * 2)  # bf16, whole, at set-up and kept through training
    assert plan.setup["image encoder (bf16, whole, kept)"] == plan.components["image encoder (bf16, whole, kept)"]
    assert plan.setup["image encoder (bf16, whole, kept)"] == encoder
    assert planner.architecture_name("/m/HunyuanVideo-1.5-Diffusers-480p_t2v") == "hunyuanvideo-1.5-480p-t2v"
    sampling = plan_sampling(SamplingSettings("hunyuanvideo-1.5-480p_i2v", 61, 352, 624, guidance=False), 1)
    assert f"1 seq x {16 * 22 * 39 + 1000 + 256 + 729} tokens" in sampling.report(), sampling.report()
    assert sampling.phases["denoising"]["image encoder (bfloat16, whole)"] == encoder
    text_to_video = planner.plan_training(TrainConfig.load("grpo_hunyuanvideo15"), 16, 80)  # ByT5's 256 tokens too
    assert _plan_tokens(text_to_video) == 16 * 30 * 53 + 1000 + 256 + 1  # the policy's one masked image token
    sampling = plan_sampling(SamplingSettings("hunyuanvideo-1.5-480p-t2v", 61, 352, 624, guidance=False), 1)
    assert f"1 seq x {16 * 22 * 39 + 1000 + 256 + 729} tokens" in sampling.report()  # the pipeline's 729 zero tokens
    assert not any(name.startswith("image encoder") for name in sampling.phases["denoising"])


@torch.no_grad()
def test_text_to_video_plans_count_the_masked_image_tokens_the_blocks_carry(monkeypatch):
    """HunyuanVideo-1.5 text-to-video: the stock pipeline passes 729 all-zero SigLIP tokens, which the transformer masks
    out but carries through its blocks (read at the first block of the tiny pipeline's call: the sampling plan's
    count), and the GRPO policy passes one (read in a policy forward: the training plan's)."""
    pipe = build_tiny("tiny-hunyuanvideo15")
    seen = []

    def joint(module, args, kwargs) -> None:  # the block's video (B, S, D) and conditioning (B, L, D) tokens
        values = dict(zip(("hidden_states", "encoder_hidden_states"), args)) | kwargs
        seen.append(values["hidden_states"].shape[1] + values["encoder_hidden_states"].shape[1])

    hook = pipe.transformer.transformer_blocks[0].register_forward_pre_hook(joint, with_kwargs=True)
    pipe("a red circle", num_frames=5, height=24, width=16, num_inference_steps=1, output_type="latent")
    sampled, seen[:] = set(seen), []
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=24, width=16, guidance=1.0,
                              max_sequence_length=32)  # fmt: skip
    policy.velocity(torch.randn(1, *policy.latent_shape()), 0.5, policy.encode(["a red circle"]))
    hook.remove()
    spec = {"transformers": {"transformer": (type(pipe.transformer).__name__, dict(pipe.transformer.config))},
            "text_encoders": 1e3, "vae": 1e3, "compression": (2, 4), "joint": True,
            "text_tokens": pipe.tokenizer_max_length, "text_tokens_2": pipe.tokenizer_2_max_length,
            "masked_image_tokens": pipe.vision_num_semantic_tokens}  # fmt: skip
    monkeypatch.setitem(planner.ARCHITECTURES, "tiny-hunyuanvideo15", spec)
    sampling = plan_sampling(SamplingSettings("tiny-hunyuanvideo15", 5, 24, 16, guidance=False), 1)
    assert len(sampled) == 1 and f"1 seq x {sampled.pop()} tokens" in sampling.report(), sampling.report()
    config = tiny_config(model="tiny-hunyuanvideo15", **{"sample.max_sequence_length": 32}, frames=5, height=24,
                         width=16, guidance=1.0)  # fmt: skip
    plan = planner.plan_training(config, 1, 80, arch="tiny-hunyuanvideo15")
    assert seen and set(seen) == {_plan_tokens(plan)}, (seen, plan.report())  # 3 x 6 x 4 video + 32 + 32 + 1
