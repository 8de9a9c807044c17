"""GRPO policy of LTX-2 (``LTX2Policy``: the video stream, the audio isolated), text-to-video, image-to-video and the
condition pipeline with one first-frame image: its Euler ODE at the scheduler's own noise levels is the stock
pipeline's sampling where the stock pipeline's audio path is the policy's (the audio-video cross-attentions isolated),
and the test shows what differs where it is not. One GRPO step of text- and image-to-video on 1x2 and 2x1 is in
tests/rl/test_family_policies.py (the families' shared spawn); the condition pipeline's differs from image-to-video's
only in how the image is encoded, which its test compares with the pipeline's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from grpo_checks import tiny_config
from PIL import Image
from policy_checks import image_prompt_file

from dit_sp.families import policy_for
from dit_sp.families.ltx2 import image_crf
from dit_sp.rl.preflight import check_before_loading
from dit_sp.zoo import build_tiny

SETTINGS = {"num_frames": 9, "height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 3.0,
            "max_sequence_length": 32}  # fmt: skip
"""The stock calls' size and classifier-free guidance (the policy's)."""

PLAIN_CFG = {"stg_scale": 0.0, "modality_scale": 1.0, "guidance_rescale": 0.0}
"""The stock pipeline's extra guidance off (spatio-temporal, modality isolation, rescale): not part of the policy."""


def _isolate(pipe, on: bool = True) -> None:
    """Every call of the pipeline's transformer with ``isolate_modalities`` (both audio-video cross-attentions off,
    the video's velocity independent of the audio), as the policy calls it; ``on=False`` removes that."""
    for handle in vars(pipe.transformer).pop("_isolating", []):
        handle.remove()
    if on:
        force = lambda module, args, kwargs: (args, kwargs | {"isolate_modalities": True})  # noqa: E731
        pipe.transformer._isolating = [pipe.transformer.register_forward_pre_hook(force, with_kwargs=True)]


def _stock(pipe, grid: tuple[int, int, int], decode: bool = True, **call) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The stock pipeline's final video latents ``(B, C, F, H, W)`` (read at its last step's callback, normalised as
    the policy's) and, with ``decode``, its video ``(B, F, C, H, W)``."""
    steps = []
    out = pipe(output_type="pt" if decode else "latent",
               callback_on_step_end=lambda p, i, t, kw: steps.append(kw["latents"]) or {}, **call)  # fmt: skip
    return pipe._unpack_latents(steps[-1], *grid, 1, 1), out.frames if decode else None


def _euler(policy, x: torch.Tensor, levels: list[float], cond) -> torch.Tensor:
    """The policy's Euler ODE (GRPO's SDE step without noise) through ``levels``, to 0."""
    for s, s_next in zip(levels, [*levels[1:], 0.0]):
        x = x + (s_next - s) * policy.velocity(x, s, cond)
    return x


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx2_policy_ode_is_the_pipelines_with_the_audio_isolated():
    """LTX2Pipeline with its transformer's audio-video cross-attentions isolated (the policy's audio path) and plain
    classifier-free guidance (guidance 3): its video latents are the policy's Euler ODE within 1e-5 and its video the
    policy's decode. Its own joint sampling differs: the video attends to the audio it denoises beside it. With the
    audio-to-video attention's output zeroed, the stock joint sampling (modality guidance 3 included) is the policy's
    again: that attention is the whole difference."""
    pipe = build_tiny("tiny-ltx2")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                              max_sequence_length=32)  # fmt: skip
    assert type(policy).__name__ == "LTX2Policy" and not policy.takes_images and policy.image_crf == 0
    grid = policy.shape[1:]
    noise = torch.randn(1, *policy.latent_shape(), generator=torch.Generator().manual_seed(1))
    call = {"prompt": "a red circle", "negative_prompt": "", "latents": pipe._pack_latents(noise, 1, 1)} | SETTINGS
    _isolate(pipe)
    stock, video = _stock(pipe, grid, **call, **PLAIN_CFG)
    _isolate(pipe, on=False)
    ours = _euler(policy, noise, pipe.scheduler.sigmas[:-1].tolist(), policy.encode(["a red circle"]))
    assert stock.abs().max() > 1
    print(f"LTX2Policy: ODE vs stock (audio isolated) {(ours - stock).abs().max():.2e}")
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours), video, atol=1e-5, rtol=0)
    joint, _ = _stock(pipe, grid, decode=False, **call, **PLAIN_CFG)
    print(f"LTX2Policy: ODE vs stock joint audio-video sampling {(ours - joint).abs().max():.2e}")
    assert (ours - joint).abs().max() > 0.1
    for block in pipe.transformer.transformer_blocks:
        torch.nn.init.zeros_(block.audio_to_video_attn.to_out[0].weight)
        torch.nn.init.zeros_(block.audio_to_video_attn.to_out[0].bias)
    joint, _ = _stock(pipe, grid, decode=False, **call, **PLAIN_CFG | {"modality_scale": 3.0})
    torch.testing.assert_close(ours, joint, atol=1e-5, rtol=0)


def _image(path, seed: int) -> str:
    Image.fromarray((np.random.RandomState(seed).rand(40, 30, 3) * 255).astype("uint8")).save(path)
    return str(path)


def _first_frame_run_is_the_pipelines(pipe, policy, image_path: str, label: str, **call):
    """The stock pipeline run with ``call`` (its audio isolated, plain guidance) and the policy's Euler ODE from the
    pipeline's own noise: the image frame the pipeline prepares is the policy's clean first frame, the frames after
    it are the stock latents within 1e-5 and the decode its video. Returns the start ``(B, C, F, H, W)`` (image frame
    and noise) and the policy's conditioning."""
    channels, frames, height, width = policy.shape
    prepared, stock_prepare = [], pipe.prepare_latents
    pipe.prepare_latents = lambda *a, **k: prepared.append(stock_prepare(*a, **k)) or (prepared[-1][0].clone(),
                                                                                         *prepared[-1][1:])  # fmt: skip
    _isolate(pipe)
    stock, video = _stock(pipe, policy.shape[1:], prompt="a red circle", negative_prompt="",
                          generator=torch.Generator().manual_seed(0), **SETTINGS, **PLAIN_CFG, **call)  # fmt: skip
    start = pipe._unpack_latents(prepared[0][0], frames, height, width, 1, 1)  # the pipeline's image frame and noise
    cond = policy.encode(["a red circle"], [image_path])
    torch.testing.assert_close(cond[0][1], start[:, :, :1], atol=1e-6, rtol=0)  # the image frame is the pipeline's
    assert cond[0][1].abs().max() > 0.1
    ours = _euler(policy, start[:, :, 1:], pipe.scheduler.sigmas[:-1].tolist(), cond)
    assert stock.abs().max() > 1
    print(f"{label}: ODE vs stock (audio isolated) {(policy.clean(ours, cond) - stock).abs().max():.2e}")
    torch.testing.assert_close(policy.clean(ours, cond), stock, atol=1e-5, rtol=0)
    torch.testing.assert_close(policy.decode(ours, cond), video, atol=1e-5, rtol=0)
    return start, cond


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx2_image_to_video_policy_samples_only_the_noised_frames(tmp_path):
    """LTX2ImageToVideoPipeline (audio isolated, plain guidance 3, its default image re-compression at CRF 33): the
    image's latents (the VAE's mode) are the clean first frame, timestep 0 on its tokens; the policy's latents are the
    frames after it, whose Euler ODE through the pipeline's sigmas is the stock pipeline's sampling within 1e-5 and
    whose decode with the image frame in front is its video; another image, or the image not re-compressed, moves
    the sample; one latent frame (the image's alone) is refused."""
    pipe = build_tiny("tiny-ltx2-i2v")
    size = {"height": 32, "width": 32, "guidance": 3.0, "max_sequence_length": 32}
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, **size)
    assert type(policy).__name__ == "LTX2Policy" and policy.takes_images and policy.image_crf == 33
    channels, frames, height, width = policy.shape
    assert policy.latent_shape() == (channels, frames - 1, height, width)  # the noised frames alone
    image, other = _image(tmp_path / "a.png", 0), _image(tmp_path / "b.png", 1)
    start, cond = _first_frame_run_is_the_pipelines(pipe, policy, image, "LTX2Policy I2V", image=Image.open(image))
    moved = policy.velocity(start[:, :, 1:], 1.0, policy.encode(["a red circle"], [other]))
    assert (moved - policy.velocity(start[:, :, 1:], 1.0, cond)).abs().max() > 1e-3  # the image conditions the rest
    policy.image_crf, policy._image_cache = 0, {}
    assert (policy.encode(["a red circle"], [image])[0][1] - cond[0][1]).abs().max() > 1e-3  # re-compression counts
    with pytest.raises(ValueError, match=r"^frames 1: LTX2ImageToVideoPipeline keeps the first latent frame the "
                                         r"image's .* set sample.frames to 5 or more$"):  # fmt: skip
        policy_for(pipe)(pipe, pipe.transformer, frames=1, **size)
    prompts = image_prompt_file(tmp_path)  # the trainer's preflight refuses it before loading; 5 frames pass
    with pytest.raises(ValueError, match=r"^frames 1: LTX2ImageToVideoPipeline keeps the first latent frame"):
        check_before_loading(tiny_config(model="tiny-ltx2-i2v", prompts=prompts, frames=1, height=32, width=32), 1)
    check_before_loading(tiny_config(model="tiny-ltx2-i2v", prompts=prompts, frames=5, height=32, width=32), 1)


@pytest.mark.slow  # runs the stock pipeline
@torch.no_grad()
def test_ltx2_condition_policy_is_its_image_to_video(tmp_path):
    """LTX2ConditionPipeline with one image condition at latent index 0, strength 1 (a prompt file's image): its own
    preprocessing (resize to cover, centre crop, CRF 33) makes the clean first frame, which it keeps at timestep 0; the
    policy's Euler ODE of the frames after it is the stock sampling (audio isolated, plain guidance 3) within 1e-5, its
    decode the pipeline's video (the text through the connectors at the pipeline's own padding side); one latent
    frame is refused before loading."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

    pipe = build_tiny("tiny-ltx2-condition")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=32, width=32, guidance=3.0,
                              max_sequence_length=32)  # fmt: skip
    assert type(policy).__name__ == "LTX2Policy" and policy.takes_images and policy.image_crf == 33
    channels, frames, height, width = policy.shape
    assert policy.latent_shape() == (channels, frames - 1, height, width)
    image = _image(tmp_path / "a.png", 0)
    condition = LTX2VideoCondition(frames=Image.open(image), index=0, strength=1.0)
    _first_frame_run_is_the_pipelines(pipe, policy, image, "LTX2Policy condition", conditions=[condition])
    prompts = image_prompt_file(tmp_path)  # the trainer's preflight refuses one latent frame before loading
    with pytest.raises(ValueError, match=r"^frames 1: LTX2ConditionPipeline keeps the first latent frame the image's"):
        check_before_loading(
            tiny_config(model="tiny-ltx2-condition", prompts=prompts, frames=1, height=32, width=32), 1
        )


def test_ltx2_image_crf_is_the_text_encoders_loaded_or_not(tmp_path):
    """The image's re-compression is the pipeline's default for its text encoder (Gemma 4: LTX-2.5's CRF 18; else 33),
    read from the checkpoint's text_encoder/config.json where the trainer did not load the encoder (cached embeddings:
    ``load_pipeline(..., without=TEXT_ENCODERS)``)."""
    from diffusers import DiffusionPipeline

    gemma4 = SimpleNamespace(config=SimpleNamespace(model_type="gemma4"))
    assert image_crf(SimpleNamespace(text_encoder=gemma4, config={})) == 18
    assert image_crf(SimpleNamespace(text_encoder=None, config={})) == 33  # nothing to tell: the pipeline's own
    build_tiny("tiny-ltx2-i2v").save_pretrained(tmp_path)
    config = tmp_path / "text_encoder" / "config.json"
    for model_type, crf in (("gemma4", 18), ("t5", 33)):
        config.write_text(json.dumps(json.loads(config.read_text()) | {"model_type": model_type}))
        pipe = DiffusionPipeline.from_pretrained(tmp_path, text_encoder=None, local_files_only=True)
        assert pipe.text_encoder is None and image_crf(pipe) == crf
