"""Stochastic sampling steps of flow-matching DiTs and the log-probability of each transition.

Convention: ``x_s = (1 - s) * x0 + s * eps`` with ``s`` going from 1 to 0; the model predicts the
velocity ``v = eps - x0``. A step from ``s`` to ``s' < s`` (``ds = s' - s < 0``) is

    mean = x + ds * (v + g(s)^2 / (2 s) * (x + (1 - s) * v)),    x' = mean + std * noise

which keeps the marginals of the probability-flow ODE (``g = 0`` is the Euler step). Noise schedules:

- ``"dance"`` (DanceGRPO): ``g = eta`` constant, ``std = eta * sqrt(s - s')``;
- ``"flow"`` (Flow-GRPO): ``g = a * sqrt(s / (1 - s))``, ``std = g * sqrt(s - s')`` (``1 - s`` is kept
  at least ``1 - s_cap`` so the first step from ``s = 1`` stays finite);
- ``"cps"`` (Flow-GRPO's coefficients-preserving step): not the drift above but the DDIM-like step
  ``mean = (1 - s') * x0_hat + sqrt(s'^2 - std^2) * eps_hat`` with ``x0_hat = x - s v``,
  ``eps_hat = x + (1 - s) v`` and ``std = s' * sin(a * pi / 2)``, so that signal and noise coefficients of
  ``x'`` are exactly those of level ``s'``. The step to ``s' = 0`` has no noise (deterministic: no
  log-probability, never trained). Flow-GRPO's code scores a CPS step by ``-mean((x' - mean)^2)`` (constants
  and ``1 / (2 std^2)`` dropped); here it is the same Gaussian log-density as every kind's, so its log-ratio is
  Flow-GRPO's divided by ``2 std^2`` (a clip range tuned on theirs does not carry over as is);
- ``"ode"``: no noise; the deterministic Euler step (no log-probability).

Everything is computed in fp32 (fp64 for fp64 inputs) whatever the model's dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from dit_sp.rl.sde_config import SDEConfig

Tensor = torch.Tensor


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def noise_scale(config: SDEConfig, s: float, s_cap: float) -> float:
    """``g(s)``: the diffusion coefficient at noise level ``s``."""
    if config.kind in ("ode", "cps"):  # CPS is not a drift-corrected Euler step: see ``sde_mean_std``
        return 0.0
    if config.kind == "dance":
        return config.eta
    return config.a * math.sqrt(s / max(1.0 - s, 1.0 - s_cap))


def sde_mean_std(
    x: Tensor, v: Tensor, s: float, s_next: float, config: SDEConfig, s_cap: float
) -> tuple[Tensor, float]:
    """Mean (fp32) and standard deviation of ``x_{s'}`` given ``x_s`` and the predicted velocity."""
    if not 0.0 <= s_next < s <= 1.0:
        raise ValueError(f"a step must go from s to s' with 0 <= s' < s <= 1; got s={s}, s'={s_next}")
    dtype = _compute_dtype(x)
    x, v = x.to(dtype), v.to(dtype)
    if config.kind == "cps":
        std = s_next * math.sin(config.a * math.pi / 2)
        x0_hat, eps_hat = x - s * v, x + (1.0 - s) * v
        return (1.0 - s_next) * x0_hat + math.sqrt(max(s_next * s_next - std * std, 0.0)) * eps_hat, std
    ds = s_next - s
    g = noise_scale(config, s, s_cap)
    mean = x + ds * (v + g * g / (2.0 * s) * (x + (1.0 - s) * v))
    return mean, g * math.sqrt(-ds)


def is_stochastic(config: SDEConfig, s: float, s_next: float, s_cap: float = 1.0) -> bool:
    """Whether the step from ``s`` to ``s_next`` adds noise (has a log-probability, so can be trained): not an
    ODE step, nor a zero noise level, nor CPS's last step to ``s' = 0``."""
    if config.kind == "cps":
        return s_next * math.sin(config.a * math.pi / 2) > 0
    return noise_scale(config, s, s_cap) > 0 and s_next < s


def gaussian_log_prob(x: Tensor, mean: Tensor, std: float) -> Tensor:
    """Log-density of ``x`` under ``N(mean, std^2)``, averaged over all non-batch elements: ``(B,)``."""
    if std <= 0:
        raise ValueError("the deterministic (ODE) step has no log-probability; use an SDE with noise > 0")
    x = x.to(mean.dtype)
    log_density = -((x - mean) ** 2) / (2.0 * std * std) - math.log(std) - 0.5 * math.log(2.0 * math.pi)
    return log_density.flatten(1).mean(1)


class Transition(NamedTuple):
    """One step of the sampler: the next state, its log-probability (``None`` for an ODE step), and the
    Gaussian's mean (fp32) and standard deviation."""

    x_next: Tensor
    log_prob: Tensor | None
    mean: Tensor
    std: float


def sde_step(
    x: Tensor,
    v: Tensor,
    s: float,
    s_next: float,
    config: SDEConfig,
    *,
    s_cap: float = 1.0,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    x_next: Tensor | None = None,
) -> Transition:
    """One step from ``s`` to ``s_next``: the single implementation of the transition that sampling,
    training and the KL term all use.

    Sampling: ``x_next = mean + std * noise`` with ``noise`` given (``x``'s shape) or drawn from
    ``generator``; ``x_next`` is fp32. Training: with ``x_next`` given (the recorded sample) nothing is
    drawn and its log-probability under the current ``v`` is returned (differentiable in ``v``).
    ``log_prob`` is ``(B,)``, or ``None`` for a step without noise (ODE).
    """
    mean, std = sde_mean_std(x, v, s, s_next, config, s_cap)
    if x_next is None:
        if std > 0:
            if noise is None:
                noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            x_next = mean + std * noise.to(mean)
        else:
            x_next = mean
    log_prob = gaussian_log_prob(x_next, mean, std) if std > 0 else None
    return Transition(x_next, log_prob, mean, std)


def flow_grpo_kl_scale(config: SDEConfig, s: float, s_next: float, s_cap: float = 1.0) -> float:
    """``std^2 / c^2``: what turns a step's KL (``kl_to_reference``, in nats) into the term Flow-GRPO's code
    weights, ``mean((m - m_ref)^2) / (2 c^2)`` with ``c`` its ``std_dev_t``: ``g(s)``, the noise per unit of time,
    for ``"flow"`` and ``"dance"`` (so the step size ``s - s'``), the step's std for ``"cps"`` (so 1)."""
    if not is_stochastic(config, s, s_next, s_cap):
        raise ValueError(f"the step from s={s} to s'={s_next} adds no noise ({config.kind}): it has no KL")
    return 1.0 if config.kind == "cps" else s - s_next
