"""GRPO policies of CogVideoX (v-prediction as a flow velocity), LTX-2 (video stream, audio isolated), LTX-Video,
SkyReels-V2 T2V, HunyuanVideo-1.5 T2V, Cosmos-Predict2.5 text-to-world, Kandinsky 5 T2V, Mochi (inverted time),
EasyAnimate T2V, Motif-Video T2V, Kandinsky 6 T2V (audio off), Sana-Video T2V (its ODE in
test_family_policies_sana_video.py), and ChronoEdit, CogVideoX / HunyuanVideo-1.5 / LTX-Video I2V and Wan VACE
T2V (their ODE in test_family_policies_image.py): their ODE is the stock pipeline's sampler, one step's gradients and
log-probs on 1x2 and 2x1 (FSDP2 over the SP ranks) are one process's, and a tiny run goes through the CLI (text-to-video
families); the real checkpoints' configs load and plan in test_grpo_real_configs.py."""

from __future__ import annotations

import sys

import pytest
import torch
from cli_run import run_python
from policy_checks import family_configs, family_steps, image_prompt_file, tiny_hunyuanvideo15
from train_runs import assert_grads_equal, metrics_rows

from dit_sp import spawn
from dit_sp.families.cogvideox import CogVideoXPolicy
from dit_sp.families.cosmos import Cosmos25Policy
from dit_sp.families.easyanimate import EasyAnimatePolicy
from dit_sp.families.hunyuan_video15 import HunyuanVideo15Policy
from dit_sp.families.kandinsky5 import Kandinsky5Policy
from dit_sp.families.kandinsky6 import Kandinsky6Policy
from dit_sp.families.ltx import DECODE_SEED, LTXPolicy
from dit_sp.families.mochi import MochiPolicy
from dit_sp.families.motif_video import MotifVideoPolicy
from dit_sp.families.skyreels_v2 import SkyReelsV2Policy
from dit_sp.zoo import build_tiny


@pytest.fixture(scope="module")
def hunyuanvideo15(tmp_path_factory) -> str:
    return tiny_hunyuanvideo15(str(tmp_path_factory.mktemp("hunyuanvideo15") / "pipe"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text('a red circle moving left\nthe word "hi" in blue\n')
    return str(path)


def euler(policy, noise: torch.Tensor, levels: list[float], prompt: str) -> torch.Tensor:
    """The policy's Euler ODE (``g = 0``: GRPO's SDE step without noise) through ``levels``, to 0."""
    cond = policy.encode([prompt])
    x = noise
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


def assert_euler_is_stock(policy, noise: torch.Tensor, pipe, stock: torch.Tensor, prompt: str = "a red circle") -> None:
    """The policy's Euler ODE through the scheduler's own sigmas equals the stock pipeline's latents ``stock`` (of a
    real scale) within 1e-5."""
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), prompt)
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_cogvideox_policy_ode_is_the_pipelines_ddim():
    """At the noise levels of the scheduler's own timesteps (``s = b / (a + b)``), the flow Euler steps of the
    converted velocity are the stock pipeline's DDIM v-prediction steps, guidance included."""
    pipe = build_tiny("tiny-cogvideox")
    policy = CogVideoXPolicy(pipe, pipe.transformer, frames=9, height=64, width=64, guidance=3.0,
                             max_sequence_length=8)  # fmt: skip
    noise = torch.randn(1, 3, 4, 8, 8, generator=torch.Generator().manual_seed(0))  # (B, F, C, H, W) as the pipeline's
    settings = {"num_frames": 9, "height": 64, "width": 64, "num_inference_steps": 4, "guidance_scale": 3.0}
    stock = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="latent",
                 max_sequence_length=8, **settings).frames  # fmt: skip
    alphas = pipe.scheduler.alphas_cumprod.double()
    levels = [((1 - alphas[t]).sqrt() / (alphas[t].sqrt() + (1 - alphas[t]).sqrt())).item()
              for t in pipe.scheduler.timesteps]  # fmt: skip
    assert levels[0] == 1.0 and policy.timestep_at(torch.tensor(levels, dtype=torch.float64)).tolist() == [
        float(t) for t in pipe.scheduler.timesteps
    ]
    ours = euler(policy, noise.permute(0, 2, 1, 3, 4), levels, "a red circle").permute(0, 2, 1, 3, 4)
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)


def test_cogvideox_policy_refuses_what_it_cannot_convert():
    from diffusers import CogVideoXDDIMScheduler

    pipe = build_tiny("tiny-cogvideox")
    size = {"frames": 9, "height": 64, "width": 64, "guidance": 1.0, "max_sequence_length": 8}
    config = dict(pipe.scheduler.config)
    pipe.scheduler = CogVideoXDDIMScheduler.from_config(config | {"prediction_type": "epsilon"})
    with pytest.raises(ValueError, match="^CogVideoX GRPO converts v-prediction to a flow velocity; this scheduler "):
        CogVideoXPolicy(pipe, pipe.transformer, **size)
    pipe.scheduler = CogVideoXDDIMScheduler.from_config(config | {"rescale_betas_zero_snr": False})
    with pytest.raises(ValueError, match=r"noisiest timestep is at flow noise level 0\.9620, and GRPO samples from"):
        CogVideoXPolicy(pipe, pipe.transformer, **size)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_hunyuanvideo15_policy_ode_is_the_pipelines(hunyuanvideo15):
    """The policy's Euler ODE is the stock pipeline's sampling (its guider's CFG), though the policy keeps 32 text
    tokens and one image token where the pipeline pads to 1000 + 256 text and 729 image tokens: padding is masked
    (the prompt fits in 32 tokens)."""
    from diffusers import HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance

    pipe = HunyuanVideo15Pipeline.from_pretrained(hunyuanvideo15)
    pipe.guider = ClassifierFreeGuidance(guidance_scale=2.0)
    policy = HunyuanVideo15Policy(pipe, pipe.transformer, frames=5, height=32, width=48, guidance=2.0,
                                  max_sequence_length=32)  # fmt: skip
    prompt = 'a red circle, "hi"'
    assert policy.encode([prompt])[0][3].sum() > 0  # the glyph text is encoded too
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    stock = pipe(prompt=prompt, negative_prompt="", num_frames=5, height=32, width=48, num_inference_steps=2,
                 latents=noise.clone(), output_type="latent").frames  # fmt: skip
    pipe.scheduler.set_timesteps(sigmas=[1.0, 0.5])  # the pipeline's sigmas, shifted by its scheduler
    assert_euler_is_stock(policy, noise, pipe, stock, prompt)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx_policy_ode_and_decode_are_the_pipelines():
    """The policy's Euler ODE through the scheduler's sigmas is the stock LTXPipeline's sampling (packed latents,
    guidance, its RoPE scale), and its decode is the pipeline's video, with a timestep-conditioned VAE too (at the
    pipeline's default decode_timestep 0)."""
    from diffusers import AutoencoderKLLTXVideo

    pipe = build_tiny("tiny-ltx")
    policy = LTXPolicy(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0, max_sequence_length=16)
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    settings = {"prompt": "a red circle", "negative_prompt": "", "num_frames": 9, "height": 32, "width": 32,
                "num_inference_steps": 3, "guidance_scale": 3.0, "max_sequence_length": 16}  # fmt: skip
    stock = pipe(latents=pipe._pack_latents(noise), output_type="latent", **settings).frames
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), "a red circle")
    assert stock.abs().max() > 1
    torch.testing.assert_close(pipe._pack_latents(ours), stock, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    pipe.vae = AutoencoderKLLTXVideo.from_config(dict(pipe.vae.config) | {"timestep_conditioning": True})
    video = pipe(latents=pipe._pack_latents(noise), output_type="pt", **settings).frames  # (B, F, C, H, W)
    torch.testing.assert_close(policy.decode(ours), video, atol=1e-5, rtol=0)
    # LTX-Video 0.9.1's decoder injects per-pixel noise: drawn at the policy's fixed seed, whatever the global state
    config = dict(pipe.vae.config) | {"decoder_inject_noise": (True,) * len(pipe.vae.config.decoder_inject_noise)}
    pipe.vae = AutoencoderKLLTXVideo.from_config(config)
    with torch.no_grad():
        for block in pipe.vae.decoder.modules():  # the noise scales start at zero
            for name in ("per_channel_scale1", "per_channel_scale2"):
                if getattr(block, name, None) is not None:
                    getattr(block, name).fill_(0.5)
    first = policy.decode(ours)
    torch.manual_seed(123)
    assert torch.equal(policy.decode(ours), first)
    torch.manual_seed(DECODE_SEED)
    at_seed = pipe.vae.decode(policy._unscale(ours), torch.zeros(1), return_dict=False)[0]
    assert torch.equal(((at_seed + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4), first)
    torch.manual_seed(DECODE_SEED + 1)
    other = pipe.vae.decode(policy._unscale(ours), torch.zeros(1), return_dict=False)[0]
    assert (other - at_seed).abs().max() > 1e-2  # the noise matters


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_skyreels_v2_policy_ode_is_the_pipelines():
    """SkyReels-V2 T2V is sampled as Wan: the policy's Euler ODE is the stock SkyReelsV2Pipeline's sampling with an
    Euler flow scheduler (the same velocity, timesteps and guidance its UniPC scheduler integrates)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = build_tiny("tiny-skyreels-v2")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=8.0)
    policy = SkyReelsV2Policy(pipe, pipe.transformer, frames=9, height=48, width=32, guidance=6.0,
                              max_sequence_length=16)  # fmt: skip
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    settings = {"num_frames": 9, "height": 48, "width": 32, "num_inference_steps": 3, "guidance_scale": 6.0}
    stock = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="latent",
                 max_sequence_length=16, **settings).frames  # fmt: skip
    assert_euler_is_stock(policy, noise, pipe, stock)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_cosmos25_policy_ode_is_the_pipelines():
    """Cosmos-Predict2.5 text-to-world: the policy's Euler ODE (timestep ``s``, zero condition mask, guidance
    ``cond + w (cond - uncond)``) is the stock Cosmos2_5_PredictBasePipeline's sampling with an Euler flow scheduler
    in place of its UniPC one (the same velocity and sigmas); image conditioning is refused in one line."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = build_tiny("tiny-cosmos2.5")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    policy = Cosmos25Policy(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                            max_sequence_length=160)  # fmt: skip
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    settings = {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 3, "guidance_scale": 3.0}
    stock = pipe(prompt="a red circle", negative_prompt="", max_sequence_length=160, latents=noise.clone(),
                 output_type="latent", **settings).frames  # fmt: skip
    assert_euler_is_stock(policy, noise, pipe, stock)
    with pytest.raises(ValueError, match="^Cosmos-Predict2.5 GRPO trains text-to-world only: image- and video-to-"):
        policy.encode(["a red circle"], ["frame.png"])


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky5_policy_ode_is_the_pipelines():
    """Kandinsky 5 T2V: the policy's Euler ODE (channels-last latents for the transformer, each prompt's text at its own
    length, the pipeline's rotary positions and scale) is the stock Kandinsky5T2VPipeline's sampling, guidance
    included; the prompt's and the negative prompt's text lengths differ (two transformer calls per guided step)."""
    pipe = build_tiny("tiny-kandinsky5")
    policy = Kandinsky5Policy(pipe, pipe.transformer, frames=9, height=48, width=32, guidance=4.0,
                              max_sequence_length=64)  # fmt: skip
    positive, negative = policy.encode(["a red circle"])
    assert positive[1].item() > negative[1].item() > 0 and positive[0].shape == (1, 64, 16)
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    settings = {"num_frames": 9, "height": 48, "width": 32, "num_inference_steps": 3, "guidance_scale": 4.0}
    stock = pipe(
        prompt="a red circle",
        negative_prompt="",
        max_sequence_length=64,
        output_type="latent",
        latents=noise.permute(0, 2, 3, 4, 1).clone(),
        **settings,
    ).frames  # (B, F, H, W, C)
    ours = euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), "a red circle")
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours.permute(0, 2, 3, 4, 1), stock, atol=1e-5, rtol=0)
    # a batch of prompts of different lengths: each sample's velocity is its own prompt's alone
    cond = policy.encode(["a red circle", "a blue square moving left"])
    assert cond[0][1].tolist()[0] != cond[0][1].tolist()[1]
    x = noise.repeat(2, 1, 1, 1, 1)
    both = policy.velocity(x, 0.7, cond)
    alone = torch.cat(
        [policy.velocity(noise, 0.7, policy.encode([p])) for p in ["a red circle", "a blue square moving left"]]
    )
    torch.testing.assert_close(both, alone, atol=1e-5, rtol=0)
    assert (both[0] - both[1]).abs().max() > 1e-3


def assert_ode_and_decode_are_stock(policy, pipe, levels: list[float], settings: dict) -> None:
    """The policy's Euler ODE through ``levels`` (the scheduler's own noise levels) is the stock pipeline's latents
    within 1e-5, and its decode is the pipeline's video (``output_type="pt"``, ``(B, F, C, H, W)``) within 1e-5."""
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    stock = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="latent",
                 **settings).frames  # fmt: skip
    ours = euler(policy, noise, levels, "a red circle")
    assert stock.abs().max() > 1
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    video = pipe(prompt="a red circle", negative_prompt="", latents=noise.clone(), output_type="pt", **settings).frames
    torch.testing.assert_close(policy.decode(ours), video, atol=1e-5, rtol=0)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_mochi_policy_ode_and_decode_are_the_pipelines():
    """Mochi runs time backwards (its scheduler's inverted sigmas ``1 - s``, timestep ``1000 (1 - s)``, ``x0 - eps``
    predicted): the policy's flow velocity at the noise levels ``1 - sigma`` gives the stock MochiPipeline's
    latents (its linear-quadratic schedule, guidance 4.5) and its decode the pipeline's video (the VAE's latent
    mean and std)."""
    pipe = build_tiny("tiny-mochi")
    policy = MochiPolicy(pipe, pipe.transformer, frames=13, height=48, width=16, guidance=4.5, max_sequence_length=32)
    settings = {"num_frames": 13, "height": 48, "width": 16, "num_inference_steps": 3, "guidance_scale": 4.5,
                "max_sequence_length": 32}  # fmt: skip
    pipe.scheduler.set_timesteps(sigmas=[1.0, 0.5, 0.2])  # only to read how it inverts: the pipeline sets its own
    assert pipe.scheduler.sigmas.tolist()[0] == 0.0 and pipe.scheduler.timesteps.tolist()[0] == 0.0
    levels = []
    pipe(prompt="a red circle", negative_prompt="", output_type="latent", **settings,
         callback_on_step_end=lambda p, i, t, kw: levels.append(1 - p.scheduler.sigmas[i].item()) or {})  # fmt: skip
    assert levels[0] == 1.0 and levels == sorted(levels, reverse=True)
    assert_ode_and_decode_are_stock(policy, pipe, levels, settings)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_easyanimate_policy_ode_and_decode_are_the_pipelines():
    """EasyAnimate T2V: the policy's Euler ODE (Qwen2-VL's chat-formatted prompt at the pipeline's 256 tokens,
    unmasked) is the stock EasyAnimatePipeline's sampling (guidance 5), and its decode the pipeline's video."""
    pipe = build_tiny("tiny-easyanimate")
    policy = EasyAnimatePolicy(pipe, pipe.transformer, frames=9, height=48, width=32, guidance=5.0,
                               max_sequence_length=256)  # fmt: skip
    settings = {"num_frames": 9, "height": 48, "width": 32, "num_inference_steps": 3, "guidance_scale": 5.0}
    pipe.scheduler.set_timesteps(3)
    assert_ode_and_decode_are_stock(policy, pipe, pipe.scheduler.sigmas[:-1].tolist(), settings)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_motif_video_policy_ode_and_decode_are_the_pipelines():
    """Motif-Video T2V: the policy's Euler ODE (zero condition latents and mask in channels, masked T5Gemma2 text,
    classifier-free guidance as one batch) is the stock MotifVideoPipeline's sampling through its
    ClassifierFreeGuidance guider (two calls a step), and its decode the pipeline's video."""
    from diffusers.guiders import ClassifierFreeGuidance

    pipe = build_tiny("tiny-motif-video")
    pipe.guider = ClassifierFreeGuidance(guidance_scale=3.0)
    policy = MotifVideoPolicy(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                              max_sequence_length=32)  # fmt: skip
    settings = {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 3, "max_sequence_length": 32}
    pipe.scheduler.set_timesteps(sigmas=[1.0, 2 / 3, 1 / 3])  # the pipeline's sigmas, shifted by its scheduler
    assert_ode_and_decode_are_stock(policy, pipe, pipe.scheduler.sigmas[:-1].tolist(), settings)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_kandinsky6_policy_ode_and_decode_are_the_pipelines_without_audio():
    """Kandinsky 6 T2V, audio off: the policy's Euler ODE (channels-last latents with zero condition channels, the
    pipeline's default negative prompt for an empty one, guidance as one batch) is the stock
    Kandinsky6TI2VAPipeline's sampling with sample_audio=False, and its decode the pipeline's video; at 600 text
    tokens the prompt is padded (masked) and the default negative prompt is not (the pipeline passes no mask)."""
    pipe = build_tiny("tiny-kandinsky6")
    policy = Kandinsky6Policy(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=2.0,
                              max_sequence_length=600)  # fmt: skip
    positive, negative = policy.encode(["a red circle"])
    assert 0 < positive[2].sum() < 600 and negative[2].all()
    settings = {"num_frames": 5, "height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 2.0,
                "max_sequence_length": 600, "sample_audio": False}  # fmt: skip
    pipe.scheduler.set_timesteps(2)
    assert_ode_and_decode_are_stock(policy, pipe, pipe.scheduler.sigmas[:-1].tolist(), settings)


def test_mochi_easyanimate_motif_kandinsky6_policies_refuse_what_they_cannot_match():
    from diffusers import FlowMatchEulerDiscreteScheduler, PiflowScheduler
    from diffusers.guiders import ClassifierFreeGuidance

    mochi = build_tiny("tiny-mochi")
    size = {"frames": 13, "height": 48, "width": 16, "guidance": 4.5, "max_sequence_length": 32}
    with pytest.raises(ValueError, match=r"^frames 9: Mochi's VAE needs 6\*k\+1 frames, e\.g\. \[7, 13, 19, 25\]$"):
        MochiPolicy(mochi, mochi.transformer, **size | {"frames": 9})
    mochi.scheduler = FlowMatchEulerDiscreteScheduler()
    with pytest.raises(ValueError, match="^Mochi GRPO: FlowMatchEulerDiscreteScheduler without invert_sigmas; "):
        MochiPolicy(mochi, mochi.transformer, **size)
    easyanimate = build_tiny("tiny-easyanimate")
    with pytest.raises(ValueError, match="^max_sequence_length 32: EasyAnimatePipeline pads every prompt to 256 "):
        EasyAnimatePolicy(easyanimate, easyanimate.transformer, frames=9, height=48, width=32, guidance=5.0,
                          max_sequence_length=32)  # fmt: skip
    motif = build_tiny("tiny-motif-video")
    size = {"frames": 9, "height": 32, "width": 32, "guidance": 3.0, "max_sequence_length": 32}
    for guider in (ClassifierFreeGuidance(guidance_rescale=0.7), ClassifierFreeGuidance(use_original_formulation=True),
                   ClassifierFreeGuidance(stop=0.5)):  # fmt: skip
        motif.guider = guider
        with pytest.raises(
            ValueError, match="^Motif-Video GRPO guides by classifier-free guidance on the velocity"
        ) as err:
            MotifVideoPolicy(motif, motif.transformer, **size)
        assert "\n" not in str(err.value) and "ClassifierFreeGuidance(guidance_rescale=" in str(err.value)
    MotifVideoPolicy(motif, motif.transformer, **size | {"guidance": 1.0})  # unguided: the guider is not used
    kandinsky6 = build_tiny("tiny-kandinsky6")
    kandinsky6.scheduler = PiflowScheduler()
    with pytest.raises(ValueError, match="^Kandinsky 6 GRPO trains a flow velocity, and this pipeline samples with "
                                         "PiflowScheduler"):  # fmt: skip
        Kandinsky6Policy(kandinsky6, kandinsky6.transformer, **size)


def test_helios_is_refused_with_its_reason():
    from dit_sp.families import policy_for

    for name in ("HeliosPipeline", "HeliosPyramidPipeline"):
        with pytest.raises(ValueError, match=f"^GRPO does not train {name}: it generates the video chunk by chunk, "):
            policy_for(type(name, (), {})())
    with pytest.raises(ValueError, match="^GRPO has no policy for StableDiffusionPipeline; supported pipelines: "):
        policy_for(type("StableDiffusionPipeline", (), {})())


@pytest.mark.slow
def test_policy_steps_equal_single_process_on_1x2_and_2x1(hunyuanvideo15, prompts, tmp_path):
    """One GRPO step per family (guided, joint or isolated attention, 2 or 3 heads over 2 ranks): the rollout's
    log-probabilities and rewards and the FSDP2 gradients on 1x2 and 2x1 are one process's within 1e-5; exactly on
    policy; LTX-2's and Kandinsky 6's audio layers get no gradient; the VAEs that can decode split by rows do."""
    images = image_prompt_file(tmp_path)
    single = spawn(family_steps, 1, args=(family_configs(hunyuanvideo15, images, prompts=prompts),), timeout=600)[0]
    layouts = family_configs(hunyuanvideo15, images, prompts=prompts, ulysses=2)
    layouts += family_configs(hunyuanvideo15, images, prompts=prompts, ring=2)
    results = spawn(family_steps, 2, args=(layouts,), timeout=600)
    policies = ["CogVideoXPolicy", "LTX2Policy", "LTXPolicy", "SkyReelsV2Policy", "HunyuanVideo15Policy",
                "Cosmos25Policy", "Kandinsky5Policy", "MochiPolicy", "EasyAnimatePolicy", "MotifVideoPolicy",
                "Kandinsky6Policy", "SanaVideoPolicy", "ChronoEditPolicy", "CogVideoXPolicy",
                "HunyuanVideo15Policy", "LTXPolicy", "SanaVideoPolicy", "SkyReelsV2Policy",
                "Kandinsky5Policy", "HunyuanVideoPolicy", "WanVACEPolicy",
                "LTX2Policy", "EasyAnimatePolicy", "MotifVideoPolicy", "Kandinsky5Policy", "SkyReelsV2Policy",
                "SkyReelsV2Policy", "LTX2Policy",
                "Cosmos3Policy", "Cosmos3Policy", "Kandinsky5Policy"]  # fmt: skip
    assert [r["policy"] for r in single] == policies
    for one in single:
        assert one["ratio"] == (1.0, 1.0) and (one["log_probs"] != 0).all(), one["policy"]
        assert max(g.abs().max().item() for g in one["grads"].values()) > 0
    for ltx2 in [one for one in single if one["policy"] == "LTX2Policy"]:  # text- and image-to-video
        audio = [name for name in ltx2["parameters"] if "audio" in name]
        assert len(audio) > 100  # the audio stream's layers and the audio-video cross-attention
        moved = [name for name in audio if name in ltx2["grads"] and ltx2["grads"][name].abs().max() > 0]
        assert not moved, moved
    # Kandinsky 6 runs without audio tokens: its audio stream, the audio-video cross-attentions and their modulation
    # get no gradient (the audio text branch runs, but nothing of it reaches the video)
    kandinsky6 = single[policies.index("Kandinsky6Policy")]
    audio = [name for name in kandinsky6["parameters"] if any(part in name for part in ("audio", "av_", "va_"))]
    assert len(audio) > 100 and len(audio) < len(kandinsky6["parameters"]) - 50
    moved = [name for name in audio if name in kandinsky6["grads"] and kandinsky6["grads"][name].abs().max() > 0]
    assert not moved, moved
    for rank in results:
        assert len(rank) == 2 * len(policies)
        for layout, (result, one) in zip(["1x2"] * len(policies) + ["2x1"] * len(policies), zip(rank, single * 2)):
            what = f"{one['policy']} {layout}"
            assert result["ratio"] == (1.0, 1.0), what
            torch.testing.assert_close(result["log_probs"], one["log_probs"], atol=1e-5, rtol=0, msg=what)
            torch.testing.assert_close(result["rewards"], one["rewards"], atol=1e-6, rtol=0, msg=what)
            # diffusers zero-initialises Cosmos's learnable positional embedding, whose norm is then its eps (1e-6):
            # its gradient is ~1e6 times the others', so it is compared relative to its own scale
            grads, ref = dict(result["grads"]), dict(one["grads"])
            for name in [name for name in ref if "learnable_pos_embed" in name]:
                scale = ref[name].abs().max().item()
                assert scale > 0 and (grads.pop(name) - ref.pop(name)).abs().max() <= 1e-5 * scale, (what, name)
            assert_grads_equal(grads, ref, what)
        # CogVideoX's, HunyuanVideo-1.5's, Cosmos 2.5's (Wan's), Kandinsky 5's and 6's (HunyuanVideo's), Mochi's,
        # EasyAnimate's (MagVit), Motif-Video's, Sana-Video's, ChronoEdit's and Wan VACE's (Wan's) VAEs decode split by
        # rows (a decoding rank ran fewer rows)
        split = ("CogVideoXPolicy", "HunyuanVideo15Policy", "Cosmos25Policy", "Kandinsky5Policy", "MochiPolicy",
                 "EasyAnimatePolicy", "MotifVideoPolicy", "Kandinsky6Policy", "SanaVideoPolicy",
                 "ChronoEditPolicy", "WanVACEPolicy", "Cosmos3Policy")  # fmt: skip
        for result, one in zip(rank, single * 2):
            if one["policy"] in split:
                assert 0 < result["decoder_rows"] < one["decoder_rows"], (one["policy"], result["decoder_rows"])


@pytest.mark.slow
def test_tiny_grpo_runs_through_the_cli(hunyuanvideo15, prompts, tmp_path):
    """``python -m pipelines.train_grpo`` trains each family's tiny model one step (a small config each). Mochi,
    EasyAnimate, Motif-Video, Kandinsky 6 and Sana-Video are not run here (a process each is too slow for the suite):
    the CLI builds the same ``GRPOTrainer`` from their configs that the layout test above steps on 1 and 2 processes
    (each of the five ran here once when checked by hand)."""
    runs = {
        "tiny-cogvideox": "sample: {frames: 5, height: 32, width: 32, max_sequence_length: 8}\n",
        "tiny-ltx2": "sample: {frames: 5, height: 16, width: 16}\nparallel_vae: false\n",
        "tiny-ltx": "sample: {frames: 5, height: 32, width: 32, max_sequence_length: 16}\n",
        "tiny-skyreels-v2": "sample: {frames: 5, height: 48, width: 32, max_sequence_length: 16}\n",
        hunyuanvideo15: "sample: {frames: 5, height: 32, width: 48, max_sequence_length: 32}\n",
        "tiny-cosmos2.5": "sample: {frames: 5, height: 32, width: 32, max_sequence_length: 160}\n",
        "tiny-kandinsky5": "sample: {frames: 5, height: 48, width: 32, max_sequence_length: 64}\n",
    }
    for i, (model, sample) in enumerate(runs.items()):
        config = tmp_path / f"run{i}.yaml"
        config.write_text(f"model: {model}\nprompts: {prompts}\n{sample}"
                          "grpo: {steps: 2, group_size: 2, prompts_per_step: 1}\noptim: {lr: 0.001}\n")  # fmt: skip
        out = tmp_path / f"out{i}"
        cmd = [sys.executable, "-m", "pipelines.train_grpo", "--config", str(config), "--output-dir", str(out),
               "--max-steps", "1"]  # fmt: skip
        result = run_python(cmd, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        (row,) = metrics_rows(out)
        assert row["step"] == 0 and 0 < row["reward_mean"] < 1 and row["grad_norm"] > 0, (model, row)
