"""The remaining pipelines of families with tiny models, through ``generate``: Wan's and CogVideoX's video-to-video
(``--video``: the input video noised and denoised again), Lucy Edit (Wan-based video editing: the input video's
latents join the noise in channels), SkyReels-V1's HunyuanVideo, Kandinsky 5's, LTX-2's and Cosmos 1.0's
image-to-video (``--image``), LTX-2's condition pipeline (``--image``, ``--last-image``), CogVideoX-Fun control
(``--control-video``), Cosmos-Predict2 text-to-image (one frame) and Helios' pyramid (3 stages) give the same
frames and latents on Ulysses 2, ring 2 and CFG parallel (a guidance branch per process; where the family allows
it; LTX-2's extra guidance passes of batch 1 run whole on both) as on one process, with the attention of each rank
holding half of the video tokens. One spawn runs them all."""

from __future__ import annotations

import math

import pytest
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (video tokens per forward, its inputs and settings). 48 x 32 frames: 6 x 4 latents (VAE x8), 3 x 2 patches;
# 9 frames: 3 latent frames (x4): 18 tokens
MODELS = {
    "tiny-wan-v2v": (18, {"video": "clip"}),
    "tiny-cogvideox-v2v": (18, {"video": "clip"}),
    "tiny-lucy-edit": (18, {"video": "clip", "height": 96, "width": 64}),  # the Wan 2.2 VAE: x16
    # true classifier-free guidance needs the negative prompt; the image's latents join the noise in channels
    "tiny-hunyuanvideo-skyreels-i2v": (18, {"image": "image.png", "negative_prompt": "blurry"}),
    # Kandinsky 5 I2V renormalises its first 4 latent frames against those after them: 17 frames, 5 latent frames.
    # Guidance 2: its routed attention rounds differently from the stock one (by the same 2e-4 on CFG parallel,
    # which splits nothing), and guidance 4 scales that past 1e-4 in its latents of magnitude 6
    "tiny-kandinsky5-i2v": (30, {"image": "image.png", "frames": 17, "guidance": 2.0}),
    # LTX-2 (VAE x4, patch 1): 3 x 8 x 8 video tokens; the audio stays whole on every rank
    "tiny-ltx2-i2v": (192, {"image": "image.png", "height": 32, "width": 32}),
    # the image replaces the first latent frame's tokens, the last image's 8 x 8 tokens are appended (a keyframe)
    "tiny-ltx2-condition": (256, {"image": "image.png", "last_image": "image.png", "height": 32, "width": 32}),
    "tiny-cogvideox-fun-control": (18, {"control_video": "clip"}),  # its latents join the noise in channels
    # Cosmos 1.0 (VAE x4, patch 2): 3 x 8 x 8 / 4 tokens; the image conditions the first latent frame
    "tiny-cosmos1-v2w": (48, {"image": "image.png", "height": 32, "width": 32}),
    # Cosmos-Predict2 text-to-image: one 64 x 64 frame, 8 x 8 latents (Wan's VAE), 4 x 4 patches
    "tiny-cosmos2-t2i": (16, {"frames": 1, "height": 64, "width": 64}),
    # Helios pyramid: 33 frames of 64 x 64, one chunk of 9 latent frames denoised at 2 x 2, 4 x 4 then 8 x 8 latents
    # (patch 2), 1 step each: 9, 36 and 144 tokens behind 40 history tokens, per stage
    "tiny-helios-pyramid": ((49, 76, 184), {"frames": 33, "height": 64, "width": 64, "steps": 1}),
}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
# the Cosmos family refuses CFG parallelism. (LTX-2's pipelines add spatio-temporal and modality guidance passes of
# batch 1 beside the batched pair: both cfg ranks run those whole)
CFG_REFUSED = {"tiny-cosmos1-v2w", "tiny-cosmos2-t2i"}
# Pipelines whose guidance is their family's stock batched guidance over the same transformer call, CFG parallel
# already tested on tiny-wan and tiny-cogvideox (test_generate_families.py): their CFG run adds no new path (CI time)
CFG_SAME_AS_FAMILY = {"tiny-wan-v2v", "tiny-cogvideox-v2v", "tiny-lucy-edit", "tiny-cogvideox-fun-control"}
# Cosmos' pipelines hand their frames to the safety checker as uint8 and return those: a value within float rounding
# of an 8-bit step may land on either side, so their frames agree within one step (the latents within 1e-4)
FRAME_TOLERANCE = dict.fromkeys(("tiny-cosmos1-v2w", "tiny-cosmos2-t2i"), 1 / 255 + 1e-6)
AUDIO = {
    "tiny-ltx2-i2v",
    "tiny-ltx2-condition",
}  # its video-to-audio attention (queries: the whole audio) is routed too
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
# Cosmos 1's wavelet VAE encodes the image and decodes split by rows over the sample's 2 processes: the most rows a VAE
# convolution took on the leader is its half of the 8 latent rows (one process: 8)
SPLIT_VAE_ROWS = {"tiny-cosmos1-v2w": 4}
# 3 steps at the video-to-video pipelines' strength 0.8: the last 2 of them run
SETTINGS = {"steps": 3, "height": 48, "width": 32, "frames": 9, "verify_inputs": True}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process."""
    from variant_generate_checks import layout_reports, variant_settings, write_random_inputs

    tmp = tmp_path_factory.mktemp("edit_variants")
    write_random_inputs(tmp, 9, (48, 32))  # image.png and a 9-frame clip/

    def settings(model: str, name: str, **flags) -> GenerateConfig:
        return variant_settings(tmp, model, name, MODELS[model][1], SETTINGS, **flags)

    reports = {(model, "single"): generate(settings(model, "single"), True) for model in MODELS}
    jobs = [((model, layout), settings(model, layout, **flags)) for layout, flags in LAYOUTS.items()
            for model in MODELS if not (layout == "cfg2" and model in CFG_REFUSED | CFG_SAME_AS_FAMILY)]  # fmt: skip
    return reports | layout_reports(jobs)


CASES = [(model, layout) for model in MODELS for layout in LAYOUTS
         if not (layout == "cfg2" and model in CFG_REFUSED | CFG_SAME_AS_FAMILY)]  # fmt: skip


@pytest.mark.parametrize(("model", "layout"), CASES)
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    assert_same_video(report, reference, FRAME_TOLERANCE.get(model, 1e-4))
    tokens = MODELS[model][0]
    if isinstance(tokens, tuple):  # a pyramid: each stage's tokens split
        local = [math.ceil(stage / SP[layout]) for stage in tokens]
        assert report["lengths"] == [local, local], f"each rank's attention saw {report['lengths']}, not {local}"
        return
    local = math.ceil(tokens / SP[layout])
    if model in SPLIT_VAE_ROWS:
        assert report["vae_rows"] == SPLIT_VAE_ROWS[model], report["vae_rows"]
    # each rank's routed attention: its half of the video (LTX-2: and the whole audio, the queries of one module)
    video = [[max(lengths)] for lengths in report["lengths"]] if model in AUDIO else report["lengths"]
    assert video == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} video tokens"
