"""A trainer's rollout of one iteration: its samples, their trajectories, rewards and advantages (``collect``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dit_sp.rl.advantages import group_advantages
from dit_sp.rl.batch import Batch, make_batch
from dit_sp.rl.rollout import Trajectory
from dit_sp.rl.sampling import rollout, rollout_scored
from dit_sp.rl.scoring import rewards_of

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor


@dataclass
class Rollout:
    """One iteration's samples on this rank: who they are, their trajectories, rewards and advantages."""

    batch: Batch
    traj: Trajectory
    cond: Any
    rewards: Tensor
    """``(N,)``, NaN where the reward failed."""
    parts: dict[str, Tensor]
    """Each reward component, ``(N,)``."""
    advantages: Tensor
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the rollout (``sample``) and of decoding and scoring it (``reward``)."""


def collect(trainer: GRPOTrainer, step: int) -> Rollout:
    """Roll out iteration ``step``'s samples, score them and compute their advantages (collective)."""
    self = trainer
    grpo, parallel = self.config.grpo, self.parallel
    batch = make_batch(self.prompts, step, self.config.seed, grpo, parallel, self.images)
    self.transformer.eval()
    began = time.perf_counter()
    if grpo.overlap_rewards:
        traj, cond, rewards, parts, waited = rollout_scored(self.policy, batch, self.reward, grpo, parallel,
                                                            split_decode=self._split_decode,
                                                            decode_chunk=self._decode_chunk)  # fmt: skip
        seconds = {"sample": time.perf_counter() - began - waited, "reward": waited}
    else:
        traj, cond = rollout(self.policy, batch, grpo, parallel)
        sampled = time.perf_counter()
        rewards, parts = rewards_of(self.policy, traj, batch, self.reward, parallel, cond=cond,
                                    split_decode=self._split_decode, decode_chunk=self._decode_chunk)  # fmt: skip
        seconds = {"sample": sampled - began, "reward": time.perf_counter() - sampled}
    self.transformer.train()
    return Rollout(batch, traj, cond, rewards, parts, advantages_of(self, rewards, batch), seconds)


def advantages_of(trainer: GRPOTrainer, rewards: Tensor, batch: Batch) -> Tensor:
    """The batch's advantages over every data-parallel rank: against its group's (or, with
    ``grpo.stat_tracking``, its prompt's recent) rewards (collective)."""
    grpo, group = trainer.config.grpo, trainer.parallel.dp_group
    if trainer.prompt_stats is not None:
        return trainer.prompt_stats.advantages(rewards, batch.prompt_ids, group=group, std=grpo.adv_std,
                                               clip=grpo.adv_clip)  # fmt: skip
    return group_advantages(rewards, batch.prompt_ids, group=group, std=grpo.adv_std, clip=grpo.adv_clip)
