"""A trainer's checkpoints: saving its whole state (``save``) and continuing from the latest (``resume``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dit_sp._compat.torch_api import rebased_lr_schedule
from dit_sp.errors import ConfigError
from dit_sp.io.runlock import held_by_this_run
from dit_sp.rl import rundir
from dit_sp.train import checkpoint

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor


def tensor_states(trainer: GRPOTrainer) -> dict[str, dict[str, Tensor]] | None:
    """What checkpoints hold beside the model and optimizer, sharded like them (the EMA, DiffusionNFT's old
    policy)."""
    states = {"ema": trainer.ema.state_dict()} if trainer.ema is not None else {}
    if getattr(trainer, "nft_old", None) is not None:
        states["nft_old"] = trainer.nft_old.state_dict()
    return states or None


def save(trainer: GRPOTrainer) -> Path:
    """Model, optimizer, LR schedule and RNG states at ``step_index`` (atomic; collective). Under the output
    directory's run lock (the CLIs take it) no other run writes there, so every stale ``.tmp`` is cleared."""
    self = trainer
    extra = {"step": self.step_index, "scheduler": self.scheduler.state_dict(), "skipped_steps": self.skipped_steps}
    if self.prompt_stats is not None:
        extra["prompt_stats"] = self.prompt_stats.state_dict()
    return checkpoint.save(self.checkpoint_dir, self.step_index, self.transformer, self.optimizer, extra,
                           tensors=tensor_states(self), sole_writer=held_by_this_run(self.output_dir))  # fmt: skip


def _schedule(trainer: GRPOTrainer, state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's LR schedule, rebased on ``optim.lr`` if a resume changed it (``allow_change``); the
    optimizer's groups (restored with the old rate and weight decay) take the new ones."""
    lr, scheduler = trainer.config.optim.lr, trainer.scheduler
    if state.get("base_lrs") and any(base != lr for base in state["base_lrs"]):
        state = rebased_lr_schedule(state, lr, [factor(state["last_epoch"]) for factor in scheduler.lr_lambdas])
        for group, rate in zip(trainer.optimizer.param_groups, state["_last_lr"]):  # noqa: B905 - one per group
            group["initial_lr"], group["lr"] = lr, rate
    for group in trainer.optimizer.param_groups:
        group["weight_decay"] = trainer.config.optim.weight_decay
    return state


def resume(trainer: GRPOTrainer) -> None:
    """The trainer's state from the latest complete checkpoint of its run (``resume``); the changes of
    settings it was allowed to make are recorded with the step they take effect (``rundir.record_changes``)."""
    self = trainer
    changes = rundir.resume_changes(self.config)
    found = checkpoint.load_latest(self.checkpoint_dir, self.transformer, self.optimizer, tensor_states(self))
    if found is None:
        raise ConfigError(f"resume: {self.checkpoint_dir} holds no complete checkpoint; start a new run "
                          "without resume")  # fmt: skip
    _, extra = found
    self.scheduler.load_state_dict(_schedule(self, extra["scheduler"]))
    self.step_index = extra["step"]
    self.skipped_steps = extra.get("skipped_steps", 0)
    if self.prompt_stats is not None:
        if "prompt_stats" not in extra:
            raise ConfigError("resume: grpo.stat_tracking is on, but the checkpoint holds no per-prompt "
                              "statistics (the run was started without it)")  # fmt: skip
        self.prompt_stats.load_state_dict(extra["prompt_stats"])
    if self.is_leader:
        rundir.record_changes(self.output_dir, self.step_index, changes)
