"""A trainer's iteration: roll out, score, update, log (``step``), stopping a run whose updates keep being
skipped (``NonFiniteError``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dit_sp.errors import RunStopped
from dit_sp.rl import nft
from dit_sp.rl.batch import seed_for
from dit_sp.rl.evaluate import video_name
from dit_sp.rl.step_stats import metrics_row
from dit_sp.rl.update import train_on_rollout

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer


class NonFiniteError(RunStopped, RuntimeError):
    """Too many updates in a row were skipped for a non-finite loss or gradient norm (a documented stop: one
    line from the CLIs)."""


def step(trainer: GRPOTrainer) -> dict[str, Any]:
    """One iteration (roll out, score, update), logged; returns its metrics row (collective)."""
    self = trainer
    config, step = self.config, self.step_index
    began, forwards = time.perf_counter(), self.policy.forwards
    data = self.collect(step)
    trained = time.perf_counter()
    if config.algorithm == "nft":
        stats = nft.train_step(self, data, step)
    else:
        stats = train_on_rollout(self.policy, self.transformer, self.optimizer, data.traj, data.cond,
                                 data.advantages, config.grpo, seed_for(config.seed, step, 1),
                                 config.optim.max_grad_norm)  # fmt: skip
    self.scheduler.step()
    stats["transformer_forwards"] = float(self.policy.forwards - forwards)  # rollout and training, all ranks
    skipped = bool(stats.pop("skipped"))
    if self.ema is not None and not skipped:
        self.ema.update()
    self.skipped_steps += skipped
    self._skipped_in_a_row = self._skipped_in_a_row + 1 if skipped else 0
    data.seconds["train"] = time.perf_counter() - trained
    row = metrics_row(self, step, stats, data, time.perf_counter() - began)
    row["skipped_steps"] = self.skipped_steps
    self.step_index = done = step + 1
    if config.eval_every and done % config.eval_every == 0:
        video = self.output_dir / video_name(step)  # numbered like its metrics row
        row["eval_reward"] = self.evaluate(video)
        if self.is_leader:
            self.metrics.log_video(video, step)
    self.metrics.log(row)
    if self._skipped_in_a_row >= config.max_skipped_steps:
        raise NonFiniteError(
            f"{self._skipped_in_a_row} updates in a row (the last at step {step}) had a non-finite loss or "
            f"gradient norm, or no sample with a reward, and were skipped; the weights are still those of the "
            "last good update. Check the reward (a reward server that is down?) and the data, lower optim.lr, "
            "or raise max_skipped_steps"
        )
    return row
