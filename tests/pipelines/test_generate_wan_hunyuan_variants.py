"""Group B's pipelines through ``generate``: SkyReels-V2's text-to-video pipeline and its diffusion forcing (a
timestep per latent frame), Wan
VACE (control hints per token), ChronoEdit (an image), AnyFlow (two timesteps per frame, batched guidance) and
HunyuanVideo Framepack (history latents packed in front of the video) give the same frames and latents on
Ulysses 2 and ring 2 as on one process, with the attention of each rank holding half of the tokens, and with
CFG parallelism (the two guidance branches on two processes). One spawn runs them all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: video tokens per forward
MODELS = {"tiny-skyreels-v2": 18, "tiny-skyreels-v2-df": 18, "tiny-wan-vace": 18, "tiny-chronoedit": 12,
          "tiny-anyflow": 18, "tiny-hunyuanvideo-framepack": 72}  # fmt: skip
# ChronoEdit and Framepack take an image; Framepack (guidance-distilled) runs true CFG with guidance > 1
OVERRIDES = {"tiny-chronoedit": {"image": True}, "tiny-hunyuanvideo-framepack": {"image": True, "guidance": 4.0}}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
ASYNC = {"frames": 21, "causal_block_size": 2, "ar_step": 1}  # 6 latent frames of 6 tokens


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    overrides = OVERRIDES.get(model, {}) | flags
    if overrides.get("image"):
        overrides["image"] = str(tmp / "image.png")
    return GenerateConfig.load(overrides={"model": model, "steps": 2, "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), "verify_inputs": True,
                                          **overrides})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process."""
    from variant_generate_checks import layout_reports

    tmp = tmp_path_factory.mktemp("variants")
    pixels = np.random.RandomState(0).rand(40, 30, 3)
    Image.fromarray((pixels * 255).astype("uint8")).save(tmp / "image.png")
    reports = {(model, "single"): generate(_settings(tmp, model, "single"), True) for model in MODELS}
    jobs = [((model, layout), _settings(tmp, model, layout, **flags)) for layout, flags in LAYOUTS.items()
            for model in MODELS]  # fmt: skip
    # Wan VACE with the first-block step cache: each rank's decision is the one-process decision
    cached = {"cache": "first_block:0.5", "steps": 4}
    reports[("tiny-wan-vace", "single+cache")] = generate(
        _settings(tmp, "tiny-wan-vace", "single-cache", **cached), True
    )
    jobs.append((("tiny-wan-vace", "1x2+cache"), _settings(tmp, "tiny-wan-vace", "1x2-cache", ulysses=2, **cached)))
    # SkyReels-V2 asynchronous diffusion forcing: 6 latent frames in causal blocks of 2, the blocks lagging a step
    reports[("tiny-skyreels-v2-df", "single+async")] = generate(
        _settings(tmp, "tiny-skyreels-v2-df", "single-async", **ASYNC), True
    )
    jobs.append((("tiny-skyreels-v2-df", "1x2+async"),
                 _settings(tmp, "tiny-skyreels-v2-df", "1x2-async", ulysses=2, **ASYNC)))  # fmt: skip
    return reports | layout_reports(jobs)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    assert_same_video(report, reference)
    local = math.ceil(MODELS[model] / SP[layout])
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} tokens"


def test_the_first_block_cache_decides_as_one_process(videos):
    reference, report = videos[("tiny-wan-vace", "single+cache")], videos[("tiny-wan-vace", "1x2+cache")]
    assert report["cache"]["computed"] == reference["cache"]["computed"]
    assert 0 < reference["cache"]["saved_fraction"] < 1  # it skipped some blocks, not all
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    assert (torch.load(report["latents"]) - torch.load(reference["latents"])).abs().max() <= 1e-4


def test_asynchronous_diffusion_forcing_splits_its_block_causal_attention_under_ulysses(videos):
    """Blocks of 2 latent frames, each attending to itself and the blocks before it: on Ulysses 2 the shards of 18
    tokens cut the middle block, and the video is one process's."""
    reference, report = videos[("tiny-skyreels-v2-df", "single+async")], videos[("tiny-skyreels-v2-df", "1x2+async")]
    assert torch.load(reference["latents"]).shape[2] == 6
    assert_same_video(report, reference)
    assert report["lengths"] == [[18], [18]], report["lengths"]
