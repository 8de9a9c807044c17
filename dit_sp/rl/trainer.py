"""The GRPO trainer: a diffusers video pipeline fine-tuned with GRPO, its DiT sequence-parallel (USP) inside
FSDP2 over the flattened ``dp x ring x ulysses`` mesh, with exact resume.

    from dit_sp import GRPOTrainer, TrainConfig

    trainer = GRPOTrainer(TrainConfig.load("grpo_tiny_wan", {"max_steps": 2}))  # every rank runs this
    for _ in range(2):
        row = trainer.step()        # one iteration: roll out, score, update; returns its metrics
    trainer.export("outputs/final")  # a diffusers pipeline directory

Every rank of the world builds the trainer and calls the same methods (they are collective). Every step
appends one JSON line to ``OUTPUT_DIR/metrics.jsonl`` and TensorBoard scalars and redraws the reward curve;
``train()`` also checkpoints every ``checkpoint_every`` steps (resume with ``resume: true``) and exports.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dit_sp.bundled import asset_path
from dit_sp.models import DiffusersPolicy, policy_for
from dit_sp.parallel import ParallelConfig, ParallelState, free_port, init_parallel
from dit_sp.parallelizer import parallelize
from dit_sp.rl.advantages import gather_across, group_advantages
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.grpo import Batch, make_batch, rewards_of, rollout, seed_for, train_on_rollout
from dit_sp.rl.metrics import MetricsLog
from dit_sp.rl.rewards import RewardFn, WeightedReward, build_reward
from dit_sp.rl.rollout import Trajectory, sample_trajectory
from dit_sp.rl.schedule import shifted_sigmas
from dit_sp.rl.sde import SDEConfig
from dit_sp.train import checkpoint, shard_model
from dit_sp.train.lora import AdaptersDisabled, add_lora, merge_lora
from dit_sp.video import save_video
from dit_sp.zoo import load_pipeline

Tensor = torch.Tensor


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a .txt file (one per line) or a .jsonl file (``{"prompt": ...}`` per line); bundled
    prompt files (``toy_prompts_train.txt``) by name."""
    file = asset_path(path)
    if file is None or not file.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (give a .txt with one prompt per line or a .jsonl)")
    lines = [line for line in file.read_text().splitlines() if line.strip()]
    if file.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(lines, 1):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{file}:{number}: expected a JSON object with a 'prompt' ({e})") from e
    else:
        prompts = [line.strip() for line in lines]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts


def init_world(config: TrainConfig) -> ParallelState:
    """The training layout on the running world (torchrun's or ``spawn``'s); a single process becomes a
    world of one, since FSDP2 needs a process group."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"])
    parallel = init_parallel(ParallelConfig.for_world(world, ring=config.ring, ulysses=config.ulysses))
    if config.dp is not None and config.dp != parallel.dp:
        raise ValueError(f"dp={config.dp} but {world} processes / (ring*ulysses={parallel.sp}) give dp={parallel.dp}")
    return parallel


@dataclass
class Rollout:
    """One iteration's samples on this rank: who they are, their trajectories, rewards and advantages."""

    batch: Batch
    traj: Trajectory
    cond: Any
    rewards: Tensor
    """``(N,)``, NaN where the reward failed."""
    parts: dict[str, Tensor]
    """Each reward component, ``(N,)``."""
    advantages: Tensor


class GRPOTrainer:
    """GRPO fine-tuning of one pipeline's transformer; every rank of the world builds one.

    Args:
        config: the run's settings (``TrainConfig``; ``TrainConfig.load(path_or_name, overrides)`` reads YAML).
        pipeline: a loaded diffusers pipeline to train (fp32); default: ``load_pipeline(config.model)``. Its
            transformer is parallelized and sharded in place.
        reward: a reward function ``(videos (B, F, C, H, W) in [0, 1], prompts) -> Tensor[B]`` or a
            ``WeightedReward``; default: ``build_reward(config.reward)``.
        prompts: the prompt list; default: read from ``config.prompts``.
        parallel: the layout; default: ``ring x ulysses`` of ``config`` on the running world, dp the rest.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        pipeline: Any | None = None,
        reward: RewardFn | WeightedReward | None = None,
        prompts: list[str] | None = None,
        parallel: ParallelState | None = None,
    ):
        self.config = config
        self.parallel = parallel or init_world(config)
        self.prompts = list(prompts) if prompts is not None else read_prompts(config.prompts)
        if reward is None:
            reward = build_reward(config.reward)
        self.reward = reward if isinstance(reward, WeightedReward) else WeightedReward([("reward", 1.0, reward)])
        make_batch(self.prompts, 0, config.seed, config.grpo, self.parallel)  # validates the batch split early
        self.output_dir = Path(config.output_dir)
        self.is_leader = self.parallel.rank == 0

        torch.manual_seed(config.seed)  # identical initial weights (LoRA included) on every rank
        self.pipe = pipeline if pipeline is not None else load_pipeline(config.model, torch.float32)
        self.pipe.to(self.parallel.device)
        self.transformer: torch.nn.Module = self.pipe.transformer
        self._transformer_class = type(self.transformer)
        # the policy checks the settings against the model before it is sharded
        sample = config.sample
        self.policy: DiffusersPolicy = policy_for(self.pipe)(
            self.pipe, self.transformer, frames=sample.frames, height=sample.height, width=sample.width,
            guidance=sample.guidance, negative_prompt=sample.negative_prompt,
            max_sequence_length=sample.max_sequence_length, embedded_guidance=sample.embedded_guidance,
            device=self.parallel.device,
        )  # fmt: skip
        self._shard(config)
        params = [p for p in self.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
        warmup = max(1, config.optim.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))

        self.step_index = 0
        """Iterations done (the next ``step()`` runs iteration ``step_index``)."""
        if config.resume and (last := checkpoint.latest(self.checkpoint_dir)) is not None:
            extra = checkpoint.load(last, self.transformer, self.optimizer)
            self.scheduler.load_state_dict(extra["scheduler"])
            self.step_index = extra["step"]
        if self.is_leader:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            import yaml

            (self.output_dir / "config.yaml").write_text(yaml.safe_dump(asdict(config), sort_keys=False))
        self.metrics = MetricsLog(self.output_dir, self.step_index, self.is_leader)

    def _shard(self, config: TrainConfig) -> None:
        """LoRA or a frozen reference copy, USP, activation checkpointing, FSDP2 (in that order)."""
        parallel, transformer = self.parallel, self.transformer
        reference = None
        if config.lora.rank:
            add_lora(transformer, config.lora.rank, config.lora.alpha)
        elif config.grpo.kl_coef:
            import copy

            reference = copy.deepcopy(transformer).requires_grad_(False)
        parallelize(transformer, parallel, gather_grad="sum")
        if reference is not None:
            parallelize(reference, parallel)
            shard_model(reference, parallel, hsdp=config.hsdp)
        if config.activation_checkpointing:
            transformer.enable_gradient_checkpointing()
        compute_dtype = getattr(torch, config.mixed_precision) if config.mixed_precision else None
        shard_model(transformer, parallel, hsdp=config.hsdp, param_dtype=compute_dtype)
        if reference is not None:
            self.policy.reference = reference
        elif config.lora.rank and config.grpo.kl_coef:
            self.policy.reference = AdaptersDisabled(transformer)

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def collect(self, step: int) -> Rollout:
        """Roll out iteration ``step``'s samples, score them and compute their advantages (collective)."""
        grpo, parallel = self.config.grpo, self.parallel
        batch = make_batch(self.prompts, step, self.config.seed, grpo, parallel)
        self.transformer.eval()
        traj, cond = rollout(self.policy, batch, grpo, parallel)
        rewards, parts, _ = rewards_of(self.policy, traj, batch, self.reward, parallel)
        advantages = group_advantages(rewards, batch.prompt_ids, group=parallel.dp_group, std=grpo.adv_std,
                                      clip=grpo.adv_clip)  # fmt: skip
        self.transformer.train()
        return Rollout(batch, traj, cond, rewards, parts, advantages)

    def step(self) -> dict[str, Any]:
        """One iteration (roll out, score, update), logged; returns its metrics row (collective)."""
        config, step = self.config, self.step_index
        began = time.perf_counter()
        data = self.collect(step)
        stats = train_on_rollout(self.policy, self.transformer, self.optimizer, data.traj, data.cond, data.advantages,
                                 config.grpo, seed_for(config.seed, step, 1), config.optim.max_grad_norm)  # fmt: skip
        self.scheduler.step()
        row = self._metrics_row(step, stats, data, time.perf_counter() - began)
        self.step_index = done = step + 1
        if config.eval_every and done % config.eval_every == 0:
            row["eval_reward"] = self.evaluate(self.output_dir / f"eval_step{done:06d}.mp4")
        self.metrics.log(row)
        return row

    def train(self) -> list[dict[str, Any]]:
        """Steps until ``max_steps`` with periodic checkpoints, then a final checkpoint and the export to
        ``OUTPUT_DIR/final``; returns the metrics rows of the whole run (on rank 0; empty elsewhere)."""
        from tqdm import tqdm

        config = self.config
        bar = tqdm(total=config.max_steps, initial=self.step_index, disable=not self.is_leader, desc="GRPO")
        while self.step_index < config.max_steps:
            self.step()
            bar.update()
            done = self.step_index
            if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.max_steps:
                self.save_checkpoint()
        bar.close()
        self.save_checkpoint()
        self.export(self.output_dir / "final")
        return self.metrics.rows if self.is_leader else []

    def save_checkpoint(self) -> Path:
        """Model, optimizer, LR schedule and RNG states at ``step_index`` (atomic; collective)."""
        extra = {"step": self.step_index, "scheduler": self.scheduler.state_dict()}
        return checkpoint.save(self.checkpoint_dir, self.step_index, self.transformer, self.optimizer, extra)

    def _metrics_row(self, step: int, stats: dict, data: Rollout, seconds: float) -> dict[str, Any]:
        """Rewards over every data-parallel rank, loss statistics, learning rate and time of one step."""
        parallel = self.parallel

        def mean_std(values: Tensor) -> tuple[float | None, float | None, int]:
            every = gather_across(values.to(parallel.device), parallel.dp_group).cpu()
            valid = every[~torch.isnan(every)]
            failed = int(torch.isnan(every).sum())
            if not len(valid):
                return None, None, failed
            return valid.mean().item(), valid.std(unbiased=False).item(), failed

        reward_mean, reward_std, failed = mean_std(data.rewards)
        row = {"step": step, "loss": stats["loss"], "reward_mean": reward_mean, "reward_std": reward_std,
               "reward_failed": failed, **{k: v for k, v in stats.items() if k != "loss"},
               "lr": self.scheduler.get_last_lr()[0], "seconds": seconds}  # fmt: skip
        for name, values in data.parts.items():
            row[f"reward/{name}"] = mean_std(values)[0]
        return row

    @torch.no_grad()
    def evaluate(self, path: str | Path | None = None) -> float:
        """ODE samples of the first ``eval_prompts`` prompts from fixed noise: their mean reward (the same on
        every rank), and, if ``path`` is given, a video of them side by side written by rank 0. Touches no
        training RNG (collective)."""
        config, policy, parallel = self.config, self.policy, self.parallel
        prompts = self.prompts[: config.eval_prompts]
        cond = policy.encode(prompts)
        generator = torch.Generator().manual_seed(config.seed)
        noise = torch.randn((len(prompts), *policy.latent_shape()), generator=generator)
        self.transformer.eval()
        traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise.to(parallel.device),
                                 shifted_sigmas(config.grpo.steps, config.grpo.shift), SDEConfig("ode"))  # fmt: skip
        self.transformer.train()
        reward = torch.zeros(1, device=parallel.device)
        if parallel.rank == 0:
            videos = policy.decode(traj.final).cpu()  # (B, F, C, H, W)
            reward[0] = self.reward(videos, prompts).nanmean()
            if path is not None:
                save_video(torch.cat(list(videos), dim=-1).permute(0, 2, 3, 1).numpy(), path)
        if parallel.world_size > 1:
            dist.broadcast(reward, src=0)
        return reward.item()

    def export(self, path: str | Path) -> Path:
        """The trained weights as a diffusers pipeline directory (LoRA merged), loadable by
        ``load_pipeline`` and ``python -m pipelines.generate --model PATH`` (collective)."""
        path = Path(path)
        state = checkpoint.full_state_dict(self.transformer)
        if self.is_leader:
            target = self._transformer_class.from_config(self.transformer.config)
            if self.config.lora.rank:
                add_lora(target, self.config.lora.rank, self.config.lora.alpha)
            missing, unexpected = target.load_state_dict(state, strict=False)
            if unexpected or missing:
                raise RuntimeError(f"exported weights do not fit the model: missing {missing}, unexpected {unexpected}")
            if self.config.lora.rank:
                merge_lora(target)
            components = dict(self.pipe.components) | {"transformer": target}
            # the pipeline's other constructor settings too (e.g. Wan 2.2's boundary_ratio)
            accepted = inspect.signature(type(self.pipe).__init__).parameters
            settings = {k: v for k, v in self.pipe.config.items() if k in accepted and k not in components}
            type(self.pipe)(**settings, **components).save_pretrained(path)
        if self.parallel.world_size > 1:
            dist.barrier()
        return path


def train(config: TrainConfig) -> dict[str, Any]:
    """One rank of a whole training run (what ``python -m pipelines.train_grpo`` runs on every rank):
    ``{"rows": metrics rows (rank 0), "final": export path}``."""
    trainer = GRPOTrainer(config)
    rows = trainer.train()
    return {"rows": rows, "final": str(trainer.output_dir / "final")}
