"""The remaining LTX-2 and LTX-Video pipelines, through ``generate``: LTX-2's HDR IC-LoRA pipeline (``--video``: the
reference video, whose latent tokens are appended to the noisy ones, clean; linear HDR frames) and its IC-LoRA
in-context pipeline (``--video`` the reference, ``--image`` / ``--last-image`` frame conditions) and its DFR pass
(generated keyframe slots appended, ``--image`` / ``--last-image`` frame conditions; no guidance) give the same frames
and latents on Ulysses 2, ring 2 and (HDR, IC-LoRA: guidance is one batched call, IC-LoRA's spatio-temporal and
modality passes of batch 1 run whole on both cfg ranks) CFG parallel as on one process, with the
attention of each rank holding half of the video tokens; so does LTX-Video's long multi-prompt image-to-video
pipeline (``--image``: its first frame; a temporal window per transformer call, conditioning frames appended), CFG
parallel included. IC-LoRA's attention-strength mode (a video self-attention mask) is refused in one line. One spawn
runs them all."""

from __future__ import annotations

import math

import numpy as np
import pytest
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (video tokens per forward, its inputs and settings). 9 frames of 32 x 32: 3 x 8 x 8 latent tokens (LTX-2's
# VAE x4, patch 1), and the reference video's as many again
MODELS = {
    "tiny-ltx2-hdr": (384, {"video": "clip"}),
    # and the first frame's tokens replaced by the image's, the last image's 8 x 8 tokens appended (a keyframe)
    "tiny-ltx2-in-context": (448, {"video": "clip", "image": "image.png", "last_image": "image.png"}),
    # DFR: the 9 frames' canvas padded to a segment of 12 (4 latent frames), one generated keyframe slot (a latent
    # frame's tokens) appended, and the last image's; its 8 distilled steps, no guidance
    "tiny-ltx2-dfr": (384, {"image": "image.png", "last_image": "image.png", "steps": 8, "guidance": 1.0}),
    # LTX-Video long (VAE x4, patch 1): one temporal window of 3 latent frames and its negative-index frame, 4 x 8 x 8
    # tokens; a prompt per window (the bar splits them); 3 steps: its schedule's last sigma is not stepped
    "tiny-ltx-long": (256, {"image": "image.png", "prompt": "a red cat | a blue dog", "steps": 3}),
}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
# DFR runs no guidance at all. (LTX-2's IC-LoRA pipeline adds spatio-temporal and modality guidance passes of batch 1
# beside the batched pair: both cfg ranks run those whole)
CFG_REFUSED = {"tiny-ltx2-dfr"}
# LTX-2: the video-to-audio attention (queries: the whole audio) is routed too
AUDIO = {"tiny-ltx2-hdr", "tiny-ltx2-in-context", "tiny-ltx2-dfr"}
HDR = {"tiny-ltx2-hdr"}
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
SETTINGS = {"steps": 2, "height": 32, "width": 32, "frames": 9, "verify_inputs": True}


CASES = [(model, layout) for model in MODELS for layout in LAYOUTS if not (layout == "cfg2" and model in CFG_REFUSED)]


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process; "then": each rank's IC-LoRA
    attention-strength error."""
    from ltx_variant_checks import in_context_mask_refusal
    from variant_generate_checks import layout_reports, variant_settings, write_random_inputs

    tmp = tmp_path_factory.mktemp("ltx_variants")
    write_random_inputs(tmp, 9, (32, 32))  # image.png and a 9-frame clip/

    def settings(model: str, name: str, **flags) -> GenerateConfig:
        return variant_settings(tmp, model, name, MODELS[model][1], SETTINGS, **flags)

    reports = {(model, "single"): generate(settings(model, "single"), True) for model in MODELS}
    jobs = [((model, layout), settings(model, layout, **LAYOUTS[layout])) for model, layout in CASES]
    return reports | layout_reports(jobs, then=in_context_mask_refusal)


@pytest.mark.parametrize(("model", "layout"), CASES)
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    # HDR frames are linear light, exp of the decoded values (LogC3): float rounding grows with the value (up to ~55)
    scale = np.maximum(np.abs(reference["frames"]), 1.0) if model in HDR else 1.0
    assert_same_video(report, reference, frame_scale=scale)
    local = math.ceil(MODELS[model][0] / SP[layout])
    # each rank's routed attention: its half of the video (and the whole audio, the queries of one module)
    video = [[max(lengths)] for lengths in report["lengths"]] if model in AUDIO else report["lengths"]
    assert video == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} video tokens"


def test_in_context_attention_strength_is_refused_in_one_line(videos):
    for error in videos["then"]:
        assert error.startswith("LTX-2's video self-attention mask (video_self_attention_mask")
        assert "\n" not in error and "so dit-sp does not split it" in error
