"""GRPO policies of pipelines whose sampler is one trajectory from pure noise in one mode: Kandinsky 5 text-to-image
and image editing (one frame) and SkyReels-V2 diffusion forcing, synchronous and in one chunk. Their GRPO step on 1x2
and 2x1 is in test_family_policies.py's layout test (``policy_checks.family_configs``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from grpo_checks import tiny_config

from dit_sp.families.kandinsky5 import Kandinsky5Policy
from dit_sp.rl.preflight import check_before_loading
from dit_sp.zoo import build_tiny


def _euler(policy, noise: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    """The policy's Euler ODE (GRPO's SDE step without noise) through ``levels``, to 0."""
    x = noise
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky5_text_to_image_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """Kandinsky5T2IPipeline: the policy's Euler ODE over one latent frame (rotary scale 1, no sparse attention, each
    text at its own length, guidance 4) is the stock pipeline's sampling, and its decode (the image VAE's, one frame
    ``(B, 1, C, H, W)``) the pipeline's image; a size off the pipeline's resolutions is refused in one line, and so is
    a reward between frames for one frame, before loading."""
    pipe = build_tiny("tiny-kandinsky5-t2i")
    policy = Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=64, guidance=4.0,
                              max_sequence_length=64)  # fmt: skip
    assert policy.latent_shape() == (4, 1, 8, 8) and not policy.takes_images
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    call = {"prompt": "a red circle", "negative_prompt": "", "max_sequence_length": 64, "height": 64, "width": 64,
            "num_inference_steps": 3, "guidance_scale": 4.0}  # fmt: skip
    stock = pipe(latents=noise.permute(0, 2, 3, 4, 1).clone(), output_type="latent", **call).image  # (B, 1, H, W, C)
    cond = policy.encode(["a red circle"])
    assert cond[0][1].item() > cond[1][1].item() > 0  # the prompt's and the negative prompt's own lengths
    ours = _euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours.permute(0, 2, 3, 4, 1), stock, atol=1e-5, rtol=0)
    image = pipe(latents=noise.permute(0, 2, 3, 4, 1).clone(), output_type="pt", **call).image  # (B, C, H, W)
    decoded = policy.decode(ours)
    assert decoded.shape == (1, 1, 3, 64, 64)
    torch.testing.assert_close(decoded[:, 0], image, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"^Kandinsky5T2IPipeline samples at its resolutions alone \(width x height: "
                                         r"64x64\) and moves 32x64 to the nearest; set sample.width"):  # fmt: skip
        Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=32, guidance=4.0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    image_run = {"model": "tiny-kandinsky5-t2i", "prompts": str(prompts), "frames": 1, "height": 64, "width": 64}
    with pytest.raises(ValueError, match=r"^reward 'temporal_smoothness' scores the change between consecutive frames, "
                                         "and sample.frames 1 makes one frame"):  # fmt: skip
        check_before_loading(tiny_config(**image_run, reward={"brightness": 1.0, "temporal_smoothness": 1.0}), 1)
    check_before_loading(tiny_config(**image_run, reward="brightness"), 1)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky5_image_edit_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """Kandinsky5I2IPipeline (image editing): the source image's latents (the VAE's posterior, drawn by the pipeline's
    prepare_latents at IMAGE_SEED) and a mask of ones in channels, clean throughout; the prompt and the negative prompt
    each encoded with the source image (Qwen2.5-VL reads it inside the template: its 64 tokens in the text). The
    policy's Euler ODE over the one latent frame is the stock pipeline's sampling (guidance 4) and its decode the
    pipeline's image; another source image changes the text, the image latents and the velocity. A text length the
    image's tokens do not fit in is refused in one line (the stock pipeline fails in its processor)."""
    from PIL import Image

    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-kandinsky5-i2i")
    policy = Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=64, guidance=4.0,
                              max_sequence_length=512)  # fmt: skip
    assert policy.takes_images and policy.latent_shape() == (4, 1, 8, 8) and policy.prompt_reads_image(
        "Kandinsky5I2IPipeline")  # fmt: skip
    paths = [str(tmp_path / f"{name}.png") for name in "ab"]
    for seed, path in enumerate(paths):
        Image.fromarray((np.random.RandomState(seed).rand(40, 30, 3) * 255).astype("uint8")).save(path)
    prepared, stock_prepare = [], pipe.prepare_latents
    pipe.prepare_latents = lambda *args, **kwargs: (
        prepared.append(stock_prepare(*args, **kwargs)) or prepared[-1].clone()
    )
    call = {"prompt": "a red circle", "negative_prompt": "", "image": Image.open(paths[0]), "height": 64, "width": 64,
            "num_inference_steps": 2, "guidance_scale": 4.0, "max_sequence_length": 512}  # fmt: skip
    steps = []  # the latents after each step (B, 1, H, W, 2C + 1)
    image = pipe(output_type="pt", generator=torch.Generator().manual_seed(IMAGE_SEED), **call,
                 callback_on_step_end=lambda p, i, t, kw: steps.append(kw["latents"].clone()) or {}).image  # fmt: skip
    stock = steps[-1][..., :4]
    cond = policy.encode(["a red circle"], [paths[0]])
    start = prepared[0].permute(0, 4, 1, 2, 3)  # (B, 2C + 1, 1, H, W): noise, the image's latents, the mask
    torch.testing.assert_close(cond[0][1], start[:, 4:8], atol=1e-6, rtol=0)
    assert cond[0][0][1].item() > cond[1][0][1].item() > 64  # both texts hold the image's 64 tokens
    ours = _euler(policy, start[:, :4], pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    print(f"Kandinsky5Policy I2I: ODE vs stock {(ours.permute(0, 2, 3, 4, 1) - stock).abs().max():.2e}")
    torch.testing.assert_close(ours.permute(0, 2, 3, 4, 1), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond)[:, 0], image, atol=1e-5, rtol=0)
    other = policy.encode(["a red circle"], [paths[1]])
    for branch in range(2):  # the source image is in each branch's text
        assert (other[branch][0][0] - cond[branch][0][0]).abs().max() > 1e-3
    assert (other[0][1] - cond[0][1]).abs().max() > 1e-3
    assert (policy.velocity(ours, 1.0, other) - policy.velocity(ours, 1.0, cond)).abs().max() > 1e-3
    short = Kandinsky5Policy(pipe, pipe.transformer, frames=1, height=64, width=64, guidance=4.0,
                             max_sequence_length=128)  # fmt: skip
    with pytest.raises(ValueError, match=r"^max_sequence_length 128 cannot hold the source image's tokens and the "
                                         r"prompt 'a red circle' .* raise sample.max_sequence_length"):  # fmt: skip
        short.encode(["a red circle"], [paths[0]])


def _first_order(pipe) -> None:
    """The pipeline's UniPC scheduler at first order without its corrector: a flow velocity's Euler step at the
    scheduler's own noise levels and (integer) timesteps."""
    from diffusers import UniPCMultistepScheduler

    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, solver_order=1,
                                                         disable_corrector=list(range(10)))  # fmt: skip


def _record_prepare_latents(pipe) -> list:
    """Keeps a copy of the noise and the image's frame (``condition``; None for text-to-video) that each
    ``prepare_latents`` call returns (the pipeline steps its latents in place)."""
    import functools

    prepared, stock = [], pipe.prepare_latents

    @functools.wraps(stock)  # the policy reads its signature
    def record(*args, **kwargs):
        out = stock(*args, **kwargs)
        prepared.append((out[0].clone(), None if out[2] is None else out[2].clone()))
        return out

    pipe.prepare_latents = record
    return prepared


def _df_run(pipe, **call) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """The stock pipeline's latents and video of one seeded call, and what its ``prepare_latents`` returned."""
    call = {"prompt": "a red circle", "negative_prompt": "", "num_frames": 9, "height": 48, "width": 32,
            "num_inference_steps": 3, "guidance_scale": 6.0, "max_sequence_length": 16} | call  # fmt: skip
    prepared = _record_prepare_latents(pipe)
    latents = pipe(generator=torch.Generator().manual_seed(1), output_type="latent", **call).frames
    video = pipe(generator=torch.Generator().manual_seed(1), output_type="pt", **call).frames
    pipe.prepare_latents = type(pipe).prepare_latents.__get__(pipe)
    return latents, video, prepared[0]


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_skyreels_v2_diffusion_forcing_policy_ode_and_decode_are_the_pipelines_synchronous_one_chunk(tmp_path):
    """SkyReels-V2 diffusion forcing at ar_step 0 in one chunk: the policy's Euler ODE (per-frame timesteps, all the
    step's, truncated as the pipeline's matrix holds them; the fps embedding) is the stock pipeline's sampling with
    its UniPC scheduler at first order, and its decode the pipeline's video; a batch of two prompts is each alone (one
    fps entry for the batch). Image-to-video: the image's latents are the clean first frame at timestep 0. Refused:
    more frames than base_num_frames and ar_step / overlap_history (before loading), an image with causal blocks of 2
    frames, latent frames that are not whole blocks."""
    from PIL import Image

    from dit_sp import TrainConfig
    from dit_sp.families.skyreels_v2 import SkyReelsV2Policy

    size = {"frames": 9, "height": 48, "width": 32, "guidance": 6.0, "max_sequence_length": 16}
    pipe = build_tiny("tiny-skyreels-v2-df")
    _first_order(pipe)
    policy = SkyReelsV2Policy(pipe, pipe.transformer, **size)
    stock, video, (noise, _) = _df_run(pipe)
    levels = pipe.scheduler.sigmas[:-1].tolist()
    ours = _euler(policy, noise, levels, policy.encode(["a red circle"]))
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours), video, atol=1e-5, rtol=0)
    prompts = ["a red circle", "a blue square moving left"]
    both = policy.velocity(noise.repeat(2, 1, 1, 1, 1), 0.7, policy.encode(prompts))
    alone = torch.cat([policy.velocity(noise, 0.7, policy.encode([prompt])) for prompt in prompts])
    torch.testing.assert_close(both, alone, atol=1e-5, rtol=0)
    assert (both[0] - both[1]).abs().max() > 1e-3

    image = tmp_path / "image.png"
    Image.fromarray((np.random.RandomState(0).rand(40, 30, 3) * 255).astype("uint8")).save(image)
    pipe = build_tiny("tiny-skyreels-v2-df-i2v")
    _first_order(pipe)
    policy = SkyReelsV2Policy(pipe, pipe.transformer, **size)
    stock, video, (noise, frame) = _df_run(pipe, image=Image.open(image).convert("RGB"))
    cond = policy.encode(["a red circle"], [str(image)])
    torch.testing.assert_close(cond[0][1], frame, atol=0, rtol=0)
    assert policy.latent_shape() == (4, 2, 6, 4)
    ours = _euler(policy, noise[:, :, 1:], levels, cond)
    torch.testing.assert_close(policy.clean(ours, cond), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)

    pipe.transformer._set_ar_attention(2)  # causal blocks of 2 latent frames
    with pytest.raises(ValueError, match=r"^frames 9: 3 latent frames, and SkyReelsV2DiffusionForcingImageToVideo"):
        SkyReelsV2Policy(pipe, pipe.transformer, **size)
    with pytest.raises(ValueError, match=r"^SkyReelsV2DiffusionForcingImageToVideoPipeline with num_frame_per_block "
                                         "2 steps the image's latent frame"):  # fmt: skip
        SkyReelsV2Policy(pipe, pipe.transformer, **size | {"frames": 13})
    texts = tmp_path / "prompts.txt"
    texts.write_text("a red circle\n")
    run = {"model": "tiny-skyreels-v2-df", "prompts": str(texts), "height": 48, "width": 32}
    with pytest.raises(ValueError, match=r"^frames 101: SkyReelsV2DiffusionForcingPipeline generates more than "
                                         r"base_num_frames \(97\) chunk by chunk"):  # fmt: skip
        check_before_loading(tiny_config(**run, frames=101), 1)
    check_before_loading(tiny_config(**run, frames=97), 1)
    for key in ("ar_step", "overlap_history", "base_num_frames"):
        with pytest.raises(ValueError, match=rf"^config.sample.{key}: GRPO trains SkyReels-V2 diffusion forcing "
                                             r"synchronously in one chunk \(ar_step 0"):  # fmt: skip
            TrainConfig.from_dict({"model": "tiny-skyreels-v2-df", "prompts": str(texts), "sample": {key: 5}})
