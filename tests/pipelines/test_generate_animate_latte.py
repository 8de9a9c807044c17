"""Wan Animate and Latte through ``generate`` give the same frames and latents on Ulysses 2, ring 2 and with CFG
parallelism as on one process, with each rank's attention holding half of the tokens; one spawn runs both.

Wan Animate: a reference image animated by a pose video and a face video (``--image``, ``--pose-video``,
``--face-video``) in two segments, the second conditioned on the first's last frame (18 tokens per forward: 3 latent
frames of 6, so the split cuts a frame). Latte: 5 frames of 15 patches each (8 and 7 over two ranks), batched
guidance; its image VAE decodes the frames split by rows over the sample's 2 processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp import GenerateConfig, generate
from dit_sp.errors import ConfigError

MODEL = "tiny-wan-animate"
TOKENS = {MODEL: 18, "tiny-latte": 15}  # per forward (Latte: per frame, its spatial attention's sequence)
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch
# Latte's AutoencoderKL runs split by rows over the sample's 2 processes (both CFG halves too): the most rows a VAE
# convolution took on the leader is its half of the 48 pixel rows (one process: 48)
SPLIT_VAE_ROWS = {"tiny-latte": 24}


DOC = Path(__file__).resolve().parents[2] / "docs" / "families-wan-animate.md"  # its command runs below


def _inputs(tmp) -> dict[str, str]:
    """A reference image and 9-frame pose and face videos (directories of PNG frames) of random pixels."""
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8")).save(tmp / "image.png")
    for name, size in (("pose", (48, 32)), ("face", (20, 20))):
        (tmp / name).mkdir()
        for i in range(9):
            Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")).save(tmp / name / f"{i:02d}.png")
    return {"image": str(tmp / "image.png"), "pose_video": str(tmp / "pose"), "face_video": str(tmp / "face")}


def _replace_inputs(tmp) -> dict[str, str]:
    """Replace mode's 9-frame background video and its mask (white where the person is)."""
    rng = np.random.RandomState(1)
    (tmp / "background").mkdir()
    (tmp / "mask").mkdir()
    mask = np.zeros((48, 32), dtype="uint8")
    mask[10:30, 8:24] = 255
    for i in range(9):
        Image.fromarray((rng.rand(48, 32, 3) * 255).astype("uint8")).save(tmp / "background" / f"{i:02d}.png")
        Image.fromarray(np.roll(mask, i, axis=1)).save(tmp / "mask" / f"{i:02d}.png")
    return {"background_video": str(tmp / "background"), "mask_video": str(tmp / "mask")}


def _settings(tmp, inputs: dict[str, str], model: str, name: str, **flags) -> GenerateConfig:
    # Wan Animate: segments of 5 frames (2 latent frames and the reference's), 9 pose frames: two segments; guidance
    # on for both (Latte: its default, 7.5)
    extra = inputs | {"guidance": 4.0} if model == MODEL else {}
    return GenerateConfig.load(overrides={"model": model, "steps": 2, "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), "verify_inputs": True,
                                          **extra, **flags})  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report}, "single" being one process."""
    from variant_generate_checks import layout_reports

    tmp = tmp_path_factory.mktemp("animate")
    inputs = _inputs(tmp)
    reports = {(model, "single"): generate(_settings(tmp, inputs, model, "single"), True) for model in TOKENS}
    jobs = [((model, layout), _settings(tmp, inputs, model, layout, **flags)) for layout, flags in LAYOUTS.items()
            for model in TOKENS]  # fmt: skip
    # Wan Animate's replace mode: the background's latents and the mask in the conditioning channels
    replace = inputs | _replace_inputs(tmp)
    reports[("replace", "single")] = generate(_settings(tmp, replace, MODEL, "replace-single"), True)
    jobs.append((("replace", "1x2"), _settings(tmp, replace, MODEL, "replace-1x2", ulysses=2)))
    return reports | layout_reports(jobs)


@pytest.mark.slow  # spawns worker processes
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", list(TOKENS))
def test_every_layout_gives_the_same_video_from_a_split_sequence(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    # Wan Animate: the pose video's frames, from two segments
    assert reference["frames"].shape == ((9, 48, 32, 3) if model == MODEL else (5, 48, 80, 3))
    assert report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant
    local = -(-TOKENS[model] // SP[layout])
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local} tokens"
    if model in SPLIT_VAE_ROWS:
        assert report["vae_rows"] == SPLIT_VAE_ROWS[model], report["vae_rows"]


@pytest.mark.slow  # spawns worker processes
def test_replace_mode_gives_the_same_video_on_ulysses_2(videos):
    reference, report = videos[("replace", "single")], videos[("replace", "1x2")]
    assert reference["frames"].shape == (9, 48, 32, 3)
    assert np.abs(reference["frames"] - videos[(MODEL, "single")]["frames"]).max() > 0.01  # the background counts
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    assert (torch.load(report["latents"]) - torch.load(reference["latents"])).abs().max() <= 1e-4
    assert report["lengths"] == [[TOKENS[MODEL] // 2]] * 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"pose_video": None}, r"^tiny-wan-animate animates an image by pose and face videos .*give --pose-video PATH"),
        ({"face_video": "missing"}, r"^--face-video missing: no such file or directory$"),
        ({"model": "tiny-wan"}, r"^--pose-video: tiny-wan \(WanPipeline\) takes no pose video; use a Wan Animate"),
        ({"background_video": "."}, r"^--background-video and --mask-video come together \(Wan Animate's replace mode"),
    ],
)  # fmt: skip
def test_driving_videos_are_checked_before_loading(tmp_path, flags, message):
    from dit_sp.inference.checks import check_image_inputs

    settings = {"model": MODEL, "image": "first_frame.png", "pose_video": str(tmp_path), "face_video": str(tmp_path)}
    Image.new("RGB", (8, 8)).save(tmp_path / "0.png")
    settings |= flags
    if settings["model"] == "tiny-wan":
        settings.pop("image")
    with pytest.raises((ConfigError, FileNotFoundError), match=message):
        check_image_inputs(GenerateConfig.load(overrides=settings))


@pytest.mark.slow  # runs the CLI on 2 worker processes
def test_the_documented_command_runs(tmp_path):
    """docs/families-wan-animate.md's command, as written (its pose/ and face/ frames made here), with 1 step."""
    from doc_blocks import blocks, commands, run_command, substitute

    _inputs(tmp_path)
    (command,) = commands(blocks(DOC.read_text(), "bash")[0])
    run = substitute(command, [("--ulysses 2", "--ulysses 2 --steps 1 --out doc.mp4")], DOC.name)
    result = run_command(run, tmp_path)
    assert (tmp_path / "doc.mp4").stat().st_size > 0 and "wrote" in result.stdout
