"""Image conditioning that the text encoders compute (Motif-Video I2V's SigLIP tokens, from the vision tower inside its
T5Gemma2 text encoder): a trainer computes it while it has the encoders loaded for the prompts, keeps it on disk with
their embeddings and drops the encoders; a resumed run reads it from there without loading them, and one whose files are
gone loads them again and computes the same tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dit_sp import spawn
from dit_sp.families import policy_for
from dit_sp.zoo import build_tiny


@pytest.mark.slow  # two processes build three trainers
def test_motif_image_tokens_are_kept_with_the_prompt_embeddings_and_the_encoder_dropped(tmp_path):
    """Over 2 ranks (the text encoder sharded over both, each image's tokens encoded collectively): the first run
    encodes both images' tokens and drops the encoder (no T5Gemma2 encoder is alive after the trainer is built); the
    resumed run encodes nothing (the encoder is never loaded) and conditions on the same tokens; a resumed run with an
    empty embedding cache loads the encoder again, encodes both, drops it, and gets the same tokens. The tokens are the
    ones the policy computes from the loaded pipeline's vision tower."""
    from grpo_checks import tiny_config
    from policy_checks import image_prompt_file, image_tokens_through_runs

    prompts = image_prompt_file(tmp_path)
    pipe = build_tiny("tiny-motif-video-i2v")
    pipe.save_pretrained(tmp_path / "motif")
    first = tiny_config(model=str(tmp_path / "motif"), prompts=prompts, frames=5, height=32, width=32, group_size=2,
                        prompts_per_step=1, **{"sample.max_sequence_length": 32})  # fmt: skip
    resumed = dataclasses.replace(first, resume=True)
    recomputed = dataclasses.replace(resumed, embedding_cache=str(tmp_path / "fresh"))
    ranks = spawn(image_tokens_through_runs, 2, args=([first, resumed, recomputed],), timeout=300)
    policy = policy_for(pipe)(pipe, pipe.transformer, frames=5, height=32, width=32, guidance=2.0,
                              max_sequence_length=32)  # fmt: skip
    expected = [policy.encoder_image_parts(str(tmp_path / f"image{i}.png"))[0] for i in range(2)]
    assert expected[0].shape == (1, 4, 16) and (expected[0] - expected[1]).abs().max() > 1e-3
    for rank in ranks:
        assert [run["encoded"] for run in rank] == [["image0.png", "image1.png"], [], ["image0.png", "image1.png"]]
        for run in rank:
            assert not run["text_encoder"] and run["alive"] == 0, run
            for tokens, want in zip(run["tokens"], expected):
                torch.testing.assert_close(tokens, want, atol=1e-6, rtol=0)
