"""One GRPO iteration: roll out groups of samples with the SDE, score them, update the policy.

The iteration's names in one place; each lives in the module of its job:

- ``dit_sp.rl.grpo_config``: ``GRPOConfig``, ``SlidingWindow``, ``RandomWindow`` (the settings);
- ``dit_sp.rl.batch``: ``Batch``, ``make_batch``, ``seed_for``, ``check_split``, ``sde_window_at``,
  ``rollout_sigmas``, ``stochastic_steps``, ``trained_steps``, ``select``, ``micro_batches`` (what an iteration runs);
- ``dit_sp.rl.policy``: ``Policy`` (what GRPO needs from a model family);
- ``dit_sp.rl.sampling``: ``rollout``, ``rollout_scored`` (the trajectories);
- ``dit_sp.rl.scoring``: ``decode_videos``, ``score_videos``, ``rewards_of``, ``score_batch``,
  ``share_over_sp`` (their rewards);
- ``dit_sp.rl.update``: ``accumulate_gradients``, ``train_on_rollout``, ``drift_free_log_prob`` (the update).

Everything a sequence-parallel group shares is made identical on its ranks by construction: prompts,
initial noise and every SDE noise draw come from per-sample seeds (independent of the rank layout),
trained timesteps from the step's seed, and rewards are scored once per sample (on the group's first
rank, or each rank its share of the samples) and shared. Rollout and training run the same batch, so
before the first update the recomputed log-probabilities equal the sampled ones bit for bit (ratio
exactly 1).
"""

from dit_sp.rl.batch import (
    Batch,
    check_split,
    make_batch,
    micro_batches,
    rollout_sigmas,
    sde_window_at,
    seed_for,
    select,
    stochastic_steps,
    trained_steps,
)
from dit_sp.rl.grpo_config import GRPOConfig, RandomWindow, SlidingWindow
from dit_sp.rl.policy import Policy
from dit_sp.rl.sampling import rollout, rollout_scored
from dit_sp.rl.scoring import Split, decode_videos, rewards_of, score_batch, score_videos, share_over_sp
from dit_sp.rl.update import accumulate_gradients, drift_free_log_prob, train_on_rollout

__all__ = [
    "Batch",
    "GRPOConfig",
    "Policy",
    "RandomWindow",
    "SlidingWindow",
    "Split",
    "accumulate_gradients",
    "check_split",
    "decode_videos",
    "drift_free_log_prob",
    "make_batch",
    "micro_batches",
    "rewards_of",
    "rollout",
    "rollout_scored",
    "rollout_sigmas",
    "score_batch",
    "score_videos",
    "sde_window_at",
    "seed_for",
    "select",
    "share_over_sp",
    "stochastic_steps",
    "train_on_rollout",
    "trained_steps",
]
