"""The GRPO objective: PPO-clipped policy ratio of SDE transitions, optionally with a KL penalty."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class LossStats:
    loss: float
    policy_loss: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    clip_fraction: float
    kl: float


def kl_to_reference(mean: Tensor, ref_mean: Tensor, std: float) -> Tensor:
    """Closed-form KL between the policy's and the reference's Gaussian transitions (same std),
    averaged over non-batch elements like the log-probabilities: ``(B,)``."""
    return ((mean - ref_mean.to(mean.dtype)) ** 2).flatten(1).mean(1) / (2.0 * std * std)


def grpo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    *,
    clip_range: float = 1e-4,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, LossStats]:
    """``mean(max(-A*r, -A*clip(r, 1-eps, 1+eps))) + kl_coef * mean(KL)`` with ``r = exp(logp - logp_old)``.

    All ``(B,)``; ``log_prob`` carries the gradient. Samples with zero advantage contribute nothing
    (e.g. a failed reward).
    """
    ratio = torch.exp(log_prob - old_log_prob.detach())
    advantages = advantages.detach().to(ratio.dtype)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.maximum(unclipped, clipped).mean()
    loss = policy_loss
    kl_value = 0.0
    if kl is not None:
        loss = loss + kl_coef * kl.mean()
        kl_value = kl.mean().item()
    with torch.no_grad():
        stats = LossStats(
            loss=loss.item(),
            policy_loss=policy_loss.item(),
            ratio_mean=ratio.mean().item(),
            ratio_min=ratio.min().item(),
            ratio_max=ratio.max().item(),
            clip_fraction=((ratio - 1.0).abs() > clip_range).float().mean().item(),
            kl=kl_value,
        )
    return loss, stats
