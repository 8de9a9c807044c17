"""A trainer's checkpoints: saving its whole state (``save``) and continuing from the latest (``resume``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dit_sp.errors import ConfigError
from dit_sp.train import checkpoint

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor


def tensor_states(trainer: GRPOTrainer) -> dict[str, dict[str, Tensor]] | None:
    """What checkpoints hold beside the model and optimizer, sharded like them (the EMA)."""
    return {"ema": trainer.ema.state_dict()} if trainer.ema is not None else None


def save(trainer: GRPOTrainer) -> Path:
    """Model, optimizer, LR schedule and RNG states at ``step_index`` (atomic; collective)."""
    self = trainer
    extra = {"step": self.step_index, "scheduler": self.scheduler.state_dict(), "skipped_steps": self.skipped_steps}
    if self.prompt_stats is not None:
        extra["prompt_stats"] = self.prompt_stats.state_dict()
    return checkpoint.save(self.checkpoint_dir, self.step_index, self.transformer, self.optimizer, extra,
                           tensors=tensor_states(self))  # fmt: skip


def resume(trainer: GRPOTrainer) -> None:
    """The trainer's state from the latest complete checkpoint of its run (``resume``)."""
    self = trainer
    found = checkpoint.load_latest(self.checkpoint_dir, self.transformer, self.optimizer, tensor_states(self))
    if found is None:
        raise ConfigError(f"resume: {self.checkpoint_dir} holds no complete checkpoint; start a new run "
                          "without resume")  # fmt: skip
    _, extra = found
    self.scheduler.load_state_dict(extra["scheduler"])
    self.step_index = extra["step"]
    self.skipped_steps = extra.get("skipped_steps", 0)
    if self.prompt_stats is not None:
        if "prompt_stats" not in extra:
            raise ConfigError("resume: grpo.stat_tracking is on, but the checkpoint holds no per-prompt "
                              "statistics (the run was started without it)")  # fmt: skip
        self.prompt_stats.load_state_dict(extra["prompt_stats"])
