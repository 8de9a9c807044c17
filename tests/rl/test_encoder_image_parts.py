"""Text-encoder conditioning that depends on the image. Motif-Video I2V's SigLIP tokens (from the vision tower inside
its T5Gemma2 text encoder) and Kandinsky 5 I2I's text (its Qwen2.5-VL reads the source image inside the prompt's
template, the negative prompt's too, so it is each (prompt, image) pair's): a trainer computes it while it has the
encoders loaded for the prompts, keeps it on disk with their embeddings and drops the encoders; a resumed run reads it
from there without loading them, and one whose files are gone loads them again and computes the same."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dit_sp import spawn
from dit_sp.families import policy_for
from dit_sp.io.prompts import read_prompt_file
from dit_sp.zoo import build_tiny


@pytest.mark.slow  # two processes build six trainers
def test_image_conditioning_of_the_text_encoders_is_kept_with_the_prompt_embeddings(tmp_path):
    """Over 2 ranks. Motif-Video I2V from a checkpoint directory (its text encoder sharded over both, each image's
    tokens encoded collectively): the first run encodes both images' tokens and drops the encoder (no T5Gemma2 encoder
    is alive after the trainer is built); the resumed run encodes nothing (the encoder is never loaded) and conditions
    on the same tokens; a resumed run with an empty embedding cache loads the encoder again, encodes both, drops it,
    and gets the same tokens. Kandinsky 5 I2I (the built-in model: its code-built processor is not saved to a
    directory, so its encoders stay loaded): the first run's ranks share the two (prompt, image) pairs, the resumed
    run encodes none, the empty cache both again; each run conditions on the text the policy computes (both
    branches: the negative prompt reads the image too)."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file, image_tokens_through_runs

    prompts = image_prompt_file(tmp_path)
    lines, images = read_prompt_file(prompts)
    runs, expected = [], {}
    for name, size in (("motif-video-i2v", {"frames": 5, "height": 32, "width": 32}),
                       ("kandinsky5-i2i", {"frames": 1, "height": 64, "width": 64})):  # fmt: skip
        pipe, text = build_tiny(f"tiny-{name}"), 32 if name == "motif-video-i2v" else 512
        model = str(tmp_path / name) if name == "motif-video-i2v" else f"tiny-{name}"
        if name == "motif-video-i2v":
            pipe.save_pretrained(model)
        first = tiny_config(model=model, prompts=prompts, group_size=2, prompts_per_step=1,
                            **{"sample.max_sequence_length": text}, **size)  # fmt: skip
        resumed = dataclasses.replace(first, resume=True)
        runs += [first, resumed, dataclasses.replace(resumed, embedding_cache=str(tmp_path / f"fresh-{name}"))]
        policy = policy_for(pipe)(pipe, pipe.transformer, guidance=2.0, max_sequence_length=text, **size)
        expected[name] = [policy.encode([line], [image]) for line, image in zip(lines, images)]
    motif = [cond[0][2] for cond in expected["motif-video-i2v"]]  # the SigLIP tokens
    assert motif[0].shape == (1, 4, 16) and (motif[0] - motif[1]).abs().max() > 1e-3
    kandinsky = expected["kandinsky5-i2i"]
    assert (kandinsky[0][1][0][0] - kandinsky[1][1][0][0]).abs().max() > 1e-3  # the negative prompt reads the image
    ranks = spawn(image_tokens_through_runs, 2, args=(runs,), timeout=300)
    pairs = [(line, f"image{i}.png") for i, line in enumerate(lines)]
    both = ["image0.png", "image1.png"]
    for r, rank in enumerate(ranks):
        assert [run["encoded"] for run in rank] == [both, [], both, [], [], []]
        assert [run["pairs"] for run in rank] == [[], [], [], [pairs[r]], [], [pairs[r]]]  # the ranks share them
        for i, run in enumerate(rank):
            kept = i >= 3  # a built-in model's encoders stay
            assert run["text_encoder"] == kept and run["alive"] == kept, (i, run)
        for run in rank[:3]:
            for cond, want in zip(run["cond"], motif):
                torch.testing.assert_close(cond[0][2], want, atol=1e-6, rtol=0)
        for run in rank[3:]:
            for cond, want in zip(run["cond"], kandinsky):
                for branch in range(2):
                    torch.testing.assert_close(cond[branch][0], want[branch][0], atol=1e-6, rtol=0)
