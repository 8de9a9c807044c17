"""The synthetic shape world, its evaluator, the faithfulness reward and the shipped tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import imageio.v3 as iio
import pytest
import torch
from cli_run import run_python

from dit_sp.io.bundled import ASSET_DIR
from dit_sp.rl import build_reward
from dit_sp.toy import world as toyworld

REPO = Path(__file__).resolve().parents[2]
TOY = ASSET_DIR / "toy-wan"


def test_generator_is_deterministic_and_varied():
    a = toyworld.render("a red circle moving left", seed=3)
    assert a.shape == (9, 3, 32, 32) and a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, toyworld.render("a red circle moving left", seed=3))
    assert not torch.equal(a, toyworld.render("a red circle moving left", seed=4))


def test_evaluator_reads_real_clips():
    attrs = toyworld.all_attributes()
    hits = {"color": 0, "shape": 0, "direction": 0}
    for seed in range(3):
        for i, a in enumerate(attrs):
            seen = toyworld.evaluate(toyworld.render(a, seed=seed * 1000 + i))
            for key in hits:
                hits[key] += getattr(seen, key) == getattr(a, key)
    for key, value in hits.items():
        assert value / (3 * len(attrs)) >= 0.95, (key, value)


def test_captions_and_reward():
    assert toyworld.Attributes.parse("A Blue square, moving up").caption == "a blue square moving up"
    with pytest.raises(ValueError, match="must name one colour"):
        toyworld.Attributes.parse("a purple circle moving left")
    clip = toyworld.render("a green triangle moving down", seed=0).unsqueeze(0)
    reward = build_reward("faithfulness")
    assert reward(clip, ["a green triangle moving down"]).item() == pytest.approx(1.0)
    assert reward(clip, ["a red triangle moving up"]).item() == pytest.approx(1 / 3)
    assert reward(torch.zeros(1, 9, 3, 32, 32), ["a red circle moving up"]).item() == 0.0  # nothing visible


def _other(options, value):
    options = list(options)
    return options[(options.index(value) + 1) % len(options)]


def test_dense_agreement_follows_the_evaluator():
    """Near 1 for the attributes a clip shows, near 0 for others; smooth in between (a near miss scores
    between a clear success and a clear failure)."""
    right, wrong = [], []
    for i, a in enumerate(toyworld.all_attributes()):
        clip = toyworld.render(a, seed=i)
        right.append(toyworld.agreement(clip, a))
        other = toyworld.Attributes(_other(toyworld.COLORS, a.color), _other(toyworld.SHAPES, a.shape),
                                    _other(toyworld.DIRECTIONS, a.direction))  # fmt: skip
        wrong.append(toyworld.agreement(clip, other))
    right, wrong = torch.tensor(right), torch.tensor(wrong)
    assert (right.mean(0) > 0.95).all() and (right.min(0).values > 0.8).all()
    assert (wrong.mean(0) < 0.05).all() and (wrong.max(0).values < 0.2).all()

    want = toyworld.Attributes.parse("a red square moving right")
    square = toyworld.render(want, seed=0)
    blurred = torch.nn.functional.avg_pool2d(square, 3, stride=1, padding=1, count_include_pad=False)
    rounder = torch.nn.functional.avg_pool2d(blurred, 3, stride=1, padding=1, count_include_pad=False)
    shape_scores = [toyworld.agreement(clip, want)[1] for clip in (square, blurred, rounder)]
    assert shape_scores[0] > shape_scores[1] > shape_scores[2]  # corners fade: less and less a square
    diagonal = square.clone()
    for f in range(9):  # drifting down-right at 40 degrees: still "right", with less margin
        diagonal[f] = torch.roll(square[0], shifts=(round(f * 0.84), f), dims=(1, 2))
    assert 0.5 < toyworld.agreement(diagonal, want)[2] < toyworld.agreement(square, want)[2]
    reward = build_reward("dense_faithfulness")
    assert reward(square.unsqueeze(0), [want.caption]).item() > 0.95
    assert reward(torch.zeros(1, 9, 3, 32, 32), [want.caption]).item() == 0.0


def test_shipped_model_is_small_and_loads_offline():
    files = [p for p in TOY.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 20 * 2**20
    assert all(p.suffix != ".bin" for p in files), "weights ship as safetensors"
    from dit_sp.zoo import load_pipeline

    pipe = load_pipeline(str(TOY), torch.float32)
    generator = torch.Generator().manual_seed(0)
    video = pipe(prompt="a red circle moving left", height=32, width=32, num_frames=9, num_inference_steps=4,
                 generator=generator, output_type="pt", max_sequence_length=16).frames  # fmt: skip
    assert video.shape == (1, 9, 3, 32, 32)


@pytest.mark.slow
def test_default_generate_follows_its_prompt(tmp_path):
    """The README's default command, on a batch of four prompts (one model load; seeds 0-3): each video
    shows its prompt's colour and direction."""
    prompts = ["a red circle moving left", "a green square moving up", "a blue triangle moving right",
               "a yellow circle moving down"]  # fmt: skip
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    cmd = [sys.executable, "-m", "pipelines.generate", "--prompts", str(tmp_path / "prompts.txt"), "--seed", "0",
           "--out", str(tmp_path / "videos.mp4")]  # fmt: skip
    result = run_python(cmd, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = [json.loads(line) for line in (tmp_path / "videos" / "manifest.jsonl").read_text().splitlines()]
    assert sorted((entry["prompt"], entry["seed"]) for entry in manifest) == sorted(zip(prompts, range(4)))
    correct = {"color": 0, "direction": 0}
    for entry in manifest:
        frames = torch.from_numpy(iio.imread(tmp_path / "videos" / entry["path"]))
        seen = toyworld.evaluate(frames.permute(0, 3, 1, 2).float() / 255)
        want = toyworld.Attributes.parse(entry["prompt"])
        for key in correct:
            correct[key] += seen is not None and getattr(seen, key) == getattr(want, key)
    assert correct["color"] >= 3 and correct["direction"] >= 3, correct


@pytest.mark.slow
def test_train_toy_runs_end_to_end(tmp_path):
    """The script that produced the shipped toy-wan runs (a few steps) and writes a loadable pipeline."""
    out = tmp_path / "toy"
    cmd = [sys.executable, "-m", "pipelines.train_toy", "--vae-steps", "2", "--transformer-steps", "2",
           "--seeds-per-caption", "1", "--work-dir", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    result = run_python(cmd, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    from dit_sp.zoo import load_pipeline

    pipe = load_pipeline(str(out), torch.float32)
    assert pipe.vae.config.scale_factor_spatial == 4 and len(pipe.vae.config.latents_std) == 8


@pytest.mark.slow
def test_eval_toy_reports_accuracy_and_paired_gain():
    from dit_sp.toy.model import paired_gain, summarize

    good = [{"color": True, "shape": True, "direction": True}] * 3
    half = [{"color": True, "shape": False, "direction": True}, *good[:2]]
    assert summarize(half) == {"color": 1.0, "shape": pytest.approx(2 / 3), "direction": 1.0,
                               "faithfulness": pytest.approx(8 / 9), "samples": 3}  # fmt: skip
    gain = paired_gain(good, half)
    assert gain["gain"] == pytest.approx(1 / 9) and gain["gain_ci95"][0] < 1 / 9 < gain["gain_ci95"][1]

    cmd = [sys.executable, "-m", "pipelines.eval_toy", "--seeds", "1", "--steps", "2", "--baseline", str(TOY)]
    result = run_python(cmd, timeout=300, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["model"] == report["baseline"] and report["model"]["samples"] == 8  # same model, same noise
    assert report["gain"] == 0 and report["gain_ci95"] == [0, 0]


@pytest.mark.slow
def test_eval_toy_input_errors(tmp_path):
    def error(*args: str) -> str:
        result = run_python([sys.executable, "-m", "pipelines.eval_toy", *args], timeout=120)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    assert "--seeds and --steps must be at least 1, got 0" in error("--seeds", "0")
    assert "does not exist" in error("--prompts", str(tmp_path / "none.txt"))
    odd = tmp_path / "odd.txt"
    odd.write_text("a red circle moving left\na purple blob\n")
    assert "'a purple blob' must name one colour" in error("--prompts", str(odd))
