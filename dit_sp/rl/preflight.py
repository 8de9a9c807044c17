"""The checks of a training run that need no weights and no workers (``check_before_loading``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError, require_package
from dit_sp.io.prompts import read_prompt_file
from dit_sp.io.video import check_writable
from dit_sp.parallel import ParallelConfig
from dit_sp.rl.batch import check_split
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.rundir import check_output_dir
from dit_sp.train.lora_io import lora_file


def check_before_loading(config: TrainConfig, world_size: int) -> None:
    """Everything that can be checked from files alone before weights load or workers start: the output
    directory (a run in it, and that it takes a file: read-only or full), the prompts, the optional packages
    the settings need, the model directory's files, the reward names, the sample size against the model's
    config files, and the split of a step's samples over the layout's data-parallel ranks (``ConfigError``
    naming the setting or file)."""
    from dit_sp.rl.rewards import check_reward
    from dit_sp.zoo import check_checkpoint, check_shape_from_files

    check_output_dir(config)
    check_writable(Path(config.output_dir) / "config.yaml", "output_dir")
    if config.embedding_cache:
        check_writable(Path(config.embedding_cache) / "embedding.pt", "embedding_cache")
    images = any(read_prompt_file(config.prompts)[1])
    check_packages(config)
    for key in ("init_from", "init_from_2"):
        if getattr(config.lora, key):
            lora_file(getattr(config.lora, key), f"lora.{key}")  # a MissingFileError before any worker starts
    check_checkpoint(config.model)
    check_reward(config.reward, config.sample.frames)
    info = check_shape_from_files(config.model, asdict(config.sample), flags=False)
    check_ring(config, info)
    check_policy(config, info, images)
    check_split(config.grpo, ParallelConfig.for_world(world_size, ring=config.ring, ulysses=config.ulysses).dp)


def check_ring(config: TrainConfig, info: Any | None) -> None:
    """A ring that the model's family refuses for its transformer's config (``ModelFamily.ring_refusal``: Kandinsky
    5's NABLA checkpoints), refused from the config files (``info``: ``dit_sp.zoo.shape_info``) before loading."""
    from dit_sp.families import ring_refusal
    from dit_sp.zoo import pipeline_class_name

    if config.ring > 1:  # without readable config files, the family's refusals that need none still apply
        transformer = info.transformer.config if info is not None else {}
        why = ring_refusal(transformer, pipeline=pipeline_class_name(config.model) or "")
        if why:
            raise ConfigError(f"ring {config.ring} for {config.model}: {why}")


def check_policy(config: TrainConfig, info: Any | None, images: bool = False) -> str | None:
    """A pipeline GRPO does not train (``ModelFamily.policy_refused``) and the settings the model's GRPO policy refuses
    (``DiffusersPolicy.check_settings``: ChronoEdit's 5 frames, ...), from its pipeline class and VAE factors
    (``info``: ``dit_sp.zoo.shape_info``) before loading. With ``images`` (the prompt file gives them), the pipeline
    class is the one the trainer runs the model as with images (``dit_sp.zoo.image``: SANA-Video 2B's
    ``SanaVideoPipeline`` as ``SanaImageToVideoPipeline``). Returns that class's name (None where unknown)."""
    import diffusers

    from dit_sp.families import policy_named, policy_refusal
    from dit_sp.zoo import pipeline_class_name

    name = pipeline_class_name(config.model, image=images)
    refusal = policy_refusal(name)
    if refusal is not None:
        raise ConfigError(refusal)
    policy, pipeline = policy_named(name), getattr(diffusers, name or "", None)
    if policy is not None and pipeline is not None and info is not None:
        policy.check_settings(pipeline, config.sample.frames, info.vae_scale_factor_temporal)
    return name


def check_packages(config: TrainConfig) -> None:
    """The optional packages the settings need are installed (``MissingPackageError`` with the pip command):
    peft for LoRA, wandb for W&B logging."""
    if config.lora.rank > 0:
        require_package("peft", "LoRA (lora.rank > 0)", "lora")
    if config.wandb is not None:
        require_package("wandb", "W&B logging (the wandb setting)", "tracking")
