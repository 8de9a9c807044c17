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
    masked: int = 0
    """Samples left out of the loss (failed reward, or a non-finite sampled log-probability)."""


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

    All ``(B,)``; ``log_prob`` carries the gradient. Samples whose advantage or sampled log-probability is
    not finite (a failed reward gives NaN advantages) are masked out: they add nothing to the loss and
    nothing, not even a NaN, to the gradient; the mean still divides by ``B`` so that the loss does not
    depend on how samples are split across ranks.
    """
    valid = torch.isfinite(advantages) & torch.isfinite(old_log_prob)
    # Masked samples get finite stand-ins *before* any arithmetic: a NaN times zero would still reach
    # the gradient through the backward of the product.
    old_log_prob = torch.where(valid, old_log_prob.detach().to(log_prob.dtype), log_prob.detach())
    advantages = torch.where(valid, advantages.detach().to(log_prob.dtype), 0.0)
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.where(valid, torch.maximum(unclipped, clipped), 0.0).mean()
    loss = policy_loss
    kl_value = 0.0
    if kl is not None:
        kl = torch.where(valid, kl, 0.0)
        loss = loss + kl_coef * kl.mean()
        kl_value = kl.mean().item()
    with torch.no_grad():
        kept = ratio[valid] if valid.any() else torch.ones(1, device=ratio.device)
        stats = LossStats(
            loss=loss.item(),
            policy_loss=policy_loss.item(),
            ratio_mean=kept.mean().item(),
            ratio_min=kept.min().item(),
            ratio_max=kept.max().item(),
            clip_fraction=((kept - 1.0).abs() > clip_range).float().mean().item(),
            kl=kl_value,
            masked=int((~valid).sum()),
        )
    return loss, stats
