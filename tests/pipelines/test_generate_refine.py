"""``generate --refine``: Sana-WM's stage-2 refiner (``SanaWMLTX2Refiner``, the built-in ``tiny-sana-wm``'s from its
spec) run on stage 1's latents. The CLI on Ulysses 2 (both stages' transformers split, the VAE shared) writes the
frames and refined latents of one process (one CLI run), and the one-process result is what diffusers' own refiner
makes of stage 1's saved latents in Python. A checkpoint directory's refiner is its ``refiner/`` folder (loaded back
exactly). Refused in one line before loading: a model without a refiner, a checkpoint without ``refiner/``,
``--cfg-parallel``, ``--prompts``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError

BASE = {"model": "tiny-sana-wm", "image": "first_frame.png", "steps": 2}
TOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process in this process (stage 1 alone, then with the refiner; with the threads each of two CLI workers
    gets: the model's bf16 softmax branches move with the thread count), then the CLI on Ulysses 2 with --refine."""
    import imageio.v3 as iio
    from cli_run import run_cli

    from dit_sp import generate

    tmp = tmp_path_factory.mktemp("refine")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        paths = {"out": str(tmp / "s1.mp4"), "save_latents": str(tmp / "s1.pt")}
        stage1 = generate(GenerateConfig.load(overrides=BASE | paths))
        paths = {"out": str(tmp / "one.mp4"), "save_latents": str(tmp / "one.pt")}
        refined = generate(GenerateConfig.load(overrides=BASE | paths | {"refine": True}), True)
    finally:
        torch.set_num_threads(threads)
    argv = ["--model", "tiny-sana-wm", "--image", "first_frame.png", "--steps", "2", "--refine", "--ulysses", "2",
            "--out", str(tmp / "split"), "--save-latents", str(tmp / "split.pt")]  # fmt: skip
    result = run_cli("pipelines.generate", argv, cwd=tmp, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    frames = np.stack([iio.imread(path) for path in sorted((tmp / "split").glob("frame_*.png"))])
    return {"stage1": torch.load(stage1["latents"]), "one": refined, "one_latents": torch.load(tmp / "one.pt"),
            "cli": result, "frames": frames, "latents": torch.load(tmp / "split.pt")}  # fmt: skip


@pytest.mark.slow  # one CLI run on two processes
def test_ulysses_2_refines_as_one_process(runs):
    one, latents = runs["one"], runs["latents"]
    assert "ulysses=2" in runs["cli"].stdout
    # stage 1's 5 latent frames of 8 x 12, refined past the sink frame (in blocks of 3)
    assert latents.shape == runs["one_latents"].shape == runs["stage1"].shape == (1, 4, 5, 8, 12)
    assert (latents - runs["one_latents"]).abs().max() <= TOL
    assert (runs["one_latents"] - runs["stage1"])[:, :, 1:].abs().max() > 0.1  # the refiner changed them
    assert torch.equal(runs["one_latents"][:, :, :1], runs["stage1"][:, :, :1])  # the sink frame kept as it is
    expected = (np.clip(one["frames"], 0, 1) * 255).round().astype(np.uint8)  # as save_video writes them
    assert runs["frames"].shape == expected.shape and expected.std() > 5
    difference = np.abs(runs["frames"].astype(int) - expected.astype(int))  # 8-bit PNGs of frames equal to 1e-4
    assert difference.max() <= 1 and (difference > 0).mean() < 1e-3, (difference.max(), (difference > 0).mean())


@pytest.mark.slow  # reads the runs above
def test_the_refined_video_is_diffusers_refiner_on_stage_1s_latents(runs):
    """diffusers' ``SanaWMLTX2Refiner`` called in Python on the latents stage 1 saved (the one-process run without
    --refine), with the built-in refiner and the pipeline's VAE: the frames and latents ``generate --refine`` gave."""
    from dit_sp.zoo import load_pipeline
    from dit_sp.zoo.refiner import load_refiner

    config = GenerateConfig.load(overrides=BASE)
    refiner = load_refiner("tiny-sana-wm", load_pipeline("tiny-sana-wm", torch.float32).vae, torch.float32)
    assert type(refiner).__name__ == "SanaWMLTX2Refiner"
    call = {"prompt": config.prompt, "fps": config.fps}
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        frames = refiner(runs["stage1"], **call, generator=torch.Generator().manual_seed(0), output_type="np")
        latents = refiner(runs["stage1"], **call, generator=torch.Generator().manual_seed(0), output_type="latent")
    finally:
        torch.set_num_threads(threads)
    assert np.abs(frames - runs["one"]["frames"]).max() <= 1e-5
    assert (latents - runs["one_latents"]).abs().max() <= 1e-5


def test_a_checkpoints_refiner_is_its_refiner_folder(tmp_path):
    """A saved Sana-WM checkpoint: without ``refiner/`` refused in one line; with the refiner saved there it loads
    back exactly, decoding through the pipeline's VAE."""
    from dit_sp.inference import check_before_loading
    from dit_sp.zoo import build_tiny
    from dit_sp.zoo.refiner import load_refiner

    pipe = build_tiny("tiny-sana-wm")
    pipe.save_pretrained(tmp_path / "ckpt")
    settings = BASE | {"model": str(tmp_path / "ckpt"), "refine": True, "out": str(tmp_path / "v.mp4"),
                       "frames": 17, "height": 32, "width": 48}  # fmt: skip
    settings |= {"camera": "w-16", "intrinsics": "40,40,24,16"}
    with pytest.raises(MissingFileError, match=r"^--refine: .*ckpt has no refiner/model_index.json: save its "
                                               r"SanaWMLTX2Refiner there"):  # fmt: skip
        check_before_loading(GenerateConfig.load(overrides=settings))
    built = load_refiner("tiny-sana-wm", pipe.vae, torch.float32)
    built.save_pretrained(tmp_path / "ckpt" / "refiner")
    check_before_loading(GenerateConfig.load(overrides=settings))
    loaded = load_refiner(tmp_path / "ckpt", pipe.vae, torch.float32)
    assert loaded.vae is pipe.vae
    for name in ("transformer", "connectors", "text_encoder"):
        expected, found = getattr(built, name).state_dict(), getattr(loaded, name).state_dict()
        assert expected.keys() == found.keys() and all(torch.equal(expected[k], found[k]) for k in expected), name


def test_bad_combinations_are_refused_in_one_line_before_loading(tmp_path):
    """A model without a refiner (before loading: ``check_before_loading``); CFG parallelism or a batch (the settings
    themselves)."""
    from dit_sp.inference import check_before_loading

    config = GenerateConfig.load(overrides={"model": "tiny-wan", "refine": True, "out": str(tmp_path / "v.mp4")})
    with pytest.raises(ConfigError, match=r"^--refine: tiny-wan \(WanPipeline\) has no stage-2 refiner that generate "
                                          r"runs \(it refines SanaWMPipeline\); drop --refine$"):  # fmt: skip
        check_before_loading(config)
    (tmp_path / "prompts.txt").write_text("a walk\n")
    for overrides, message in (
        ({"cfg_parallel": True}, "refine with cfg_parallel: the refiner's calls are unguided"),
        ({"prompts": str(tmp_path / "prompts.txt")}, "refine with prompts: the refiner runs"),
    ):
        with pytest.raises(ConfigError) as refused:
            GenerateConfig.load(overrides=BASE | {"refine": True} | overrides)
        assert str(refused.value).startswith("settings: " + message) and "\n" not in str(refused.value), refused.value


def test_the_cli_refuses_refine_for_a_model_without_one(tmp_path):
    from cli_run import run_cli

    result = run_cli("pipelines.generate", ["--model", "tiny-wan", "--refine", "--out", str(tmp_path / "v.mp4")],
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --refine: tiny-wan (WanPipeline) has no stage-2")
    assert not (tmp_path / "v.mp4").exists()


def test_serve_refuses_refine_before_starting():
    """``serve`` samples each request's video and writes it unrefined: ``refine`` in its settings is refused."""
    from pipelines.serve import main

    with pytest.raises(ConfigError, match=r"^refine: serve does not run a stage-2 refiner \(generate --refine"):
        main(["--model", "tiny-sana-wm", "--set", "refine=true"])
