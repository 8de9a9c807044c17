"""The reward registry: names and ``module:function`` references, weighted sums, failures isolated (NaN),
and the pixel rewards."""

from __future__ import annotations

import pytest
import torch

from dit_sp.rl.rewards import build_reward


def test_reward_registry_and_failures():
    videos = torch.rand(3, 4, 3, 8, 8)
    prompts = ["a red circle", "a blue square", "a green triangle"]
    combined = build_reward({"brightness": 1.0, "tests.support.rewards_for_tests:red": 2.0})
    expected = videos.flatten(1).mean(1) + 2 * videos[:, :, 0].flatten(1).mean(1)
    torch.testing.assert_close(combined(videos, prompts), expected)
    partial = build_reward("tests.support.rewards_for_tests:fails_on_blue")(videos, prompts)
    assert torch.isnan(partial[1]) and torch.isfinite(partial[[0, 2]]).all()
    assert torch.isnan(build_reward("tests.support.rewards_for_tests:nan_reward")(videos, prompts)).all()
    with pytest.raises(ValueError, match="unknown reward 'shiny'.*brightness"):
        build_reward("shiny")
    with pytest.raises(ValueError, match="cannot import"):
        build_reward("tests.support.rewards_for_tests:missing")
    smooth = build_reward("temporal_smoothness")(videos, prompts)
    assert (smooth <= 0).all()
    assert (build_reward("saturation")(videos, prompts) >= 0).all()
