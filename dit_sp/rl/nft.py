"""DiffusionNFT beside GRPO (``algorithm: nft``): a trainer's iteration rolls out with the ODE under the old
policy, scores the clean samples, and trains the forward-process loss of ``dit_sp.rl.nft_loss``; the old policy
then follows the trained one softly (``OldPolicy``). Everything else is the GRPO trainer's: FSDP2 over the
flattened ``dp x ring x ulysses`` mesh, USP inside, checkpoints (the old policy is in them) and exact resume.

Every sequence-parallel peer sees the same numbers by construction: initial noise from per-sample seeds, the
trained noise levels from the step's seed, the forward-process noise ``eps`` of a sample at a level from its own
seed and that level, rewards scored once and shared; so the gradients are the one-process gradients on every
layout, and a sample's contribution does not depend on the rank or micro-batch it is in.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from dit_sp.errors import ConfigError
from dit_sp.rl.batch import Batch, make_batch, micro_batches, seed_for, select, trained_steps
from dit_sp.rl.collect import Rollout, advantages_of
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.nft_config import NFTConfig
from dit_sp.rl.nft_loss import NFTStats, nft_loss, optimality
from dit_sp.rl.policy import Policy
from dit_sp.rl.rollout import Trajectory
from dit_sp.rl.schedule import shifted_sigmas
from dit_sp.rl.scoring import rewards_of
from dit_sp.rl.update import step_if_finite
from dit_sp.train.ema import EMA

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor


class OldPolicy(EMA):
    """The old (sampling) policy of DiffusionNFT: a copy of the trainable weights kept where they are (each rank
    its own FSDP shards), moved towards the trained ones after every update with a decay that grows over the run
    (``NFTConfig.old_decay``); ``swapped()`` puts it in the model for rollouts and ``v_old``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model, 0.5)  # the decay is given at every update (``follow``)

    @torch.no_grad()
    def follow(self, decay: float) -> None:
        """``old = decay * old + (1 - decay) * new`` (``decay`` 0: an exact copy)."""
        if decay == 0.0:
            for name, p in self.params.items():
                self.shadow[name].copy_(p.detach())
            return
        self.decay = decay
        self.update()


def check_trainer(trainer: GRPOTrainer) -> None:
    """What DiffusionNFT cannot train: the forward process noises every latent, so a model that keeps a clean
    conditioning frame (image-to-video) is refused."""
    if trainer.images is not None:
        raise ConfigError("algorithm nft trains text-to-video models (its forward process would noise the "
                          "conditioning frame of image-to-video): use algorithm grpo")  # fmt: skip


def _noise(seeds: list[int], shape: tuple[int, ...], device: torch.device, *tag: int) -> Tensor:
    """One standard normal ``shape`` per sample, from its seed (and ``tag``): ``(B, *shape)``."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(seed_for(seed, *tag)))
                        for seed in seeds]).to(device)  # fmt: skip


@torch.no_grad()
def ode_rollout(policy: Policy, batch: Batch, config: GRPOConfig, device: torch.device) -> tuple[Tensor, Any]:
    """The clean samples ``(B, ...)`` fp32 of Euler ODE sampling over ``config.steps`` shifted levels, micro-batch
    by micro-batch, from each sample's initial noise; and the batch's conditioning."""
    cond = policy.encode(batch.prompts, batch.images)
    sigmas = shifted_sigmas(config.steps, config.shift)
    init = _noise(batch.noise_seeds, policy.latent_shape(), device)
    parts = []
    for part in micro_batches(len(batch.prompts), config):
        c, x = select(cond, part), init[part].float()
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + (s_next - s) * policy.velocity(x, s, c)
        parts.append(x)
    return torch.cat(parts), cond


def collect(trainer: GRPOTrainer, step: int) -> Rollout:
    """Iteration ``step``'s ODE rollouts under the old policy, their rewards and advantages (collective); the
    rollout's trajectory holds the clean samples only (``traj.final``)."""
    config, grpo, parallel = trainer.config, trainer.config.grpo, trainer.parallel
    batch = make_batch(trainer.prompts, step, config.seed, grpo, parallel, trainer.images)
    trainer.transformer.eval()
    began = time.perf_counter()
    with trainer.nft_old.swapped():
        x0, cond = ode_rollout(trainer.policy, batch, grpo, parallel.device)
    traj = Trajectory(x0[None], torch.zeros(0, x0.shape[0], device=x0.device), shifted_sigmas(grpo.steps, grpo.shift))
    sampled = time.perf_counter()
    rewards, parts = rewards_of(trainer.policy, traj, batch, trainer.reward, parallel, cond=cond,
                                split_decode=trainer._split_decode, decode_chunk=trainer._decode_chunk)  # fmt: skip
    seconds = {"sample": sampled - began, "reward": time.perf_counter() - sampled}
    trainer.transformer.train()
    return Rollout(batch, traj, cond, rewards, parts, advantages_of(trainer, rewards, batch), seconds)


def accumulate_gradients(policy: Policy, old: OldPolicy, data: Rollout, grpo: GRPOConfig, nft: NFTConfig,
                         step_seed: int) -> dict[str, float]:  # fmt: skip
    """Backward of the DiffusionNFT loss, averaged over the trained noise levels (a random ``grpo.train_fraction``
    of the rollout's, the same for every sample) and the samples (gradients accumulate in ``.grad``)."""
    x0, sigmas = data.traj.final, data.traj.sigmas
    eligible = [t for t in range(len(sigmas) - 1) if policy.trains(sigmas[t])]
    steps = trained_steps(grpo, step_seed, eligible)
    r = optimality(data.advantages.to(x0.device), grpo.adv_clip)
    size, seeds = x0.shape[0], data.batch.sample_seeds
    totals: dict[str, float] = {}
    for t in steps:
        s = sigmas[t]
        for part in micro_batches(size, grpo):
            share = (part.stop - part.start) / size
            clean, cond = x0[part], select(data.cond, part)
            eps = _noise(seeds[part], tuple(x0.shape[1:]), x0.device, t)
            x_s = (1.0 - s) * clean + s * eps
            with torch.no_grad(), old.swapped():
                v_old = policy.velocity(x_s, s, cond)
            v_ref = None
            if nft.kl_coef:
                with torch.no_grad():
                    v_ref = policy.velocity(x_s, s, cond, reference=True)
            v = policy.velocity(x_s, s, cond)
            loss, stats = nft_loss(v, v_old, clean, eps, s, r[part], beta=nft.beta, weighting=nft.weighting,
                                   v_ref=v_ref, kl_coef=nft.kl_coef)  # fmt: skip
            (loss * share / len(steps)).backward()
            _accumulate(totals, stats, share, len(steps))
    return totals | {"trained_steps": float(len(steps))}


def _accumulate(totals: dict[str, float], stats: NFTStats, share: float, steps: int) -> None:
    """Running means over the samples and trained levels; the masked samples summed."""
    for key, value in vars(stats).items():
        totals[key] = totals.get(key, 0.0) + (value if key == "masked" else value * share) / steps


def train_step(trainer: GRPOTrainer, data: Rollout, step: int) -> dict[str, float]:
    """One DiffusionNFT update from ``data`` (iteration ``step``): accumulate, clip, step (skipped alike on every
    rank when a number is not finite), then the old policy follows the trained one."""
    config = trainer.config
    trainer.optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(trainer.policy, trainer.nft_old, data, config.grpo, config.nft,
                                 seed_for(config.seed, step, 1))  # fmt: skip
    stats |= step_if_finite(
        trainer.transformer, trainer.optimizer, stats["loss"], data.advantages, config.optim.max_grad_norm
    )
    decay = config.nft.old_decay(step + 1)
    trainer.nft_old.follow(decay)
    return stats | {"old_decay": decay}
