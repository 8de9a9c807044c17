"""A trainer's evaluation: ODE samples of the first prompts from fixed noise, their mean reward and a video
(the samples side by side, each captioned with its prompt, named by its metrics row: ``video_name``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dit_sp.io.video import captioned_side_by_side, save_video
from dit_sp.rl.rollout import sample_trajectory
from dit_sp.rl.schedule import schedule_sigmas
from dit_sp.rl.scoring import decode_videos
from dit_sp.rl.sde import SDEConfig

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer


def video_name(step: int) -> str:
    """The evaluation video run after step ``step``'s update: numbered like the ``metrics.jsonl`` row that
    holds its ``eval_reward`` (0-based, zero-padded to 6 digits)."""
    return f"eval_step{step:06d}.mp4"


@torch.no_grad()
def evaluate(trainer: GRPOTrainer, path: str | Path | None = None) -> float:
    """ODE samples of the first ``eval_prompts`` prompts from fixed noise: their mean reward (the same on
    every rank), and, if ``path`` is given, a video of them side by side, captioned with their prompts,
    written by rank 0. Touches no training RNG (collective)."""
    self = trainer
    config, policy, parallel = self.config, self.policy, self.parallel
    prompts = self.prompts[: config.eval_prompts]
    images = self.images[: config.eval_prompts] if self.images is not None else None
    cond = policy.encode(prompts, images)
    generator = torch.Generator().manual_seed(config.seed)
    noise = torch.randn((len(prompts), *policy.latent_shape()), generator=generator)
    self.transformer.eval()
    sigmas = schedule_sigmas(config.grpo.schedule, config.grpo.steps, config.grpo.shift)
    with self._averaged():
        traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise.to(parallel.device), sigmas,
                                 SDEConfig("ode"))  # fmt: skip
    self.transformer.train()
    reward = torch.zeros(1, device=parallel.device)
    if parallel.dp_rank == 0:
        videos = decode_videos(
            policy, traj.final, cond, parallel, split=self._split_decode, chunk=self._decode_chunk
        )  # on rank 0
    if parallel.rank == 0:
        videos = videos.cpu()
        reward[0] = self.reward(videos, prompts, images).nanmean()
        if path is not None:
            tiles = [video.permute(0, 2, 3, 1).float().numpy() for video in videos]  # (F, H, W, 3) each
            save_video(captioned_side_by_side(tiles, prompts), path)
    if parallel.world_size > 1:
        dist.broadcast(reward, src=0)
    return reward.item()
