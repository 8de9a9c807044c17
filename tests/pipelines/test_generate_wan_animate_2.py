"""Wan-Animate-2 (Modular Diffusers only: ``WanAnimate2ModularPipeline``) through the ``generate`` CLI: the built-in
``tiny-wan-animate-2`` animates a reference image (``--image``) by a driving video (``--video``, its
``driving_video``) in segments of ``--frames`` (5 here: 9 driving frames make two segments, the second conditioned on
the first's decoded last frame), guided (its guider's scale, 3). One CLI run per layout: one process, then Ulysses 2;
the same latents within 1e-4 and the same written frames. A ring and CFG parallelism are refused in one line before
anything loads, and so are a missing or foreign input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError

MODEL = "tiny-wan-animate-2"
DRIVING_FRAMES = 9


def _inputs(tmp: Path) -> list[str]:
    """A 32 x 48 reference image and a 9-frame driving video (a directory of PNG frames) of random pixels."""
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(32, 48, 3) * 255).astype("uint8")).save(tmp / "image.png")
    (tmp / "drive").mkdir()
    for i in range(DRIVING_FRAMES):
        Image.fromarray((rng.rand(32, 48, 3) * 255).astype("uint8")).save(tmp / "drive" / f"{i:02d}.png")
    return ["--image", str(tmp / "image.png"), "--video", str(tmp / "drive")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{layout: (the CLI's result, its frames (F, H, W, 3) uint8, its saved latents)}: one CLI run per layout."""
    import imageio.v3 as iio
    from cli_run import run_cli

    tmp = tmp_path_factory.mktemp("animate2")
    inputs, results = _inputs(tmp), {}
    for layout, flags in (("single", []), ("1x2", ["--ulysses", "2"])):
        argv = ["--model", MODEL, *inputs, "--out", str(tmp / layout), "--save-latents", str(tmp / f"{layout}.pt")]
        result = run_cli("pipelines.generate", [*argv, *flags], cwd=tmp, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        frames = np.stack([iio.imread(path) for path in sorted((tmp / layout).glob("frame_*.png"))])
        results[layout] = (result, frames, torch.load(tmp / f"{layout}.pt"))
    return results


@pytest.mark.slow  # runs the CLI on one process and on two
def test_ulysses_2_gives_the_one_process_video(runs):
    (single, ref_frames, ref_latents), (split, frames, latents) = runs["single"], runs["1x2"]
    assert "ulysses=2" in split.stdout and "ulysses=1" in single.stdout
    # the driving video's frame count, at the reference image's size (its aspect ratio, the area asked)
    assert ref_frames.shape == frames.shape == (DRIVING_FRAMES, 32, 48, 3)
    assert ref_frames.std() > 5  # a real video, not a constant
    # the last segment's last step: (B, C, 1 + 2 latent frames (the reference's and a segment's), 32 / 8, 48 / 8)
    assert ref_latents.shape == latents.shape == (1, 4, 3, 4, 6)
    assert ref_latents.abs().max() > 0.1 and (latents - ref_latents).abs().max() <= 1e-4
    # written as 8-bit PNGs: frames within 1e-4 round to the same level but where one sits at a rounding boundary
    difference = np.abs(frames.astype(int) - ref_frames.astype(int))
    assert difference.max() <= 1 and (difference > 0).mean() < 1e-3, (difference.max(), (difference > 0).mean())


@pytest.mark.slow  # reads the two-process run above
def test_two_ranks_draw_one_set_of_segment_bars(runs):
    """The blocks draw each segment's bar with a bare tqdm (not their progress_bar): the follower's are off too."""
    from console_checks import bar_starts

    bars = bar_starts(runs["1x2"][0].stderr)
    assert {"Segment 1/2", "Segment 2/2"} <= set(bars), bars
    assert set(bars.values()) == {1}, f"a bar drawn by more than one rank: {bars}"


def test_ring_and_cfg_parallel_are_refused_in_one_line_before_loading(tmp_path):
    from cli_run import run_cli

    inputs = _inputs(tmp_path)
    refusals = {("--ring", "2"): "--ring 2 for WanAnimate2ModularPipeline: Wan-Animate-2 attends through",
                ("--cfg-parallel",): "--cfg-parallel for WanAnimate2ModularPipeline: Wan-Animate-2's"}  # fmt: skip
    for flags, start in refusals.items():
        result = run_cli("pipelines.generate", ["--model", MODEL, *inputs, *flags, "--out", str(tmp_path / "v.mp4")],
                         cwd=tmp_path)  # fmt: skip
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and last.startswith("error: " + start), result.stderr[-2000:]
        assert "Traceback" not in result.stderr and "Segment" not in result.stderr
    assert not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"image": None},
            r"^tiny-wan-animate-2 \(WanAnimate2ModularPipeline\) needs --image PATH: its image, the "
            r"reference image holding the character to animate$",
        ),
        (
            {"video": None},
            r"^tiny-wan-animate-2 \(WanAnimate2ModularPipeline\) needs --video PATH: its "
            r"driving_video, the driving video that provides the motion$",
        ),
        (
            {"pose_video": "drive"},
            r"^--pose-video: tiny-wan-animate-2 \(WanAnimate2ModularPipeline\) takes no pose "
            r"video, only --image and --video; drop --pose-video$",
        ),
        ({"video": "nope"}, r"^--video nope: no such file or directory$"),
    ],
)
def test_inputs_are_checked_in_one_line_before_loading(tmp_path, flags, message):
    from dit_sp.inference import check_before_loading

    _inputs(tmp_path)
    files = {"image": "image.png", "video": "drive", **flags}
    paths = {key: str(tmp_path / value) if value else None for key, value in files.items()}
    config = GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"), **paths})
    with pytest.raises(ConfigError, match=message.replace("nope", str(tmp_path / "nope"))):
        check_before_loading(config)


def test_its_input_names_are_the_blocks_inputs():
    """``generate``'s renames (``ModelFamily.modular_inputs``) name inputs diffusers' blocks take, the distilled
    pipeline's too (no built-in model; a repository of it runs: ``test_generate_modular_repos.py``)."""
    import diffusers

    from dit_sp.families import FAMILIES, python_only_pipelines

    family = next(f for f in FAMILIES if f.name == "wan_animate_2")
    for pipeline in family.modular_pipelines:
        names = {p.name for p in getattr(diffusers, getattr(diffusers, pipeline).default_blocks_name)().inputs}
        assert set(family.modular_inputs.values()) <= names, pipeline
    assert not set(family.modular_pipelines) & set(python_only_pipelines())


def test_guidance_is_its_guiders_scale():
    """``--guidance`` replaces the scale of the pipeline's ClassifierFreeGuidance guider (the blocks take none); 1
    turns its unconditional branch off (checked by hand: the extract call, then one cached call a step, not two)."""
    from diffusers import WanAnimate2Blocks

    from dit_sp.inference import guidance_arguments
    from dit_sp.zoo import build_tiny

    pipe = WanAnimate2Blocks().init_pipeline()  # its guider made from the blocks' config, as the tiny model's is
    pipe.update_components(transformer=build_tiny(MODEL, "transformer"))
    assert pipe.guider.guidance_scale == 3.0 and pipe.guider.num_conditions == 2  # the blocks' default
    for scale, branches in ((1.5, 2), (1.0, 1)):
        settings = GenerateConfig.load(overrides={"model": MODEL, "guidance": scale})
        assert guidance_arguments(pipe, settings) == {}
        assert pipe.guider.guidance_scale == scale and pipe.guider.num_conditions == branches


def test_the_pages_command_is_the_tested_layout():
    """docs/families-wan-animate-2.md's generate command: the model, inputs and layout the CLI runs above run."""
    from doc_blocks import blocks, commands

    text = (Path(__file__).resolve().parents[2] / "docs" / "families-wan-animate-2.md").read_text()
    found = [command for block in blocks(text, "bash") for command in commands(block)]
    assert found == [f"python -m pipelines.generate --model {MODEL} --image character.png --video driving.mp4 "
                     "--ulysses 2 --out a.mp4"]  # fmt: skip


def test_flags_no_modular_blocks_take_are_refused_not_dropped(tmp_path):
    """``--camera`` / ``--intrinsics`` (Sana-WM's) and ``--causal-block-size`` / ``--ar-step`` (SkyReels-V2 diffusion
    forcing's) reach no block of a modular pipeline: refused in one line before loading, not silently dropped."""
    from dit_sp.inference import check_before_loading

    _inputs(tmp_path)
    refusals = {"camera": "--camera: {model} ({name}) takes no camera; it is Sana-WM's",
                "intrinsics": "--intrinsics: {model} ({name}) takes no camera",
                "ar_step": "--ar-step: {model} ({name}) takes none; it is SkyReels-V2 diffusion forcing's",
                "causal_block_size": "--causal-block-size: {model} ({name}) takes none"}  # fmt: skip
    files = {"image": str(tmp_path / "image.png"), "video": str(tmp_path / "drive")}
    for model, name, inputs in (
        (MODEL, "WanAnimate2ModularPipeline", files),
        ("tiny-minimax-h3", "MiniMaxH3ModularPipeline", {}),
    ):
        for key, message in refusals.items():
            value = "w-8" if key == "camera" else "1,1,1,1" if key == "intrinsics" else 2
            overrides = {"model": model, "out": str(tmp_path / "v.mp4"), **inputs, key: value}
            with pytest.raises(ConfigError) as refused:
                check_before_loading(GenerateConfig.load(overrides=overrides))
            text = str(refused.value)
            assert text.startswith(message.format(model=model, name=name)) and "\n" not in text, text
    # MiniMax-H3's blocks take no negative prompt (Wan-Animate-2's do): refused, not passed over
    overrides = {"model": "tiny-minimax-h3", "out": str(tmp_path / "v.mp4"), "negative_prompt": "blurry"}
    with pytest.raises(
        ConfigError, match=r"^--negative-prompt: tiny-minimax-h3 \(MiniMaxH3ModularPipeline\) takes no "
    ):
        check_before_loading(GenerateConfig.load(overrides=overrides))
    check_before_loading(GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"), **files,
                                                        "negative_prompt": "blurry"}))  # fmt: skip
