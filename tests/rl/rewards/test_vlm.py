"""vlm_score on a tiny local Qwen2-VL built in code."""

from __future__ import annotations

import pytest
import torch
from rewards_for_tests import tiny_qwen2_vl

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards import build_reward


def test_vlm_score_rates_videos_with_a_tiny_local_qwen2_vl(tmp_path):
    tiny_qwen2_vl(tmp_path)
    reward = build_reward([{"name": "vlm_score", "path": str(tmp_path), "frames": 2}])
    videos = torch.rand(2, 3, 3, 32, 32)
    scores = reward(videos, ["a red circle", "a blue square"])
    assert scores.shape == (2,) and ((scores > 1) & (scores < 5)).all()  # an expected rating on 1..5
    assert torch.equal(scores, reward(videos, ["a red circle", "a blue square"]))  # deterministic
    assert not torch.equal(scores, reward(videos, ["a blue square", "a red circle"]))  # it reads the prompt
    assert not torch.equal(scores, reward(videos.flip(-1), ["a red circle", "a blue square"]))  # and the frames
    with pytest.raises(ConfigError, match="no single token"):
        build_reward([{"name": "vlm_score", "path": str(tmp_path), "scale": ["1", "10"]}])
