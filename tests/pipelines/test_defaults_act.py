"""Defaults that show something on the first run: ``--cache NAME`` takes the threshold measured for the model
(the shipped toy-wan visibly skips), random tiny models say that their video is noise, toy-wan is listed as
the trained one. (The compile timing line is checked in tests/cache/test_cache.py, which compiles anyway.)"""

from __future__ import annotations

import re

import pytest
from cli_run import run_cli

from dit_sp import GenerateConfig
from dit_sp.cache import DEFAULT_THRESHOLDS, CacheSpec
from dit_sp.zoo import model_defaults

RANDOM_NOTE = "has random weights"


def test_cache_without_a_threshold_takes_the_models_measured_one():
    measured = model_defaults("toy-wan")["cache_thresholds"]
    assert set(measured) == set(DEFAULT_THRESHOLDS) and measured != DEFAULT_THRESHOLDS
    for policy, threshold in measured.items():  # the default model: toy-wan
        assert GenerateConfig.load(overrides={"cache": policy}).cache_spec == CacheSpec(policy, threshold)
    explicit = GenerateConfig.load(overrides={"cache": "first_block:0.3"}).cache_spec
    assert explicit.threshold == 0.3  # a threshold given wins
    tiny = GenerateConfig.load(overrides={"model": "tiny-wan", "cache": "first_block"}).cache_spec
    assert tiny.threshold == DEFAULT_THRESHOLDS["first_block"]  # random weights: nothing measured


@pytest.mark.slow
def test_generate_cache_first_block_skips_blocks_of_the_default_model(tmp_path):
    result = run_cli("pipelines.generate", ["--cache", "first_block", "--out", str(tmp_path / "v.mp4")],
                     cwd=tmp_path, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    skipped = re.search(r"cache first_block:([\d.]+) skipped (\d+)% of the transformer block", result.stdout)
    assert skipped, result.stdout
    assert float(skipped[1]) == model_defaults("toy-wan")["cache_thresholds"]["first_block"]
    assert int(skipped[2]) > 0, result.stdout
    assert RANDOM_NOTE not in result.stdout + result.stderr  # toy-wan is trained


@pytest.mark.slow
def test_a_random_tiny_model_says_so_once_and_the_help_lists_toy_wan_as_trained(tmp_path):
    result = run_cli("pipelines.generate", ["--model", "tiny-wan", "--steps", "1", "--ulysses", "2", "--out",
                                            str(tmp_path / "v.mp4")], cwd=tmp_path, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert output.count(RANDOM_NOTE) == 1, output  # once, though two processes ran
    assert "tiny-wan has random weights" in result.stderr and "toy-wan is trained" in result.stderr
    usage = run_cli("pipelines.generate", ["--help"], cwd=tmp_path)
    assert usage.returncode == 0
    assert "toy-wan (trained; the default)" in " ".join(usage.stdout.split()), usage.stdout
