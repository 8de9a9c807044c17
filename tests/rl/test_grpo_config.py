"""The GRPO iteration's settings: the sliding SDE window and the coarse ODE tail."""

from __future__ import annotations

import pytest

from dit_sp.errors import ConfigError
from dit_sp.rl import (
    shifted_sigmas,
)
from dit_sp.rl.batch import rollout_sigmas, sde_window_at, trained_steps
from dit_sp.rl.grpo_config import GRPOConfig, SlidingWindow


def test_sliding_window_moves_over_the_training_and_bad_ones_are_clear():
    config = GRPOConfig(steps=6, sliding_window=SlidingWindow(size=2, every=3, stride=2))
    assert [sde_window_at(config, step) for step in (0, 2, 3, 5, 6, 9, 100)] == [
        (0, 2), (0, 2), (2, 4), (2, 4), (4, 6), (4, 6), (4, 6)]  # fmt: skip
    assert sde_window_at(GRPOConfig(sde_window=(1, 3)), 7) == (1, 3) and sde_window_at(GRPOConfig(), 7) is None
    assert trained_steps(config, 0, window=(2, 4)) == [2, 3]
    with pytest.raises(ConfigError, match="exclude each other"):
        GRPOConfig(sde_window=(0, 2), sliding_window=SlidingWindow())
    with pytest.raises(ConfigError, match="more than steps"):
        GRPOConfig(steps=2, sliding_window=SlidingWindow(size=3))
    with pytest.raises(ConfigError, match=">= 1"):
        SlidingWindow(every=0)
    with pytest.raises(ConfigError, match="same_noise_per_group"):
        GRPOConfig(branch=True, same_noise_per_group=False)


def test_coarse_tail_keeps_the_window_levels_and_respaces_the_rest():
    """tail_steps: the window's noise levels are the schedule's own; after it, tail_steps steps down to the
    schedule's last non-zero level, then 0; a tail as long as the schedule's is left alone."""
    config = GRPOConfig(steps=10, shift=2.0, sde_window=(0, 2), tail_steps=3)
    full = shifted_sigmas(10, 2.0)
    coarse = rollout_sigmas(config, (0, 2))
    assert coarse[:3] == full[:3] and coarse[-2:] == full[-2:] and len(coarse) == 2 + 3 + 1
    assert all(a > b for a, b in zip(coarse, coarse[1:]))
    moved = rollout_sigmas(config, (6, 8))  # a slid window: 2 ODE steps left, fewer than the tail's 3
    assert moved == full and rollout_sigmas(GRPOConfig(steps=10, shift=2.0), None) == full
    assert rollout_sigmas(GRPOConfig(steps=4, sde_window=(0, 1), tail_steps=1), (0, 1))[1:] == [
        shifted_sigmas(4, 3.0)[1], 0.0]  # fmt: skip
    with pytest.raises(ConfigError, match="there is none"):
        GRPOConfig(tail_steps=2)
    with pytest.raises(ConfigError, match="tail_steps must be >= 1"):
        GRPOConfig(sde_window=(0, 2), tail_steps=0)
