"""The settings of a GRPO iteration: ``GRPOConfig`` (``TrainConfig.grpo``), MixGRPO's ``SlidingWindow`` and
Flow-GRPO-Fast's ``RandomWindow``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dit_sp.errors import ConfigError
from dit_sp.io.schema import allow_inf, check_ranges
from dit_sp.rl.schedule import ScheduleKind
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
class RandomWindow:
    """Flow-GRPO-Fast's random SDE window: ``size`` consecutive stochastic (and trained) steps at a position
    drawn anew every iteration, uniformly among those inside steps ``[within[0], within[1])`` (Flow-GRPO's
    ``sde_window_size`` and ``sde_window_range``; ``None``: all steps); the other steps are ODE steps."""

    size: int = 2
    within: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        check_ranges(self, size=">= 1")
        if self.within is not None and not 0 <= self.within[0] < self.within[1]:
            raise ConfigError(f"random_window.within {self.within} must be steps [start, end) with 0 <= start < end")
        if self.within is not None and self.within[1] - self.within[0] < self.size:
            raise ConfigError(f"random_window.within {self.within} holds fewer than size={self.size} steps: "
                              "widen it or make the window smaller")  # fmt: skip


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 8
    """Denoising steps of a rollout."""
    shift: float = 3.0
    schedule: ScheduleKind = "flow_match"
    """The noise levels of a rollout (``dit_sp.rl.schedule``): ``"flow_match"`` (diffusers' Euler grid) or
    ``"wan"`` (Wan's UniPC flow grid, as Flow-GRPO samples Wan; with ``shift: 3.0`` at 480p)."""
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
    random_window: RandomWindow | None = None
    """An SDE window at a random place every iteration (Flow-GRPO-Fast, ``RandomWindow``), instead of a fixed
    or sliding one."""
    tail_steps: int | None = None
    """ODE steps after the SDE window (MixGRPO-Flash's cheaper tail): the schedule from the window's end to 0
    re-spaced into this many steps, so a rollout costs ``window end + tail_steps`` model evaluations instead
    of ``steps``. The window's steps, and so the log-probabilities and what trains, are the schedule's own;
    only the deterministic part after them is coarser. None: the schedule's own steps."""
    clip_range: float = 1e-3
    """PPO clip range of the ratio (1e-4 in DanceGRPO; 1e-3 for Wan)."""
    kl_coef: float = 0.0
    """Weight of the closed-form KL to the reference model (the adapters off, or a frozen sharded copy), in
    the units of ``kl_units``."""
    kl_units: Literal["nats", "flow_grpo"] = "nats"
    """``"nats"``: the KL of a step's two Gaussians, ``mean((m - m_ref)^2) / (2 std^2)``. ``"flow_grpo"``: the
    term Flow-GRPO's code (and the recipes copied from it) weight, ``mean((m - m_ref)^2) / (2 c^2)`` with ``c``
    its ``std_dev_t``: the noise per unit of time (``std / sqrt(s - s')``) for ``"flow"`` and ``"dance"``,
    so the KL times the step size ``s - s'``; the step's std itself for ``"cps"``, so the KL as it is. With it,
    a published ``beta`` (0.004 for Wan and SD3) is ``kl_coef`` as is. The logged ``kl`` is in these units."""
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
    """Ratio normalisation against the clipping bias, after GRPO-Guard's RatioNorm, in part. A Gaussian
    transition's log-ratio is ``mean(e*d)/std^2 - mean(d^2)/(2 std^2)`` (``d``: the change of the mean, ``e``:
    the sampled noise times ``std``), whose second term pulls the ratio below 1 on every step, so the clip range
    acts lopsided. With this on, that term is added back (the rollout keeps its means), leaving a log-ratio
    centred on 0; the gradient at the rollout's weights is unchanged, and the ratio is still exactly 1 before
    the first update. Implemented of GRPO-Guard: the centring of each step's log-ratio (its mean shift).
    Not implemented: RatioNorm's rescaling of each step's log-ratio to a common spread across steps (the
    division by a per-step standard deviation), and its gradient reweighting, which balances the steps' shares
    of the policy gradient; the clip range and the loss weights are the same on every step."""
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
        windows = [
            name for name in ("sde_window", "sliding_window", "random_window") if getattr(self, name) is not None
        ]
        if len(windows) > 1:
            raise ConfigError(f"{' and '.join(windows)} exclude each other (one SDE window per run): give one")
        if self.random_window is not None:
            start, end = self.random_window.within or (0, self.steps)
            if end > self.steps or end - start < self.random_window.size:
                window = self.random_window
                raise ConfigError(f"random_window (size {window.size}, within {window.within}) must fit in steps "
                                  f"[0, {self.steps}): make it smaller or raise grpo.steps")  # fmt: skip
        if self.sliding_window is not None and self.sliding_window.size > self.steps:
            raise ConfigError(f"sliding_window size {self.sliding_window.size} is more than steps={self.steps}")
        if self.tail_steps is not None and not windows:
            raise ConfigError("tail_steps re-spaces the ODE steps after the SDE window, and there is none: "
                              "give grpo.sde_window, sliding_window or random_window, or drop tail_steps")  # fmt: skip
        if self.sde.kind == "ode":
            raise ConfigError("GRPO needs a stochastic sampler: sde.kind 'dance', 'flow' or 'cps'")
        if self.schedule not in ("flow_match", "wan"):
            raise ConfigError(f"schedule must be 'flow_match' or 'wan', got {self.schedule!r}")
        if self.kl_units not in ("nats", "flow_grpo"):
            raise ConfigError(f"kl_units must be 'nats' or 'flow_grpo', got {self.kl_units!r}")
