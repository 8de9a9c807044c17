"""Sampling trajectories with their transition log-probabilities, and recomputing them for training."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dit_sp.rl.sde import SDEConfig, Transition, sde_step

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
    window: tuple[int, int] | None = None
    """The steps ``[start, end)`` that were stochastic (an SDE window), or None: all of them."""

    @property
    def final(self) -> Tensor:
        return self.latents[-1]

    def select(self, index: slice) -> Trajectory:
        """The samples ``index`` of every step (views, no copy)."""
        return Trajectory(self.latents[:, index], self.log_probs[:, index], self.sigmas, self.window)

    @staticmethod
    def concat(parts: list[Trajectory]) -> Trajectory:
        """The trajectories of consecutive micro-batches as one batch."""
        if len(parts) == 1:
            return parts[0]
        return Trajectory(torch.cat([p.latents for p in parts], 1), torch.cat([p.log_probs for p in parts], 1),
                          parts[0].sigmas, parts[0].window)  # fmt: skip

    def transition(self, t: int, v: Tensor, sde: SDEConfig) -> Transition:
        """The recorded step ``t`` under velocity ``v`` (the current or the reference model's): its
        log-probability (differentiable in ``v``) and mean, for training."""
        sigmas = self.sigmas
        return sde_step(self.latents[t], v, sigmas[t], sigmas[t + 1], sde, s_cap=sigmas[1], x_next=self.latents[t + 1])


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
        step = sde_step(x, velocity(x, sigmas[t]), sigmas[t], sigmas[t + 1], kind, s_cap=sigmas[1],
                        noise=None if step_noise is None else step_noise[t], generator=generator)  # fmt: skip
        latents.append(step.x_next.float())
        log_probs.append(step.log_prob if step.log_prob is not None else torch.zeros(x.shape[0], device=x.device))
    window = None if sde_steps is None else (sde_steps.start, sde_steps.stop)
    return Trajectory(torch.stack(latents), torch.stack(log_probs), list(sigmas), window)
