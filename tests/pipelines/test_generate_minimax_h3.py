"""MiniMax-H3 (Modular Diffusers only: ``MiniMaxH3ModularPipeline``) through ``generate``: the built-in
``tiny-minimax-h3`` on Ulysses 2 and ring 2 gives the frames and latents of one process, with each rank's attention
holding half of the one packed sequence (text, video and audio rows), and the video VAE's decoder calls (one a clip)
shared out over the ranks; CFG parallelism and guidance are refused in one line (the model is guidance-distilled). Its
first-and-last-frame workflow (``fl2va``: ``--last-image``, with ``--image`` the first frame) on Ulysses 2 gives the
one-process video from a split sequence too; contradictory workflow flags are refused in one line before loading.
Echo (``EchoModularPipeline``, modular only, on LTX-2's transformer), from a saved tiny repository, on Ulysses 2 and
ring 2 gives its one-process video too, and so does LTX-2.5 (``LTX25ModularPipeline``: LTX-2's guided blocks, its
diffusion decoder run whole on every rank), whose CFG parallelism is refused in one line. One spawn runs the seven
jobs."""

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


def _keyframes(tmp) -> dict[str, str]:
    """``fl2va``'s first and last frames (random pixels, 32 x 32): ``--image`` and ``--last-image``."""
    from PIL import Image

    rng = np.random.RandomState(0)
    frames = {}
    for key in ("image", "last_image"):
        Image.fromarray((rng.rand(32, 32, 3) * 255).astype("uint8")).save(tmp / f"{key}.png")
        frames[key] = str(tmp / f"{key}.png")
    return frames


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{layout: the sample leader's report}, "single" being one process; "fl2va" and "fl2va-1x2" the keyframe
    workflow's on one process and on Ulysses 2."""
    from variant_generate_checks import generate_recording, layout_reports

    tmp = tmp_path_factory.mktemp("minimax_h3")
    keyframes = _keyframes(tmp)
    echo, ltx25 = _echo_settings(tmp), _ltx25_settings(tmp)
    single, fl2va, echo_single, ltx25_single = generate_recording(
        [_settings(tmp, "single"), _settings(tmp, "fl2va", **keyframes), echo("echo"), ltx25("ltx25")]
    )
    jobs = [(layout, _settings(tmp, layout, **flags)) for layout, flags in LAYOUTS.items()]
    jobs.append(("fl2va-1x2", _settings(tmp, "fl2va-1x2", ulysses=2, **keyframes)))
    jobs += [(f"echo-{layout}", echo(f"echo-{layout}", **flags)) for layout, flags in LAYOUTS.items()]
    jobs += [(f"ltx25-{layout}", ltx25(f"ltx25-{layout}", **flags)) for layout, flags in LAYOUTS.items()]
    return {"single": single, "fl2va": fl2va, "echo": echo_single, "ltx25": ltx25_single} | layout_reports(jobs)


def _ltx25_settings(tmp):
    """Settings of ``generate`` on a tiny LTX-2.5 repository (``LTX25ModularPipeline``: LTX-2's guided blocks, the
    diffusion decoder), saved in ``tmp``: ``tiny-ltx2``'s components and ``tiny_diffusion_decoder`` under
    ``LTX25AutoBlocks``; 5 frames of 32 x 32 (2 latent frames of 8 x 8), 2 steps at the default guidance 3."""
    from modular_repos import save_blocks_repository, tiny_diffusion_decoder

    repo = save_blocks_repository("tiny-ltx2", "LTX25AutoBlocks", tmp / "ltx25-repo",
                                  diffusion_decoder=tiny_diffusion_decoder())  # fmt: skip

    def settings(name: str, **flags) -> GenerateConfig:
        return GenerateConfig.load(overrides={"model": str(repo), "out": str(tmp / f"{name}.mp4"), "frames": 5,
                                              "height": 32, "width": 32, "max_sequence_length": 32, "steps": 2,
                                              "save_latents": str(tmp / f"{name}.pt"), "verify_inputs": True,
                                              **flags})  # fmt: skip

    return settings


def _echo_settings(tmp):
    """Settings of ``generate`` on a tiny Echo repository (``EchoModularPipeline``, modular only: the LTX-2
    transformer), saved in ``tmp``: ``tiny-ltx2``'s components run by ``EchoBlocks``; 5 frames of 32 x 32 (2 latent
    frames of 8 x 8)."""
    from modular_repos import save_blocks_repository

    repo = save_blocks_repository("tiny-ltx2", "EchoBlocks", tmp / "echo-repo")

    def settings(name: str, **flags) -> GenerateConfig:
        return GenerateConfig.load(overrides={"model": str(repo), "out": str(tmp / f"{name}.mp4"), "frames": 5,
                                              "height": 32, "width": 32, "max_sequence_length": 32,
                                              "save_latents": str(tmp / f"{name}.pt"), "verify_inputs": True,
                                              **flags})  # fmt: skip

    return settings


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


def test_the_keyframe_workflow_on_ulysses_2_gives_the_one_process_video(videos):
    """``--last-image`` (with ``--image``: the first frame) runs ``fl2va`` on ``transformer``: its video and latents on
    Ulysses 2 within 1e-4 of one process's, each rank's attention holding half of the one packed sequence, which holds
    the keyframes' rows besides text to video's; the keyframes change the video."""
    from variant_generate_checks import assert_same_video

    one, split, text = videos["fl2va"], videos["fl2va-1x2"], videos["single"]
    assert one["frames"].shape == (124, 32, 32, 3)
    assert_same_video(split, one)
    latents = torch.load(one["latents"])
    assert latents.shape == (1, 4, VIDEO_ROWS, 2, 2)
    assert (latents - torch.load(text["latents"])).abs().max() > 0.1  # not text to video's
    lengths, text_lengths = split["lengths"], videos["1x2"]["lengths"]
    assert len(lengths) == 2 and lengths[0] == lengths[1] and len(lengths[0]) == 1, lengths
    # (measured: 318 rows a rank, text to video's 238: the keyframes' rows and their labels in the text)
    assert lengths[0][0] > text_lengths[0][0], (lengths, text_lengths)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_echo_on_every_layout_gives_the_one_process_video_from_a_split_sequence(videos, layout):
    """Echo (``EchoModularPipeline``: LTX-2's transformer under Echo's DMD blocks, one call a step, fresh noise each
    step from the generator every rank shares) from a saved repository: frames and latents within 1e-4 of one
    process's, each rank's video self-attention holding half of the 2 x 8 x 8 video tokens, the VAE split by rows."""
    from variant_generate_checks import assert_same_video

    one, split = videos["echo"], videos[f"echo-{layout}"]
    assert torch.load(one["latents"]).shape == (1, 4, 2, 8, 8)
    assert_same_video(split, one)
    # each rank's video attention: half the 128 video tokens (its video-to-audio attention: the 5 audio queries, whole)
    assert split["lengths"] == [[5, 64], [5, 64]], split["lengths"]
    assert split["vae_rows"] < one["vae_rows"]  # the decoder's rows split (a halo beside each half)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ltx25_on_every_layout_gives_the_one_process_video_from_a_split_sequence(videos, layout):
    """LTX-2.5 (``LTX25ModularPipeline``: LTX-2's guided blocks, guidance 3, then the diffusion decoder run whole on
    every rank) from a saved repository: frames and latents within 1e-4 of one process's, each rank's video
    self-attention holding half of the 2 x 8 x 8 video tokens."""
    from variant_generate_checks import assert_same_video

    one, split = videos["ltx25"], videos[f"ltx25-{layout}"]
    assert torch.load(one["latents"]).shape == (1, 128, 4)  # packed: 2 x 8 x 8 tokens of 4 channels
    assert_same_video(split, one)
    assert split["batches"] == [[1], [1]], split["batches"]  # each guidance pass its own call of batch 1
    assert split["lengths"] == [[5, 64], [5, 64]], split["lengths"]


def test_contradictory_workflow_flags_are_refused_in_one_line_before_loading(tmp_path):
    """``--workflow`` against the inputs (the flags a workflow does not take, one it needs, a name it does not have,
    a model without workflows), each one line before loading; the CLI says it with exit status 2."""
    from cli_run import run_cli

    from dit_sp.errors import ConfigError
    from dit_sp.inference import check_before_loading

    keyframes, model = _keyframes(tmp_path), f"{MODEL} (MiniMaxH3ModularPipeline)"
    cases = [
        ({"workflow": "t2va", "image": keyframes["image"]},
         f"--image: {model} takes no input files in its t2va workflow (text only); drop --image or --workflow"),
        ({"workflow": "ref2va", **keyframes},
         f"--last-image: {model} takes no last image in its ref2va workflow, only --image; drop --last-image or "
         "--workflow"),
        ({"workflow": "fl2va"}, f"--workflow fl2va: {model} needs --image or --last-image in it; add one"),
        ({"workflow": "ref2va"}, f"--workflow ref2va: {model} needs --image in it; add one"),
        ({"workflow": "i2v"}, f"--workflow i2v: {model} has no such workflow (its workflows are t2va, fl2va, ref2va); "
                              "name one of them"),
        ({"model": "tiny-wan", "workflow": "fl2va"},
         "--workflow fl2va: tiny-wan (WanPipeline) is not a Modular Diffusers pipeline with workflows (MiniMax-H3's); "
         "drop --workflow"),
    ]  # fmt: skip
    for flags, message in cases:
        with pytest.raises(ConfigError) as refused:
            check_before_loading(GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"),
                                                                **flags}))  # fmt: skip
        assert str(refused.value) == message
    # each workflow by its inputs, or named: a first frame alone is fl2va only when --workflow says so
    from dit_sp.families import FAMILIES

    family = next(f for f in FAMILIES if f.name == "minimax_h3")
    for flags, workflow in (({}, "t2va"), ({"image": "a"}, "ref2va"), ({"last_image": "b"}, "fl2va"),
                            ({"image": "a", "last_image": "b"}, "fl2va"), ({"image": "a", "workflow": "fl2va"},
                                                                          "fl2va")):  # fmt: skip
        assert family.workflow_for(flags) == workflow, flags
    check_before_loading(GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"),
                                                        "workflow": "fl2va", "image": keyframes["image"]}))  # fmt: skip
    result = run_cli("pipelines.generate", ["--model", MODEL, "--workflow", "ref2va", "--image", keyframes["image"],
                                            "--last-image", keyframes["last_image"], "--out",
                                            str(tmp_path / "v.mp4")], cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: {cases[1][1]}"
    assert not (tmp_path / "v.mp4").exists()


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


def test_ltx25_cfg_parallel_is_refused_in_one_line_before_loading(tmp_path):
    """LTX-2.5's blocks guide through LTX2Guidance, one call of batch 1 a pass; the ltx2 family's cfg parallelism
    splits its classic pipelines' one batched call, so ``--cfg-parallel`` is refused (``MODULAR_BATCHED_REFUSED``)."""
    from modular_repos import save_blocks_repository, tiny_diffusion_decoder

    from dit_sp import generate
    from dit_sp.errors import ConfigError
    from dit_sp.sp.pipeline import MODULAR_BATCHED_REFUSED

    repo = save_blocks_repository("tiny-ltx2", "LTX25AutoBlocks", tmp_path / "repo",
                                  diffusion_decoder=tiny_diffusion_decoder())  # fmt: skip
    settings = GenerateConfig.load(overrides={"model": str(repo), "out": str(tmp_path / "v.mp4"), "cfg_parallel": True})
    with pytest.raises(ConfigError) as refused:
        generate(settings)
    assert str(refused.value) == f"--cfg-parallel for LTX25ModularPipeline: {MODULAR_BATCHED_REFUSED}"
    assert not (tmp_path / "v.mp4").exists()


def test_guidance_is_refused_for_the_distilled_model():
    """The pipeline takes no guidance argument and has no guider: ``guidance`` 1 passes nothing, others are refused;
    Echo's blocks too."""
    from diffusers import MiniMaxH3Blocks

    from dit_sp.errors import ConfigError
    from dit_sp.inference import guidance_arguments
    from dit_sp.zoo import build_tiny

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(transformer=build_tiny(MODEL, "transformer"))
    assert guidance_arguments(pipe, GenerateConfig.load(overrides={"model": MODEL})) == {}
    with pytest.raises(ConfigError, match="takes no guidance .*guidance-distilled"):
        guidance_arguments(pipe, GenerateConfig.load(overrides={"model": MODEL, "guidance": 3.0}))
    # Echo's blocks (LTX-2's transformer) neither: so --guidance, and with it --cfg-parallel, is refused in one line
    from diffusers import EchoBlocks

    echo = EchoBlocks().init_pipeline()
    echo.update_components(transformer=build_tiny("tiny-ltx2", "transformer"))
    assert guidance_arguments(echo, GenerateConfig.load(overrides={"model": "tiny-ltx2", "guidance": 1.0})) == {}
    with pytest.raises(ConfigError, match="^EchoModularPipeline takes no guidance .*drop --guidance or set it to 1$"):
        guidance_arguments(echo, GenerateConfig.load(overrides={"model": "tiny-ltx2", "guidance": 3.0}))


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
