"""Image-conditioned GRPO: prompts with an image each (JSONL), rollouts that sample what the stock
image-to-video pipeline samples (Wan 2.1 I2V; Wan 2.2 TI2V's clean first frame and per-token timesteps), and
training steps whose gradients do not depend on the layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dit_sp.families import policy_for
from dit_sp.rl.rollout import sample_trajectory
from dit_sp.rl.sde import SDEConfig
from dit_sp.zoo import as_image_to_video, build_tiny

SIZES = {"tiny-wan-i2v": (9, 48, 32), "tiny-wan2.2-ti2v": (9, 96, 64)}


def _image(path, seed: int) -> str:
    Image.fromarray((np.random.RandomState(seed).rand(40, 30, 3) * 255).astype("uint8")).save(path)
    return str(path)


@pytest.mark.parametrize("model", list(SIZES))
def test_image_rollout_samples_what_the_stock_pipeline_samples(tmp_path, model):
    pipe = as_image_to_video(build_tiny(model))
    frames, height, width = SIZES[model]
    image = _image(tmp_path / "first.png", 0)
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=frames, height=height, width=width, guidance=4.0,
                              max_sequence_length=16)  # fmt: skip
    assert policy.takes_images
    noise = torch.randn((1, *policy.latent_shape()), generator=torch.Generator().manual_seed(0))
    stock = pipe(image=Image.open(image), prompt="a red circle", negative_prompt="", num_frames=frames,
                 height=height, width=width, num_inference_steps=4, guidance_scale=4.0, latents=noise.clone(),
                 output_type="latent", max_sequence_length=16).frames  # fmt: skip
    pipe.scheduler.set_timesteps(4)
    sigmas = [float(s) for s in pipe.scheduler.sigmas]
    encodes = []
    stock_encode = pipe.vae.encode
    pipe.vae.encode = lambda *args, **kwargs: encodes.append(1) or stock_encode(*args, **kwargs)
    cond = policy.encode(["a red circle"] * 3, [image] * 3)
    policy.encode(["a red circle"], [image])
    assert len(encodes) == 1, "an image is encoded once, whatever the group size and the step"
    cond = tuple(None if branch is None else tuple(part[:1] for part in branch) for branch in cond)
    traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise, sigmas, SDEConfig("ode"))
    assert (policy.clean(traj.final, cond) - stock).abs().max() <= 1e-4
    other = policy.encode(["a red circle"], [_image(tmp_path / "other.png", 1)])
    moved = sample_trajectory(lambda x, s: policy.velocity(x, s, other), noise, sigmas, SDEConfig("ode"))
    assert (policy.clean(moved.final, other) - stock).abs().max() > 1e-2  # the image conditions the sample


def test_ti2v_text_to_video_rollout_samples_what_the_stock_pipeline_samples():
    """Wan 2.2 TI2V without an image: its stock pipeline gives every token the step's timestep."""
    pipe = build_tiny("tiny-wan2.2-ti2v")
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=9, height=96, width=64, guidance=4.0,
                              max_sequence_length=16)  # fmt: skip
    assert not policy.takes_images and pipe.config.expand_timesteps
    noise = torch.randn((1, *policy.latent_shape()), generator=torch.Generator().manual_seed(0))
    stock = pipe(prompt="a red circle", negative_prompt="", num_frames=9, height=96, width=64,
                 num_inference_steps=4, guidance_scale=4.0, latents=noise.clone(), output_type="latent",
                 max_sequence_length=16).frames  # fmt: skip
    sigmas = [float(s) for s in pipe.scheduler.sigmas]
    cond = policy.encode(["a red circle"])
    traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise, sigmas, SDEConfig("ode"))
    assert (traj.final - stock).abs().max() <= 1e-4


def _prompt_file(tmp_path) -> str:
    """Two prompts, each with its own image (paths relative to the file)."""
    (tmp_path / "images").mkdir(exist_ok=True)
    lines = [{"prompt": "a red circle moving left", "image": "images/a.png"},
             {"prompt": "a blue square moving up", "image": "images/b.png"}]  # fmt: skip
    _image(tmp_path / "images" / "a.png", 0)
    _image(tmp_path / "images" / "b.png", 1)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


IMAGE_RUNS = {"tiny-wan-i2v": {"height": 32, "width": 48}, "tiny-wan2.2-ti2v": {"height": 64, "width": 64}}


@pytest.mark.slow
def test_image_grpo_step_gradients_on_every_layout_equal_one_process(tmp_path):
    from grpo_checks import each_step_gradients, tiny_config

    from dit_sp import spawn

    prompts = _prompt_file(tmp_path)

    def configs(**layout):
        return [tiny_config(model=model, prompts=prompts, **size, **layout) for model, size in IMAGE_RUNS.items()]

    singles = spawn(each_step_gradients, 1, args=(configs(),), timeout=300)[0]
    for single in singles:
        assert single["ratio_min"] == single["ratio_max"] == 1.0  # on-policy: the rollout's own log-probs
        assert len(single["grads"]) > 10 and single["rewards"].std() > 0
    for layout in ({"ulysses": 2}, {"ring": 2}):
        for rank in spawn(each_step_gradients, 2, args=(configs(**layout),), timeout=300):
            for model, got, single in zip(IMAGE_RUNS, rank, singles):
                assert got["grads"].keys() == single["grads"].keys()
                worst = max((got["grads"][k] - single["grads"][k]).abs().max().item() for k in got["grads"])
                assert worst <= 1e-5, f"{model} on {layout}: gradients differ by {worst:.2e}"
                assert torch.allclose(got["rewards"], single["rewards"], atol=1e-5)


@pytest.mark.slow
def test_an_image_run_killed_with_sigkill_resumes_exactly_and_exports(tmp_path):
    import sys

    from cli_run import kill_after, run_python

    prompts = _prompt_file(tmp_path)

    def command(out, *extra):
        return [sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_tiny_wan", "--model",
                "tiny-wan2.2-ti2v", "--prompts", prompts, "--output-dir", str(out), "--eval-every", "0",
                "--set", "sample.frames=5", "--set", "sample.height=64", "--set", "sample.width=64",
                "--set", "grpo.steps=3", "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=2",
                "--set", "optim.lr=0.001", "--max-steps", "3", "--checkpoint-every", "1", *extra]  # fmt: skip

    def rows(out):
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    run_python(command(tmp_path / "full"), check=True, timeout=600)
    killed = tmp_path / "killed"
    kill_after(command(killed), killed / "checkpoints" / "step_00000002" / "COMPLETE")
    assert not (killed / "final").exists(), "killed before the end: the resume has work to do"
    run_python(command(killed, "--resume"), check=True, timeout=600)
    expected, resumed = rows(tmp_path / "full"), rows(killed)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    for a, b in zip(resumed, expected):
        assert a["loss"] == b["loss"] and a["reward_mean"] == b["reward_mean"], (a, b)

    # the export is the text-and-image model it was (a WanPipeline): generate runs it with an image
    video = tmp_path / "v.mp4"
    result = run_python([sys.executable, "-m", "pipelines.generate", "--model", str(killed / "final"), "--image",
                         str(tmp_path / "images" / "a.png"), "--frames", "5", "--height", "64", "--width", "64",
                         "--steps", "2", "--out", str(video)], timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert video.stat().st_size > 0


def test_a_reward_that_takes_images_gets_each_videos_image():
    from dit_sp.rl.rewards import WeightedReward

    seen = []

    def with_images(videos, prompts, images):
        seen.append(list(images))
        if len(videos) > 1:
            raise RuntimeError("batch refused: scored one by one")
        return torch.ones(len(videos))

    reward = WeightedReward([("a", 1.0, with_images), ("b", 2.0, lambda videos, prompts: torch.zeros(len(videos)))])
    total = reward(torch.zeros(2, 1, 3, 4, 4), ["p", "p"], ["x.png", "y.png"])
    assert total.tolist() == [1.0, 1.0]
    assert seen == [["x.png", "y.png"], ["x.png"], ["y.png"]]
