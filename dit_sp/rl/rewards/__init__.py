"""Rewards: the registry (``registry``), the scorers (``pixel``, ``clip``, ``vlm``), and the ``remote`` reward
client (``remote``) with its wire format (``wire``); the server is ``dit_sp.server.rewards``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
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

_WHERE = {
    "BUILTIN": "dit_sp.rl.rewards.registry",
    "ClipScore": "dit_sp.rl.rewards.clip",
    "RewardFn": "dit_sp.rl.rewards.registry",
    "WeightedReward": "dit_sp.rl.rewards.registry",
    "brightness": "dit_sp.rl.rewards.pixel",
    "build_reward": "dit_sp.rl.rewards.registry",
    "check_reward": "dit_sp.rl.rewards.registry",
    "score": "dit_sp.rl.rewards.registry",
}
"""Each name and its module, imported on first use (PEP 562): importing the package alone imports no torch."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


__all__ = ["BUILTIN", "ClipScore", "RewardFn", "WeightedReward", "brightness", "build_reward", "check_reward", "score"]
