"""GRPO for flow-matching video DiTs: SDE steps with log-probabilities, advantages, loss, rewards."""

from dit_sp.rl.advantages import group_advantages
from dit_sp.rl.loss import LossStats, grpo_loss, kl_to_reference
from dit_sp.rl.rewards import BUILTIN, WeightedReward, build_reward, score
from dit_sp.rl.rollout import Trajectory, sample_trajectory
from dit_sp.rl.schedule import shifted_sigmas
from dit_sp.rl.sde import SDEConfig, Transition, gaussian_log_prob, sde_mean_std, sde_step

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
