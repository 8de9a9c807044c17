"""The DiffusionNFT objective (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward
Process", arXiv 2509.16117): a flow-matching loss on the forward process, weighted by each sample's optimality.

With ``x_s = (1 - s) x0 + s eps`` (``x0`` a rollout's clean sample, fresh noise ``eps``), the flow-matching
target ``u = eps - x0``, the old (sampling) policy's velocity ``v_old`` (no gradient) and the trained one's ``v``:

    v+ = (1 - beta) v_old + beta v          the implicit positive policy
    v- = (1 + beta) v_old - beta v          the implicit negative policy
    L  = mean_b [ r * D(v+) + (1 - r) * D(v-) ] / beta

with ``r`` in [0, 1] the sample's optimality (``optimality``) and ``D`` the squared error, either of the velocity
(``D(w) = mean((w - u)^2)``) or, as in the paper's code, of the x0-prediction ``x_s - s w`` scaled by its own
detached mean absolute error (``D(w) = mean(e^2) / mean(|e|)`` with ``e = s (w - u)``: each sample's term is
about as large at every noise level). At ``v = v_old`` the gradient is ``(2r - 1) dD/dv``: towards the clean
samples of rewarded rollouts, away from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class NFTStats:
    loss: float
    policy_loss: float
    kl: float
    old_deviation: float
    """``mean((v - v_old)^2)`` over the samples kept: how far the trained policy has moved from the sampling one."""
    masked: int = 0
    """Samples left out of the loss (a failed reward)."""


def optimality(advantages: Tensor, clip: float) -> Tensor:
    """``r = clip(A, -clip, clip) / (2 clip) + 1/2``, in [0, 1], ``(B,)`` (the paper's normalised reward)."""
    return (advantages.clamp(-clip, clip) / clip / 2.0 + 0.5).clamp(0.0, 1.0)


def _distance(w: Tensor, target: Tensor, sigma: float, weighting: str) -> Tensor:
    """``D(w)`` per sample, ``(B,)``."""
    error = w - target
    if weighting == "velocity":
        return (error**2).flatten(1).mean(1)
    error = sigma * error  # the x0-prediction's error: (x_s - s w) - x0 = -s (w - u)
    scale = error.detach().abs().flatten(1).mean(1).clamp(min=1e-5)
    return (error**2).flatten(1).mean(1) / scale


def nft_loss(
    v: Tensor,
    v_old: Tensor,
    x0: Tensor,
    eps: Tensor,
    sigma: float,
    r: Tensor,
    *,
    beta: float = 1.0,
    weighting: str = "adaptive",
    v_ref: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, NFTStats]:
    """The DiffusionNFT loss of one noise level ``sigma`` (see the module): ``v``, ``v_old``, ``x0``, ``eps``,
    ``v_ref`` are ``(B, ...)`` (``v`` carries the gradient), ``r`` is ``(B,)``. With ``v_ref``, adds
    ``kl_coef * mean_b mean((v - v_ref)^2)``. Samples whose ``r`` is not finite (a failed reward) are masked
    out, their stand-ins finite before any arithmetic; the mean still divides by ``B`` so that the loss does not
    depend on how the samples are split across ranks."""
    valid = torch.isfinite(r)
    r = torch.where(valid, r.detach().to(v.dtype), 0.0)
    v_old = v_old.detach().to(v.dtype)
    target = (eps - x0).to(v.dtype)
    positive = (1.0 - beta) * v_old + beta * v
    negative = (1.0 + beta) * v_old - beta * v
    per_sample = (r * _distance(positive, target, sigma, weighting)
                  + (1.0 - r) * _distance(negative, target, sigma, weighting)) / beta  # fmt: skip
    policy_loss = torch.where(valid, per_sample, 0.0).mean()
    loss = policy_loss
    kl_value = 0.0
    if v_ref is not None:
        kl = torch.where(valid, ((v - v_ref.detach().to(v.dtype)) ** 2).flatten(1).mean(1), 0.0)
        loss = loss + kl_coef * kl.mean()
        kl_value = kl.mean().item()
    with torch.no_grad():
        deviation = ((v - v_old) ** 2).flatten(1).mean(1)
        kept = deviation[valid] if valid.any() else torch.zeros(1, device=v.device)
        stats = NFTStats(loss=loss.item(), policy_loss=policy_loss.item(), kl=kl_value,
                         old_deviation=kept.mean().item(), masked=int((~valid).sum()))  # fmt: skip
    return loss, stats
