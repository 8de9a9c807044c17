"""The settings of DiffusionNFT (``TrainConfig.nft``, used with ``algorithm: nft``) and the check that a run's
GRPO settings fit it (``check_algorithm``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dit_sp.errors import ConfigError
from dit_sp.io.schema import check_ranges

if TYPE_CHECKING:
    from dit_sp.rl.config import TrainConfig


@dataclass(frozen=True)
class NFTConfig:
    """DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117): ODE rollouts of the old policy, rewards mapped to an
    optimality ``r`` in [0, 1], and a flow-matching loss on the forward process that pulls the implicit
    positive policy ``(1 - beta) v_old + beta v`` towards the clean samples of rewarded rollouts and the
    implicit negative one ``(1 + beta) v_old - beta v`` towards those of the others (``dit_sp.rl.nft_loss``)."""

    beta: float = 1.0
    """Guidance strength of the implicit policies (the paper's beta; 1.0 for most of its runs, 0.1 for OCR).
    The policy loss is divided by it, so the gradient's size does not shrink with it."""
    weighting: Literal["adaptive", "velocity"] = "adaptive"
    """``adaptive``: the x0-prediction error squared over its own (detached) mean absolute value, per sample
    (the paper's code); ``velocity``: the plain mean squared velocity error."""
    old_decay_rate: float = 0.001
    """The old (sampling) policy follows the trained one softly after every update:
    ``old = d * old + (1 - d) * new`` with ``d = min(old_decay_rate * (updates - old_decay_flat), old_decay_max)``
    (0 before ``old_decay_flat`` updates: a copy). The paper's defaults: 0.001, 0.5, 0."""
    old_decay_max: float = 0.5
    old_decay_flat: int = 0
    kl_coef: float = 0.0
    """Weight of ``mean((v - v_ref)^2)`` to the reference model (the adapters off, or a frozen sharded copy);
    the paper's code uses 1e-4."""

    def __post_init__(self) -> None:
        check_ranges(self, beta="> 0", old_decay_rate=">= 0", old_decay_max="[0, 1)", old_decay_flat=">= 0",
                     kl_coef=">= 0")  # fmt: skip
        if self.weighting not in ("adaptive", "velocity"):
            raise ConfigError(f"nft.weighting must be 'adaptive' or 'velocity', got {self.weighting!r}")

    def old_decay(self, updates: int) -> float:
        """The old policy's decay after ``updates`` updates of the run."""
        if updates < self.old_decay_flat:
            return 0.0
        return min(self.old_decay_rate * (updates - self.old_decay_flat), self.old_decay_max)


def check_algorithm(config: TrainConfig) -> None:
    """Refuse settings that the chosen algorithm would silently ignore, or that DiffusionNFT cannot honour."""
    if config.algorithm not in ("grpo", "nft"):
        raise ConfigError(f"algorithm must be 'grpo' or 'nft', got {config.algorithm!r}")
    if config.algorithm == "grpo":
        if config.nft != NFTConfig():
            raise ConfigError("the nft section sets DiffusionNFT's settings, but algorithm is grpo: set algorithm: nft "
                              "or drop the nft section")  # fmt: skip
        return
    grpo = config.grpo
    if grpo.same_noise_per_group:
        raise ConfigError("algorithm nft samples with the ODE, so a group from one initial noise would be one video "
                          "repeated: set grpo.same_noise_per_group: false")  # fmt: skip
    refused = {"grpo.sde_window": grpo.sde_window is not None, "grpo.sliding_window": grpo.sliding_window is not None,
               "grpo.tail_steps": grpo.tail_steps is not None, "grpo.branch": grpo.branch,
               "grpo.ratio_norm": grpo.ratio_norm, "grpo.overlap_rewards": grpo.overlap_rewards,
               "grpo.kl_coef": grpo.kl_coef != 0}  # fmt: skip
    named = [key for key, set_ in refused.items() if set_]
    if named:
        raise ConfigError(f"algorithm nft has no use for {', '.join(named)} (GRPO's SDE rollouts and loss): drop "
                          "them (its KL weight is nft.kl_coef)")  # fmt: skip
    if not math.isfinite(grpo.adv_clip):
        raise ConfigError("algorithm nft maps advantages in [-grpo.adv_clip, grpo.adv_clip] to r in [0, 1]: give a "
                          "finite grpo.adv_clip (the paper's: 5)")  # fmt: skip
