"""The settings of a GRPO iteration: ``GRPOConfig`` (``TrainConfig.grpo``) and MixGRPO's ``SlidingWindow``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dit_sp.errors import ConfigError
from dit_sp.io.schema import allow_inf, check_ranges
from dit_sp.rl.sde_config import SDEConfig


@dataclass(frozen=True)
class SlidingWindow:
    """MixGRPO's sliding SDE window: ``size`` stochastic (and trained) steps, starting at step 0 and moved
    ``stride`` steps later every ``every`` iterations, until it holds the last steps. Early in training the
    high-noise steps (where the layout forms) are optimised, later the detail; the steps outside it are ODE
    steps, which cost no training."""

    size: int = 2
    every: int = 10
    stride: int = 1

    def __post_init__(self) -> None:
        check_ranges(self, size=">= 1", every=">= 1", stride=">= 1")


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 8
    """Denoising steps of a rollout."""
    shift: float = 3.0
    sde: SDEConfig = field(default_factory=SDEConfig)
    group_size: int = 4
    """Samples per prompt (G)."""
    prompts_per_step: int = 2
    """Prompts of one iteration (over all data-parallel ranks): ``prompts_per_step * group_size`` samples."""
    same_noise_per_group: bool = True
    train_fraction: float = 0.6
    """Fraction of the rollout's steps trained on each iteration (chosen at random; of a two-expert model's
    steps, among those whose expert is trained)."""
    sde_window: tuple[int, int] | None = None
    """Steps ``[start, end)``: the only stochastic steps of a rollout (the others are ODE steps), and the
    only trained ones, instead of a random fraction of an all-SDE rollout. With the same initial noise per
    group, the reward differences within a group then come from the window's noise alone."""
    sliding_window: SlidingWindow | None = None
    """An SDE window that moves over the training (``SlidingWindow``), instead of the fixed ``sde_window``."""
    tail_steps: int | None = None
    """ODE steps after the SDE window (MixGRPO-Flash's cheaper tail): the schedule from the window's end to 0
    re-spaced into this many steps, so a rollout costs ``window end + tail_steps`` model evaluations instead
    of ``steps``. The window's steps, and so the log-probabilities and what trains, are the schedule's own;
    only the deterministic part after them is coarser. None: the schedule's own steps."""
    clip_range: float = 1e-3
    """PPO clip range of the ratio (1e-4 in DanceGRPO; 1e-3 for Wan)."""
    kl_coef: float = 0.0
    """Weight of the closed-form KL to the reference model (the adapters off, or a frozen sharded copy)."""
    micro_batch: int | None = None
    """Samples per transformer forward in rollouts and training (gradients accumulate over them), so that
    activation memory follows the micro-batch, not the samples per step; ``None``: this rank's whole batch.
    The step equals the one-batch step up to float rounding."""
    adv_std: Literal["group", "global"] = "group"
    """Advantage scale: each prompt group's reward std, or the std over all samples of the iteration."""
    adv_clip: float = allow_inf(5.0)
    """Clip the advantages to ``[-adv_clip, adv_clip]`` (``.inf``: never clip)."""
    branch: bool = False
    """Branching rollouts (Flow-GRPO-Fast / BranchGRPO style): a group's samples, which start from the same
    noise (``same_noise_per_group``), share their ODE steps before the first stochastic step and the velocity
    there, computed once per group, and branch with their own noise at that step; training evaluates the
    branch step once per group too. Saves ``(G - 1) / G`` of the model evaluations up to the branch."""
    ratio_norm: bool = False
    """Ratio normalisation against the clipping bias (after GRPO-Guard): a Gaussian transition's log-ratio
    is ``mean(e*d)/std^2 - mean(d^2)/(2 std^2)`` (``d``: the change of the mean, ``e``: the sampled noise times
    ``std``), whose second term pulls the ratio below 1 on every step, so the clip range acts lopsided. With
    this on, that term is added back (the rollout keeps its means), leaving a log-ratio centred on 0; the
    gradient at the rollout's weights is unchanged, and the ratio is still exactly 1 before the first update."""
    overlap_rewards: bool = False
    """Score each micro-batch (``micro_batch``) in a background thread while the next one samples: a remote
    reward (or any reward that waits) overlaps the rollout. Same numbers as without."""
    stat_tracking: int = 0
    """Per-prompt reward statistics (Flow-GRPO): a prompt's advantages use its rewards of this many past
    iterations it was drawn in, and this one's (``PromptStats``); 0: this iteration's group only."""

    def __post_init__(self) -> None:
        check_ranges(self, steps=">= 1", group_size=">= 1", prompts_per_step=">= 1", shift="> 0", clip_range="> 0",
                     kl_coef=">= 0", adv_clip="> 0", micro_batch=(">= 1", "or null: the whole batch"),
                     stat_tracking=(">= 0", "iterations; 0: off"), train_fraction="(0, 1]",
                     tail_steps=(">= 1", "or null: the schedule's own"))  # fmt: skip
        if self.branch and not self.same_noise_per_group:
            raise ConfigError("grpo.branch shares a group's start, so its samples need the same initial noise: "
                              "set same_noise_per_group: true or drop branch")  # fmt: skip
        if self.adv_std not in ("group", "global"):
            raise ConfigError(f"adv_std must be 'group' or 'global', got {self.adv_std!r}")
        if self.sde_window is not None and not 0 <= self.sde_window[0] < self.sde_window[1] <= self.steps:
            raise ConfigError(f"sde_window {self.sde_window} must satisfy 0 <= start < end <= steps={self.steps}")
        if self.sliding_window is not None:
            if self.sde_window is not None:
                raise ConfigError("sde_window (fixed) and sliding_window (moving) exclude each other: give one")
            if self.sliding_window.size > self.steps:
                raise ConfigError(f"sliding_window size {self.sliding_window.size} is more than steps={self.steps}")
        if self.tail_steps is not None and self.sde_window is None and self.sliding_window is None:
            raise ConfigError("tail_steps re-spaces the ODE steps after the SDE window, and there is none: "
                              "give grpo.sde_window or grpo.sliding_window, or drop tail_steps")  # fmt: skip
        if self.sde.kind == "ode":
            raise ConfigError("GRPO needs a stochastic sampler: sde.kind 'dance' or 'flow'")
