"""The tiny CogVideoX, HunyuanVideo and two-expert Wan 2.2 pipelines through `pipelines.generate`: the same
video on every layout (Ulysses, ring, CFG parallel), readable files, their prompt encoding, guidance and shape
checks.

Spawning workers costs most of the time here, so each world size is started once and its workers run
every (model, layout) job of that size in turn.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from diffusers.configuration_utils import FrozenDict

from dit_sp import GenerateConfig, generate, spawn
from dit_sp.families import check_shape
from dit_sp.inference import guidance_arguments
from dit_sp.zoo import build_tiny, model_defaults

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end

MODELS = ("tiny-cogvideox", "tiny-hunyuanvideo", "tiny-wan2.2-a14b")
LAYOUTS = {  # name: (world, flags)
    "1x2": (2, {"ulysses": 2}),
    "2x1": (2, {"ring": 2}),
    "cfg2x(1x2)": (4, {"ulysses": 2, "cfg_parallel": True}),
}
# CogVideoX at 48 x 32 (not its 64 x 64 default): 3 latent frames x 3 x 2 patches = 18 video tokens, as for
# HunyuanVideo, and a RoPE grid off the transformer's sample size. Wan 2.2 A14B: both experts run (4 steps
# cross its boundary), the low-noise one with its own guidance.
SETTINGS = {"tiny-cogvideox": {"height": 48, "width": 32}, "tiny-hunyuanvideo": {},
            "tiny-wan2.2-a14b": {"guidance_2": 2.5}}  # fmt: skip
VIDEO_TOKENS = 18  # each model: 3 latent frames of 3 x 2 patches


def _settings(tmp_path, model: str, name: str, path: str | None = None, **overrides) -> GenerateConfig:
    """The built-in ``model``'s settings (for ``path`` too: a saved copy of it)."""
    out, latents = tmp_path / f"{model}-{name}.mp4", tmp_path / f"{model}-{name}.pt"
    settings = GenerateConfig.load(overrides={"model": model, "out": str(out), "save_latents": str(latents),
                                              "verify_inputs": True, **SETTINGS[model], **overrides})  # fmt: skip
    return dataclasses.replace(settings, model=path) if path else settings


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report, with every rank's attention lengths under "lengths"}, "single"
    being one process."""
    from variant_generate_checks import generate_recording

    tmp = tmp_path_factory.mktemp("families")
    reports = {(model, "single"): generate(_settings(tmp, model, "single"), True) for model in MODELS}
    worlds: dict[int, list] = {}
    for layout, (world, flags) in LAYOUTS.items():
        for model in MODELS:
            worlds.setdefault(world, []).append(((model, layout), _settings(tmp, model, layout, **flags)))
    for world, jobs in worlds.items():
        by_rank = spawn(generate_recording, world, args=([settings for _, settings in jobs],), timeout=300)
        for i, (key, _) in enumerate(jobs):
            leaders = [rank_reports[i] for rank_reports in by_rank if "out" in rank_reports[i]]
            assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
            reports[key] = leaders[0] | {"lengths": [rank_reports[i]["attention_lengths"] for rank_reports in by_rank]}
    return reports


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", MODELS)
def test_every_layout_gives_the_same_video(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    assert report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant
    world, flags = LAYOUTS[layout]
    local = -(-VIDEO_TOKENS // (flags.get("ring", 1) * flags.get("ulysses", 1)))  # the sequence really split
    assert report["lengths"] == [[local]] * world, f"each rank's attention saw {report['lengths']}, not {local}"


@pytest.mark.parametrize("model", MODELS)
def test_videos_read_back_with_the_requested_frames(videos, model):
    settings = GenerateConfig.load(overrides={"model": model, **SETTINGS[model]})
    for layout in ("single", *LAYOUTS):
        frames = list(iio.imiter(videos[(model, layout)]["out"]))
        assert len(frames) == settings.frames == 9
        assert frames[0].shape[:2] == (settings.height, settings.width)


@pytest.mark.parametrize("model", MODELS)
def test_saved_checkpoint_loads_offline(videos, tmp_path, model):
    build_tiny(model).save_pretrained(tmp_path / "ckpt")
    report = generate(_settings(tmp_path, model, "ckpt", path=str(tmp_path / "ckpt")), True)
    assert np.abs(report["frames"] - videos[(model, "single")]["frames"]).max() <= 1e-5


def test_hunyuan_prompt_template_crop_is_exact():
    """The pipeline's stock template skips its first 95 tokens (crop_start, counted with HunyuanVideo's Llama
    3 tokenizer); the tiny tokenizer counts the same, so the text tokens are the prompt's, then <|eot_id|>."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    pipe = build_tiny("tiny-hunyuanvideo")
    template, crop = DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]
    assert len(pipe.tokenizer(template).input_ids) - 2 == crop  # without "{}" and <|eot_id|>
    prompt = "A red circle, moving left!"
    ids = pipe.tokenizer(template.format(prompt)).input_ids
    assert pipe.tokenizer.decode(ids[crop:]) == prompt + "<|eot_id|>"
    embeds, mask = pipe._get_llama_prompt_embeds(prompt, DEFAULT_PROMPT_TEMPLATE, max_sequence_length=32)
    assert embeds.shape == (1, 32, 16) and mask.tolist() == [[1] * (len(ids) - crop) + [0] * (32 - len(ids) + crop)]


@pytest.mark.parametrize(
    ("model", "argument"),
    [("tiny-wan", "guidance_scale"), ("tiny-cogvideox", "guidance_scale"), ("tiny-hunyuanvideo", "true_cfg_scale")],
)
def test_guidance_goes_to_the_pipelines_classifier_free_guidance(model, argument):
    pipe = SimpleNamespace(transformer=build_tiny(model, "transformer"))
    settings = GenerateConfig.load(overrides={"model": model, "guidance": 3})
    assert guidance_arguments(pipe, settings) == {argument: 3.0}
    embedded = dataclasses.replace(settings, embedded_guidance=6.0)
    if model == "tiny-hunyuanvideo":  # guidance-distilled: guidance_scale is the embedded guidance
        assert guidance_arguments(pipe, embedded) == {"true_cfg_scale": 3.0, "guidance_scale": 6.0}
    else:
        with pytest.raises(ValueError, match="distilled guidance of HunyuanVideo; this model has none"):
            guidance_arguments(pipe, embedded)


@pytest.mark.parametrize("model", MODELS)
def test_shape_errors_give_valid_values(model):
    transformer = build_tiny(model, "transformer")
    pipe = SimpleNamespace(transformer=transformer, vae_scale_factor_temporal=4, vae_scale_factor_spatial=8)
    settings = dataclasses.asdict(GenerateConfig.load(overrides={"model": model}))
    check_shape(pipe, settings)  # the defaults fit
    with pytest.raises(ValueError, match=r"the VAE needs 4\*k\+1 frames, e.g. \[5, 9, 13, 17\]"):
        check_shape(pipe, settings | {"frames": 8})
    with pytest.raises(ValueError, match="--width 40: must be a multiple of 16 .* e.g. 32 or 48"):
        check_shape(pipe, settings | {"width": 40})


def test_cogvideox_positional_embeddings_need_their_text_length():
    config = FrozenDict(patch_size=2, use_rotary_positional_embeddings=False, max_text_seq_length=226)
    pipe = SimpleNamespace(transformer=SimpleNamespace(config=config), vae_scale_factor_temporal=4,
                           vae_scale_factor_spatial=8)  # fmt: skip
    settings = {"frames": 49, "height": 480, "width": 720, "max_sequence_length": 226}
    check_shape(pipe, settings)
    with pytest.raises(ValueError, match="take exactly 226 text tokens"):
        check_shape(pipe, settings | {"max_sequence_length": 512})


def test_checkpoint_defaults_follow_the_pipeline_class(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "HunyuanVideoPipeline"}))
    assert model_defaults(str(tmp_path))["guidance"] == 1.0  # distilled: true CFG off
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXPipeline"}))
    assert model_defaults(str(tmp_path))["max_sequence_length"] == 226


def _hunyuan_cfg_without_negative_prompt() -> str:
    import torch

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-hunyuanvideo")
    parallelize(pipe, init_parallel(ParallelConfig.for_world(2, cfg=2)))
    try:
        pipe(prompt="a red circle moving left", negative_prompt=None, true_cfg_scale=4.0, height=48, width=32,
             num_frames=9, num_inference_steps=2, generator=torch.Generator().manual_seed(0), max_sequence_length=32,
             output_type="np")  # fmt: skip
    except ValueError as e:
        return str(e)
    return "no error"


def test_cfg_parallel_without_a_guidance_branch_is_an_error():
    """HunyuanVideo runs true CFG only with a negative prompt: cfg=2 must refuse, not pair wrong calls."""
    from dit_sp import spawn

    message = spawn(_hunyuan_cfg_without_negative_prompt, 2, timeout=300)[0]
    assert "negative_prompt" in message and "use cfg=1" in message
