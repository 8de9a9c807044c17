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
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dit_sp.errors import ConfigError
from dit_sp.families import (
    DiffusersPolicy,
    policy_for,
    policy_loads_vae,
    policy_named,
    supported_vaes,
    vae_plan_of,
)
from dit_sp.io.console import plain_tracebacks, quiet_followers
from dit_sp.io.prompts import image_digests, read_prompt_file
from dit_sp.parallel import ParallelState, check_ranks_agree, free_port, init_layout, read_on_every_rank
from dit_sp.rl import evaluate as _evaluate
from dit_sp.rl import export as _export
from dit_sp.rl import nft as _nft
from dit_sp.rl import resume as _resume
from dit_sp.rl import step as _step
from dit_sp.rl.advantages import PromptStats
from dit_sp.rl.batch import make_batch, rollout_sigmas, sde_window_at, stochastic_steps, trained_steps
from dit_sp.rl.collect import Rollout, collect
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.embeddings import TEXT_ENCODERS, PromptEmbeddings, model_identity
from dit_sp.rl.metrics import MetricsLog
from dit_sp.rl.rewards import RewardFn, WeightedReward, build_reward
from dit_sp.rl.rundir import check_output_dir, clear_run, write_config
from dit_sp.rl.step_stats import step_line
from dit_sp.sp import parallelize, parallelize_vae
from dit_sp.train import shard_model
from dit_sp.train.ema import EMA
from dit_sp.train.fsdp import copy_sharded
from dit_sp.train.lora import AdaptersDisabled, add_lora
from dit_sp.train.lora_io import init_adapters
from dit_sp.weights import has_meta_parameters, load_shards
from dit_sp.zoo import TRANSFORMERS, as_image_to_video, checkpoint_dir, load_pipeline, pipeline_class_name


def init_world(config: TrainConfig) -> ParallelState:
    """The training layout on the running world (torchrun's or ``spawn``'s); a single process becomes a
    world of one, since FSDP2 needs a process group."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    with plain_tracebacks():  # a world of one: tracebacks without torch's "[rank0]:" on every line
        return init_layout(ring=config.ring, ulysses=config.ulysses, dp=config.dp, timeout=config.collective_timeout)


def loads_vae(sp_rank: int, split_decode: str | None, images: bool, pipeline: str | None) -> bool:
    """Whether a rank loads the checkpoint's VAE: where videos are decoded (a sample's first rank, or all its ranks
    with the parallel VAE, ``split_decode``), on every rank that encodes images (image-to-video) and on every rank of
    a policy that conditions with the VAE (``pipeline``'s, Wan VACE's zero context): a rank without it would fail
    alone while the others wait in a collective."""
    return sp_rank == 0 or split_decode is not None or images or policy_loads_vae(pipeline)


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
        self._set_up_run(parallel, prompts, images, reward)
        missing = self._load(pipeline)
        self._build_policy()
        self._encode_prompts(missing, free_encoders=self._loaded_checkpoint)
        self._parallelize_vae()
        self._shard(self.config)
        self._build_optimizer()
        if config.resume:
            _resume.resume(self)
            if self.is_leader:
                layout = self.parallel.config
                print(f"resumed from step {self.step_index} (layout ring {layout.ring} x ulysses {layout.ulysses} "
                      f"x dp {layout.dp})", flush=True)  # fmt: skip
        self._open_run_dir()

    def _set_up_run(self, parallel: ParallelState | None, prompts: list[str] | None, images: list[str] | None,
                    reward: RewardFn | WeightedReward | None) -> None:  # fmt: skip
        """The layout, the prompts and the reward, checked to agree on every rank; an overwritten run cleared."""
        config = self.config
        self.parallel = parallel or init_world(config)
        self.is_leader = self.parallel.rank == 0
        quiet_followers(self.is_leader)  # one set of progress bars and library warnings: rank 0's
        self._split_decode = config.vae_split if config.parallel_vae and self.parallel.sp > 1 else None
        self._decode_chunk = config.vae_batch or config.grpo.micro_batch
        if prompts is None:
            prompts, images = read_on_every_rank(self.parallel, lambda: read_prompt_file(config.prompts), "the prompts")
        self.prompts = list(prompts)
        self.images: list[str | None] | None = list(images) if images is not None and any(images) else None
        """Each prompt's conditioning image (image-to-video), or None (text-to-video)."""
        check_ranks_agree(self.parallel, [asdict(config), self.prompts, self.images], "settings or prompts")
        if self.images is not None and self.parallel.world_size > 1:  # a path may hold another image elsewhere
            digests = read_on_every_rank(self.parallel, lambda: image_digests(self.images), "the prompts' images")
            check_ranks_agree(self.parallel, digests, "image files (the same paths, other content)")
        if reward is None:
            reward = build_reward(config.reward)
        self.reward = reward if isinstance(reward, WeightedReward) else WeightedReward([("reward", 1.0, reward)])
        make_batch(self.prompts, 0, config.seed, config.grpo, self.parallel)  # validates the batch split early
        if config.overwrite and self.is_leader:
            clear_run(self.output_dir)

    def _load(self, pipeline: Any | None) -> list[Any]:
        """The pipeline (``config.model``'s unless given) and its transformers; returns the prompts (or (prompt,
        image) pairs) that lack an embedding."""
        config = self.config
        source = checkpoint_dir(config.model) if pipeline is None else None
        self._loaded_checkpoint = source is not None
        self._sharded_encoders = False
        self.embeddings = PromptEmbeddings(
            config.embedding_cache or self.output_dir / "embeddings",
            {"model": model_identity(config.model) if pipeline is None else type(pipeline).__name__,
             "max_sequence_length": config.sample.max_sequence_length,
             "negative_prompt": config.sample.negative_prompt if config.sample.guidance > 1 else None}
            | ({"text_encoder_dtype": config.mixed_precision} if config.mixed_precision else {}),
            {"height": config.sample.height, "width": config.sample.width},
        )  # fmt: skip
        class_name = type(pipeline).__name__ if pipeline is not None else pipeline_class_name(config.model)
        policy = policy_named(class_name)
        self._pairs = self.images is not None and policy is not None and policy.prompt_reads_image(class_name)
        """Whether the text is each (prompt, image) pair's (``DiffusersPolicy.prompt_reads_image``): then ``missing``
        lists the pairs whose text is not on disk yet."""
        missing = self._agreed(self.embeddings.missing_pairs(self.prompts, self.images) if self._pairs
                               else self.embeddings.missing(self.prompts))  # fmt: skip
        needs_images = self.images is not None and policy is not None and policy.images_need_text_encoders
        self._missing_images = self._agreed(self.embeddings.missing_images(self.images)) if needs_images else []
        """The images whose text-encoder parts (Motif-Video I2V's SigLIP tokens) are not on disk yet."""
        encode = bool(missing or self._missing_images)
        self._source = source if source is not None and source.is_dir() else None
        if pipeline is None:
            # a checkpoint's text encoders load only if some prompt lacks its embedding, sharded over the world
            # in the compute dtype; the VAE only where it runs (``loads_vae``), and the transformer empty (filled
            # after sharding)
            vae = loads_vae(self.parallel.sp_rank, self._split_decode, self.images is not None,
                            class_name)  # fmt: skip
            without = (() if encode else TEXT_ENCODERS) + (() if vae else ("vae",))
            encoders = (dist.group.WORLD, getattr(torch, config.mixed_precision or "float32")) if encode else None
            pipeline = load_pipeline(config.model, torch.float32, self.parallel.device, empty_transformers=True,
                                     without=without if source is not None else (),
                                     sharded_text_encoders=encoders)  # fmt: skip
            self._sharded_encoders = source is not None and encode
        torch.manual_seed(config.seed)  # identical LoRA initialisation on every rank, however the model loaded
        self._export_class = type(pipeline)
        if self.images is not None:
            pipeline = as_image_to_video(pipeline)  # a T2V checkpoint that is I2V too (SANA-Video, Wan 2.2 TI2V)
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
        return missing

    def _build_policy(self) -> None:
        """The model family's policy, checked against the settings before the model is sharded."""
        config, sample = self.config, self.config.sample
        self.policy: DiffusersPolicy = policy_for(self.pipe)(
            self.pipe, self.experts["transformer"], frames=sample.frames, height=sample.height, width=sample.width,
            guidance=sample.guidance, negative_prompt=sample.negative_prompt,
            max_sequence_length=sample.max_sequence_length, embedded_guidance=sample.embedded_guidance,
            transformer_2=self.experts.get("transformer_2"), guidance_2=sample.guidance_2, device=self.parallel.device,
        )  # fmt: skip
        self.policy.trained_experts = tuple(self.trained)
        self.policy.use_images(self.images is not None)
        if self.policy.takes_images != (self.images is not None):
            raise ConfigError(
                f"{config.model} is an image-to-video model: give a JSONL prompt file with an 'image' per prompt"
                if self.policy.takes_images else
                f"{config.model} is a text-to-video model ({type(self.pipe).__name__}): its prompts take no image"
            )  # fmt: skip
        if self.images is not None:
            self.policy.check_images([image for image in self.images if image is not None])
        sigmas = rollout_sigmas(config.grpo, sde_window_at(config.grpo, 0, config.seed))
        eligible = [t for t in stochastic_steps(config.grpo, sigmas) if self.policy.trains(sigmas[t])]
        if not trained_steps(config.grpo, 0, eligible, sde_window_at(config.grpo, 0, config.seed)):
            raise ConfigError(f"experts {self.trained} run at none of the trained steps (grpo.steps, grpo.shift, "
                              "grpo.sde_window): train another expert or move the steps")  # fmt: skip

    def _parallelize_vae(self) -> None:
        """The VAE decoding split by rows over the SP group (``vae_split: rows``), where it can."""
        if self._split_decode == "rows":
            if vae_plan_of(self.pipe.vae) is None:
                raise ConfigError(f"parallel_vae: {type(self.pipe.vae).__name__} cannot decode split (supported: "
                                  f"{supported_vaes()}); set parallel_vae: false")  # fmt: skip
            parallelize_vae(self.pipe.vae, self.parallel.sp_group, gather_to=0)

    def _build_optimizer(self) -> None:
        """The optimizer, LR schedule, EMA, per-prompt statistics and step counters of a fresh run."""
        config = self.config
        params = [p for p in self.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
        warmup = max(1, config.optim.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))

        self.ema = EMA(self.transformer, config.ema_decay) if config.ema_decay else None
        if config.algorithm == "nft":
            _nft.check_trainer(self)
        self.nft_old = _nft.OldPolicy(self.transformer) if config.algorithm == "nft" else None
        """DiffusionNFT's old (sampling) policy (``algorithm: nft``), or None."""
        """The moving average of the trained weights (``ema_decay``), used by ``evaluate`` and ``export``."""
        self.prompt_stats = PromptStats(config.grpo.stat_tracking) if config.grpo.stat_tracking else None
        """Per-prompt reward statistics across iterations (``grpo.stat_tracking``), or None."""
        self.step_index = 0
        """Iterations done (the next ``step()`` runs iteration ``step_index``)."""
        self.skipped_steps = 0
        """Updates skipped for a non-finite loss or gradient norm, over the whole run."""
        self._skipped_in_a_row = 0

    def _open_run_dir(self) -> None:
        """The run's directory, its ``config.yaml`` and metrics log (after the leader cleared an overwritten run)."""
        if self.parallel.world_size > 1:
            dist.barrier()  # the leader's clearing of an overwritten run is done before anyone writes
        if self.is_leader:
            write_config(self.output_dir, self.config)
        self.metrics = MetricsLog(
            self.output_dir, self.step_index, self.is_leader, self.config.wandb, asdict(self.config)
        )

    def _agreed(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (ranks may look at a shared directory at different moments)."""
        if self.parallel.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _encode_prompts(self, missing: list[Any], free_encoders: bool) -> None:
        """Every prompt's embedding on disk (the ranks share the missing ones), and every image's parts that the text
        encoders compute (``DiffusersPolicy.images_need_text_encoders``), read from there from now on; then the text
        encoders of a loaded checkpoint are dropped."""
        images, embeddings = self._missing_images, self.embeddings
        # (prompt, image) pairs where the prompt encoder reads the image (prompt_reads_image)
        compute = embeddings.compute_pairs if self._pairs else embeddings.compute
        encode = self.policy.encode_pairs if self._pairs else self.policy._encode
        if missing or images:
            parallel = self.parallel
            if self._sharded_encoders:  # collective: every rank encodes every prompt, rank 0 writes the files
                compute(missing, encode, write=self.is_leader)
                embeddings.compute_images(images, self.policy.encoder_image_parts, write=self.is_leader)
            else:  # whole encoders: the ranks share the prompts
                compute(missing[parallel.rank :: parallel.world_size], encode)
                share = images[parallel.rank :: parallel.world_size]
                embeddings.compute_images(share, self.policy.encoder_image_parts)
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
        for key, expert in (("init_from", "transformer"), ("init_from_2", "transformer_2")):
            if getattr(config.lora, key) and expert not in self.trained:
                raise ConfigError(f"lora.{key} starts the adapters of {expert}, which this run does not train "
                                  f"(experts: {self.trained}): drop lora.{key} or train {expert}")  # fmt: skip
        for name, transformer in self.experts.items():
            trained = name in self.trained
            if trained and config.lora.rank:
                add_lora(transformer, config.lora.rank, config.lora.alpha)
                start = config.lora.init_from_2 if name == "transformer_2" else config.lora.init_from
                if start:  # the adapters as that LoRA has them (a resume then restores the checkpoint's)
                    key = "lora.init_from_2" if name == "transformer_2" else "lora.init_from"
                    init_adapters(transformer, self._export_class, start, config.lora.alpha or config.lora.rank, key)
            elif not trained:
                transformer.requires_grad_(False)
            parallelize(transformer, parallel, gather_grad="sum")
            if config.activation_checkpointing and trained:
                transformer.enable_gradient_checkpointing()
            shard_model(transformer, parallel, hsdp=config.hsdp, param_dtype=compute_dtype)
            if has_meta_parameters(transformer):
                load_shards(transformer, transformer.weights_dir, parallel.device)
        if config.grpo.kl_coef or config.nft.kl_coef:
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
        return _nft.collect(self, step) if self.config.algorithm == "nft" else collect(self, step)

    def step(self) -> dict[str, Any]:
        """One iteration (roll out, score, update), logged; returns its metrics row (collective)."""
        return _step.step(self)

    def train(self) -> list[dict[str, Any]]:
        """Steps until ``max_steps`` with periodic checkpoints, then a final checkpoint and the export to
        ``OUTPUT_DIR/final``; rank 0 shows a progress bar and prints a line per step (``step_line``).
        Returns the metrics rows of the whole run (on rank 0; empty elsewhere)."""
        from tqdm import tqdm

        config = self.config
        bar = tqdm(total=config.max_steps, initial=self.step_index, disable=not self.is_leader, desc="GRPO")
        while self.step_index < config.max_steps:
            row = self.step()
            bar.update()
            if self.is_leader:  # one line per step, above the bar, numbered like metrics.jsonl
                video = _evaluate.video_name(row["step"]) if row.get("eval_reward") is not None else None
                bar.write(step_line(row, video), file=sys.stdout)
                sys.stdout.flush()
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
        return _resume.save(self)

    def _averaged(self):
        """The weights evaluation and export use: the EMA's inside the block when there is one."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

    def evaluate(self, path: str | Path | None = None) -> float:
        """ODE samples of the first ``eval_prompts`` prompts from fixed noise: their mean reward (the same on
        every rank), and, if ``path`` is given, a video of them side by side written by rank 0. Touches no
        training RNG (collective)."""
        return _evaluate.evaluate(self, path)

    def export(self, path: str | Path) -> Path:
        """The trained weights (their EMA, with ``ema_decay``) as a diffusers pipeline directory (LoRA
        merged), loadable by ``load_pipeline`` and ``python -m pipelines.generate --model PATH``
        (collective). Written to ``PATH.tmp``, checked to load, then renamed (replacing an earlier export
        of this run)."""
        return _export.export(self, path)


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
