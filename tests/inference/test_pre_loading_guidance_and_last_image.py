"""Two pre-loading checks of ``generate``: ``--cfg-parallel`` on a pipeline whose family refuses CFG parallelism
(Kandinsky 6 SR does not guide) is refused before loading with the family's one line, and ``--last-image`` follows
the class the checkpoint runs as: a SkyReels-V2 diffusion-forcing text-to-video checkpoint runs as its image-to-video
class, which takes a last frame (the same video as that class built by hand), while Wan 2.2 TI2V (whose
``WanImageToVideoPipeline`` ignores ``last_image`` under ``expand_timesteps``) is still refused."""

from __future__ import annotations

import dataclasses
import json

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp import GenerateConfig, generate
from dit_sp.errors import ConfigError
from dit_sp.families.kandinsky6_sr import CFG_REFUSAL
from dit_sp.inference.checks import check_before_loading
from dit_sp.zoo import build_tiny, load_pipeline

DF = "tiny-skyreels-v2-df"


def _image(path, seed: int) -> str:
    Image.fromarray((np.random.RandomState(seed).rand(32, 32, 3) * 255).astype("uint8")).save(path)
    return str(path)


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    return GenerateConfig.load(overrides={"model": model, "steps": 2, "out": str(tmp / f"{name}.mp4"),
                                          "save_latents": str(tmp / f"{name}.pt"), **flags})  # fmt: skip


def test_cfg_parallel_on_a_pipeline_that_does_not_guide_is_refused_before_loading(tmp_path):
    with pytest.raises(ConfigError) as error:
        check_before_loading(_settings(tmp_path, "tiny-kandinsky6-sr", "sr", cfg_parallel=True, guidance=4.0))
    assert str(error.value) == f"--cfg-parallel for Kandinsky6SRPipeline: {CFG_REFUSAL}"  # parallelize's reason
    check_before_loading(_settings(tmp_path, "tiny-wan", "wan", cfg_parallel=True, guidance=4.0))  # Wan guides


def test_last_image_follows_the_class_the_checkpoint_runs_as(tmp_path):
    first, last, other = (_image(tmp_path / f"{n}.png", s) for n, s in (("first", 0), ("last", 1), ("other", 2)))
    with pytest.raises(ConfigError, match=r"^--last-image: tiny-wan2.2-ti2v takes the first frame only \(Wan 2.2 "
                       r"TI2V's WanImageToVideoPipeline, with expand_timesteps, .* ignores last_image\); drop "
                       r"--last-image$"):  # fmt: skip
        check_before_loading(_settings(tmp_path, "tiny-wan2.2-ti2v", "ti2v", image=first, last_image=last))
    saved, by_hand = tmp_path / "df", tmp_path / "df-i2v-class"
    build_tiny(DF).save_pretrained(saved)
    assert json.loads((saved / "model_index.json").read_text())["_class_name"] == "SkyReelsV2DiffusionForcingPipeline"
    components = load_pipeline(saved, torch.float32).components
    diffusers.SkyReelsV2DiffusionForcingImageToVideoPipeline(**components).save_pretrained(by_hand)
    runs = {}
    for name, model, end in (("df", saved, last), ("by-hand", by_hand, last), ("other", saved, other)):
        settings = dataclasses.replace(_settings(tmp_path, DF, name, image=first, last_image=end), model=str(model))
        check_before_loading(settings)
        runs[name] = torch.load(generate(settings, True)["latents"])
    assert runs["df"].shape == runs["by-hand"].shape and (runs["df"] - runs["by-hand"]).abs().max() <= 1e-5
    assert (runs["df"] - runs["other"]).abs().max() > 1e-3  # the last frame conditions the video: not ignored
