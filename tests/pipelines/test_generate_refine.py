"""``generate --refine``: Sana-WM's stage-2 refiner (``SanaWMLTX2Refiner``, the built-in ``tiny-sana-wm``'s from its
spec) run on stage 1's latents. One video is refined as a batch's line with its prompt and seed; the CLI with a batch
of prompts (``--prompts``, each video refined with its own prompt and seed) on CFG parallelism and two data-parallel
groups (four processes: in each group stage 1's guidance branches on two, the unguided refiner on both as one Ulysses
group; one video a group) writes each video's refined latents of one process; the server started with ``--set
refine=true`` writes the refined video of one process, or stage 1's for a request that turns ``refine`` off. The
one-process results are what diffusers' own refiner makes of stage 1's saved latents in Python. A checkpoint
directory's refiner is its ``refiner/`` folder (loaded back exactly). Refused in one line before loading: a model
without a refiner, a checkpoint without ``refiner/``, a Ulysses degree that leaves a refiner rank no head; a request
asking a server without the refiner for it."""

from __future__ import annotations

import dataclasses
import io
import json
import os

import numpy as np
import pytest
import torch

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError

BASE = {"model": "tiny-sana-wm", "image": "first_frame.png", "steps": 2}
TOL = 1e-4
PROMPTS = [{"prompt": "a red circle moving left", "seed": 0}, {"prompt": "a walk along a stone wall", "seed": 5}]
"""The batch: the first line is the one video of the default prompt and seed (the Ulysses 2 run's)."""
WORKER_THREADS = max(1, (os.cpu_count() or 1) // 4)
"""The threads of each of the CLI's four workers (``dit_sp.spawn``'s share of the cores); the one-process runs' too."""


def _mp4_frames(data: bytes) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(io.BytesIO(data), extension=".mp4")


def _same_mp4(video: np.ndarray, expected: np.ndarray) -> None:
    """Two mp4s encoded from frames equal to 1e-4: an 8-bit step at a few pixels moves the codec's choices in their
    blocks (measured: at most 6 levels, 0.03 on average, 0.8% of the values more than 1 level apart), where another
    video is about 19 levels away on average."""
    assert video.shape == expected.shape and video.shape[1:] == (32, 48, 3) and expected.std() > 5
    difference = np.abs(video.astype(int) - expected.astype(int))
    assert difference.mean() < 0.1 and (difference > 1).mean() < 0.02, (difference.mean(), (difference > 1).mean())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process in this process (the batch's stage 1 alone, then its first video alone and the batch with the
    refiner; with the threads each of the four CLI workers gets: the model's bf16 softmax branches move with the thread
    count), then the CLI with the batch on CFG parallelism and two data-parallel groups with --refine."""
    from cli_run import run_cli

    from dit_sp import generate

    tmp = tmp_path_factory.mktemp("refine")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in PROMPTS))
    batch = BASE | {"prompts": str(tmp / "prompts.jsonl")}
    threads = torch.get_num_threads()
    torch.set_num_threads(WORKER_THREADS)
    try:
        generate(
            GenerateConfig.load(overrides=batch | {"out": str(tmp / "s1/v.mp4"), "save_latents": str(tmp / "s1.pt")})
        )
        paths = {"out": str(tmp / "single.mp4"), "save_latents": str(tmp / "single.pt"), "refine": True}
        single = generate(GenerateConfig.load(overrides=BASE | paths), True)
        paths = {"out": str(tmp / "one/v.mp4"), "save_latents": str(tmp / "one.pt")}
        refined = generate(GenerateConfig.load(overrides=batch | paths | {"refine": True}), True)
    finally:
        torch.set_num_threads(threads)
    argv = [
        "--model",
        "tiny-sana-wm",
        "--image",
        "first_frame.png",
        "--steps",
        "2",
        "--refine",
        "--cfg-parallel",
        "--dp",
        "2",
        "--prompts",
        "prompts.jsonl",
        "--out",
        str(tmp / "cfg/v.mp4"),
        "--save-latents",
        str(tmp / "cfg.pt"),
    ]
    cfg = run_cli("pipelines.generate", argv, cwd=tmp, timeout=300)
    assert cfg.returncode == 0, cfg.stderr[-3000:]
    latents = {name: [torch.load(tmp / f"{name}_{i:05d}.pt") for i in range(len(PROMPTS))] for name in ("s1", "one")}
    return {"tmp": tmp, "stage1": latents["s1"], "one": refined["frames"], "one_latents": latents["one"],
            "single": single, "single_latents": torch.load(tmp / "single.pt"),
            "cfg": cfg, "cfg_latents": [torch.load(tmp / f"cfg_{i:05d}.pt") for i in range(len(PROMPTS))]}  # fmt: skip


@pytest.mark.slow  # reads the runs above
def test_one_video_is_refined_as_the_batchs_first(runs):
    """``generate --refine`` of one video (its prompt and seed: the batch's first line's) writes the refined frames and
    latents the batch writes for that line: stage 1's latents past the sink frame refined, the sink kept."""
    one, stage1 = runs["one_latents"][0], runs["stage1"][0]
    # stage 1's 5 latent frames of 8 x 12, refined past the sink frame (in blocks of 3)
    assert runs["single_latents"].shape == one.shape == stage1.shape == (1, 4, 5, 8, 12)
    assert torch.equal(runs["single_latents"], one)
    assert np.array_equal(runs["single"]["frames"], runs["one"][0]) and runs["one"][0].std() > 0.02
    assert (one - stage1)[:, :, 1:].abs().max() > 0.1  # the refiner changed them
    assert torch.equal(one[:, :, :1], stage1[:, :, :1])  # the sink frame kept as it is
    assert "refine_seconds" in runs["single"]


@pytest.mark.slow  # reads the runs above
def test_a_batch_on_cfg_parallelism_refines_each_video_as_one_process(runs):
    """``--prompts`` with ``--cfg-parallel --dp 2`` (four processes, one video a data-parallel group): each video's
    refined latents within 1e-4 of one process's (each refined: they differ from its stage 1's past the sink frame),
    and its mp4 that of one process (``_same_mp4``)."""
    assert "cfg=2" in runs["cfg"].stdout and "dp=2" in runs["cfg"].stdout and "wrote 2 videos" in runs["cfg"].stdout
    # the refiner split over both guidance groups' processes of each data-parallel group (stage 1's cfg=2 layout:
    # one Ulysses group of 2 a data-parallel group)
    assert "refiner on ulysses=2" in runs["cfg"].stdout
    for index, (latents, one, stage1) in enumerate(zip(runs["cfg_latents"], runs["one_latents"], runs["stage1"])):
        assert latents.shape == (1, 4, 5, 8, 12)
        assert (latents - one).abs().max() <= TOL, index
        assert (one - stage1)[:, :, 1:].abs().max() > 0.1 and torch.equal(one[:, :, :1], stage1[:, :, :1]), index
        name = f"{index:05d}.mp4"
        _same_mp4(*(_mp4_frames((runs["tmp"] / d / "v" / name).read_bytes()) for d in ("cfg", "one")))
    assert (runs["one_latents"][0] - runs["one_latents"][1]).abs().max() > 0.1  # two videos, not one twice


@pytest.mark.slow  # reads the runs above
def test_the_refined_video_is_diffusers_refiner_on_stage_1s_latents(runs):
    """diffusers' ``SanaWMLTX2Refiner`` called in Python on the latents stage 1 saved (the one-process batch without
    --refine), with the built-in refiner, the pipeline's VAE and each video's prompt and seed: the frames and latents
    the batch with ``--refine`` gave."""
    from dit_sp.zoo import load_pipeline
    from dit_sp.zoo.refiner import load_refiner

    config = GenerateConfig.load(overrides=BASE)
    refiner = load_refiner("tiny-sana-wm", load_pipeline("tiny-sana-wm", torch.float32).vae, torch.float32)
    assert type(refiner).__name__ == "SanaWMLTX2Refiner"
    threads = torch.get_num_threads()
    torch.set_num_threads(WORKER_THREADS)
    try:
        for index, line in enumerate(PROMPTS):
            call = {"prompt": line["prompt"], "fps": config.fps}
            generator = torch.Generator().manual_seed(line["seed"])
            frames = refiner(runs["stage1"][index], **call, generator=generator, output_type="np")
            generator = torch.Generator().manual_seed(line["seed"])
            latents = refiner(runs["stage1"][index], **call, generator=generator, output_type="latent")
            assert np.abs(frames - runs["one"][index]).max() <= 1e-5, index
            assert (latents - runs["one_latents"][index]).abs().max() <= 1e-5, index
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # a server (one worker)
def test_the_server_refines_a_requests_video_as_generate_does(runs):
    """``serve --set refine=true``: a request's video is the one-process batch's refined one (the same
    prompt, seed and first frame: ``_same_mp4``), and a request with ``refine: false`` gets stage 1's video (one
    frame more: the refiner drops the sink frame's)."""
    openai = pytest.importorskip("openai")
    from serve_run import Server, wait_until

    from dit_sp.io.bundled import asset_path

    tmp = runs["tmp"]
    server = Server(["--model", "tiny-sana-wm", "--set", "steps=2", "--set", "refine=true", "--job-dir",
                     str(tmp / "jobs")], cwd=tmp, start_timeout=180)  # fmt: skip
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        image = ("first.png", asset_path("first_frame.png").read_bytes(), "image/png")
        served = {}
        for index, refine in ((0, True), (1, False)):
            job = client.videos.create(prompt=PROMPTS[index]["prompt"], input_reference=image,
                                       extra_body={"seed": PROMPTS[index]["seed"], "refine": refine})  # fmt: skip
            done = wait_until(lambda job=job: (v := client.videos.retrieve(job.id)).status in ("completed", "failed")
                              and v, 120, f"{job.id} to finish")  # fmt: skip
            assert done.status == "completed", done
            served[index] = _mp4_frames(client.videos.download_content(job.id).content)
        assert server.terminate(60) == 0, server.output
    finally:
        server.kill()
    for index, directory in ((0, "one"), (1, "s1")):  # refined, then stage 1's
        _same_mp4(served[index], _mp4_frames((tmp / directory / "v" / f"{index:05d}.mp4").read_bytes()))


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
    with pytest.raises(ConfigError, match=r"^--refine: its refiner runs on Ulysses 4 \(--ulysses\): Ulysses 4 over "
                                          r"SanaWMLTX2RefinerTransformer3DModel's 3 heads"):  # fmt: skip
        check_before_loading(GenerateConfig.load(overrides=settings | {"ulysses": 4}))  # its transformer's config.json
    loaded = load_refiner(tmp_path / "ckpt", pipe.vae, torch.float32)
    assert loaded.vae is pipe.vae
    for name in ("transformer", "connectors", "text_encoder"):
        expected, found = getattr(built, name).state_dict(), getattr(loaded, name).state_dict()
        assert expected.keys() == found.keys() and all(torch.equal(expected[k], found[k]) for k in expected), name


def test_bad_combinations_are_refused_in_one_line_before_loading(tmp_path):
    """A model without a refiner, and a CFG-parallel layout whose merged Ulysses group would leave a refiner rank no
    head (before loading: ``check_before_loading``); a request for the refiner to a server started without it (a 400
    naming the field)."""
    from dit_sp.inference import check_before_loading
    from dit_sp.server.video_request import BadRequest, read_request

    config = GenerateConfig.load(overrides={"model": "tiny-wan", "refine": True, "out": str(tmp_path / "v.mp4")})
    with pytest.raises(ConfigError, match=r"^--refine: tiny-wan \(WanPipeline\) has no stage-2 refiner that generate "
                                          r"runs \(it refines SanaWMPipeline\); drop --refine$"):  # fmt: skip
        check_before_loading(config)
    cfg = GenerateConfig.load(overrides=BASE | {"refine": True, "cfg_parallel": True, "ulysses": 2,
                                                "out": str(tmp_path / "v.mp4")})  # fmt: skip
    with pytest.raises(ConfigError) as refused:  # the refiner on both guidance groups: 4 ranks over its 3 heads
        check_before_loading(cfg)
    assert str(refused.value).startswith("--refine: its refiner runs on Ulysses 4 (--cfg-parallel x --ulysses 2: its "
                                         "calls are unguided): Ulysses 4 over SanaWMLTX2RefinerTransformer3DModel's "
                                         "3 heads (1 a rank) leaves the last rank no head")  # fmt: skip
    assert "\n" not in str(refused.value)
    check_before_loading(dataclasses.replace(cfg, ulysses=1))  # Ulysses 2: a head or two a rank
    base = GenerateConfig.load(overrides=BASE)
    with pytest.raises(BadRequest, match=r"^refine: this server runs no stage-2 refiner; start it with --set "
                                         r"refine=true") as refused:  # fmt: skip
        read_request({"prompt": "a walk", "refine": True}, None, base, "tiny-sana-wm")
    assert refused.value.param == "refine"
    with pytest.raises(BadRequest, match=r"^refine must be true or false, got 'yes'$"):
        read_request({"prompt": "a walk", "refine": "yes"}, None, base, "tiny-sana-wm")
    served = dataclasses.replace(base, refine=True)
    assert read_request({"prompt": "a walk", "refine": "false"}, None, served, "tiny-sana-wm")[1]["refine"] is False


def test_the_cli_refuses_refine_for_a_model_without_one(tmp_path):
    from cli_run import run_cli

    result = run_cli("pipelines.generate", ["--model", "tiny-wan", "--refine", "--out", str(tmp_path / "v.mp4")],
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --refine: tiny-wan (WanPipeline) has no stage-2")
    assert not (tmp_path / "v.mp4").exists()


def test_serve_refuses_refine_for_a_model_without_one_before_starting():
    """``serve --set refine=true`` checks the model's refiner as ``generate --refine`` does, before workers start."""
    from pipelines.serve import main

    with pytest.raises(ConfigError, match=r"^--refine: tiny-wan \(WanPipeline\) has no stage-2 refiner"):
        main(["--model", "tiny-wan", "--set", "refine=true"])
