"""Worker-side GRPO checks: the gradients of one training step on a given layout."""

from __future__ import annotations

import torch

from dit_sp.rl.grpo import accumulate_gradients, seed_for
from pipelines.train_grpo import TrainConfig, collect, setup


def tiny_config(**overrides) -> TrainConfig:
    base = {"max_steps": 2, "frames": 5, "height": 32, "width": 48, "steps": 3, "group_size": 2,
            "prompts_per_step": 2, "checkpoint_every": 0, "guidance": 2.0, "train_fraction": 1.0}  # fmt: skip
    return TrainConfig(**(base | overrides))


def step_gradients(cfg: TrainConfig, lora_b: float | None = None) -> dict:
    """Full (unsharded) gradients of step 0, the rewards and the on-policy ratio and KL statistics.
    ``lora_b``: set every LoRA B weight to this value first (elementwise, so the same on every layout),
    so that the adapted policy differs from its reference."""
    run = setup(cfg)
    if lora_b is not None:
        with torch.no_grad():
            for name, p in run.transformer.named_parameters():
                if "lora_B" in name:
                    p.fill_(lora_b)
    data = collect(run, 0)
    run.optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(run.policy, data["traj"], data["cond"], data["advantages"], run.grpo,
                                 seed_for(cfg.seed, 0, 1))  # fmt: skip
    grads = {}
    for name, p in run.transformer.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().clone()
    return {"grads": grads, "rewards": data["rewards"], "prompt_ids": data["batch"].prompt_ids,
            "ratio_min": stats["ratio_min"], "ratio_max": stats["ratio_max"], "kl": stats["kl"],
            "rank": run.parallel.rank}  # fmt: skip
