"""MiniMax-H3 (Modular Diffusers only: ``MiniMaxH3ModularPipeline``) through ``generate``: the built-in
``tiny-minimax-h3`` on Ulysses 2 and ring 2 gives the frames and latents of one process, with each rank's attention
holding half of the one packed sequence (text, video and audio rows), and the video VAE's decoder calls (one a clip)
shared out over the ranks; CFG parallelism and guidance are refused in one line (the model is guidance-distilled). One
spawn runs both layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dit_sp import GenerateConfig

pytestmark = pytest.mark.slow  # spawns worker processes, runs the CLI

MODEL = "tiny-minimax-h3"
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}}
# 124 frames of 32 x 32 (the shortest MiniMax-H3 makes: 5 s at 24 fps) -> 37 latent frames of 2 x 2, patch (1, 2, 2):
# 37 video rows; 124 / 24 s at 40 audio latents a second, stereo: 2 x 207 audio rows; and the prompt's text rows
VIDEO_ROWS, AUDIO_ROWS = 37, 2 * 207


def _settings(tmp, name: str, **flags) -> GenerateConfig:
    return GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp / f"{name}.mp4"),
                                          "save_latents": str(tmp / f"{name}.pt"), "verify_inputs": True,
                                          **flags})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{layout: the sample leader's report}, "single" being one process."""
    from variant_generate_checks import generate_recording, layout_reports

    tmp = tmp_path_factory.mktemp("minimax_h3")
    reports = {"single": generate_recording([_settings(tmp, "single")])[0]}
    return reports | layout_reports([(layout, _settings(tmp, layout, **flags)) for layout, flags in LAYOUTS.items()])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, layout):
    from dit_sp.zoo import build_tiny

    reference, report = videos["single"], videos[layout]
    assert reference["frames"].shape == (124, 32, 32, 3)
    assert report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert ref_latents.shape == (1, 4, VIDEO_ROWS, 2, 2)
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant
    prompt = GenerateConfig.load(overrides={"model": MODEL}).prompt
    text_rows = len(build_tiny(MODEL, "tokenizer")(prompt, add_special_tokens=False).input_ids)
    local = math.ceil((text_rows + VIDEO_ROWS + AUDIO_ROWS) / 2)
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} rows"
    # the video VAE ran split: its decoder calls (37 latent frames: 7 clips, one tile each) shared out, call t on rank
    # t % 2 (the leader assembles the frames)
    one = reference["vae_calls"]
    assert one > 2 and report["vae_calls"] == [one - one // 2, one // 2], (report["vae_calls"], one)


def test_cfg_parallel_is_refused_in_one_line_before_loading(tmp_path):
    from cli_run import run_cli

    result = run_cli("pipelines.generate", ["--model", MODEL, "--cfg-parallel", "--guidance", "4", "--out",
                                            str(tmp_path / "v.mp4")], cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1:] == [
        "error: --cfg-parallel for MiniMaxH3ModularPipeline: MiniMax-H3 is guidance-distilled: its modular denoise "
        "step makes one transformer call a step (no guider, no unconditional branch), so there is no guidance pair "
        "to split; use cfg=1"
    ]
    assert not (tmp_path / "v.mp4").exists()


def test_guidance_is_refused_for_the_distilled_model():
    """The pipeline takes no guidance argument and has no guider: ``guidance`` 1 passes nothing, others are refused."""
    from diffusers import MiniMaxH3Blocks

    from dit_sp.errors import ConfigError
    from dit_sp.inference import guidance_arguments
    from dit_sp.zoo import build_tiny

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(transformer=build_tiny(MODEL, "transformer"))
    assert guidance_arguments(pipe, GenerateConfig.load(overrides={"model": MODEL})) == {}
    with pytest.raises(ConfigError, match="takes no guidance .*guidance-distilled"):
        guidance_arguments(pipe, GenerateConfig.load(overrides={"model": MODEL, "guidance": 3.0}))


def test_the_tiny_processor_finds_the_encoders_vision_markers():
    """The byte tokenizer's Qwen-VL markers are the ids the tiny Qwen3-VL config names, and the processor (built
    without a video processor) marks image pads as Qwen3-VL's image tokens."""
    from dit_sp.zoo import build_tiny

    config = build_tiny(MODEL, "text_encoder").config
    processor = build_tiny(MODEL, "processor")
    names = ("vision_start", "vision_end", "image", "video")
    tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    assert processor.tokenizer.convert_tokens_to_ids(list(tokens)) == [getattr(config, f"{n}_token_id") for n in names]
    ids = processor.tokenizer("a<|image_pad|>b", add_special_tokens=False).input_ids
    assert processor.create_mm_token_type_ids([ids]) == [[0, 1, 0]]


def test_the_pages_commands_are_the_tested_ones():
    """docs/minimax-h3.md's commands: its generate layouts are the ones the matrix above runs (through ``generate``, as
    the CLI's workers do), and its plan command is the plan that tests/memory/test_new_family_configs.py checks fits
    (the config's layout on 8 GPUs of 141 GiB)."""
    from pathlib import Path

    from doc_blocks import blocks, commands

    text = (Path(__file__).resolve().parents[2] / "docs" / "minimax-h3.md").read_text()
    found = [command for block in blocks(text, "bash") for command in commands(block)]
    generate_flags = {"--ulysses 2": "1x2", "--ring 2": "2x1"}
    generate = [f"python -m pipelines.generate --model {MODEL} {flag} --out minimax.mp4" for flag in generate_flags]
    assert found == [*generate, "python -m pipelines.plan --generate --config minimax-h3 --gpus 8 --gpu-memory 141"]
    assert set(generate_flags.values()) == set(LAYOUTS)
    assert GenerateConfig.load("minimax-h3").ulysses == 8
