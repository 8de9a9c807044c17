"""Worker-side DiffusionNFT checks through the library's ``GRPOTrainer`` (``algorithm: nft``): the gradients of
a step whose old policy differs from the trained one, and a run stopped after a step and resumed."""

from __future__ import annotations

import dataclasses

from grpo_checks import tiny_config

from dit_sp import GRPOTrainer, TrainConfig
from dit_sp.rl.batch import seed_for
from dit_sp.rl.nft import accumulate_gradients

NFT = {"algorithm": "nft", "grpo.same_noise_per_group": False, "nft.old_decay_rate": 0.25, "optim.lr": 1e-3}
"""A tiny NFT run whose old policy lags the trained one from the first update on (decay 0.25 after it)."""


def nft_config(**overrides) -> TrainConfig:
    return tiny_config(**(NFT | overrides))


def full_grads(trainer: GRPOTrainer) -> dict:
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for name, p in trainer.transformer.named_parameters() if p.grad is not None}  # fmt: skip


def second_step_gradients(trainer: GRPOTrainer) -> dict:
    """The gradients of iteration 1 (left in no optimizer: the next ``step()`` recomputes them)."""
    cfg = trainer.config
    data = trainer.collect(1)
    trainer.optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(trainer.policy, trainer.nft_old, data, cfg.grpo, cfg.nft, seed_for(cfg.seed, 1, 1))
    grads = full_grads(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"grads": grads, "rewards": data.rewards, "stats": stats, "rank": trainer.parallel.rank}


def run_with_checks(cfg: TrainConfig, steps: int) -> dict:
    """A run of ``steps`` iterations, checkpointed after step 0 (its last checkpoint), with the gradients of
    iteration 1 taken before it runs (the old policy then differs from the trained one); its metrics rows."""
    trainer = GRPOTrainer(cfg)
    rows = [trainer.step()]
    trainer.save_checkpoint()
    out = second_step_gradients(trainer)
    rows += [trainer.step() for _ in range(steps - 1)]
    return out | {"rows": rows}


def layouts_and_resume(configs: list[TrainConfig], steps: int, resumed: TrainConfig | None = None) -> dict:
    """``run_with_checks`` of each config in turn on one world; then, if given, ``resumed`` (a run checkpointed
    after step 0) continued here for two steps."""
    out = {"layouts": [run_with_checks(cfg, steps) for cfg in configs]}
    if resumed is not None:
        trainer = GRPOTrainer(dataclasses.replace(resumed, resume=True))
        out["resumed"] = [trainer.step() for _ in range(2)]
    return out
