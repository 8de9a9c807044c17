"""The policy update of a GRPO iteration: the loss's gradients accumulated over the trained steps and
micro-batches (``accumulate_gradients``), clipped, and the optimizer step, skipped alike on every rank when
a number is not finite (``train_on_rollout``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from dit_sp.rl.batch import micro_batches, select, stochastic_steps, trained_steps
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.loss import LossStats, grpo_loss, kl_to_reference
from dit_sp.rl.policy import Policy
from dit_sp.rl.rollout import Trajectory, shared_velocity
from dit_sp.rl.sde import Transition, flow_grpo_kl_scale

Tensor = torch.Tensor


def drift_free_log_prob(step: Transition, old_mean: Tensor) -> Tensor:
    """``step.log_prob`` plus ``mean((mean - old_mean)^2) / (2 std^2)``, ``(B,)``: against the sampled
    log-probability, a log-ratio without the term that pulls every step's ratio below 1
    (``GRPOConfig.ratio_norm``); equal to ``step.log_prob`` where the mean has not moved."""
    drift = (step.mean - old_mean.to(step.mean.dtype)) ** 2
    return step.log_prob + drift.flatten(1).mean(1) / (2.0 * step.std * step.std)


def _velocity_at(policy: Policy, traj: Trajectory, t: int, cond: Any, *, reference: bool = False) -> Tensor:
    """The velocity at step ``t`` of ``traj``'s states; a branch point once per group, as the rollout did."""
    x, s = traj.latents[t], traj.sigmas[t]
    if traj.branch_keys is None or t != traj.branch_step:
        return policy.velocity(x, s, cond, reference=reference)
    velocity = lambda z, level, index: policy.velocity(z, level, select(cond, index), reference=reference)  # noqa: E731
    return shared_velocity(velocity, x, s, traj.branch_keys)


def accumulate_gradients(
    policy: Policy, traj: Trajectory, cond: Any, advantages: Tensor, config: GRPOConfig, step_seed: int
) -> dict[str, float]:
    """Backward of the GRPO loss, averaged over the trained steps (gradients accumulate in ``.grad``)."""
    eligible = [t for t in stochastic_steps(config, traj.sigmas) if policy.trains(traj.sigmas[t])]
    steps = trained_steps(config, step_seed, eligible, traj.window)
    totals: dict[str, float] = {}
    adv = advantages.to(traj.latents.device)
    size = adv.shape[0]
    for t in steps:
        for part in micro_batches(size, config):
            # the loss is a mean over the batch: each micro-batch's mean counts with its share of the samples
            share = (part.stop - part.start) / size
            sub, part_cond = traj.select(part), select(cond, part)
            step = sub.transition(t, _velocity_at(policy, sub, t, part_cond), config.sde)
            log_prob = drift_free_log_prob(step, sub.means[t]) if config.ratio_norm else step.log_prob
            kl = None
            if config.kl_coef:
                with torch.no_grad():
                    reference = sub.transition(t, _velocity_at(policy, sub, t, part_cond, reference=True), config.sde)
                kl = kl_to_reference(step.mean, reference.mean, step.std)
                if config.kl_units == "flow_grpo":
                    kl = kl * flow_grpo_kl_scale(config.sde, sub.sigmas[t], sub.sigmas[t + 1], sub.sigmas[1])
            loss, stats = grpo_loss(log_prob, sub.log_probs[t], adv[part], clip_range=config.clip_range, kl=kl,
                                    kl_coef=config.kl_coef)  # fmt: skip
            (loss * share / len(steps)).backward()
            _accumulate(totals, stats, share, len(steps))
    return totals | {"trained_steps": float(len(steps))}


def _accumulate(totals: dict[str, float], stats: LossStats, share: float, steps: int) -> None:
    """Running statistics of a step's micro-batches: means over the samples (each micro-batch with its
    ``share`` of them) and the ``steps`` trained steps, the extremes of the ratio, the samples masked."""
    for key, value in vars(stats).items():
        if key == "ratio_min":
            totals[key] = min(totals.get(key, math.inf), value)
        elif key == "ratio_max":
            totals[key] = max(totals.get(key, -math.inf), value)
        else:
            totals[key] = totals.get(key, 0.0) + (value if key == "masked" else value * share) / steps


def _state_for_every_weight(optimizer: torch.optim.Optimizer) -> None:
    """Give a weight that had no gradient yet (a two-expert model's expert that ran at none of the trained
    steps) the state AdamW would start it with. Its update is still skipped while it gets no gradient (no
    momentum, no weight decay), and then starts as from fresh; but every checkpoint holds the same optimizer
    keys, so resuming is exact whenever it was saved."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and not optimizer.state[p]:
                optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip
                if group.get("amsgrad"):
                    optimizer.state[p]["max_exp_avg_sq"] = torch.zeros_like(p)


def train_on_rollout(
    policy: Policy,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    traj: Trajectory,
    cond: Any,
    advantages: Tensor,
    config: GRPOConfig,
    step_seed: int,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One policy update from a rollout: accumulate the loss over the trained steps, clip, step.

    A non-finite loss (on any rank) or gradient norm, or a step in which no sample got a reward, skips the
    update on every rank alike (``skipped`` is 1 in the returned statistics): non-finite numbers never reach
    the weights or the optimizer state.
    """
    optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(policy, traj, cond, advantages, config, step_seed)
    return stats | step_if_finite(model, optimizer, stats["loss"], advantages, max_grad_norm)


def step_if_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: float, advantages: Tensor,
                   max_grad_norm: float) -> dict[str, float]:  # fmt: skip
    """Clip the accumulated gradients and step, or, if the loss (on any rank) or the gradient norm is not
    finite or no sample was scored, skip alike on every rank: ``{"grad_norm", "skipped"}``."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    device = next(model.parameters()).device
    finite = torch.tensor([float(math.isfinite(loss) and math.isfinite(grad_norm))], device=device)
    scored = torch.tensor([float(torch.isfinite(advantages).any())], device=device)
    if dist.is_initialized():  # the gradient norm is global already; the loss is per rank
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        dist.all_reduce(scored, op=dist.ReduceOp.MAX)
    if finite.item() and scored.item():  # no sample scored (a reward server down): no update, not even Adam's
        optimizer.step()
        _state_for_every_weight(optimizer)
    else:
        optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": grad_norm, "skipped": float(not (finite.item() and scored.item()))}
