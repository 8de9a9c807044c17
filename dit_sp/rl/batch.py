"""An iteration's plan: which samples this rank runs and their seeds (``make_batch``), the SDE window and
noise levels of the rollout, the steps that train, and the slicing of a batch into micro-batches.

Everything a sequence-parallel group shares is made identical on its ranks by construction: prompts,
initial noise and every SDE noise draw come from per-sample seeds (independent of the rank layout), and
trained timesteps from the step's seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.parallel.state import ParallelState
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.schedule import schedule_sigmas, shifted_sigmas_between

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


def sde_window_at(config: GRPOConfig, step: int, seed: int = 0) -> tuple[int, int] | None:
    """The SDE window of iteration ``step``: the fixed ``sde_window``, the sliding window's place, the random
    window's place (drawn from the run's ``seed`` and ``step``, so alike on every rank), or None (every step
    stochastic)."""
    if config.random_window is not None:
        size = config.random_window.size
        low, high = config.random_window.within or (0, config.steps)
        start = random.Random(seed_for(seed, step, 0x5DE)).randint(low, high - size)
        return (start, start + size)
    window = config.sliding_window
    if window is None:
        return config.sde_window
    start = min(step // window.every * window.stride, config.steps - window.size)
    return (start, start + window.size)


def rollout_sigmas(config: GRPOConfig, window: tuple[int, int] | None) -> list[float]:
    """The noise levels of a rollout with SDE ``window``: the schedule (``config.schedule``) of ``config.steps``,
    its part after the window re-spaced into ``config.tail_steps`` steps when that is fewer (same shift, same
    last non-zero level, then 0)."""
    sigmas = schedule_sigmas(config.schedule, config.steps, config.shift)
    if config.tail_steps is None or window is None or config.steps - window[1] <= config.tail_steps:
        return sigmas
    end = window[1]
    tail = shifted_sigmas_between(sigmas[end], sigmas[-2], config.tail_steps, config.shift)
    return sigmas[:end] + tail + [0.0]


def stochastic_steps(config: GRPOConfig, sigmas: list[float]) -> list[int]:
    """The steps of a rollout with levels ``sigmas`` that add noise, so have a log-probability and can train
    (all but CPS's last step to 0, whose noise is 0)."""
    from dit_sp.rl.sde import is_stochastic

    return [t for t in range(len(sigmas) - 1) if is_stochastic(config.sde, sigmas[t], sigmas[t + 1], sigmas[1])]


@dataclass
class Batch:
    """This rank's samples of one iteration."""

    prompts: list[str]
    prompt_ids: Tensor
    sample_seeds: list[int]
    noise_seeds: list[int]
    images: list[str] | None = None
    """Each sample's conditioning image (image-to-video), or None."""
    window: tuple[int, int] | None = None
    """The iteration's SDE window (``sde_window_at``)."""


def seed_for(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    return random.Random(str(parts)).getrandbits(63)


def check_split(config: GRPOConfig, dp: int) -> None:
    """An iteration's ``prompts_per_step * group_size`` samples must split evenly over the dp ranks."""
    total = config.prompts_per_step * config.group_size
    if total % dp:
        raise ConfigError(
            f"{config.prompts_per_step} prompts x group size {config.group_size} = {total} samples cannot be split "
            f"evenly over dp={dp} ranks; make grpo.prompts_per_step * grpo.group_size a multiple of dp"
        )


def make_batch(prompts: list[str], step: int, seed: int, config: GRPOConfig, parallel: ParallelState,
               images: list[str | None] | None = None) -> Batch:  # fmt: skip
    """This dp rank's share of the iteration's ``prompts_per_step * group_size`` samples (``images``: each
    prompt's conditioning image, for an image-to-video model)."""
    import torch

    check_split(config, parallel.dp)
    prompts_per_step = config.prompts_per_step
    total = prompts_per_step * config.group_size
    order = random.Random(seed_for(seed, step // max(1, len(prompts) // prompts_per_step))).sample(
        range(len(prompts)), len(prompts)
    )
    start = (step * prompts_per_step) % len(prompts)
    chosen = [order[(start + i) % len(prompts)] for i in range(prompts_per_step)]
    samples = [(pid, k) for pid in chosen for k in range(config.group_size)]
    per_rank = total // parallel.dp
    mine = samples[parallel.dp_rank * per_rank : (parallel.dp_rank + 1) * per_rank]
    return Batch(
        prompts=[prompts[pid] for pid, _ in mine],
        prompt_ids=torch.tensor([pid for pid, _ in mine]),
        sample_seeds=[seed_for(seed, step, pid, k) for pid, k in mine],
        noise_seeds=[seed_for(seed, step, pid, 0 if config.same_noise_per_group else k) for pid, k in mine],
        images=[images[pid] for pid, _ in mine] if images is not None and any(images) else None,
        window=sde_window_at(config, step, seed),
    )


def trained_steps(config: GRPOConfig, step_seed: int, eligible: list[int] | None = None,
                  window: tuple[int, int] | None = None) -> list[int]:  # fmt: skip
    """The steps whose transitions train this iteration: the SDE ``window``'s (the trajectory's), or a
    random ``train_fraction`` of all; of the ``eligible`` steps only (those whose model is trained: not a
    frozen expert's)."""
    candidates = list(range(*window) if window is not None else range(config.steps))
    if eligible is not None:
        candidates = [t for t in candidates if t in eligible]
    if window is not None or not candidates:
        return candidates
    count = max(1, round(config.train_fraction * len(candidates)))
    return sorted(random.Random(step_seed).sample(candidates, count))


def select(cond: Any, index: slice) -> Any:
    """The samples ``index`` of a batch's conditioning (tensors, nested tuples of them, or None)."""
    import torch

    if isinstance(cond, torch.Tensor):
        return cond[index]
    if isinstance(cond, (tuple, list)):
        return type(cond)(select(part, index) for part in cond)
    return cond


def micro_batches(size: int, config: GRPOConfig) -> list[slice]:
    """The micro-batches of a batch of ``size`` samples."""
    step = config.micro_batch or size
    return [slice(start, min(start + step, size)) for start in range(0, size, step)]
