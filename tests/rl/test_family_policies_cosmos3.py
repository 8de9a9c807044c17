"""Cosmos 3's GRPO policy (``Cosmos3Policy``: one packed sequence per sample and guidance branch, sound and action
generation off): its Euler ODE is the stock ``Cosmos3OmniPipeline``'s sampling (text-to-video and image-to-video, with
an Euler flow scheduler in place of its UniPC one) and its decode the pipeline's video; its refusals. Its GRPO step on
1x2 and 2x1 is in test_family_policies.py's layout test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dit_sp.errors import ConfigError
from dit_sp.families.cosmos3 import Cosmos3Policy
from dit_sp.zoo import build_tiny

SIZE = {"frames": 9, "height": 32, "width": 48, "guidance": 2.0, "max_sequence_length": 256}
SETTINGS = {"num_frames": 9, "height": 32, "width": 48, "num_inference_steps": 3, "guidance_scale": 2.0}


@pytest.fixture(scope="module")
def pipe():
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = build_tiny("tiny-cosmos3")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)  # the same velocity and sigmas, integrated by Euler
    return pipe


def euler(policy: Cosmos3Policy, x: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


def stock(pipe, latents: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock pipeline's final latents (read by its step callback) and its video ``(F, C, H, W)``."""
    final = []
    keep = lambda pipe, i, t, tensors: final.append(tensors["latents"]) or {}  # noqa: E731
    video = pipe(prompt="a red circle", negative_prompt="", latents=latents.clone(), output_type="pt", **SETTINGS,
                 callback_on_step_end=keep, **kwargs).video  # fmt: skip
    return final[-1], video


@torch.no_grad()
def test_cosmos3_policy_ode_and_decode_are_the_pipelines(pipe, tmp_path):
    """Text-to-video: the policy's Euler ODE (each sample's packed sequence from the pipeline's own segment helpers,
    the prompt and negative prompt packed to their own lengths, guidance 2) is the stock pipeline's latents, and its
    decode the pipeline's video. Image-to-video: the image's frame is the pipeline's own first latent frame (the image
    encoded alone), the ODE of the frames after it is the pipeline's sampling, and another image moves the sample."""
    from PIL import Image

    policy = Cosmos3Policy(pipe, pipe.transformer, **SIZE)
    positive, negative = policy.encode(["a red circle"])
    assert positive[0].shape == (1, 256) and positive[1].item() != negative[1].item()  # two packed lengths
    assert not policy.takes_images and policy.latent_shape() == (4, 3, 4, 6)
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    expected, video = stock(pipe, noise)  # sets the scheduler's 3 noise levels, which the ODE steps through
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), (positive, negative))
    assert expected.abs().max() > 1
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours)[0], video, atol=1e-5, rtol=0)

    paths = []
    for seed in (0, 1):
        paths.append(str(tmp_path / f"image{seed}.png"))
        Image.fromarray((np.random.RandomState(seed).rand(40, 56, 3) * 255).astype("uint8")).save(paths[-1])
    policy.use_images(True)
    assert policy.takes_images and policy.latent_shape() == (4, 2, 4, 6)
    image = Image.open(paths[0]).convert("RGB")
    start = pipe.prepare_latents(
        image=image,
        num_frames=9,
        height=32,
        width=48,
        device="cpu",
        dtype=torch.float32,
        generator=torch.Generator().manual_seed(1),
    )[0]  # the image's frame, then noise
    cond = policy.encode(["a red circle"], [paths[0]])
    torch.testing.assert_close(cond[0][1], start[:, :, :1], atol=1e-6, rtol=0)
    ours = euler(policy, start[:, :, 1:], pipe.scheduler.sigmas[:-1].tolist(), cond)
    expected, video = stock(pipe, start, image=image)
    torch.testing.assert_close(policy.clean(ours, cond), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond)[0], video, atol=1e-5, rtol=0)
    other = euler(
        policy, start[:, :, 1:], pipe.scheduler.sigmas[:-1].tolist(), policy.encode(["a red circle"], paths[1:])
    )
    assert (other - ours).abs().max() > 1e-3  # 4.5e-3 on the tiny model (an ignored image: 0)


def test_cosmos3_policy_refusals(pipe):
    """A prompt longer than max_sequence_length (the pipeline cuts none) and image-to-video with one latent frame (the
    image's alone) are refused in one line; a text-to-video policy refuses images, an image-to-video one needs them."""
    short = Cosmos3Policy(pipe, pipe.transformer, **SIZE | {"max_sequence_length": 64})
    why = r"^max_sequence_length 64: Cosmos 3 conditions on the whole templated prompt \(199 tokens here"
    with pytest.raises(ConfigError, match=why + r".*set sample.max_sequence_length to 199 or more$"):
        short.encode(["a red circle"])
    policy = Cosmos3Policy(pipe, pipe.transformer, **SIZE)
    with pytest.raises(ConfigError, match="is text-to-video: its prompts take no image"):
        policy.encode(["a red circle"], ["image.png"])
    policy.use_images(True)
    with pytest.raises(ConfigError, match="is image-to-video: every prompt needs an image"):
        policy.encode(["a red circle"])
    one_frame = Cosmos3Policy(pipe, pipe.transformer, **SIZE | {"frames": 1})
    one_frame.use_images(False)  # text-to-image is sampled as the pipeline does (one latent frame)
    with pytest.raises(ConfigError, match=r"^frames 1: Cosmos3OmniPipeline keeps the first latent frame the image's .*"
                                          r"set sample.frames to 5 or more$"):  # fmt: skip
        one_frame.use_images(True)


def test_cosmos3_policy_with_sound_and_action_heads_samples_the_video_alone():
    """A transformer with sound and action heads (``sound_gen``, ``action_gen``): the policy's Euler ODE is the stock
    pipeline's ``enable_sound=False`` sampling without an action (no sound or action tokens packed), and a step's
    gradient reaches none of those heads."""
    import diffusers
    from cosmos3_checks import build_omni

    pipe = build_tiny("tiny-cosmos3")
    pipe.register_modules(transformer=build_omni(), scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0))
    policy = Cosmos3Policy(pipe, pipe.transformer, **SIZE)
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = stock(pipe, noise, enable_sound=False)
        ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), policy.encode(["a red circle"]))
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    policy.velocity(noise, 0.7, policy.encode(["a red circle"])).square().sum().backward()
    heads = [name for name, _ in pipe.transformer.named_parameters() if name.startswith(("audio_", "action_"))]
    grads = {name: p.grad for name, p in pipe.transformer.named_parameters()}
    assert len(heads) == 10 and all(grads[name] is None for name in heads), heads
    assert grads["proj_out.weight"].abs().max() > 0


@torch.no_grad()
def test_cosmos3_policy_batch_is_each_samples_own_call(pipe):
    """A batch of prompts of different lengths: each sample's guided velocity is its own prompt's alone (one packed call
    per sample and branch), with the kept packings bounded (``PACKINGS`` 2 here: the 6 calls evict)."""
    policy = Cosmos3Policy(pipe, pipe.transformer, **SIZE)
    policy.PACKINGS = 2
    prompts = ["a red circle", "a blue square moving left", "fog"]
    cond = policy.encode(prompts)
    assert len(set(cond[0][1].tolist())) == 3
    x = torch.randn(3, *policy.latent_shape(), generator=torch.Generator().manual_seed(4))
    both = policy.velocity(x, 0.7, cond)
    assert len(policy._segments) == 2
    alone = torch.cat([policy.velocity(x[i : i + 1], 0.7, policy.encode([p])) for i, p in enumerate(prompts)])
    torch.testing.assert_close(both, alone, atol=1e-6, rtol=0)
    assert (policy.velocity(x[:1], 0.7, policy.encode(prompts[1:2])) - alone[:1]).abs().max() > 1e-3
