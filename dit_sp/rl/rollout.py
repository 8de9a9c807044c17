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
    means: Tensor | None = None
    """``(T, B, ...)``: each step's Gaussian mean under the sampling policy (kept for ratio normalisation),
    or None."""
    branch_keys: Tensor | None = None
    """``(B,)``: samples with one key shared their trajectory up to the first stochastic step, and the
    velocity there (``branched_trajectory``); None: every sample ran alone."""

    @property
    def branch_step(self) -> int:
        """The first stochastic step: where a branched group's samples part."""
        return self.window[0] if self.window is not None else 0

    @property
    def final(self) -> Tensor:
        return self.latents[-1]

    def select(self, index: slice) -> Trajectory:
        """The samples ``index`` of every step (views, no copy)."""
        keys = None if self.branch_keys is None else self.branch_keys[index]
        means = None if self.means is None else self.means[:, index]
        return Trajectory(self.latents[:, index], self.log_probs[:, index], self.sigmas, self.window, means, keys)

    @staticmethod
    def concat(parts: list[Trajectory]) -> Trajectory:
        """The trajectories of consecutive micro-batches as one batch."""
        if len(parts) == 1:
            return parts[0]
        keys = None if parts[0].branch_keys is None else torch.cat([p.branch_keys for p in parts])
        means = None if parts[0].means is None else torch.cat([p.means for p in parts], 1)
        return Trajectory(torch.cat([p.latents for p in parts], 1), torch.cat([p.log_probs for p in parts], 1),
                          parts[0].sigmas, parts[0].window, means, keys)  # fmt: skip

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
    keep_means: bool = False,
) -> Trajectory:
    """Run the SDE from ``noise`` (``x`` at ``sigmas[0]``) through every step, recording all states.

    The noise of each step is drawn from ``generator``, or taken from ``step_noise`` ``(T, B, ...)``
    (drawn per sample, so a sample's trajectory does not depend on which rank or batch it is in).
    With ``sde_steps``, only those steps are stochastic and the others are ODE steps (log-prob 0): an
    SDE window, whose samples differ only by the window's noise. ``keep_means`` records each step's mean.
    """
    latents, log_probs, means = [noise.float()], [], []
    steps = range(len(sigmas) - 1)
    ode = SDEConfig("ode")
    for t in progress(steps) if progress else steps:
        x = latents[-1]
        kind = sde if sde_steps is None or t in sde_steps else ode
        step = sde_step(x, velocity(x, sigmas[t]), sigmas[t], sigmas[t + 1], kind, s_cap=sigmas[1],
                        noise=None if step_noise is None else step_noise[t], generator=generator)  # fmt: skip
        latents.append(step.x_next.float())
        log_probs.append(step.log_prob if step.log_prob is not None else torch.zeros(x.shape[0], device=x.device))
        if keep_means:
            means.append(step.mean.float())
    window = None if sde_steps is None else (sde_steps.start, sde_steps.stop)
    kept = torch.stack(means) if keep_means else None
    return Trajectory(torch.stack(latents), torch.stack(log_probs), list(sigmas), window, kept)


def representatives(keys: Tensor) -> tuple[Tensor, Tensor]:
    """``(first, inverse)``: the index of the first sample of each distinct key, and for every sample the
    position of its key among them (``x[first][inverse]`` spreads one value per key back to all)."""
    _, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), keys.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(keys.numel()), reduce="amin")
    return first, inverse


def shared_velocity(velocity: Callable[[Tensor, float, Tensor], Tensor], x: Tensor, s: float, keys: Tensor) -> Tensor:
    """``velocity(x[first], s, first)[inverse]``: one model evaluation per distinct key, for samples whose
    ``x`` and conditioning agree within a key. Rollout and training both evaluate a branch point this way,
    so the recomputed log-probability equals the sampled one bit for bit."""
    first, inverse = representatives(keys.cpu())
    return velocity(x[first.to(x.device)], s, first)[inverse.to(x.device)]


@torch.no_grad()
def branched_trajectory(
    velocity: Callable[[Tensor, float, Tensor], Tensor],
    noise: Tensor,
    sigmas: list[float],
    sde: SDEConfig,
    keys: Tensor,
    *,
    step_noise: Tensor,
    sde_steps: range | None = None,
    keep_means: bool = False,
) -> Trajectory:
    """``sample_trajectory`` for groups of samples that share their start (``keys``: one per group, e.g. the
    initial-noise seed and the prompt): the ODE steps before the first stochastic step, and that step's
    velocity, are evaluated once per group; the samples branch with their own noise there and run alone
    after it. ``velocity(x, s, index)``: the model on the samples ``index`` of the batch.

    The result equals ``sample_trajectory``'s (the same arithmetic on identical rows) up to float rounding of
    the smaller model batches, and saves ``(G - 1) / G`` of the evaluations up to the branch point.
    """
    first, inverse = representatives(keys.cpu())
    branch = sde_steps.start if sde_steps is not None else 0
    ode = SDEConfig("ode")
    x = noise.float()[first.to(noise.device)]
    shared, shared_means = [x], []
    for t in range(branch):
        step = sde_step(x, velocity(x, sigmas[t], first), sigmas[t], sigmas[t + 1], ode, s_cap=sigmas[1])
        x = step.x_next.float()
        shared.append(x)
        shared_means.append(step.mean.float())
    spread = inverse.to(noise.device)
    latents, means = [z[spread] for z in shared], [m[spread] for m in shared_means]
    log_probs = [torch.zeros(noise.shape[0], device=noise.device) for _ in range(branch)]
    for t in range(branch, len(sigmas) - 1):
        x = latents[-1]
        v = shared_velocity(velocity, x, sigmas[t], keys) if t == branch else velocity(x, sigmas[t], None)
        kind = sde if sde_steps is None or t in sde_steps else ode
        step = sde_step(x, v, sigmas[t], sigmas[t + 1], kind, s_cap=sigmas[1], noise=step_noise[t])
        latents.append(step.x_next.float())
        log_probs.append(step.log_prob if step.log_prob is not None else torch.zeros(x.shape[0], device=x.device))
        means.append(step.mean.float())
    window = None if sde_steps is None else (sde_steps.start, sde_steps.stop)
    kept = torch.stack(means) if keep_means else None
    return Trajectory(torch.stack(latents), torch.stack(log_probs), list(sigmas), window, kept, keys.clone())
