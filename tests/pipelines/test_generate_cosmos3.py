"""Cosmos 3 through ``generate``: the built-in ``tiny-cosmos3`` (``Cosmos3OmniPipeline``), text-to-video on Ulysses 2
and ring 2, image-to-video (the image's latents a clean first frame) on Ulysses 2 and video-to-video (the video's
first two latent frames clean) on ring 2, gives the frames and latents of one process, each rank's attention holding
the whole prompt prefix and half of the video's tokens (CFG parallelism's refusal: tests/families/test_cosmos3.py);
so does Cosmos 3's distilled modular pipeline (``Cosmos3DistilledModularPipeline``, modular only) from a saved tiny
repository, on both layouts. One spawn runs every layout."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dit_sp import GenerateConfig, generate, spawn

pytestmark = pytest.mark.slow  # spawns worker processes

MODEL = "tiny-cosmos3"
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}}
INPUTS = {"t2v": {}, "i2v": {"image": "image.png"}, "v2v": {"video": "clip"}}
JOBS = [("t2v", "1x2"), ("t2v", "2x1"), ("i2v", "1x2"), ("v2v", "2x1")]  # every input, every layout
# 9 frames of 16 x 40 -> 3 latent frames of 2 x 5, patches of 2 x 2 (the width padded): 3 x 1 x 3 gen tokens, uneven
GEN_TOKENS = 9


def _settings(tmp, name: str, inputs: dict, **flags) -> GenerateConfig:
    inputs = {key: str(tmp / value) for key, value in inputs.items()}
    return GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp / f"{name}.mp4"),
                                          "save_latents": str(tmp / f"{name}.pt"), "verify_inputs": True,
                                          **inputs, **flags})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(inputs, layout): the sample leader's report}, layout "single" being one process."""
    from cosmos3_checks import generate_recording
    from PIL import Image

    from dit_sp.zoo import build_tiny

    tmp = tmp_path_factory.mktemp("cosmos3")
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8")).save(tmp / "image.png")
    (tmp / "clip").mkdir()
    for i in range(9):
        Image.fromarray((rng.rand(16, 40, 3) * 255).astype("uint8")).save(tmp / "clip" / f"{i:02d}.png")
    reports = {(kind, "single"): generate(_settings(tmp, f"{kind}-single", inputs), True)
               for kind, inputs in INPUTS.items()}  # fmt: skip
    settings = [_settings(tmp, f"{kind}-{layout}", INPUTS[kind], **LAYOUTS[layout]) for kind, layout in JOBS]
    distilled = _distilled_settings(tmp)
    reports[("distilled", "single")] = generate(distilled("distilled-single"), True)
    settings += [distilled(f"distilled-{layout}", **flags) for layout, flags in LAYOUTS.items()]
    by_rank = spawn(generate_recording, 2, args=(settings,), timeout=300)
    for i, key in enumerate(JOBS + [("distilled", layout) for layout in LAYOUTS]):
        leaders = [reports_of_rank[i] for reports_of_rank in by_rank if "out" in reports_of_rank[i]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        reports[key] = leaders[0] | {"every_rank_lengths": [r[i]["lengths"] for r in by_rank]}
    pipe = build_tiny(MODEL)
    cond, uncond = pipe.tokenize_prompt(settings[0].prompt, "", num_frames=9, height=16, width=40)
    return reports | {"prefix_lengths": {len(cond), len(uncond)}}  # the conditional and unconditional calls'


def _distilled_settings(tmp):
    """Settings of ``generate`` on a tiny repository of Cosmos 3's distilled modular pipeline
    (``Cosmos3DistilledModularPipeline``: ``Cosmos3DistilledBlocks``), saved in ``tmp``: ``tiny-cosmos3``'s transformer,
    VAE and tokenizer with a flow-match scheduler and 4 distilled sigmas in its index (``generate``'s default steps)."""
    import diffusers
    from modular_repos import save_blocks_repository

    repo = save_blocks_repository("tiny-cosmos3", "Cosmos3DistilledBlocks", tmp / "distilled-repo",
                                  config={"distilled_sigmas": [1.0, 0.75, 0.5, 0.25], "enable_safety_checker": False},
                                  scheduler=diffusers.FlowMatchEulerDiscreteScheduler())  # fmt: skip

    def settings(name: str, **flags) -> GenerateConfig:
        return GenerateConfig.load(overrides={"model": str(repo), "out": str(tmp / f"{name}.mp4"), "frames": 9,
                                              "height": 16, "width": 40, "save_latents": str(tmp / f"{name}.pt"),
                                              "verify_inputs": True, **flags})  # fmt: skip

    return settings


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_distilled_modular_pipeline_gives_the_one_process_video_from_a_split_sequence(videos, layout):
    """Cosmos 3 distilled (modular only) from a saved repository: its 4 unguided steps (the index's sigmas:
    ``generate``'s default steps) on Ulysses 2 and ring 2 give frames and latents within 1e-4 of one process's, each
    rank's attention holding the whole prompt prefix and half of the 9 video tokens."""
    from dit_sp.zoo import model_defaults

    reference, report = videos[("distilled", "single")], videos[("distilled", layout)]
    assert reference["frames"].shape == report["frames"].shape == (9, 16, 40, 3)
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert ref_latents.shape == (1, 4, 3, 2, 5) and (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01
    (first,), (second,) = report["every_rank_lengths"]  # one call a step: one prompt prefix, no unconditional branch
    assert first == second and first[1] == math.ceil(GEN_TOKENS / 2) and first[0] > GEN_TOKENS, first
    repo = Path(report["out"]).parent / "distilled-repo"
    assert (model_defaults(str(repo))["steps"], model_defaults(str(repo))["guidance"]) == (4, 1.0)


@pytest.mark.parametrize(("kind", "layout"), JOBS, ids=lambda x: x)
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, kind, layout):
    reference, report = videos[(kind, "single")], videos[(kind, layout)]
    assert reference["frames"].shape == (9, 16, 40, 3)
    assert report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert ref_latents.shape == (1, 4, 3, 2, 5)
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant
    # the prompt's tokens (the pipeline's chat template: its system prompt, the prompt with its duration and size
    # sentences, end and start-of-generation markers) whole on every rank, the video's tokens halved
    local = math.ceil(GEN_TOKENS / 2)
    expected = sorted((prefix, local) for prefix in videos["prefix_lengths"])
    assert report["every_rank_lengths"] == [expected, expected], f"attention calls got {report['every_rank_lengths']}"


def test_the_image_and_the_video_condition_their_latent_frames(videos):
    """The image-to-video run keeps its first latent frame the image's (clean), the video-to-video run its first two
    the video's (``condition_frame_indexes_vision``' default): not what the text-to-video run denoised there."""
    t2v, i2v, v2v = (torch.load(videos[(kind, "single")]["latents"]) for kind in ("t2v", "i2v", "v2v"))
    assert (t2v[:, :, 0] - i2v[:, :, 0]).abs().max() > 0.1
    assert (t2v[:, :, :2] - v2v[:, :, :2]).abs().amax(dim=(0, 1, 3, 4)).min() > 0.1
