"""Image-to-video through ``generate --image`` (and ``--last-image``): Wan 2.1 I2V and FLF2V, Wan 2.2 TI2V
(per-token timesteps, clean first frame), a SANA-Video text-to-video checkpoint (run as ``SanaImageToVideoPipeline``;
on CFG parallel too, its batched guidance halved over the ranks),
CogVideoX I2V and HunyuanVideo I2V (a Llava text encoder that sees
the image), from saved model directories, give the same video on every layout; the image conditions the
video; a batch takes an image per prompt."""

from __future__ import annotations

import dataclasses
import json
import sys

import diffusers
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from cli_run import run_python
from PIL import Image

from dit_sp import GenerateConfig, generate
from dit_sp.zoo import build_tiny, load_pipeline

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLI

MODELS = {  # built-in name: (settings, with a last frame)
    "tiny-wan-i2v": ({}, False),
    "tiny-wan-flf2v": ({}, True),
    "tiny-wan2.2-ti2v": ({}, False),
    "tiny-cogvideox-i2v": ({"height": 48, "width": 32}, False),
    "tiny-hunyuanvideo-i2v": ({"guidance": 4.0}, False),  # true CFG: the image-conditioned branches run apart
    # saved as SanaVideoPipeline (as SANA-Video 2B ships), run with the image as SanaImageToVideoPipeline
    "tiny-sana-video": ({}, False),
}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}  # cfg2: a branch per rank
CFG_MODELS = ("tiny-wan-i2v", "tiny-wan-flf2v", "tiny-wan2.2-ti2v", "tiny-cogvideox-i2v", "tiny-hunyuanvideo-i2v",
              "tiny-sana-video")  # fmt: skip
"""The guided image-to-video pipelines also run with their two guidance branches on the two ranks (SANA-Video's
batched pair: one call on both branches, halved over the ranks)."""
SP = {"1x2": 2, "2x1": 2, "cfg2": 1}  # processes per guidance branch


def _local_tokens(model: str, sp: int) -> int:
    """The video tokens each rank's split attention takes: 3 latent frames of 3 x 2 patches, ceil(18 / sp); SANA-Video
    splits whole latent frames (3 of 2 x 4 patches, ceil(3 / sp) frames a rank, the last one padded)."""
    return -(-3 // sp) * 8 if model == "tiny-sana-video" else -(-18 // sp)


def _image(path, seed: int) -> str:
    pixels = np.random.RandomState(seed).rand(40, 30, 3)  # another size and aspect than the video: resized
    Image.fromarray((pixels * 255).astype("uint8")).save(path)
    return str(path)


def _settings(tmp, model: str, name: str, image: str, **flags) -> GenerateConfig:
    overrides, flf = MODELS[model]
    directory = tmp / "models" / model
    if not directory.exists():
        build_tiny(model).save_pretrained(directory)  # a model directory, as users pass one
    settings = GenerateConfig.load(overrides={"model": model, "image": image, "steps": 3,
                                              "last_image": str(tmp / "last.png") if flf else None,
                                              "out": str(tmp / f"{model}-{name}.mp4"),
                                              "save_latents": str(tmp / f"{model}-{name}.pt"),
                                              **overrides, **flags})  # fmt: skip
    return dataclasses.replace(settings, model=str(directory))  # the built-in model's sizes, from its directory


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """{(model, layout): the sample leader's report, every rank's attention lengths under "lengths"}; "single" is
    one process, "other" another image."""
    from variant_generate_checks import layout_reports

    tmp = tmp_path_factory.mktemp("i2v")
    first, other = _image(tmp / "first.png", 0), _image(tmp / "other.png", 2)
    _image(tmp / "last.png", 1)
    reports = {}
    for model in MODELS:
        reports[(model, "single")] = generate(_settings(tmp, model, "single", first), True)
        reports[(model, "other")] = generate(_settings(tmp, model, "other", other), True)
    # SanaImageToVideoPipeline built by hand from the text-to-video checkpoint's components, saved as that class
    components = load_pipeline(tmp / "models" / "tiny-sana-video", torch.float32).components
    reports["saved as"] = json.loads((tmp / "models" / "tiny-sana-video" / "model_index.json").read_text())[
        "_class_name"
    ]
    diffusers.SanaImageToVideoPipeline(**components).save_pretrained(tmp / "models" / "sana-i2v-class")
    by_hand = _settings(tmp, "tiny-sana-video", "by-hand", first)
    reports[("sana-i2v-class", "single")] = generate(
        dataclasses.replace(by_hand, model=str(tmp / "models" / "sana-i2v-class")), True
    )
    jobs = [((model, layout), _settings(tmp, model, layout, first, **flags)) for layout, flags in LAYOUTS.items()
            for model in MODELS if layout != "cfg2" or model in CFG_MODELS]  # fmt: skip
    return reports | layout_reports(jobs)  # one spawn for every layout


LAYOUT_RUNS = [(m, layout) for layout in LAYOUTS for m in MODELS if layout != "cfg2" or m in CFG_MODELS]


@pytest.mark.parametrize(("model", "layout"), LAYOUT_RUNS)
def test_every_layout_gives_the_one_process_video(videos, model, layout):
    reference, report = videos[(model, "single")], videos[(model, layout)]
    local = _local_tokens(model, SP[layout])  # the sequence really split (cfg2: whole on each branch's one rank)
    assert report["lengths"] == [[local], [local]], f"each rank's attention saw {report['lengths']}, not {local}"
    latents, expected = torch.load(report["latents"]), torch.load(reference["latents"])
    assert latents.shape == expected.shape and (latents - expected).abs().max() <= 1e-4
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    frames = list(iio.imiter(report["out"]))  # 9, or 5 for HunyuanVideo I2V (its first 4 repeat the image)
    assert len(frames) == len(reference["frames"]) in (5, 9) and frames[0].shape[:2] == reference["frames"].shape[1:3]


def test_cfg_parallel_halves_sana_videos_batched_guidance(videos):
    """SANA-Video I2V guides in one call on ``[uncond, cond]``: every split attention call takes the batch of 2 on
    Ulysses 2, and one branch (batch 1) on each rank of CFG parallel, whose video is the one-process one (above)."""
    assert videos[("tiny-sana-video", "1x2")]["batches"] == [[2], [2]]
    assert videos[("tiny-sana-video", "cfg2")]["batches"] == [[1], [1]]


def test_a_text_to_video_checkpoint_runs_as_its_image_to_video_class(videos):
    """SANA-Video's SanaVideoPipeline checkpoint with --image is SanaImageToVideoPipeline of the same components."""
    converted, by_hand = videos[("tiny-sana-video", "single")], videos[("sana-i2v-class", "single")]
    assert videos["saved as"] == "SanaVideoPipeline"  # its model_index.json, nothing edited by hand
    latents, expected = torch.load(converted["latents"]), torch.load(by_hand["latents"])
    assert latents.shape == expected.shape and (latents - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("model", list(MODELS))
def test_the_image_conditions_the_video(videos, model):
    a, b = videos[(model, "single")]["frames"], videos[(model, "other")]["frames"]
    assert np.abs(a - b).max() > 0.02  # an ignored image gives 0; the tiny SANA-Video's smallest effect is 0.054


def test_the_cli_takes_an_image_on_two_processes(videos, tmp_path):
    reference = videos[("tiny-wan-i2v", "single")]
    settings = GenerateConfig.load(overrides={"model": "tiny-wan-i2v"})
    image = _image(tmp_path / "first.png", 0)
    result = run_python([sys.executable, "-m", "pipelines.generate", "--model", "tiny-wan-i2v", "--image", image,
                         "--steps", "3", "--ulysses", "2", "--out", str(tmp_path / "v.mp4"), "--save-latents",
                         str(tmp_path / "v.pt")], timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    latents = torch.load(tmp_path / "v.pt")
    assert (latents - torch.load(reference["latents"])).abs().max() <= 1e-4
    assert len(list(iio.imiter(tmp_path / "v.mp4"))) == settings.frames


def test_a_batch_takes_an_image_per_prompt(videos, tmp_path):
    _image(tmp_path / "first.png", 0)
    _image(tmp_path / "other.png", 2)
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "a red circle moving left", "image": "first.png", "seed": 0},
             {"prompt": "a red circle moving left", "image": "other.png", "seed": 0}]  # fmt: skip
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    single = videos[("tiny-wan2.2-ti2v", "single")]
    config = _settings(tmp_path, "tiny-wan2.2-ti2v", "batch", str(tmp_path / "first.png"))
    config = dataclasses.replace(config, prompts=str(prompts), image=None, save_latents=None)
    report = generate(config, True)
    assert np.abs(report["frames"][0] - single["frames"]).max() <= 1e-5
    assert np.abs(report["frames"][1] - videos[("tiny-wan2.2-ti2v", "other")]["frames"]).max() <= 1e-5
    manifest = [json.loads(line) for line in (tmp_path / "tiny-wan2.2-ti2v-batch" / "manifest.jsonl").open()]
    assert [m["image"] for m in manifest] == [str(tmp_path / "first.png"), str(tmp_path / "other.png")]
