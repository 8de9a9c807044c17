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

import contextlib
import gc
import inspect
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dit_sp.errors import ConfigError
from dit_sp.families import DiffusersPolicy, policy_for, supported_vaes, vae_plan_of
from dit_sp.io.prompts import read_prompt_file
from dit_sp.io.video import save_video
from dit_sp.parallel import ParallelConfig, ParallelState, check_ranks_agree, free_port, init_parallel
from dit_sp.rl.advantages import PromptStats, gather_across, group_advantages
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.embeddings import TEXT_ENCODERS, PromptEmbeddings, model_identity
from dit_sp.rl.grpo import (
    Batch,
    check_split,
    decode_videos,
    make_batch,
    rewards_of,
    rollout,
    rollout_scored,
    sde_window_at,
    seed_for,
    train_on_rollout,
    trained_steps,
)
from dit_sp.rl.metrics import MetricsLog
from dit_sp.rl.rewards import RewardFn, WeightedReward, build_reward
from dit_sp.rl.rollout import Trajectory, sample_trajectory
from dit_sp.rl.schedule import shifted_sigmas
from dit_sp.rl.sde import SDEConfig
from dit_sp.sp import parallelize, parallelize_vae
from dit_sp.train import checkpoint, shard_model
from dit_sp.train.ema import EMA
from dit_sp.train.fsdp import copy_sharded
from dit_sp.train.lora import AdaptersDisabled, add_lora, merge_lora
from dit_sp.weights import has_meta_parameters, load_shards
from dit_sp.zoo import TRANSFORMERS, as_image_to_video, checkpoint_dir, load_pipeline

Tensor = torch.Tensor


class NonFiniteError(RuntimeError):
    """Too many updates in a row were skipped for a non-finite loss or gradient norm."""


LOSS_STATS = {"loss": "mean", "policy_loss": "mean", "ratio_mean": "mean", "clip_fraction": "mean", "kl": "mean",
              "ratio_min": "min", "ratio_max": "max", "masked": "sum", "transformer_forwards": "sum"}  # fmt: skip
"""How each per-rank loss statistic combines over the data-parallel ranks."""

RUN_FILES = ("metrics.jsonl", "checkpoints", "config.yaml", "final", "tensorboard", "reward_curve.png", "wandb",
             "wandb_run_id")  # fmt: skip
"""What a training run writes to its output directory (and, with ``overwrite``, what is removed)."""


def check_output_dir(config: TrainConfig) -> None:
    """Refuse to mix two runs in one directory: an existing run there needs ``resume`` (which needs a
    checkpoint) or ``overwrite``. Cheap and side-effect free: the CLI calls it before starting workers."""
    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a directory")
    existing = [name for name in RUN_FILES if (out / name).exists()]
    if config.resume:
        if checkpoint.latest(out / "checkpoints") is None:
            raise ConfigError(f"--resume: {out / 'checkpoints'} holds no complete checkpoint to continue from; "
                              "start a new run without --resume")  # fmt: skip
    elif existing and not config.overwrite:
        raise ConfigError(f"output_dir {out} already holds a run ({', '.join(existing)}); pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --output-dir")  # fmt: skip


def clear_run(out: Path) -> None:
    """Remove the files of the run in ``out`` (``overwrite``); other files stay."""
    for name in RUN_FILES:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for path in out.glob("eval_step*.mp4"):
        path.unlink()


def check_before_loading(config: TrainConfig, world_size: int) -> None:
    """Everything that can be checked from files alone before weights load or workers start: the output
    directory, the prompts, the reward names, the sample size against the model's config files, and the
    split of a step's samples over the layout's data-parallel ranks (``ConfigError`` naming the setting)."""
    from dit_sp.families import check_shape
    from dit_sp.rl.rewards import check_reward
    from dit_sp.zoo import shape_info

    check_output_dir(config)
    read_prompt_file(config.prompts)
    check_reward(config.reward)
    info = shape_info(config.model)
    if info is not None:
        check_shape(info, asdict(config.sample), flags=False)
    check_split(config.grpo, ParallelConfig.for_world(world_size, ring=config.ring, ulysses=config.ulysses).dp)


def init_world(config: TrainConfig) -> ParallelState:
    """The training layout on the running world (torchrun's or ``spawn``'s); a single process becomes a
    world of one, since FSDP2 needs a process group."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"])
    parallel = init_parallel(ParallelConfig.for_world(world, ring=config.ring, ulysses=config.ulysses))
    if config.dp is not None and config.dp != parallel.dp:
        raise ConfigError(f"dp={config.dp} but {world} processes / (ring*ulysses={parallel.sp}) give dp={parallel.dp}")
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
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the rollout (``sample``) and of decoding and scoring it (``reward``)."""


class GRPOTrainer:
    """GRPO fine-tuning of one pipeline's transformer; every rank of the world builds one.

    Args:
        config: the run's settings (``TrainConfig``; ``TrainConfig.load(path_or_name, overrides)`` reads YAML).
        pipeline: a loaded diffusers pipeline to train (fp32); default: ``config.model``, whose transformer
            (from a checkpoint directory) is built empty, sharded, then filled with each rank's own shards
            only. The transformer is parallelized and sharded in place.
        reward: a reward function ``(videos (B, F, C, H, W) in [0, 1], prompts) -> Tensor[B]`` or a
            ``WeightedReward``; default: ``build_reward(config.reward)``.
        prompts: the prompt list; default: read from ``config.prompts``.
        images: each prompt's conditioning image (an image-to-video model); default: from ``config.prompts``.
        parallel: the layout; default: ``ring x ulysses`` of ``config`` on the running world, dp the rest.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        pipeline: Any | None = None,
        reward: RewardFn | WeightedReward | None = None,
        prompts: list[str] | None = None,
        images: list[str] | None = None,
        parallel: ParallelState | None = None,
    ):
        self.config = config
        self.output_dir = Path(config.output_dir)
        check_output_dir(config)  # before anything heavy: never clobber a run
        self.parallel = parallel or init_world(config)
        self.is_leader = self.parallel.rank == 0
        self._split_decode = config.vae_split if config.parallel_vae and self.parallel.sp > 1 else None
        self._decode_chunk = config.vae_batch or config.grpo.micro_batch
        if prompts is None:
            prompts, images = read_prompt_file(config.prompts)
        self.prompts = list(prompts)
        self.images: list[str | None] | None = list(images) if images is not None and any(images) else None
        """Each prompt's conditioning image (image-to-video), or None (text-to-video)."""
        check_ranks_agree(self.parallel, [asdict(config), self.prompts, self.images], "settings or prompts")
        if reward is None:
            reward = build_reward(config.reward)
        self.reward = reward if isinstance(reward, WeightedReward) else WeightedReward([("reward", 1.0, reward)])
        make_batch(self.prompts, 0, config.seed, config.grpo, self.parallel)  # validates the batch split early
        if config.overwrite and self.is_leader:
            clear_run(self.output_dir)

        source = checkpoint_dir(config.model) if pipeline is None else None
        self.embeddings = PromptEmbeddings(
            config.embedding_cache or self.output_dir / "embeddings",
            {"model": model_identity(config.model) if pipeline is None else type(pipeline).__name__,
             "max_sequence_length": config.sample.max_sequence_length,
             "negative_prompt": config.sample.negative_prompt if config.sample.guidance > 1 else None},
        )  # fmt: skip
        missing = self._agreed(self.embeddings.missing(self.prompts))
        self._source = source if source is not None and source.is_dir() else None
        if pipeline is None:
            # a checkpoint's text encoders load only if some prompt lacks its embedding, the VAE only where
            # videos are decoded (a sample's first rank, or all its ranks with the parallel VAE), and the
            # transformer empty (filled after sharding); every rank encodes the images of image-to-video
            decodes = self.parallel.sp_rank == 0 or self._split_decode is not None or self.images is not None
            without = (() if missing else TEXT_ENCODERS) + (() if decodes else ("vae",))
            pipeline = load_pipeline(config.model, torch.float32, self.parallel.device, empty_transformers=True,
                                     without=without if source is not None else ())  # fmt: skip
        torch.manual_seed(config.seed)  # identical LoRA initialisation on every rank, however the model loaded
        self._export_class = type(pipeline)
        if self.images is not None:
            pipeline = as_image_to_video(pipeline)  # Wan 2.2 TI2V's WanPipeline: the same model, with images
        self.pipe = pipeline.to(self.parallel.device) if not has_meta_parameters(pipeline.transformer) else pipeline
        self.experts: dict[str, torch.nn.Module] = {
            name: getattr(self.pipe, name) for name in TRANSFORMERS if getattr(self.pipe, name, None) is not None
        }
        """The pipeline's transformers (Wan 2.2 A14B: two experts)."""
        self.trained = _trained_experts(config.experts, list(self.experts))
        self.transformer: torch.nn.Module = (
            self.experts["transformer"] if len(self.experts) == 1 else torch.nn.ModuleDict(self.experts)
        )
        """What is trained, checkpointed and exported: the transformer, or a ``ModuleDict`` of the experts."""
        # the policy checks the settings against the model before it is sharded
        sample = config.sample
        self.policy: DiffusersPolicy = policy_for(self.pipe)(
            self.pipe, self.experts["transformer"], frames=sample.frames, height=sample.height, width=sample.width,
            guidance=sample.guidance, negative_prompt=sample.negative_prompt,
            max_sequence_length=sample.max_sequence_length, embedded_guidance=sample.embedded_guidance,
            transformer_2=self.experts.get("transformer_2"), guidance_2=sample.guidance_2, device=self.parallel.device,
        )  # fmt: skip
        self.policy.trained_experts = tuple(self.trained)
        if self.policy.takes_images != (self.images is not None):
            raise ConfigError(
                f"{config.model} is an image-to-video model: give a JSONL prompt file with an 'image' per prompt"
                if self.policy.takes_images else
                f"{config.model} is a text-to-video model ({type(self.pipe).__name__}): its prompts take no image"
            )  # fmt: skip
        sigmas = shifted_sigmas(config.grpo.steps, config.grpo.shift)
        eligible = [t for t in range(config.grpo.steps) if self.policy.trains(sigmas[t])]
        if not trained_steps(config.grpo, 0, eligible, sde_window_at(config.grpo, 0)):
            raise ConfigError(f"experts {self.trained} run at none of the trained steps (grpo.steps, grpo.shift, "
                              "grpo.sde_window): train another expert or move the steps")  # fmt: skip
        self._encode_prompts(missing, free_encoders=source is not None)
        if self._split_decode == "rows":
            if vae_plan_of(self.pipe.vae) is None:
                raise ConfigError(f"parallel_vae: {type(self.pipe.vae).__name__} cannot decode split (supported: "
                                  f"{supported_vaes()}); set parallel_vae: false")  # fmt: skip
            parallelize_vae(self.pipe.vae, self.parallel.sp_group, gather_to=0)
        self._shard(config)
        params = [p for p in self.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
        warmup = max(1, config.optim.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))

        self.ema = EMA(self.transformer, config.ema_decay) if config.ema_decay else None
        """The moving average of the trained weights (``ema_decay``), used by ``evaluate`` and ``export``."""
        self.prompt_stats = PromptStats(config.grpo.stat_tracking) if config.grpo.stat_tracking else None
        """Per-prompt reward statistics across iterations (``grpo.stat_tracking``), or None."""
        self.step_index = 0
        """Iterations done (the next ``step()`` runs iteration ``step_index``)."""
        self.skipped_steps = 0
        """Updates skipped for a non-finite loss or gradient norm, over the whole run."""
        self._skipped_in_a_row = 0
        if config.resume:
            found = checkpoint.load_latest(self.checkpoint_dir, self.transformer, self.optimizer, self._tensor_states())
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
        if self.parallel.world_size > 1:
            dist.barrier()  # the leader's clearing of an overwritten run is done before anyone writes
        if self.is_leader:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            import yaml

            (self.output_dir / "config.yaml").write_text(yaml.safe_dump(asdict(config), sort_keys=False))
        self.metrics = MetricsLog(self.output_dir, self.step_index, self.is_leader, config.wandb, asdict(config))

    def _agreed(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (ranks may look at a shared directory at different moments)."""
        if self.parallel.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _encode_prompts(self, missing: list[str], free_encoders: bool) -> None:
        """Every prompt's embedding on disk (the ranks share the missing ones), read from there from now on;
        then the text encoders of a loaded checkpoint are dropped."""
        if missing:
            parallel = self.parallel
            self.embeddings.compute(missing[parallel.rank :: parallel.world_size], self.policy._encode)
            if parallel.world_size > 1:
                dist.barrier()
        self.policy.embeddings = self.embeddings
        if free_encoders:
            self.pipe.register_modules(**{name: None for name in TEXT_ENCODERS if hasattr(self.pipe, name)})
            gc.collect()

    def _shard(self, config: TrainConfig) -> None:
        """Each expert: LoRA (trained ones) or frozen (the others), USP, activation checkpointing, FSDP2 (in
        that order), then the KL term's reference."""
        parallel = self.parallel
        compute_dtype = getattr(torch, config.mixed_precision) if config.mixed_precision else None
        for name, transformer in self.experts.items():
            trained = name in self.trained
            if trained and config.lora.rank:
                add_lora(transformer, config.lora.rank, config.lora.alpha)
            elif not trained:
                transformer.requires_grad_(False)
            parallelize(transformer, parallel, gather_grad="sum")
            if config.activation_checkpointing and trained:
                transformer.enable_gradient_checkpointing()
            shard_model(transformer, parallel, hsdp=config.hsdp, param_dtype=compute_dtype)
            if has_meta_parameters(transformer):
                load_shards(transformer, transformer.weights_dir, parallel.device)
        if config.grpo.kl_coef:
            # LoRA: the same model with its adapters off; full fine-tuning: a frozen sharded copy; a frozen
            # expert is its own reference
            references = {name: (AdaptersDisabled(model) if config.lora.rank else self._frozen_copy(model))
                          for name, model in self.experts.items() if name in self.trained}  # fmt: skip
            self.policy.reference = references.get("transformer")
            self.policy.reference_2 = references.get("transformer_2")

    def _frozen_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model``'s initial weights as a frozen, sharded, parallelized model, built on the meta device and
        filled shard by shard from it: never a second full copy in memory."""
        with torch.device("meta"):
            reference = type(model).from_config(model.config)
        parallelize(reference, self.parallel)
        shard_model(reference, self.parallel, hsdp=self.config.hsdp)
        reference.to_empty(device=self.parallel.device)
        copy_sharded(model, reference)
        return reference.requires_grad_(False).eval()

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def collect(self, step: int) -> Rollout:
        """Roll out iteration ``step``'s samples, score them and compute their advantages (collective)."""
        grpo, parallel = self.config.grpo, self.parallel
        batch = make_batch(self.prompts, step, self.config.seed, grpo, parallel, self.images)
        self.transformer.eval()
        began = time.perf_counter()
        if grpo.overlap_rewards:
            traj, cond, rewards, parts, waited = rollout_scored(self.policy, batch, self.reward, grpo, parallel,
                                                                split_decode=self._split_decode,
                                                                decode_chunk=self._decode_chunk)  # fmt: skip
            seconds = {"sample": time.perf_counter() - began - waited, "reward": waited}
        else:
            traj, cond = rollout(self.policy, batch, grpo, parallel)
            sampled = time.perf_counter()
            rewards, parts = rewards_of(self.policy, traj, batch, self.reward, parallel, cond=cond,
                                        split_decode=self._split_decode, decode_chunk=self._decode_chunk)  # fmt: skip
            seconds = {"sample": sampled - began, "reward": time.perf_counter() - sampled}
        if self.prompt_stats is not None:
            advantages = self.prompt_stats.advantages(rewards, batch.prompt_ids, group=parallel.dp_group,
                                                      std=grpo.adv_std, clip=grpo.adv_clip)  # fmt: skip
        else:
            advantages = group_advantages(rewards, batch.prompt_ids, group=parallel.dp_group, std=grpo.adv_std,
                                          clip=grpo.adv_clip)  # fmt: skip
        self.transformer.train()
        return Rollout(batch, traj, cond, rewards, parts, advantages, seconds)

    def step(self) -> dict[str, Any]:
        """One iteration (roll out, score, update), logged; returns its metrics row (collective)."""
        config, step = self.config, self.step_index
        began, forwards = time.perf_counter(), self.policy.forwards
        data = self.collect(step)
        trained = time.perf_counter()
        stats = train_on_rollout(self.policy, self.transformer, self.optimizer, data.traj, data.cond, data.advantages,
                                 config.grpo, seed_for(config.seed, step, 1), config.optim.max_grad_norm)  # fmt: skip
        self.scheduler.step()
        stats["transformer_forwards"] = float(self.policy.forwards - forwards)  # rollout and training, all ranks
        skipped = bool(stats.pop("skipped"))
        if self.ema is not None and not skipped:
            self.ema.update()
        self.skipped_steps += skipped
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if skipped else 0
        data.seconds["train"] = time.perf_counter() - trained
        row = self._metrics_row(step, stats, data, time.perf_counter() - began)
        row["skipped_steps"] = self.skipped_steps
        self.step_index = done = step + 1
        if config.eval_every and done % config.eval_every == 0:
            video = self.output_dir / f"eval_step{done:06d}.mp4"
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
        self.metrics.close()
        return self.metrics.rows if self.is_leader else []

    def save_checkpoint(self) -> Path:
        """Model, optimizer, LR schedule and RNG states at ``step_index`` (atomic; collective)."""
        extra = {"step": self.step_index, "scheduler": self.scheduler.state_dict(), "skipped_steps": self.skipped_steps}
        if self.prompt_stats is not None:
            extra["prompt_stats"] = self.prompt_stats.state_dict()
        return checkpoint.save(self.checkpoint_dir, self.step_index, self.transformer, self.optimizer, extra,
                               tensors=self._tensor_states())  # fmt: skip

    def _tensor_states(self) -> dict[str, dict[str, Tensor]] | None:
        """What checkpoints hold beside the model and optimizer, sharded like them (the EMA)."""
        return {"ema": self.ema.state_dict()} if self.ema is not None else None

    def _averaged(self):
        """The weights evaluation and export use: the EMA's inside the block when there is one."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

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
        row |= self._over_dp({k: v for k, v in row.items() if k in LOSS_STATS})
        for name, values in data.parts.items():
            row[f"reward/{name}"] = mean_std(values)[0]
        row |= {f"seconds/{name}": value for name, value in data.seconds.items()}
        return row

    def _over_dp(self, stats: dict[str, float]) -> dict[str, float]:
        """Per-rank loss statistics as the whole step's (every dp rank has as many samples): means, or the
        extreme / the total, so that the logged numbers do not depend on the layout."""
        group = self.parallel.dp_group
        if group is None or self.parallel.dp == 1:
            return stats
        out = {}
        for op in ("mean", "sum", "min", "max"):  # one collective per kind of reduction
            keys = [key for key in stats if LOSS_STATS[key] == op]
            if not keys:
                continue
            values = torch.tensor([stats[key] for key in keys], dtype=torch.float64, device=self.parallel.device)
            reduce_op = dist.ReduceOp.SUM if op in ("mean", "sum") else getattr(dist.ReduceOp, op.upper())
            dist.all_reduce(values, op=reduce_op, group=group)
            if op == "mean":
                values /= self.parallel.dp
            out |= dict(zip(keys, values.tolist()))
        return out

    @torch.no_grad()
    def evaluate(self, path: str | Path | None = None) -> float:
        """ODE samples of the first ``eval_prompts`` prompts from fixed noise: their mean reward (the same on
        every rank), and, if ``path`` is given, a video of them side by side written by rank 0. Touches no
        training RNG (collective)."""
        config, policy, parallel = self.config, self.policy, self.parallel
        prompts = self.prompts[: config.eval_prompts]
        images = self.images[: config.eval_prompts] if self.images is not None else None
        cond = policy.encode(prompts, images)
        generator = torch.Generator().manual_seed(config.seed)
        noise = torch.randn((len(prompts), *policy.latent_shape()), generator=generator)
        self.transformer.eval()
        sigmas = shifted_sigmas(config.grpo.steps, config.grpo.shift)
        with self._averaged():
            traj = sample_trajectory(lambda x, s: policy.velocity(x, s, cond), noise.to(parallel.device), sigmas,
                                     SDEConfig("ode"))  # fmt: skip
        self.transformer.train()
        reward = torch.zeros(1, device=parallel.device)
        if parallel.dp_rank == 0:
            videos = decode_videos(
                policy, traj.final, cond, parallel, split=self._split_decode, chunk=self._decode_chunk
            )  # on rank 0
        if parallel.rank == 0:
            videos = videos.cpu()
            reward[0] = self.reward(videos, prompts, images).nanmean()
            if path is not None:
                save_video(torch.cat(list(videos), dim=-1).permute(0, 2, 3, 1).numpy(), path)
        if parallel.world_size > 1:
            dist.broadcast(reward, src=0)
        return reward.item()

    def _plain_copy(self, name: str, state: dict[str, Tensor]) -> torch.nn.Module:
        """Expert ``name`` as a plain diffusers model holding the full weights ``state`` (LoRA merged)."""
        model = self.experts[name]
        target = type(model).from_config(model.config)
        adapted = bool(self.config.lora.rank) and name in self.trained
        if adapted:
            add_lora(target, self.config.lora.rank, self.config.lora.alpha)
        missing, unexpected = target.load_state_dict(state, strict=False)
        if unexpected or missing:
            raise RuntimeError(f"exported weights of {name} do not fit the model: missing {missing}, "
                               f"unexpected {unexpected}")  # fmt: skip
        if adapted:
            merge_lora(target)
        return target

    def export(self, path: str | Path) -> Path:
        """The trained weights (their EMA, with ``ema_decay``) as a diffusers pipeline directory (LoRA
        merged), loadable by ``load_pipeline`` and ``python -m pipelines.generate --model PATH``
        (collective). Written to ``PATH.tmp``, checked to load, then renamed (replacing an earlier export
        of this run)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        if self._source is not None:
            # the checkpoint's other components as they are (some were never loaded), and its frozen experts;
            # each trained expert gathered, saved and freed in turn (one full copy in host memory at a time)
            if self.is_leader:
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(self._source, tmp, ignore=shutil.ignore_patterns(*self.trained))
            for name in self.trained:
                with self._averaged():
                    state = checkpoint.full_state_dict(self.experts[name])
                if self.is_leader:
                    self._plain_copy(name, state).save_pretrained(tmp / name)
                del state
        else:
            # a pipeline built in code (small): saved whole, with its other constructor settings (e.g. Wan 2.2's
            # boundary_ratio), as the class it was loaded as (Wan 2.2 TI2V: a WanPipeline, though it trained
            # with images)
            with self._averaged():
                states = {name: checkpoint.full_state_dict(model) for name, model in self.experts.items()}
            if self.is_leader:
                targets = {name: self._plain_copy(name, state) for name, state in states.items()}
                shutil.rmtree(tmp, ignore_errors=True)
                accepted = inspect.signature(self._export_class.__init__).parameters
                components = {k: v for k, v in (dict(self.pipe.components) | targets).items() if k in accepted}
                settings = {k: v for k, v in self.pipe.config.items() if k in accepted and k not in components}
                self._export_class(**settings, **components).save_pretrained(tmp)
        if self.is_leader:
            self._export_class.load_config(tmp)  # raises if what was written does not read back
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
        if self.parallel.world_size > 1:
            dist.barrier()
        return path


def _trained_experts(chosen: list[str] | None, present: list[str]) -> list[str]:
    """The experts a run trains: ``chosen`` (checked against the pipeline's) or all of them."""
    if chosen is None:
        return present
    unknown = [name for name in chosen if name not in present]
    if unknown or not chosen:
        raise ConfigError(f"experts: {chosen} must name some of this pipeline's transformers {present}")
    return [name for name in present if name in chosen]


def train(config: TrainConfig) -> dict[str, Any]:
    """One rank of a whole training run (what ``python -m pipelines.train_grpo`` runs on every rank):
    ``{"rows": metrics rows (rank 0), "final": export path}``."""
    trainer = GRPOTrainer(config)
    rows = trainer.train()
    return {"rows": rows, "final": str(trainer.output_dir / "final")}
