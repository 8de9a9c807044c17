"""GRPO for flow-matching video DiTs: SDE steps with log-probabilities, advantages, loss, rewards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
    from dit_sp.rl.advantages import group_advantages
    from dit_sp.rl.loss import LossStats, grpo_loss, kl_to_reference
    from dit_sp.rl.rewards import BUILTIN, WeightedReward, build_reward, score
    from dit_sp.rl.rollout import Trajectory, sample_trajectory
    from dit_sp.rl.schedule import shifted_sigmas
    from dit_sp.rl.sde import SDEConfig, Transition, gaussian_log_prob, sde_mean_std, sde_step

_WHERE = {
    "BUILTIN": "dit_sp.rl.rewards",
    "LossStats": "dit_sp.rl.loss",
    "SDEConfig": "dit_sp.rl.sde",
    "Trajectory": "dit_sp.rl.rollout",
    "Transition": "dit_sp.rl.sde",
    "WeightedReward": "dit_sp.rl.rewards",
    "build_reward": "dit_sp.rl.rewards",
    "gaussian_log_prob": "dit_sp.rl.sde",
    "group_advantages": "dit_sp.rl.advantages",
    "grpo_loss": "dit_sp.rl.loss",
    "kl_to_reference": "dit_sp.rl.loss",
    "sample_trajectory": "dit_sp.rl.rollout",
    "score": "dit_sp.rl.rewards",
    "sde_mean_std": "dit_sp.rl.sde",
    "sde_step": "dit_sp.rl.sde",
    "shifted_sigmas": "dit_sp.rl.schedule",
}
"""Each name and its module, imported on first use (PEP 562): importing the package alone imports no torch."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "BUILTIN",
    "LossStats",
    "SDEConfig",
    "Trajectory",
    "Transition",
    "WeightedReward",
    "build_reward",
    "gaussian_log_prob",
    "group_advantages",
    "grpo_loss",
    "kl_to_reference",
    "sample_trajectory",
    "score",
    "sde_mean_std",
    "sde_step",
    "shifted_sigmas",
]
