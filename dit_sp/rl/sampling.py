"""An iteration's rollouts: the batch's trajectories with the SDE, micro-batch by micro-batch, and, overlapped
with them, their scores (``rollout_scored``).

Rollout and training run the same batch, so before the first update the recomputed log-probabilities
equal the sampled ones bit for bit (ratio exactly 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from dit_sp.parallel.state import ParallelState
from dit_sp.rl.batch import Batch, micro_batches, rollout_sigmas, seed_for, select
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.policy import Policy
from dit_sp.rl.rewards import WeightedReward
from dit_sp.rl.rollout import Trajectory, branched_trajectory, sample_trajectory
from dit_sp.rl.scoring import Split, score_batch, share_scores, videos_to_score

Tensor = torch.Tensor


def _per_sample_noise(seeds: list[int], shape: tuple[int, ...], device, leading: int = 0) -> Tensor:
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        out.append(torch.randn((leading, *shape) if leading else shape, generator=g))
    return torch.stack(out, dim=1 if leading else 0).to(device)


def rollout(policy: Policy, batch: Batch, config: GRPOConfig, parallel: ParallelState,
            after_part: Callable[[slice, Trajectory, Any], None] | None = None) -> tuple[Trajectory, Any]:  # fmt: skip
    """The batch's trajectories, micro-batch by micro-batch (``after_part(part, trajectory, cond)`` after
    each: e.g. sending it to be scored while the next one samples), and its conditioning."""
    cond = policy.encode(batch.prompts, batch.images)
    shape = policy.latent_shape()
    sigmas = rollout_sigmas(config, batch.window)
    init = _per_sample_noise(batch.noise_seeds, shape, parallel.device)
    step_noise = _per_sample_noise(batch.sample_seeds, shape, parallel.device, leading=config.steps)
    window = range(*batch.window) if batch.window else None
    # a group: the same initial noise and prompt (so the same start and conditioning)
    keys = torch.tensor([seed_for(n, pid) for n, pid in zip(batch.noise_seeds, batch.prompt_ids.tolist())])
    parts = []
    with torch.no_grad():
        for part in micro_batches(len(batch.prompts), config):
            c = select(cond, part)
            if config.branch:
                velocity = lambda x, s, index, c=c: policy.velocity(x, s, c if index is None else select(c, index))
                traj = branched_trajectory(velocity, init[part], sigmas, config.sde, keys[part],
                                           step_noise=step_noise[:, part], sde_steps=window,
                                           keep_means=config.ratio_norm)  # fmt: skip
            else:
                traj = sample_trajectory(lambda x, s, c=c: policy.velocity(x, s, c), init[part], sigmas, config.sde,
                                         step_noise=step_noise[:, part], sde_steps=window,
                                         keep_means=config.ratio_norm)  # fmt: skip
            parts.append(traj)
            if after_part is not None:
                after_part(part, traj, c)
    return Trajectory.concat(parts), cond


def rollout_scored(
    policy: Policy,
    batch: Batch,
    reward: WeightedReward,
    config: GRPOConfig,
    parallel: ParallelState,
    *,
    split_decode: Split = None,
    decode_chunk: int | None = None,
) -> tuple[Trajectory, Any, Tensor, dict[str, Tensor], float]:
    """``rollout`` then ``rewards_of``, overlapped: each micro-batch is decoded when it is sampled and scored
    in a background thread while the next one samples (a reward server works while this process does).
    Returns the trajectories, conditioning, rewards, their parts, and the seconds spent waiting for scores
    after the last micro-batch. The numbers are ``rollout`` + ``rewards_of``'s."""
    from concurrent.futures import ThreadPoolExecutor

    scored = []  # (micro-batch size, future of this rank's scores or None)
    with ThreadPoolExecutor(1, thread_name_prefix="reward") as pool:

        def after_part(part: slice, traj: Trajectory, cond: Any) -> None:
            prompts, images = batch.prompts[part], None if batch.images is None else batch.images[part]
            local = videos_to_score(policy, traj.final, cond, prompts, images, parallel, split_decode, decode_chunk)
            scored.append((len(prompts), None if local is None else pool.submit(score_batch, reward, *local)))

        traj, cond = rollout(policy, batch, config, parallel, after_part)
        waited = time.perf_counter()
        results = [(size, None if job is None else job.result()) for size, job in scored]
        waited = time.perf_counter() - waited
    values = torch.cat([share_scores(mine, size, reward, parallel, split_decode) for size, mine in results], 1)
    return traj, cond, values[0], dict(zip([n for n, _, _ in reward.parts], values[1:])), waited
