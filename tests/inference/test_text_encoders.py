"""The text encoders during generation (``dit_sp.inference.encoders``): freed once every prompt is encoded,
their outputs reused for prompts that come again, and the videos exactly those of encoders kept whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dit_sp import GenerateConfig, generate, spawn
from dit_sp.errors import ConfigError
from dit_sp.inference.encoders import TextEncoders
from dit_sp.zoo import load_pipeline

KEEP = {"free_text_encoders": False, "embedding_cache_mb": 0}


def _config(tmp_path, name: str, **overrides) -> GenerateConfig:
    return GenerateConfig.load(overrides={"model": "tiny-wan", "steps": 2, "out": str(tmp_path / f"{name}.mp4")}
                               | overrides)  # fmt: skip


def test_one_video_frees_its_encoders_in_the_first_step_and_is_unchanged(tmp_path):
    kept = generate(_config(tmp_path, "kept", **KEEP), return_frames=True)
    freed = generate(_config(tmp_path, "freed"), return_frames=True)
    np.testing.assert_array_equal(freed["frames"], kept["frames"])
    assert kept["text_encoders"]["freed"] is False and kept["text_encoders"]["held_bytes"] > 0
    # the prompt and the (empty) negative prompt, each encoded once; nothing of the encoder's weights left
    assert freed["text_encoders"] | {"cached_bytes": 0} == {"encoded": 2, "reused": 0, "freed": True,
                                                           "cached_bytes": 0, "held_bytes": 0}  # fmt: skip


def test_a_batch_encodes_each_text_once_and_frees_after_the_last_new_one(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving left\na blue square moving up\na red circle moving left\n")
    cached = generate(_config(tmp_path, "cached", prompts=str(prompts)), return_frames=True)
    kept = generate(_config(tmp_path, "kept", prompts=str(prompts), **KEEP), return_frames=True)
    for index in range(3):
        np.testing.assert_array_equal(cached["frames"][index], kept["frames"][index])
    # three distinct texts (two prompts and the empty negative prompt) encoded; the other three answered from
    # the cache; freed in the second video, the last with a new prompt
    assert {k: cached["text_encoders"][k] for k in ("encoded", "reused", "freed", "held_bytes")} == {
        "encoded": 3, "reused": 3, "freed": True, "held_bytes": 0}  # fmt: skip
    assert kept["text_encoders"]["encoded"] == 6 and kept["text_encoders"]["freed"] is False


def test_a_batch_keeps_its_encoders_when_the_cache_cannot_hold_every_prompt(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving left\na red circle moving left\n")
    report = generate(_config(tmp_path, "small", prompts=str(prompts), embedding_cache_mb=0))
    assert report["text_encoders"]["freed"] is False and report["text_encoders"]["encoded"] == 4


def test_a_new_prompt_after_freeing_fails_in_one_line_and_a_cached_one_still_works():
    pipe = load_pipeline("tiny-wan", torch.float32, "cpu")
    encoders = TextEncoders(pipe, max_bytes=1 << 20)
    first = pipe.encode_prompt("a red circle", do_classifier_free_guidance=False, max_sequence_length=16)[0]
    encoders.free()
    assert encoders.held_bytes() == 0
    again = pipe.encode_prompt("a red circle", do_classifier_free_guidance=False, max_sequence_length=16)[0]
    assert again.equal(first)
    with pytest.raises(ConfigError, match="text_encoder was freed once every prompt was encoded.*--no-free-text"):
        pipe.encode_prompt("a blue square", do_classifier_free_guidance=False, max_sequence_length=16)
    with pytest.raises(ConfigError, match="embedding cache's size must be >= 0"):
        TextEncoders(pipe, max_bytes=-1)


def test_the_cache_drops_its_oldest_outputs_beyond_its_size():
    pipe = load_pipeline("tiny-wan", torch.float32, "cpu")
    one = 16 * pipe.text_encoder.config.d_model * 4  # a prompt's (1, 16, D) fp32 embedding
    encoders = TextEncoders(pipe, max_bytes=2 * one)
    for prompt in ("a", "b", "c", "a"):  # "a" was pushed out by "c": encoded again
        pipe.encode_prompt(prompt, do_classifier_free_guidance=False, max_sequence_length=16)
    assert encoders.report()["encoded"] == 4 and encoders.report()["cached_bytes"] <= 2 * one


def test_embedding_cache_size_is_checked():
    with pytest.raises(ConfigError, match="embedding_cache_mb must be >= 0"):
        GenerateConfig.load(overrides={"embedding_cache_mb": -1})


@pytest.mark.slow  # 2 workers
def test_sharded_encoders_are_freed_too(tmp_path):
    one = generate(_config(tmp_path, "one", **KEEP), return_frames=True)
    config = dataclasses.replace(_config(tmp_path, "two"), ulysses=2, shard_weights=True)
    reports = spawn(generate, 2, args=(config, True), timeout=300)
    np.testing.assert_allclose(reports[0]["frames"], one["frames"], rtol=0, atol=1e-4)
    assert [r["text_encoders"]["freed"] for r in reports] == [True, True]
    assert [r["text_encoders"]["held_bytes"] for r in reports] == [0, 0]
