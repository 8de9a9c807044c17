"""Rewards: the registry and built-in scorers (``registry``), and the remote reward client (``remote``)."""

from dit_sp.rl.rewards.registry import (
    BUILTIN,
    ClipScore,
    RewardFn,
    WeightedReward,
    brightness,
    build_reward,
    check_reward,
    score,
)

__all__ = ["BUILTIN", "ClipScore", "RewardFn", "WeightedReward", "brightness", "build_reward", "check_reward", "score"]
