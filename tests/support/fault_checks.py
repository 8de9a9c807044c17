"""Worker-side fault checks: a non-finite loss on one rank, and ranks that disagree on their settings."""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

import dit_sp.rl.update as update
from dit_sp import GenerateConfig, GRPOTrainer, TrainConfig, generate
from dit_sp.rl.step import NonFiniteError


def _weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in trainer.transformer.named_parameters()}  # fmt: skip


def nan_loss_on_one_rank(config: TrainConfig, nan_rank: int) -> dict:
    """From step 1 on, rank ``nan_rank``'s loss is NaN (its gradients stay finite, so only that rank can
    tell): every rank must skip the same updates, the weights stay those after step 0, and the run stops
    after ``max_skipped_steps`` skips in a row."""
    trainer = GRPOTrainer(config)
    rows = [trainer.step()]
    after_first = _weights(trainer)
    loss_fn = update.grpo_loss

    def poisoned(*args, **kwargs):
        loss, stats = loss_fn(*args, **kwargs)
        if dist.get_rank() != nan_rank:
            return loss, stats
        return loss + float("nan"), dataclasses.replace(stats, loss=float("nan"))

    update.grpo_loss = poisoned
    error = None
    try:
        for _ in range(config.max_skipped_steps + 1):
            rows.append(trainer.step())
    except NonFiniteError as e:
        error = str(e)
    finally:
        update.grpo_loss = loss_fn
    weights = _weights(trainer)
    return {"rows": rows, "error": error, "finite": all(bool(torch.isfinite(w).all()) for w in weights.values()),
            "unchanged": all(torch.equal(weights[k], after_first[k]) for k in weights)}  # fmt: skip


def train_with_rank_settings(config: TrainConfig, changes: dict) -> str:
    """Rank 1 gets other settings (as a torchrun rank that read another file would): the trainer refuses."""
    if os.environ["RANK"] == "1":
        config = dataclasses.replace(config, **changes)
    try:
        GRPOTrainer(config)
    except ValueError as e:
        return str(e)
    return "no error"


def generate_with_rank_prompt(config: GenerateConfig) -> str:
    """Rank 1 was given another prompt: generate refuses before sampling."""
    if os.environ["RANK"] == "1":
        config = dataclasses.replace(config, prompt="a blue square moving up")
    try:
        generate(config)
    except ValueError as e:
        return str(e)
    return "no error"
