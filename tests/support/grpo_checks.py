"""Worker-side GRPO checks: the gradients of one training step on a given layout, through the library's
``GRPOTrainer``."""

from __future__ import annotations

import tempfile
import warnings

import torch

from dit_sp import GRPOTrainer, TrainConfig
from dit_sp.io.schema import set_dotted
from dit_sp.rl.batch import seed_for
from dit_sp.rl.update import accumulate_gradients

# Short names for the nested keys the tests vary.
KEYS = {"frames": "sample.frames", "height": "sample.height", "width": "sample.width", "guidance": "sample.guidance",
        "embedded_guidance": "sample.embedded_guidance", "steps": "grpo.steps", "group_size": "grpo.group_size",
        "prompts_per_step": "grpo.prompts_per_step", "train_fraction": "grpo.train_fraction",
        "kl_coef": "grpo.kl_coef", "lora_rank": "lora.rank", "micro_batch": "grpo.micro_batch"}  # fmt: skip


def tiny_config(**overrides) -> TrainConfig:
    """A small run in a fresh output directory of its own."""
    base = {"max_steps": 2, "frames": 5, "height": 32, "width": 48, "steps": 3, "group_size": 2,
            "prompts_per_step": 2, "checkpoint_every": 0, "guidance": 2.0, "train_fraction": 1.0,
            "output_dir": tempfile.mkdtemp(prefix="dit_sp_grpo_")}  # fmt: skip
    values: dict = {}
    for key, value in (base | overrides).items():
        set_dotted(values, KEYS.get(key, key), value)
    return TrainConfig.from_dict(values)


def step_gradients(cfg: TrainConfig, lora_b: float | None = None) -> dict:
    """Full (unsharded) gradients of step 0, the rewards and the on-policy ratio and KL statistics.
    ``lora_b``: first set every LoRA B weight to this value, or without LoRA add it to every trained
    weight (elementwise, so the same on every layout), so that the policy differs from its reference."""
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        return _step_gradients(cfg, lora_b) | {"warnings": [str(w.message) for w in caught]}


def _step_gradients(cfg: TrainConfig, lora_b: float | None) -> dict:
    trainer = GRPOTrainer(cfg)
    if lora_b is not None:
        with torch.no_grad():
            for name, p in trainer.transformer.named_parameters():
                if "lora_B" in name:
                    p.fill_(lora_b)
                elif not cfg.lora.rank:
                    p.add_(lora_b)
    data = trainer.collect(0)
    trainer.optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(trainer.policy, data.traj, data.cond, data.advantages, cfg.grpo,
                                 seed_for(cfg.seed, 0, 1))  # fmt: skip
    grads = {}
    for name, p in trainer.transformer.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().clone()
    return {"grads": grads, "rewards": data.rewards, "prompt_ids": data.batch.prompt_ids,
            "ratio_min": stats["ratio_min"], "ratio_max": stats["ratio_max"], "kl": stats["kl"],
            "rank": trainer.parallel.rank}  # fmt: skip


def moved_window_gradients(cfg: TrainConfig, step: int) -> dict:
    """The gradients of iteration ``step`` (where a sliding window has moved), its window and ratio."""
    trainer = GRPOTrainer(cfg)
    data = trainer.collect(step)
    trainer.optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(trainer.policy, data.traj, data.cond, data.advantages, cfg.grpo,
                                 seed_for(cfg.seed, step, 1))  # fmt: skip
    grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for name, p in trainer.transformer.named_parameters() if p.grad is not None}  # fmt: skip
    return {
        "grads": grads,
        "window": data.traj.window,
        "trained": stats["trained_steps"],
        "ratio": (stats["ratio_min"], stats["ratio_max"]),
        "log_probs": data.traj.log_probs,
        "forwards": trainer.policy.forwards,
    }


def evaluation(cfg: TrainConfig, video: str) -> dict:
    """The trainer's held-out evaluation: its reward (every rank) and the video rank 0 writes."""
    trainer = GRPOTrainer(cfg)
    return {"reward": trainer.evaluate(video), "rank": trainer.parallel.rank}


def expert_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full copies of every weight of a (sharded) model, by name."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.state_dict().items()}  # fmt: skip


def trained_experts(cfg: TrainConfig, export: str) -> dict:
    """One step of a two-expert run, then its export: which experts' weights moved, and the frames of the
    trained pipeline (the trainer's own experts) and of ``generate`` loading the export, from one seed."""
    from dit_sp import GenerateConfig, generate

    trainer = GRPOTrainer(cfg)
    before = expert_weights(trainer.transformer)
    trainer.step()
    after = expert_weights(trainer.transformer)
    moved = sorted({name.split(".")[0] for name in before if not torch.equal(before[name], after[name])})
    trainer.export(export)
    sample = cfg.sample
    settings = {"prompt": "a red circle", "frames": sample.frames, "height": sample.height, "width": sample.width,
                "steps": 4, "guidance": sample.guidance, "seed": 3}  # fmt: skip
    with torch.no_grad():
        trained = trainer.pipe(prompt=settings["prompt"], num_frames=sample.frames, height=sample.height,
                               width=sample.width, num_inference_steps=4, guidance_scale=sample.guidance,
                               max_sequence_length=16, generator=torch.Generator().manual_seed(3),
                               output_type="np").frames[0]  # fmt: skip
    exported = generate(GenerateConfig.load(overrides={"model": export, "out": export + ".mp4",
                                                       "max_sequence_length": 16, **settings}), True)  # fmt: skip
    return {"moved": moved, "trained": trained, "exported": exported["frames"]}


def each_step_gradients(configs: list[TrainConfig]) -> list[dict]:
    """``step_gradients`` of several runs in turn, on one world."""
    return [step_gradients(cfg) for cfg in configs]


def each_moved_window_gradients(configs: list[TrainConfig], step: int) -> list[dict]:
    """``moved_window_gradients`` of several runs in turn, on one world (one spawn instead of several)."""
    return [moved_window_gradients(cfg, step) for cfg in configs]


def remote_reward_run(url: str, out: str) -> dict:
    """The rewards of one rollout scored locally and through the reward server at ``url`` (overlapped,
    micro-batches of one); then a step and a second one with the server unreachable."""
    import socket

    from dit_sp.rl.rewards import build_reward

    # the same rollout and decode (micro-batches of one, overlapped); only where the reward is computed differs
    same = {"grpo.overlap_rewards": True, "max_skipped_steps": 2}
    local = tiny_config(reward="brightness", micro_batch=1, output_dir=f"{out}/local", **same)
    expected = GRPOTrainer(local).collect(0).rewards
    remote = {"name": "remote", "url": url, "dtype": "float32", "timeout": 30}
    config = tiny_config(reward=[remote], micro_batch=1, output_dir=f"{out}/remote", **same)
    trainer = GRPOTrainer(config)
    data = trainer.collect(0)
    with socket.socket() as s:  # a port where nothing listens: the server is gone
        s.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{s.getsockname()[1]}"
    trainer.reward = build_reward([remote | {"url": gone, "retries": 0, "timeout": 2}])
    weights = {n: p.detach().clone() for n, p in trainer.transformer.named_parameters()}
    row = trainer.step()
    unchanged = all(torch.equal(p, weights[n]) for n, p in trainer.transformer.named_parameters())
    try:
        trainer.step()
        error = ""
    except RuntimeError as e:
        error = str(e)
    return {"local": expected, "remote": data.rewards, "waited": data.seconds["reward"], "row": row,
            "unchanged": unchanged, "error": error}  # fmt: skip
