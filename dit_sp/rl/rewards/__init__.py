"""Rewards: the registry (``registry``), the scorers (``pixel``, ``clip``, ``vlm``), and the ``remote`` reward
client (``remote``) with its wire format (``wire``); the server is ``dit_sp.server.rewards``."""

from dit_sp.rl.rewards.clip import ClipScore
from dit_sp.rl.rewards.pixel import brightness
from dit_sp.rl.rewards.registry import (
    BUILTIN,
    RewardFn,
    WeightedReward,
    build_reward,
    check_reward,
    score,
)

__all__ = ["BUILTIN", "ClipScore", "RewardFn", "WeightedReward", "brightness", "build_reward", "check_reward", "score"]
