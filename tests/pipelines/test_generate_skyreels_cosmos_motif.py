"""SkyReels-V2's image-to-video, diffusion-forcing image-to-video and video-to-video pipelines, Cosmos-1.0's
text-to-world, Cosmos-Predict2's video-to-world, Cosmos-Predict2.5's, and Motif-Video's text- and image-to-video
pipelines through ``generate`` (``--image``, ``--video``) give the same frames and latents on Ulysses 2, ring 2 and
(SkyReels; Cosmos and Motif-Video refuse it) CFG parallel, a guidance branch per process, as on one process, with the
attention of each rank holding half of the video tokens (and Cosmos 1's VAE half of the rows). One spawn runs them
all."""

from __future__ import annotations

import math

import pytest
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (video tokens per forward, its inputs). 9 frames of 32 x 32: 3 latent frames of 4 x 4, patch 2: 12 tokens
# (video-to-video: the input's last 5 frames, 2 latent frames, are the history in front of the new ones)
MODELS = {
    "tiny-skyreels-v2-i2v": (12, {"image": "image.png"}),
    "tiny-skyreels-v2-df-i2v": (12, {"image": "image.png"}),
    "tiny-skyreels-v2-df-v2v": (12, {"video": "clip"}),
    "tiny-cosmos1-t2w": (48, {}),  # Cosmos 1 text-to-world: its VAE is x4 in space, 3 x 8 x 8 latents: 48 tokens
    "tiny-cosmos2-v2w": (12, {"image": "image.png"}),  # the image is the first latent frame (timestep ~0)
    "tiny-cosmos2.5": (12, {}),  # text-to-world
    "tiny-motif-video": (12, {}),  # text-to-video, guided through its guider
    "tiny-motif-video-i2v": (12, {"image": "image.png"}),  # its SigLIP image tokens join the (replicated) text
}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
COSMOS = ["tiny-cosmos1-t2w", "tiny-cosmos2-v2w", "tiny-cosmos2.5"]
CFG_REFUSED = {*COSMOS, "tiny-motif-video", "tiny-motif-video-i2v"}  # their families refuse CFG parallelism
# The Cosmos pipelines hand their frames to the safety checker as uint8 and return those (x 255, truncated, / 255): a
# value within float rounding of an 8-bit step may land on either side, so their frames agree within one step (the
# latents, before it, within 1e-4 as for every pipeline).
FRAME_TOLERANCE = dict.fromkeys(COSMOS, 1 / 255 + 1e-6)
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
# Cosmos 1's wavelet VAE runs split by rows over the sample's 2 processes: the most rows a VAE convolution took on the
# leader is its half of the 8 latent rows (one process: 8; its Haar steps are no convolution modules)
SPLIT_VAE_ROWS = {"tiny-cosmos1-t2w": 4}


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    inputs = {key: str(tmp / path) for key, path in MODELS[model][1].items()}
    return GenerateConfig.load(overrides={"model": model, "steps": 2, "height": 32,
                                          "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), "verify_inputs": True,
                                          **inputs, **flags})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process."""
    from variant_generate_checks import layout_reports, write_random_inputs

    tmp = tmp_path_factory.mktemp("skyreels_cosmos_motif")
    write_random_inputs(tmp, 5, (32, 32))  # image.png and a 5-frame clip/
    reports = {(model, "single"): generate(_settings(tmp, model, "single"), True) for model in MODELS}
    jobs = [((model, layout), _settings(tmp, model, layout, **flags)) for layout, flags in LAYOUTS.items()
            for model in MODELS if not (layout == "cfg2" and model in CFG_REFUSED)]  # fmt: skip
    return reports | layout_reports(jobs)


CASES = [(model, layout) for model in MODELS for layout in LAYOUTS if not (layout == "cfg2" and model in CFG_REFUSED)]


@pytest.mark.parametrize(("model", "layout"), CASES)
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    assert_same_video(report, reference, FRAME_TOLERANCE.get(model, 1e-4))
    local = math.ceil(MODELS[model][0] / SP[layout])
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} tokens"
    if model in SPLIT_VAE_ROWS:
        assert report["vae_rows"] == SPLIT_VAE_ROWS[model], report["vae_rows"]


def test_video_to_video_writes_the_input_followed_by_the_new_frames(videos):
    frames = videos[("tiny-skyreels-v2-df-v2v", "single")]["frames"]
    assert frames.shape == (5 + 9, 32, 32, 3)
