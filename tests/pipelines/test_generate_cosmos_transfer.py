"""Cosmos-Transfer2.5 (``Cosmos2_5_TransferPipeline``: a ControlNet reads a control video, edges, depth, segmentation
or blur, and adds its residual after each transformer block) through ``generate`` with ``--control-video`` gives the
same frames and latents on Ulysses 2 and ring 2 as on one process, each rank's attention holding half of the video
tokens, in the transformer and in the ControlNet (whose residuals are gathered whole and split again where the
transformer's blocks take them, the Cosmos plan's ``controlnet_residual``). Both Cosmos models resize a padding mask
with torchvision, not installed here: the torch-only resize stands in (``tests/families/test_cosmos_resize.py``).
One spawn runs both layouts; CFG parallelism is refused (the Cosmos pipelines compute with the conditional prediction
before the unconditional call), and bad inputs are one-line errors before anything loads."""

from __future__ import annotations

import dataclasses
import math

import pytest
from variant_generate_checks import assert_same_video, variant_settings

from dit_sp import generate

MODEL = "tiny-cosmos2.5-transfer"
TOKENS = 12  # 9 frames of 32 x 32: 3 latent frames of 4 x 4 (Wan's VAE, x4 in time, x8 in space), patch 2
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}}
# The Cosmos pipelines hand their frames to the safety checker as uint8 and return those: a value within float rounding
# of an 8-bit step may land on either side, so the frames agree within one step (the latents within 1e-4)
FRAME_TOLERANCE = 1 / 255 + 1e-6
BASE = {"steps": 2, "verify_inputs": True}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{layout: the sample leader's report}: "single" is one process, "reversed" one process with the control video's
    frames in reverse order."""
    from cosmos_transfer_checks import controlnet_split
    from variant_generate_checks import layout_reports, write_random_inputs

    tmp = tmp_path_factory.mktemp("cosmos_transfer")
    write_random_inputs(tmp, 9, (32, 32))  # a 9-frame clip/ of random pixels
    (tmp / "reversed").mkdir()
    for i, frame in enumerate(sorted((tmp / "clip").iterdir(), reverse=True)):
        (tmp / "reversed" / f"{i:02d}.png").write_bytes(frame.read_bytes())
    inputs = {"control_video": "clip"}
    reports = {name: generate(variant_settings(tmp, MODEL, name, {"control_video": clip}, BASE), True)
               for name, clip in (("single", "clip"), ("reversed", "reversed"))}  # fmt: skip
    jobs = [(layout, variant_settings(tmp, MODEL, layout, inputs, BASE, **flags)) for layout, flags in LAYOUTS.items()]
    return reports | layout_reports(jobs, then=controlnet_split)


@pytest.mark.slow  # spawns worker processes
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, layout):
    assert_same_video(videos[layout], videos["single"], FRAME_TOLERANCE)
    local = TOKENS // 2
    assert videos[layout]["lengths"] == [[local], [local]], f"each rank's attention saw {videos[layout]['lengths']}"


@pytest.mark.slow
@pytest.mark.parametrize(("case", "tokens"), [("even", TOKENS), ("uneven", 9)])
def test_the_controlnet_is_split_too(videos, case, tokens):
    """Its self-attention holds half of the control tokens on each rank (of 9, 5: padded), and its residuals, gathered
    whole, equal the whole ControlNet's on the same inputs (Ulysses 2; the generate runs above cover ring 2)."""
    for rank in videos["then"]:
        result = rank[case]
        assert result["lengths"] == [math.ceil(tokens / 2)], result["lengths"]
        assert result["shapes"] == [(1, tokens, 32)] * 2  # one residual per ControlNet block, every token
        assert result["difference"] <= 1e-5 and result["scale"] > 0.1, result


@pytest.mark.slow
def test_the_control_video_steers_the_video(videos):
    """The same seed and prompt under the control video's frames reversed: other latents, by a hundred times the
    layouts' tolerance (the tiny random VAE decodes both to nearly the same noise)."""
    import torch

    single, reversed_ = (torch.load(videos[name]["latents"]) for name in ("single", "reversed"))
    assert single.shape == reversed_.shape == (1, 4, 3, 4, 4)
    assert (single - reversed_).abs().max() > 1e-2


def test_cfg_parallelism_is_refused_in_one_line():
    from dit_sp import ParallelConfig, parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.parallel import single_process_state
    from dit_sp.zoo import build_tiny

    parallel = dataclasses.replace(single_process_state(), config=ParallelConfig(cfg=2))
    with pytest.raises(ConfigError, match=r"^cfg parallelism \(cfg=2\) for Cosmos2_5_TransferPipeline: .* before they "
                       r"make the unconditional call, .*; use cfg=1$") as error:  # fmt: skip
        parallelize(build_tiny(MODEL), parallel)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {},
            rf"^{MODEL} is a control model \(Cosmos2_5_TransferPipeline\): give its control video with "
            r"--control-video PATH$",
        ),  # fmt: skip
        ({"control_video": "missing"}, r"^--control-video .*missing: no such file or directory$"),
        (
            {"control_video": "clip", "frames": 13},
            r"^--control-video .*clip: 9 frames, fewer than the 13 to make "
            r"\(Cosmos2_5_TransferPipeline makes no more than its control video "
            r"has\); give a longer video or --frames 9 or fewer$",
        ),  # fmt: skip
        ({"control_video": "clip", "video": "clip"}, r"^--video: .*takes no input video"),
        (
            {"model": "tiny-cosmos2.5", "control_video": "clip"},
            r"^--control-video: tiny-cosmos2\.5 \(Cosmos2_5_PredictBasePipeline\) takes no control video; use a "
            r"control model \(.*tiny-cosmos2\.5-transfer\), or drop --control-video$",
        ),  # fmt: skip
    ],
    ids=["no-control-video", "missing-file", "short-video", "video-too", "not-a-control-model"],
)
def test_bad_inputs_are_one_line_errors(tmp_path, flags, message):
    """Before anything loads: each a one-line error naming the flag and what to do."""
    from variant_generate_checks import write_random_inputs

    from dit_sp.errors import ConfigError, MissingFileError

    write_random_inputs(tmp_path, 9, (32, 32))
    with pytest.raises((ConfigError, MissingFileError), match=message) as error:
        generate(variant_settings(tmp_path, flags.pop("model", MODEL), "bad", flags, {}))
    assert "\n" not in str(error.value)


def test_the_planner_knows_the_real_checkpoint_with_its_controlnet():
    """Cosmos-Transfer2.5-2B, as diffusers' conversion script configures it: published as "2B" (the base model's size;
    no total is published): Predict2.5-2B's 2.06e9 with image-context keys and values in every block, 2.41e9, and a
    4-block ControlNet of 0.47e9. Its bundled config plans: the tokens of the transformer and the ControlNet split over
    Ulysses 8, the ControlNet's weights whole, and its residuals whole (gathered for the transformer's blocks)."""
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    spec = ARCHITECTURES["cosmos-transfer2.5-2b"]
    transformer = TransformerShape.of(*spec["transformers"]["transformer"])
    controlnet = TransformerShape.of(*spec["controlnet"])
    assert 2.3e9 <= transformer.params <= 2.5e9 and transformer.layers == 28 and transformer.heads == 16
    assert 0.4e9 <= controlnet.params <= 0.55e9 and controlnet.layers == 4 and controlnet.dim == transformer.dim
    assert 2.8e9 <= transformer.params + controlnet.params <= 3.0e9
    generate = GenerateConfig.load("cosmos-transfer2.5-2b")
    assert architecture_name("/ckpt/Cosmos-Transfer2.5-2B-Diffusers") == "cosmos-transfer2.5-2b"
    settings = SamplingSettings("cosmos-transfer2.5-2b", frames=generate.frames, height=generate.height,
                                width=generate.width, dtype=generate.dtype, ulysses=generate.ulysses)  # fmt: skip
    denoising = plan_sampling(settings, 8, 80.0).phases["denoising"]
    video = 24 * 44 * 80  # 93 frames of 704 x 1280: 24 x 88 x 160 latents, patch 1 x 2 x 2
    assert any(part.endswith(f"x {video // 8} tokens)") for part in denoising), list(denoising)
    assert denoising["ControlNet weights (bfloat16, whole)"] == controlnet.params * 2
    # one of its blocks at the transformer's tokens per rank, its control and base tokens and 4 residuals whole
    per_token = (24 * controlnet.dim + 2 * controlnet.ffn) * 2
    whole = (4 + 2) * controlnet.dim * 2 * video
    held = denoising[f"ControlNet (one block at {video // 8} tokens; residuals whole)"]
    assert held == per_token * video // 8 + whole
