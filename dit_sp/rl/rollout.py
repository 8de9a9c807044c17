"""Sampling trajectories with their transition log-probabilities, and recomputing them for training."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dit_sp.rl.sde import SDEConfig, gaussian_log_prob, sde_mean_std

Tensor = torch.Tensor
Velocity = Callable[[Tensor, float], Tensor]
"""``velocity(x, s) -> v``: the (guided) model prediction at noise level ``s``, ``x``'s shape."""


@dataclass
class Trajectory:
    """``latents[t]`` is ``x`` at ``sigmas[t]`` (``t = 0``: pure noise, ``t = T``: the sample), all fp32
    ``(T+1, B, ...)``; ``log_probs[t]`` is ``log p(x_{t+1} | x_t)`` under the sampling policy, ``(T, B)``."""

    latents: Tensor
    log_probs: Tensor
    sigmas: list[float]

    @property
    def final(self) -> Tensor:
        return self.latents[-1]


@torch.no_grad()
def sample_trajectory(
    velocity: Velocity,
    noise: Tensor,
    sigmas: list[float],
    sde: SDEConfig,
    generator: torch.Generator | None = None,
    *,
    step_noise: Tensor | None = None,
    sde_steps: range | None = None,
    progress: Callable | None = None,
) -> Trajectory:
    """Run the SDE from ``noise`` (``x`` at ``sigmas[0]``) through every step, recording all states.

    The noise of each step is drawn from ``generator``, or taken from ``step_noise`` ``(T, B, ...)``
    (drawn per sample, so a sample's trajectory does not depend on which rank or batch it is in).
    With ``sde_steps``, only those steps are stochastic and the others are ODE steps (log-prob 0): an
    SDE window, whose samples differ only by the window's noise.
    """
    latents, log_probs = [noise.float()], []
    steps = range(len(sigmas) - 1)
    ode = SDEConfig("ode")
    for t in progress(steps) if progress else steps:
        x = latents[-1]
        kind = sde if sde_steps is None or t in sde_steps else ode
        mean, std = sde_mean_std(x, velocity(x, sigmas[t]), sigmas[t], sigmas[t + 1], kind, s_cap=sigmas[1])
        if std > 0:
            eps = (
                step_noise[t].to(mean)
                if step_noise is not None
                else torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            )
            x_next = mean + std * eps
            log_prob = gaussian_log_prob(x_next, mean, std)
        else:
            x_next, log_prob = mean, None
        latents.append(x_next.float())
        log_probs.append(log_prob if log_prob is not None else torch.zeros(x.shape[0], device=x.device))
    return Trajectory(torch.stack(latents), torch.stack(log_probs), list(sigmas))


def transition_log_prob(
    velocity: Velocity, trajectory: Trajectory, t: int, sde: SDEConfig
) -> tuple[Tensor, Tensor, float]:
    """``(log p_theta(x_{t+1} | x_t), mean, std)`` for the recorded step ``t`` under the current model
    (differentiable through ``velocity``)."""
    sigmas = trajectory.sigmas
    x = trajectory.latents[t]
    mean, std = sde_mean_std(x, velocity(x, sigmas[t]), sigmas[t], sigmas[t + 1], sde, s_cap=sigmas[1])
    return gaussian_log_prob(trajectory.latents[t + 1], mean, std), mean, std
