"""GRPO policies of image-conditioned pipelines beyond Wan I2V (ChronoEdit's image edit, ...): their Euler ODE at the
scheduler's own noise levels is the stock pipeline's sampling with the same image, and their decode its video. Their
GRPO step on 1x2 and 2x1 is in test_family_policies.py's layout test (``policy_checks.family_configs``)."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp.families import policy_for
from dit_sp.zoo import build_tiny


def _image(path, seed: int) -> str:
    Image.fromarray((np.random.RandomState(seed).rand(40, 30, 3) * 255).astype("uint8")).save(path)
    return str(path)


def _record_prepare_latents(pipe) -> list:
    """Wraps ``pipe.prepare_latents`` to keep what each call returns; a tensor is handed on as a copy, so what is
    kept is the pipeline's start even where it steps its latents in place."""
    prepared = []
    stock_prepare = pipe.prepare_latents

    def record(*args, **kwargs):
        prepared.append(stock_prepare(*args, **kwargs))
        return prepared[-1].clone() if isinstance(prepared[-1], torch.Tensor) else prepared[-1]

    pipe.prepare_latents = record
    return prepared


def euler(policy, noise: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    """The policy's Euler ODE (GRPO's SDE step without noise) through ``levels``, to 0."""
    x = noise
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


def stock_run(pipe, **call) -> tuple[torch.Tensor, torch.Tensor]:
    """One stock pipeline call: its final latents (as ``output_type="latent"`` returns them: read at the last step's
    callback, or from the scheduler's last step where the pipeline takes no callback) and its video
    (``output_type="pt"``, ``(B, F, C, H, W)``)."""
    steps = []
    if "callback_on_step_end" in inspect.signature(type(pipe).__call__).parameters:
        call["callback_on_step_end"] = lambda p, i, t, kw: steps.append(kw["latents"]) or {}
    else:
        stock_step = pipe.scheduler.step
        pipe.scheduler.step = lambda *args, **kwargs: steps.append(stock_step(*args, **kwargs)[0]) or (steps[-1],)
    video = pipe(output_type="pt", **call).frames
    vars(pipe.scheduler).pop("step", None)
    return steps[-1], video


def assert_image_ode_and_decode_are_stock(policy, pipe, image: str, other: str, settings: dict,
                                          levels: list[float] | None = None, frames_first: bool = False,
                                          seed: int | None = None) -> None:  # fmt: skip
    """With ``image``, the policy's Euler ODE through the scheduler's noise levels (``levels``, default its sigmas
    after the pipeline ran) is the stock pipeline's latents within 1e-5 (``frames_first``: the pipeline's are
    ``(B, F, C, H, W)``), and its decode the pipeline's video; ``other`` image changes the velocity (the image
    conditions it). ``seed``: the pipeline gets a generator at this seed (it samples the image latents with it)."""
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    layout = (lambda x: x.permute(0, 2, 1, 3, 4)) if frames_first else (lambda x: x)
    seeded = {} if seed is None else {"generator": torch.Generator().manual_seed(seed)}
    stock, video = stock_run(pipe, prompt="a red circle", negative_prompt="", image=Image.open(image),
                             latents=layout(noise).clone(), **settings, **seeded)  # fmt: skip
    levels = pipe.scheduler.sigmas[:-1].tolist() if levels is None else levels
    cond = policy.encode(["a red circle"], [image])
    ours = euler(policy, noise, levels, cond)
    assert stock.abs().max() > 1
    print(f"{type(policy).__name__}: ODE vs stock {(layout(policy.clean(ours, cond)) - stock).abs().max():.2e}")
    torch.testing.assert_close(layout(policy.clean(ours, cond)), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    moved = policy.velocity(noise, levels[0], policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(noise, levels[0], cond)).abs().max() > 1e-3


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_chronoedit_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """ChronoEdit without temporal reasoning (5 frames): Wan 2.1 I2V's image latents and mask in channels and CLIP
    tokens in cross-attention, guidance 4; any other frame count is refused in one line."""
    pipe = build_tiny("tiny-chronoedit")
    size = {"height": 48, "width": 32, "guidance": 4.0, "max_sequence_length": 16}
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, **size)
    assert type(policy).__name__ == "ChronoEditPolicy" and policy.takes_images
    settings = {"num_frames": 5, "height": 48, "width": 32, "num_inference_steps": 3, "guidance_scale": 4.0,
                "max_sequence_length": 16}  # fmt: skip
    assert_image_ode_and_decode_are_stock(policy, pipe, _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1),
                                          settings)  # fmt: skip
    with pytest.raises(ValueError, match=r"^frames 9: ChronoEditPipeline samples 5 frames \(the image and its edit\)"):
        policy_for(pipe)(pipe, pipe.transformer, frames=9, **size)
    with pytest.raises(ValueError, match="is image-to-video: every prompt needs an image"):
        policy.encode(["a red circle"])


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_skyreels_v2_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """SkyReels-V2 I2V is sampled as Wan 2.1 I2V: the image's latents and mask in channels and CLIP tokens in
    cross-attention; the Euler ODE is the stock pipeline's sampling with an Euler flow scheduler in place of its UniPC
    one (the same velocity, timesteps and guidance), guidance 5, and the decode its video."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = build_tiny("tiny-skyreels-v2-i2v")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=8.0)
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=5.0,
                              max_sequence_length=16)  # fmt: skip
    assert type(policy).__name__ == "SkyReelsV2Policy" and policy.takes_images
    settings = {"num_frames": 5, "height": 32, "width": 32, "num_inference_steps": 3, "guidance_scale": 5.0,
                "max_sequence_length": 16}  # fmt: skip
    assert_image_ode_and_decode_are_stock(policy, pipe, _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1),
                                          settings)  # fmt: skip


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_cogvideox_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """CogVideoX I2V: the image's latents (drawn from the VAE's posterior at the policy's IMAGE_SEED) join the
    v-prediction input in channels, clean at every step; the converted flow velocity's Euler ODE at the noise levels
    of the scheduler's timesteps is the stock pipeline's DDIM sampling (guidance 3), and the decode its video."""
    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-cogvideox-i2v")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=64, width=64, guidance=3.0,
                              max_sequence_length=8)  # fmt: skip
    assert type(policy).__name__ == "CogVideoXPolicy" and policy.takes_images
    settings = {"num_frames": 9, "height": 64, "width": 64, "num_inference_steps": 4, "guidance_scale": 3.0,
                "max_sequence_length": 8}  # fmt: skip
    pipe.scheduler.set_timesteps(4)
    alphas = pipe.scheduler.alphas_cumprod.double()
    levels = [((1 - alphas[t]).sqrt() / (alphas[t].sqrt() + (1 - alphas[t]).sqrt())).item()
              for t in pipe.scheduler.timesteps]  # fmt: skip

    assert_image_ode_and_decode_are_stock(policy, pipe, _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1),
                                          settings, levels, frames_first=True, seed=IMAGE_SEED)  # fmt: skip


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_skyreels_v1_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """SkyReels-V1 I2V (HunyuanVideo): the image's latents (drawn from the VAE's posterior at the policy's IMAGE_SEED)
    join the noise in channels; true classifier-free guidance 4 on the negative prompt and the pipeline's embedded
    guidance 1.0; the Euler ODE is the stock pipeline's sampling and the decode its video."""
    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-hunyuanvideo-skyreels-i2v")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=4.0,
                              max_sequence_length=32)  # fmt: skip
    assert type(policy).__name__ == "HunyuanVideoPolicy" and policy.takes_images and policy.embedded_guidance == 1.0
    settings = {"num_frames": 5, "height": 32, "width": 32, "num_inference_steps": 3, "true_cfg_scale": 4.0,
                "max_sequence_length": 32}  # fmt: skip
    assert_image_ode_and_decode_are_stock(policy, pipe, _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1),
                                          settings, seed=IMAGE_SEED)  # fmt: skip


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky5_image_to_video_policy_samples_only_the_noised_frames(tmp_path):
    """Kandinsky 5 I2V: the image's latents (the VAE's posterior, drawn by the pipeline's prepare_latents at the
    policy's IMAGE_SEED) are the first latent frame, never stepped, with the visual_cond mask on it; the policy's
    latents are the frames after it, whose Euler ODE is the stock pipeline's sampling (guidance 4) and whose decode
    (the image frame in front, the pipeline's first-frame normalization) is its video; fewer than 5 latent frames
    (NaN latents in the pipeline) are refused in one line."""
    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-kandinsky5-i2v")
    size = {"height": 32, "width": 32, "guidance": 4.0, "max_sequence_length": 600}
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=17, **size)
    assert type(policy).__name__ == "Kandinsky5Policy" and policy.takes_images
    channels, frames, height, width = policy.shape
    assert policy.latent_shape() == (channels, frames - 1, height, width) == (4, 4, 4, 4)
    image, other = _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1)
    prepared = _record_prepare_latents(pipe)
    call = {"prompt": "a red circle", "negative_prompt": "", "image": Image.open(image), "num_frames": 17,
            "num_inference_steps": 3, "guidance_scale": 4.0, "height": 32, "width": 32, "max_sequence_length": 600,
            "generator": torch.Generator().manual_seed(IMAGE_SEED)}  # fmt: skip
    stock, video = stock_run(pipe, **call)  # stock: (B, F, H, W, 2C + 1), before the first-frame normalization
    # (the pipeline steps the latents it is given in place: it gets a clone, prepared[0] keeps the start)
    cond = policy.encode(["a red circle"], [image])
    first = prepared[0][..., :channels].permute(0, 4, 1, 2, 3)  # (B, C, F, H, W)
    torch.testing.assert_close(cond[0][1], first[:, :, :1], atol=1e-6, rtol=0)  # the pipeline's image frame
    ours = euler(policy, first[:, :, 1:], pipe.scheduler.sigmas[:-1].tolist(), cond)
    stock = stock[..., :channels].permute(0, 4, 1, 2, 3)
    assert stock.abs().max() > 1
    print(f"Kandinsky5Policy I2V: ODE vs stock {(ours - stock[:, :, 1:]).abs().max():.2e}")
    torch.testing.assert_close(torch.cat([first[:, :, :1], ours], dim=2), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    # each video is normalized alone (the pipeline's batched normalization would mix their statistics)
    pair = policy.encode(["a red circle"] * 2, [image, other])
    both = policy.clean(torch.cat([ours, 3 * ours]), pair)
    torch.testing.assert_close(both[1:], policy.clean(3 * ours, policy.encode(["a red circle"], [other])))
    torch.testing.assert_close(both[:1], policy.clean(ours, cond))
    moved = policy.velocity(ours, 1.0, policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(ours, 1.0, cond)).abs().max() > 1e-3  # the image conditions the rest
    with pytest.raises(ValueError, match=r"^frames 13: Kandinsky5I2VPipeline normalizes its first 4 latent frames "
                                         r".* set sample.frames to 17 or more$"):  # fmt: skip
        policy_for(pipe)(pipe, pipe.transformer, frames=13, **size)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_hunyuanvideo15_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """HunyuanVideo-1.5 I2V: SigLIP image tokens and the image's condition latents and mask in channels, guidance as
    the pipeline's ClassifierFreeGuidance guider; the pipeline sizes the video by the image's aspect-ratio bucket
    (40x30 pixels -> 36x28 at target_size 32), and an image of another bucket is refused in one line."""
    from diffusers.guiders import ClassifierFreeGuidance

    pipe = build_tiny("tiny-hunyuanvideo15-i2v")
    pipe.guider = ClassifierFreeGuidance(guidance_scale=3.0)
    # 448 text tokens (the pipeline pads to 1000): the tiny byte-level template leaves ~400 system-prompt bytes in it
    size = {"frames": 5, "height": 36, "width": 28, "guidance": 3.0, "max_sequence_length": 448}
    policy = policy_for(pipe)(pipe, pipe.transformer, **size)
    assert type(policy).__name__ == "HunyuanVideo15Policy" and policy.takes_images
    settings = {"num_frames": 5, "num_inference_steps": 2}
    assert_image_ode_and_decode_are_stock(policy, pipe, _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1),
                                          settings)  # fmt: skip
    square = tmp_path / "square.png"
    Image.new("RGB", (32, 32)).save(square)
    with pytest.raises(ValueError, match=r"^an image of 32x32 \(width x height\): HunyuanVideo15ImageToVideoPipeline "
                                         r"samples it at height 32, width 32 .* are 36/28; "):  # fmt: skip
        policy.encode(["a red circle"], [str(square)])


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx_image_to_video_policy_samples_only_the_noised_frames(tmp_path):
    """LTX-Video I2V: the image's latents (the VAE's posterior drawn at IMAGE_SEED, as the pipeline draws them with a
    generator at that seed) are the clean first frame, timestep 0 on its tokens; the policy's latents are the frames
    after it, whose Euler ODE through the pipeline's sigmas is the stock pipeline's sampling (guidance 3) and whose
    decode with the image frame in front is its video; frames of one latent frame (the image's alone) are refused."""
    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-ltx-i2v")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                              max_sequence_length=16)  # fmt: skip
    assert type(policy).__name__ == "LTXPolicy" and policy.takes_images
    channels, frames, height, width = policy.shape
    assert policy.latent_shape() == (channels, frames - 1, height, width)  # the noised frames alone
    image, other = _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1)
    prepared = _record_prepare_latents(pipe)
    call = {"prompt": "a red circle", "negative_prompt": "", "image": Image.open(image), "num_frames": 9, "height": 32,
            "width": 32, "num_inference_steps": 3, "guidance_scale": 3.0, "max_sequence_length": 16}  # fmt: skip
    stock, video = stock_run(pipe, generator=torch.Generator().manual_seed(IMAGE_SEED), **call)
    start = pipe._unpack_latents(prepared[0][0], frames, height, width, 1, 1)  # the pipeline's image frame and noise
    cond = policy.encode(["a red circle"], [image])
    torch.testing.assert_close(cond[0][1], start[:, :, :1], atol=1e-6, rtol=0)  # the image frame is the pipeline's
    levels = pipe.scheduler.sigmas[:-1].tolist()
    ours = euler(policy, start[:, :, 1:], levels, cond)
    assert stock.abs().max() > 1
    print(f"LTXPolicy I2V: ODE vs stock {(pipe._pack_latents(policy.clean(ours, cond)) - stock).abs().max():.2e}")
    torch.testing.assert_close(pipe._pack_latents(policy.clean(ours, cond)), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    moved = policy.velocity(start[:, :, 1:], 1.0, policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(start[:, :, 1:], 1.0, cond)).abs().max() > 1e-3  # the image conditions the rest
    with pytest.raises(ValueError, match=r"^frames 1: LTXImageToVideoPipeline keeps the first latent frame the "
                                         r"image's .* set sample.frames to 5 or more$"):  # fmt: skip
        policy_for(pipe)(pipe, pipe.transformer, frames=1, height=32, width=32, guidance=3.0, max_sequence_length=16)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_sana_video_image_to_video_policy_samples_only_the_noised_frames(tmp_path):
    """Sana-Video I2V: the image's latents (the VAE's mode, normalised) are the clean first frame, timestep 0 on its
    tokens; the policy's latents are the frames after it, whose Euler ODE through the scheduler's flow sigmas is the
    stock pipeline's first-order DPM-solver++ sampling at unrounded timesteps (guidance 3) and whose decode with the
    image frame in front is its video; one latent frame (the image's alone) is refused."""
    from policy_checks import unrounded_dpm_solver

    pipe = build_tiny("tiny-sana-video-i2v")
    pipe.scheduler = unrounded_dpm_solver(pipe.scheduler)
    size = {"height": 32, "width": 32, "guidance": 3.0, "max_sequence_length": 16}
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, **size)
    assert type(policy).__name__ == "SanaVideoPolicy" and policy.takes_images
    channels, frames, height, width = policy.shape
    assert policy.latent_shape() == (channels, frames - 1, height, width)  # the noised frames alone
    image, other = _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1)
    prepared = _record_prepare_latents(pipe)
    noise = torch.randn(1, *policy.shape, generator=torch.Generator().manual_seed(1))
    call = {"prompt": "a red circle", "negative_prompt": "", "image": Image.open(image), "frames": 9,
            "num_inference_steps": 3, "guidance_scale": 3.0, "use_resolution_binning": False} | size  # fmt: skip
    del call["guidance"]
    stock, video = stock_run(pipe, latents=noise.clone(), **call)
    cond = policy.encode(["a red circle"], [image])
    torch.testing.assert_close(cond[0][1], prepared[0][:, :, :1], atol=1e-6, rtol=0)  # the pipeline's image frame
    assert cond[0][1].abs().max() > 0.1
    levels = pipe.scheduler.sigmas[:-1].tolist()
    ours = euler(policy, noise[:, :, 1:], levels, cond)
    assert stock.abs().max() > 1
    print(f"SanaVideoPolicy I2V: ODE vs stock {(policy.clean(ours, cond) - stock).abs().max():.2e}")
    torch.testing.assert_close(policy.clean(ours, cond), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    moved = policy.velocity(noise[:, :, 1:], 1.0, policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(noise[:, :, 1:], 1.0, cond)).abs().max() > 1e-3  # the image conditions the rest
    with pytest.raises(ValueError, match=r"^frames 1: SanaImageToVideoPipeline keeps the first latent frame the "
                                         r"image's .* set sample.frames to 5 or more$"):  # fmt: skip
        policy_for(pipe)(pipe, pipe.transformer, frames=1, **size)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_easyanimate_inpaint_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """EasyAnimate inpaint as image-to-video at strength 1: the mask's and the masked video's latents (the image as the
    kept first frame, its noise augmentation drawn at IMAGE_SEED) join the noise in channels; the Euler ODE from the
    pipeline's own noise is its sampling (guidance 5) and the decode its video."""
    from diffusers.pipelines.easyanimate.pipeline_easyanimate_inpaint import get_image_to_video_latent

    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-easyanimate-inpaint")
    assert pipe.transformer.config.add_noise_in_inpaint_model  # the augmentation noise is part of what is compared
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=5.0,
                              max_sequence_length=256)  # fmt: skip
    assert type(policy).__name__ == "EasyAnimatePolicy" and policy.takes_images
    assert policy.latent_shape() == (4, 2, 4, 4)  # every latent frame is sampled (in_channels 9 = 4 + 1 + 4)
    image, other = _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1)
    # the pipeline draws its noise (it cannot take latents at strength 1 in diffusers 0.42.1), then its generator
    # restarts at IMAGE_SEED for the augmentation noise, as the policy draws it
    generator, prepared, stock_prepare = torch.Generator().manual_seed(1), [], pipe.prepare_latents

    def prepare(*args, **kwargs):
        prepared.append(stock_prepare(*args, **kwargs))
        generator.manual_seed(IMAGE_SEED)
        return prepared[-1]

    pipe.prepare_latents = prepare
    video, mask = get_image_to_video_latent([Image.open(image).convert("RGB")], None, 5, (32, 32))
    stock, frames = stock_run(pipe, prompt="a red circle", negative_prompt="", video=video, mask_video=mask,
                              num_frames=5, height=32, width=32, num_inference_steps=3, guidance_scale=5.0,
                              generator=generator)  # fmt: skip
    noise, cond = prepared[0][1], policy.encode(["a red circle"], [image])
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    print(f"EasyAnimatePolicy inpaint I2V: ODE vs stock {(ours - stock).abs().max():.2e}")
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), frames, atol=1e-5, rtol=0)
    moved = policy.velocity(noise, 1.0, policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(noise, 1.0, cond)).abs().max() > 1e-3


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_motif_video_image_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """Motif-Video I2V: the image's latents (the VAE's posterior drawn at IMAGE_SEED) and mask in channels on the first
    frame, every frame stepped, its SigLIP tokens (the text encoder's vision tower) to the transformer; the Euler ODE
    is the stock pipeline's sampling with its ClassifierFreeGuidance guider (4) and the decode its video; the tokens
    condition the velocity."""
    from diffusers.guiders import ClassifierFreeGuidance

    from dit_sp.families.policy import IMAGE_SEED

    pipe = build_tiny("tiny-motif-video-i2v")
    pipe.guider = ClassifierFreeGuidance(guidance_scale=4.0)
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=4.0,
                              max_sequence_length=32)  # fmt: skip
    assert type(policy).__name__ == "MotifVideoPolicy" and policy.takes_images and policy.images_need_text_encoders
    settings = {"num_frames": 5, "height": 32, "width": 32, "num_inference_steps": 3, "max_sequence_length": 32}
    image = _image(tmp_path / "a.png", 0)
    assert_image_ode_and_decode_are_stock(policy, pipe, image, _image(tmp_path / "b.png", 1), settings,
                                          seed=IMAGE_SEED)  # fmt: skip
    positive, negative = policy.encode(["a red circle"], [image])
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    without = (positive[0], positive[1], torch.zeros_like(positive[2]))
    assert positive[2].shape == (1, 4, 16)  # the tiny tower's 4 tokens of 16
    assert (policy.velocity(noise, 1.0, (without, negative)) - policy.velocity(noise, 1.0, (positive, negative))).abs(
    ).max() > 1e-3  # fmt: skip


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_wan_vace_text_to_video_policy_ode_and_decode_are_the_pipelines(tmp_path):
    """Wan VACE without conditions: the policy's Euler ODE (the pipeline's zero VACE context, scale 1) is the stock
    WanVACEPipeline's text-to-video sampling (guidance 4), its decode the pipeline's video; the VACE context matters
    (the velocity moves without it); prompts with images are refused in one line."""
    pipe = build_tiny("tiny-wan-vace")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=4.0,
                              max_sequence_length=16)  # fmt: skip
    assert type(policy).__name__ == "WanVACEPolicy" and not policy.takes_images
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    stock, video = stock_run(pipe, prompt="a red circle", negative_prompt="", latents=noise.clone(), num_frames=9,
                             height=32, width=32, num_inference_steps=3, guidance_scale=4.0,
                             max_sequence_length=16)  # fmt: skip
    cond = policy.encode(["a red circle"])
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    print(f"WanVACEPolicy: ODE vs stock {(ours - stock).abs().max():.2e}")
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    with_context = policy.velocity(noise, 1.0, cond)
    policy.context = torch.zeros_like(policy.context)
    assert (policy.velocity(noise, 1.0, cond) - with_context).abs().max() > 1e-3
    with pytest.raises(ValueError, match="^WanVACEPipeline is text-to-video: its prompts take no image$"):
        policy.encode(["a red circle"], [_image(tmp_path / "a.png", 0)])


def test_every_rank_of_a_policy_that_conditions_with_the_vae_loads_it(tmp_path):
    """A trainer of a Wan VACE checkpoint loads the VAE on every rank, whatever parallel_vae says: its policy encodes
    the zero VACE context with it on every rank (a rank without it used to fail alone while the others waited in a
    collective); other text-to-video checkpoints keep it only where videos are decoded."""
    from dit_sp.rl.trainer import loads_vae
    from dit_sp.zoo import build_tiny, pipeline_class_name

    build_tiny("tiny-wan-vace").save_pretrained(tmp_path / "vace")
    assert loads_vae(1, None, False, pipeline_class_name(tmp_path / "vace"))  # sp rank 1, parallel_vae off
    assert not loads_vae(1, None, False, "WanPipeline") and not loads_vae(1, None, False, None)
    assert loads_vae(0, None, False, "WanPipeline") and loads_vae(1, "rows", False, "WanPipeline")
    assert loads_vae(1, None, True, "WanImageToVideoPipeline")  # every rank encodes the images


def test_an_image_the_policy_refuses_is_refused_when_the_trainer_is_built(tmp_path):
    """HunyuanVideo-1.5 I2V: the second prompt's 40x30 image (bucket 28x36, not the run's 32x32) is refused in one
    line while the trainer is built, on every rank alike (all the run's images checked from their headers), not in
    the first rollout of the data-parallel group that draws it while the others wait in a collective."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file, refusal_when_built

    from dit_sp import spawn

    prompts = image_prompt_file(tmp_path)
    Image.new("RGB", (40, 30)).save(tmp_path / "image1.png")
    config = tiny_config(model="tiny-hunyuanvideo15-i2v", prompts=prompts, frames=5, height=32, width=32,
                         **{"sample.max_sequence_length": 32})  # fmt: skip
    (message,) = spawn(refusal_when_built, 1, args=(config,), timeout=300)
    assert message.startswith("an image of 40x30 (width x height): HunyuanVideo15ImageToVideoPipeline samples it at "
                              "height 28, width 36"), message  # fmt: skip
    assert "\n" not in message


def test_ranks_whose_image_paths_hold_other_images_or_none_are_refused(tmp_path):
    """Rank 1 reads other images at the run's image paths (a machine without the shared disk), or finds none there:
    the trainer refuses in one line, on both ranks, before loading (the ranks of a sample would otherwise condition it
    on other images; a rank that failed alone would leave the others waiting in a collective)."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file, refusal_when_built_elsewhere

    from dit_sp import spawn

    prompts, other = image_prompt_file(tmp_path), tmp_path / "other.png"
    Image.new("RGB", (32, 32)).save(other)
    config = tiny_config(model="tiny-ltx-i2v", prompts=prompts, frames=5, height=32, width=32)
    messages = spawn(refusal_when_built_elsewhere, 2, args=(config, str(other)), timeout=300)
    assert messages == ["ranks [1] have other image files (the same paths, other content) than rank 0: every rank "
                        "must get the same config file, flags and files"] * 2  # fmt: skip
    # an image missing on rank 1 only: both ranks refuse in one line (rank 0 used to wait in a collective)
    messages = spawn(refusal_when_built_elsewhere, 2, args=(config, None), timeout=300)
    missing = f"{prompts}:1: image image0.png does not exist (paths are relative to the file)"
    assert messages == [f"ranks [1] cannot read the prompts: {missing}", missing], messages


def test_the_policies_refusals_come_before_loading(tmp_path):
    """The trainer's preflight (no weights, no workers) refuses what the policies refuse from the settings alone:
    ChronoEdit's frame count, LTX-Video and Sana-Video I2V's single latent frame, Kandinsky 5 I2V's fewer than 5; a size
    they train passes. A prompt line that gives a source video or a strength is refused (not ignored)."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file

    from dit_sp.rl.preflight import check_before_loading

    prompts = image_prompt_file(tmp_path)
    refused = [
        ("tiny-chronoedit", 9, r"^frames 9: ChronoEditPipeline samples 5 frames \(the image and its edit\)", 5),
        ("tiny-ltx-i2v", 1, r"^frames 1: LTXImageToVideoPipeline keeps the first latent frame the image's", 5),
        ("tiny-sana-video-i2v", 1, r"^frames 1: SanaImageToVideoPipeline keeps the first latent frame the image's", 5),
        ("tiny-kandinsky5-i2v", 13, r"^frames 13: Kandinsky5I2VPipeline normalizes its first 4 latent frames", 17),
    ]
    for model, frames, message, trained in refused:
        with pytest.raises(ValueError, match=message):
            check_before_loading(tiny_config(model=model, prompts=prompts, frames=frames, height=32, width=32), 1)
        check_before_loading(tiny_config(model=model, prompts=prompts, frames=trained, height=32, width=32), 1)
    # EasyAnimate inpaint trains image-to-video from pure noise: a line giving a source video or a strength is refused
    check_before_loading(tiny_config(model="tiny-easyanimate-inpaint", prompts=prompts, frames=9, height=32, width=32,
                                     **{"sample.max_sequence_length": 256}), 1)  # fmt: skip
    for key, value in (("video", "clip.mp4"), ("strength", 0.6)):
        line = json.dumps({"prompt": "a red circle", "image": "image0.png", key: value})
        (tmp_path / "other.jsonl").write_text(line + "\n")
        config = tiny_config(model="tiny-easyanimate-inpaint", prompts=str(tmp_path / "other.jsonl"), frames=9)
        with pytest.raises(ValueError, match=rf"other.jsonl:1: '{key}' is not trained: GRPO samples each prompt from "
                                             r"pure noise \(strength 1\) conditioned on at most one image \('image'\); "
                                             "drop it$"):  # fmt: skip
            check_before_loading(config, 1)


def test_the_preflight_runs_a_text_to_video_checkpoint_with_images_as_its_image_to_video_pipeline(tmp_path):
    """A saved SanaVideoPipeline checkpoint (as SANA-Video 2B ships) with an image prompt file: the preflight checks the
    SanaImageToVideoPipeline policy the trainer runs (its single latent frame refused), and the text-to-video one
    without images; a Motif-Video checkpoint without the image pipeline's feature_extractor is refused in one line."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file

    from dit_sp.rl.preflight import check_before_loading, check_policy
    from dit_sp.zoo import build_tiny

    build_tiny("tiny-sana-video").save_pretrained(tmp_path / "sana")
    model, images, texts = str(tmp_path / "sana"), image_prompt_file(tmp_path), tmp_path / "texts.txt"
    texts.write_text("a red circle\n")
    with pytest.raises(ValueError, match=r"^frames 1: SanaImageToVideoPipeline keeps the first latent frame"):
        check_before_loading(tiny_config(model=model, prompts=images, frames=1, height=32, width=32), 1)
    check_before_loading(tiny_config(model=model, prompts=texts, frames=1, height=32, width=32), 1)
    config = tiny_config(model=model, prompts=images, frames=5, height=32, width=32)
    assert check_policy(config, None, images=True) == "SanaImageToVideoPipeline"
    assert check_policy(config, None) == "SanaVideoPipeline"
    motif = tiny_config(model="tiny-motif-video", prompts=images, frames=5, height=32, width=32)
    with pytest.raises(
        ValueError,
        match=r"^tiny-motif-video \(MotifVideoPipeline\) cannot run with an image: its "
        r"image-to-video pipeline MotifVideoImage2VideoPipeline needs the component",
    ):
        check_before_loading(motif, 1)
