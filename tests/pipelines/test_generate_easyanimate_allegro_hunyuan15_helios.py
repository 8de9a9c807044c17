"""EasyAnimate V5.1 (joint attention, text in front; a Qwen2-VL text encoder and a chat-template tokenizer built in
code), Allegro (cross-attention to T5 text; a VAE that decodes only in tiles), HunyuanVideo-1.5 (joint attention,
conditioning behind the video; Qwen2.5-VL and ByT5 encoders; guidance through its guider, no step callback; text- and
image-to-video, the latter with a SigLIP image encoder) and Helios (a chunk of current frames behind history latents at
three scales; each rank told its own count of current tokens; text-, image- and video-to-video) through ``generate``:
the same frames and latents on Ulysses 2, ring 2 and CFG parallel (the guidance pair split over two processes:
EasyAnimate's and Allegro's batched call, HunyuanVideo-1.5's two guider calls, Helios' two calls) as on one process,
with the attention of each rank holding half of the video tokens; and Helios' distilled pyramid
(``HeliosPyramidDistilledModularPipeline``, modular only) from a saved tiny repository on Ulysses 2 and ring 2. In
the same spawn, from Python, the modular forms with a ``ClassifierFreeGuidance`` guider on CFG parallel
(``HunyuanVideo15ModularPipeline``, ``HeliosModularPipeline``, the distilled pyramid guided). One spawn runs all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: video tokens per forward. EasyAnimate: 9 frames of 48 x 32 -> 3 x 6 x 4 latents, patch 2. Allegro: 21 frames of
# 128 x 128 (one VAE tile) -> 6 x 16 x 16 latents, patch 2. HunyuanVideo-1.5: 5 frames of 24 x 16 -> 3 x 6 x 4, patch 1;
# image-to-video: the size follows the 40 x 30 image (36 x 28 at its target size) -> 3 x 9 x 7, an odd count. Helios:
# 33 frames of 32 x 32 -> one chunk of 9 x 4 x 4 latents, patch 2: 36 current tokens behind 13 history tokens.
# Helios image-to-video and video-to-video (the image or a 33-frame clip as history): the same tokens.
MODELS = {"tiny-easyanimate": 18, "tiny-allegro": 384, "tiny-hunyuanvideo15": 72, "tiny-hunyuanvideo15-i2v": 189,
          "tiny-helios": 49, "tiny-helios+image": 49, "tiny-helios+video": 49}  # fmt: skip
IMAGE_MODELS = ("tiny-hunyuanvideo15-i2v", "tiny-helios+image")
VIDEO_MODELS = ("tiny-helios+video",)
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
SPLIT_VAE = ("tiny-hunyuanvideo15", "tiny-hunyuanvideo15-i2v")
"""Models whose VAE is checked to run split by rows over the sample's 2 processes (both CFG halves too)."""


def _settings(tmp, case: str, name: str, **flags) -> GenerateConfig:
    """``case``: a built-in model, or ``MODEL+image`` / ``MODEL+video`` (that model given the image or the clip)."""
    if case in IMAGE_MODELS:
        flags["image"] = str(tmp / "image.png")
    if case in VIDEO_MODELS:
        flags["video"] = str(tmp / "clip")
    model = case.split("+")[0]
    return GenerateConfig.load(overrides={"model": model, "steps": 2, "out": str(tmp / f"{case}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{case}-{name}.pt"), "verify_inputs": True,
                                          **flags})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process."""
    from variant_generate_checks import layout_reports

    tmp = tmp_path_factory.mktemp("easyanimate_allegro_hv15")
    pixels = np.random.RandomState(0).rand(40, 30, 3)
    Image.fromarray((pixels * 255).astype("uint8")).save(tmp / "image.png")
    (tmp / "clip").mkdir()
    for i in range(33):  # a clip of PNG frames, another size than the video's (resized)
        pixels = np.random.RandomState(i + 1).rand(40, 30, 3)
        Image.fromarray((pixels * 255).astype("uint8")).save(tmp / "clip" / f"{i:03d}.png")
    reports = {(model, "single"): generate(_settings(tmp, model, "single"), True) for model in MODELS}
    jobs = [((model, layout), _settings(tmp, model, layout, **flags)) for layout, flags in LAYOUTS.items()
            for model in MODELS]  # fmt: skip
    distilled = _distilled_settings(tmp)
    reports[("distilled", "single")] = generate(distilled("single"), True)
    jobs += [(("distilled", layout), distilled(layout, **LAYOUTS[layout])) for layout in ("1x2", "2x1")]
    from modular_cfg_checks import check_guider_pairs

    return reports | layout_reports(jobs, then=check_guider_pairs)  # and the modular forms on cfg=2, from Python


def _distilled_settings(tmp):
    """Settings of ``generate`` on a tiny repository of Helios' distilled pyramid
    (``HeliosPyramidDistilledModularPipeline``, modular only), saved in ``tmp``: ``tiny-helios-pyramid``'s components
    with a 3-stage ``HeliosDMDScheduler``; one chunk of 33 frames of 64 x 64 (9 x 8 x 8 latents, patch 2: 144 current
    tokens at the last stage), one step a stage (``--steps``: each stage's, as for the classic pyramid)."""
    import diffusers
    from modular_repos import save_blocks_repository

    scheduler = diffusers.HeliosDMDScheduler(stages=3, gamma=0.25, use_dynamic_shifting=True)  # tiny-helios-pyramid's
    repo = save_blocks_repository("tiny-helios-pyramid", "HeliosPyramidDistilledAutoBlocks", tmp / "distilled-repo",
                                  scheduler=scheduler)  # fmt: skip

    def settings(name: str, **flags) -> GenerateConfig:
        return GenerateConfig.load(overrides={"model": str(repo), "out": str(tmp / f"distilled-{name}.mp4"),
                                              "frames": 33, "height": 64, "width": 64, "steps": 1,
                                              "max_sequence_length": 16, "verify_inputs": True,
                                              "save_latents": str(tmp / f"distilled-{name}.pt"), **flags})  # fmt: skip

    return settings


@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_the_distilled_pyramid_gives_the_one_process_video_from_a_split_sequence(videos, layout):
    """Helios' distilled pyramid (modular only; a DMD sampler, unguided) from a saved repository on Ulysses 2 and
    ring 2: frames and latents within 1e-4 of one process's, each rank's attention holding half of each of the 3 stages'
    sequences (the last stage's 144 current tokens and the history behind them)."""
    reference, report = videos[("distilled", "single")], videos[("distilled", layout)]
    assert_same_video(report, reference)
    assert torch.load(reference["latents"]).shape == (1, 4, 9, 8, 8) and reference["frames"].shape == (33, 64, 64, 3)
    first, second = report["lengths"]
    assert first == second and len(first) == 3 and 144 // 2 <= first[-1] < 144, report["lengths"]


def test_the_distilled_pyramid_takes_guidance_through_its_guider():
    """Its blocks take no guidance argument: ``--guidance`` sets its guider's scale (default 1: unguided, one call a
    step; the blocks' own default would be 5), never dropped with the arguments the blocks do not take."""
    import diffusers

    from dit_sp.inference import guidance_arguments
    from dit_sp.zoo import build_tiny

    pipe = diffusers.HeliosPyramidDistilledAutoBlocks().init_pipeline()
    pipe.update_components(transformer=build_tiny("tiny-helios", "transformer"))
    assert pipe.guider.guidance_scale == 5.0
    for scale in (1.0, 3.0):
        settings = GenerateConfig.load(overrides={"model": "tiny-helios", "guidance": scale})
        assert guidance_arguments(pipe, settings) == {} and pipe.guider.guidance_scale == scale


GUIDER_CALLS = {
    "HunyuanVideo15AutoBlocks": (4, 2),
    "HeliosAutoBlocks": (2, 1),
    "HeliosPyramidDistilledAutoBlocks": (9, 6),
}
"""The first transformer block's runs on one process and on each cfg rank: a guided step's pair is one run a rank; the
distilled pyramid's first chunk amplifies each stage's step (3 stages: 3 guided steps, then 3 its guider runs unguided,
one call each, whole on both ranks): 3 x 2 + 3 on one process, 3 + 3 a rank."""


@pytest.mark.parametrize("blocks", list(GUIDER_CALLS))
def test_a_modular_form_runs_its_guiders_pair_on_cfg_parallel(videos, blocks):
    """HunyuanVideo-1.5's and Helios' modular forms (``modular_cfg_checks.GUIDER_PAIRS``: the tiny models' components
    under their blocks, guided at 3) and Helios' distilled pyramid guided (``generate --guidance 3``'s guider) on cfg=2
    from Python: the video and the final latents within 1e-4 of one process's (measured: HunyuanVideo-1.5 4.8e-7 /
    8.9e-7, Helios 0 / 0, the distilled pyramid 3e-7 / 0), each rank running one call of each guided pair."""
    for rank in videos["then"]:
        checked = rank[blocks]
        assert checked["scale"] > 0.1 and checked["error"] <= 1e-4, checked
        assert checked["latent_scale"] > 0.1 and checked["latent_error"] <= 1e-4, checked
        assert checked["calls"] == GUIDER_CALLS[blocks], checked["calls"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    assert_same_video(report, reference)
    local = math.ceil(MODELS[model] / SP[layout])
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} tokens"
    if model in SPLIT_VAE:  # the leader decoded (and encoded) its half of the rows, plus a halo
        height = reference["frames"].shape[1]  # (F, H, W, 3)
        assert 0 < report["vae_rows"] <= height // 2 + 2, (report["vae_rows"], height)


@pytest.mark.parametrize("case", IMAGE_MODELS[1:] + VIDEO_MODELS)
def test_the_helios_image_or_clip_conditions_the_video(videos, case):
    """Helios' image or clip (its history latents) changes the video: an ignored input gives 0."""
    frames, text_only = videos[(case, "single")]["frames"], videos[("tiny-helios", "single")]["frames"]
    assert frames.shape == text_only.shape and np.abs(frames - text_only).max() > 0.05


def test_the_easyanimate_prompt_goes_through_the_chat_template():
    """The tiny tokenizer writes Qwen2-VL's chat template around the prompt, and its ids fit the tiny encoder."""
    from dit_sp.zoo import build_tiny

    tokenizer = build_tiny("tiny-easyanimate", "tokenizer")
    messages = [{"role": "user", "content": [{"type": "text", "text": "a red ball"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\na red ball<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text and max(ids) < 320


def test_hunyuanvideo15_guidance_sets_its_guider():
    """``guidance`` is the guider's scale (the pipeline takes no guidance argument); 1 turns guidance off."""
    from dit_sp.inference import guidance_arguments
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-hunyuanvideo15")
    for scale, conditions in ((3.5, 2), (1.0, 1)):
        settings = GenerateConfig.load(overrides={"model": "tiny-hunyuanvideo15", "guidance": scale})
        assert guidance_arguments(pipe, settings) == {}
        assert pipe.guider.guidance_scale == scale and pipe.guider.num_conditions == conditions


def test_a_saved_allegro_pipeline_loads_with_its_vae_tiled(tmp_path):
    """Allegro's VAE decodes only in tiles: a checkpoint directory loads with tiling on, as the built-in model does."""
    from dit_sp.zoo import build_tiny, load_pipeline

    built = build_tiny("tiny-allegro")
    assert built.vae.use_tiling
    built.save_pretrained(tmp_path / "allegro")
    assert load_pipeline(str(tmp_path / "allegro"), torch.float32).vae.use_tiling
