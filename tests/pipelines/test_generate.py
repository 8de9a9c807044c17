"""The sequence-parallel tiny Wan pipeline and `python -m pipelines.generate`: same video on every
layout, files that read back, offline checkpoints, and clear errors."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from cli_run import run_cli, run_python

from dit_sp import GenerateConfig, generate, spawn
from dit_sp.zoo import build_tiny

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end

LAYOUTS = {  # name: (world, flags)
    "1x2": (2, {"ulysses": 2}),
    "2x1": (2, {"ring": 2}),
    "2x2": (4, {"ring": 2, "ulysses": 2}),
    "1x4": (4, {"ulysses": 4}),
    "cfg2x(1x2)": (4, {"ulysses": 2, "cfg_parallel": True}),
    "1x2, one process decodes": (2, {"ulysses": 2, "parallel_vae": False}),
}
VIDEO_TOKENS = 18  # 9 frames at 48 x 32: 3 latent frames of 6 x 4, in 3 x 2 patches


def _settings(tmp_path, name: str, model: str | None = None, **overrides) -> GenerateConfig:
    """tiny-wan's settings (for ``model`` too: a saved copy of it)."""
    settings = GenerateConfig.load(overrides={"model": "tiny-wan", "out": str(tmp_path / f"{name}.mp4"),
                                              "save_latents": str(tmp_path / f"{name}.pt"), "verify_inputs": True,
                                              **overrides})  # fmt: skip
    return dataclasses.replace(settings, model=model) if model else settings


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    return generate(_settings(tmp, "single"), True)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_gives_the_same_video(reference, tmp_path, layout):
    from variant_generate_checks import generate_recording

    world, flags = LAYOUTS[layout]
    by_rank = spawn(generate_recording, world, args=([_settings(tmp_path, "parallel", **flags)],), timeout=300)
    reports = [rank_reports[0] for rank_reports in by_rank]
    local = -(-VIDEO_TOKENS // (flags.get("ring", 1) * flags.get("ulysses", 1)))  # the sequence really split
    assert [r["attention_lengths"] for r in reports] == [[local]] * world, f"not {local} tokens a rank"
    leaders = [r for r in reports if "out" in r]
    assert len(leaders) == 1, "exactly one rank writes the output"
    frames = leaders[0]["frames"]
    assert frames.shape == reference["frames"].shape
    assert np.abs(frames - reference["frames"]).max() <= 1e-4
    latents, ref_latents = torch.load(leaders[0]["latents"]), torch.load(reference["latents"])
    assert (latents - ref_latents).abs().max() <= 1e-4
    assert reference["frames"].std() > 0.01  # a real video, not a constant


@pytest.mark.parametrize(("out", "kind"), [("v.mp4", "mp4"), ("v.gif", "gif"), ("frames", "png")])
def test_cli_writes_readable_video(tmp_path, out, kind):
    target = tmp_path / out
    cmd = [sys.executable, "-m", "pipelines.generate", "--model", "tiny-wan", "--frames", "5", "--height", "32",
           "--width", "48",
           "--steps", "2", "--out", str(target)]  # fmt: skip
    result = run_python(cmd, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"wrote {target}" in result.stdout and "s/step" in result.stdout
    pngs = sorted(target.glob("frame_*.png"))
    frames = [iio.imread(p) for p in pngs] if kind == "png" else list(iio.imiter(target))
    assert len(frames) == 5
    assert frames[0].shape[:2] == (32, 48)


def test_cli_runs_cfg_parallel_workers_of_ltx2_with_its_extra_guidance_passes(tmp_path):
    """``generate --model tiny-ltx2 --cfg-parallel`` (LTX2Pipeline at its defaults: the batched guidance pair plus its
    spatio-temporal and modality-isolation passes, batch 1, which both cfg ranks run whole) in 2 workers: the latents
    and frames of one process."""
    reference = generate(GenerateConfig.load(overrides={"model": "tiny-ltx2", "out": str(tmp_path / "one.mp4"),
                                                        "save_latents": str(tmp_path / "one.pt")}), True)  # fmt: skip
    argv = ["--model", "tiny-ltx2", "--cfg-parallel", "--out", "v.mp4", "--save-latents", "v.pt"]
    result = run_cli("pipelines.generate", argv, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cfg=2" in result.stdout
    latents = torch.load(tmp_path / "v.pt")
    assert latents.shape == (1, 192, 4) and (latents - torch.load(tmp_path / "one.pt")).abs().max() <= 1e-4
    # the mp4s: frames equal to 1e-4 encoded alike (an 8-bit step at a few pixels may move the codec's choices)
    frames, one = (iio.imread(tmp_path / name).astype(int) for name in ("v.mp4", "one.mp4"))
    assert frames.shape == one.shape == reference["frames"].shape and reference["frames"].std() > 0.01
    assert np.abs(frames - one).mean() < 0.1 and (np.abs(frames - one) > 1).mean() < 0.02


def test_saved_checkpoint_loads_offline(tmp_path, reference):
    build_tiny("tiny-wan").save_pretrained(tmp_path / "ckpt")
    report = generate(_settings(tmp_path, "ckpt", model=str(tmp_path / "ckpt")), True)
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-5


def _error_of(argv: list[str], cwd: Path) -> str:
    result = run_cli("pipelines.generate", ["--model", "tiny-wan", *argv], cwd=cwd)
    assert result.returncode != 0
    return result.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "tiny-nope"], "unknown model 'tiny-nope': built-in models are"),
        (["--frames", "8"], "the VAE needs 4\\*k\\+1 frames, e.g. \\[5, 9, 13, 17\\]"),
        (["--height", "40"], "--height 40: must be a multiple of 16"),
        (["--cfg-parallel", "--guidance", "1"], "turns guidance off"),
        (["--ulysses", "0"], "ulysses must be >= 1"),
        (["--ulysses", "two"], "ulysses: expected an integer, got 'two'"),
        (["--dtype", "float8"], "dtype: expected one of 'float32', 'bfloat16', 'float16'"),
    ],
)
def test_cli_errors_are_clear(argv, message, tmp_path):
    import re

    error = _error_of(argv, tmp_path)
    assert re.search(message, error), error


def test_cli_checkpoint_errors(tmp_path):
    assert "model_index.json is missing" in _error_of(["--model", str(tmp_path)], tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "transformer": ["diffusers",
                                                           "WanTransformer3DModel"]}))  # fmt: skip
    assert "incomplete diffusers pipeline directory" in _error_of(["--model", str(tmp_path)], tmp_path)


def test_config_file_unknown_keys_and_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("steps: 3\nframez: 9\n")
    assert "unknown key 'framez' (did you mean 'frames'?)" in _error_of(["--config", str(config)], tmp_path)
    config.write_text("steps: 3\nheight: 64\n")
    settings = GenerateConfig.load(config, {"model": "tiny-wan", "height": 32})
    assert settings.steps == 3 and settings.height == 32  # overrides win over the file


def test_degrees_that_do_not_fit_the_world_are_an_error():
    from dit_sp import ParallelConfig

    with pytest.raises(ValueError, match="does not divide the world size 4"):
        ParallelConfig.for_world(4, ring=3)
