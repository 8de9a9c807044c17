"""The settings of a GRPO training run: one typed tree, read from YAML and flags by ``dit_sp.io.schema``.
A YAML config holds the top-level keys and a mapping for each nested section, e.g.::

    model: toy-wan
    prompts: toy_prompts_train.txt
    reward: {dense_faithfulness: 1.0}
    sample: {frames: 9, height: 32, width: 32, guidance: 1.0}
    grpo: {steps: 10, shift: 2.0, group_size: 16, sde: {kind: flow, a: 0.7}, sde_window: [0, 2]}
    optim: {lr: 3.0e-4}
    lora: {rank: 8}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dit_sp.io.schema import from_mapping, load_yaml, set_dotted
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.metrics import WandbConfig


@dataclass(frozen=True)
class SampleConfig:
    """What one rollout video is: its size and the pipeline's conditioning settings."""

    frames: int = 5
    height: int = 32
    width: int = 32
    guidance: float = 1.0
    """Classifier-free guidance scale (<= 1: off; both branches run as one batch)."""
    guidance_2: float | None = None
    """Wan 2.2 A14B: the guidance of the low-noise expert (``transformer_2``); default ``guidance``."""
    embedded_guidance: float | None = None
    """HunyuanVideo's distilled guidance (default 6.0); other families have none."""
    negative_prompt: str = ""
    max_sequence_length: int = 16
    """Text tokens of a prompt."""

    def __post_init__(self) -> None:
        for name in ("frames", "height", "width", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over this many steps."""
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.weight_decay < 0 or self.warmup_steps < 0 or self.max_grad_norm <= 0:
            raise ValueError(
                f"lr and max_grad_norm must be > 0, weight_decay and warmup_steps >= 0; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, warmup_steps={self.warmup_steps}, "
                f"max_grad_norm={self.max_grad_norm}"
            )


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 0
    """LoRA rank of the attention projections; 0 trains all weights."""
    alpha: float | None = None
    """LoRA scaling numerator (default: the rank)."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank must be >= 0 (0: full fine-tuning), got {self.rank}")


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny-wan"
    """A built-in model name (``dit_sp.zoo.builtin_models()``) or a local diffusers pipeline directory."""
    prompts: str = "prompts_demo.txt"
    """A .txt (one prompt per line) or .jsonl (``{"prompt": ...}``) file; bundled prompt files by name."""
    reward: Any = "brightness"
    """A reward name, ``{name: weight, ...}`` or a list of ``{name, weight, **options}`` (``build_reward``)."""
    output_dir: str = "outputs/grpo"
    max_steps: int = 20
    checkpoint_every: int = 10
    eval_every: int = 0
    """Every N steps: ODE samples of the first ``eval_prompts`` prompts (video + ``eval_reward`` metric)."""
    eval_prompts: int = 4
    resume: bool = False
    """Continue the run in ``output_dir`` from its newest complete checkpoint (on any layout)."""
    overwrite: bool = False
    """Replace the run in ``output_dir``; without it (or ``resume``) an existing run there is an error."""
    allow_change: list[str] = field(default_factory=list)
    """Settings (dotted keys, e.g. ``optim.lr``) a ``resume`` may change from the run's; any other change is
    refused, and those that change what a checkpoint holds always are (``dit_sp.rl.rundir``). An allowed
    change is recorded in ``OUTPUT_DIR/config_changes.jsonl`` with the step it took effect."""
    max_skipped_steps: int = 3
    """Stop with an error after this many updates in a row were skipped for a non-finite loss or gradient."""
    embedding_cache: str | None = None
    """Directory of the prompt embeddings (one file per prompt, keyed by model, prompt and text settings;
    default ``OUTPUT_DIR/embeddings``): computed once, then the text encoder is freed. Share one between runs.
    A pipeline passed to ``GRPOTrainer`` is keyed by its class only: clear the directory if you change its
    text encoder."""
    seed: int = 0
    dp: int | None = None
    """Data-parallel degree; by default the processes left after ring x ulysses."""
    ring: int = 1
    ulysses: int = 1
    hsdp: bool = False
    """Shard over the SP ranks of a sample and replicate across dp, instead of sharding over all ranks."""
    activation_checkpointing: bool = False
    mixed_precision: Literal["bfloat16", "float16"] | None = None
    """Compute dtype of FSDP2 mixed precision (GPUs); ``None`` computes in fp32."""
    experts: list[str] | None = None
    """Which transformers of a two-expert model train (Wan 2.2 A14B: ``transformer`` for the high noise
    levels, ``transformer_2`` for the low ones); default all. The others stay frozen, but still run in the
    rollouts wherever the stock pipeline would run them."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the trained weights (e.g. 0.99; 0: off), used for evaluation and
    export, and checkpointed with the run."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases (``{project, name, mode}``; offline by default), beside JSONL and
    TensorBoard; evaluation videos go to its media panel."""
    parallel_vae: bool = True
    """Decode the rollouts split over a sample's SP ranks (``vae_split``), the frames assembled on the first,
    where the rewards are computed; off, the first rank decodes alone."""
    vae_split: Literal["rows", "samples"] = "rows"
    """How ``parallel_vae`` splits: ``rows``, each frame's rows (``dit_sp.parallelize_vae``: a decode's
    activation memory divided over the SP ranks, for high resolutions); ``samples``, whole videos, each rank
    its share of the batch (no halo exchange: faster for many small videos), which it also scores (only the
    scores travel)."""
    vae_batch: int | None = None
    """Videos per VAE decode call (a decode's activations follow it, not the samples per step); ``None``: the
    micro-batch (``grpo.micro_batch``, or a rank's whole batch). Many small videos decode fastest in moderate
    chunks (the toy model: 32)."""
    sample: SampleConfig = field(default_factory=SampleConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        if self.vae_batch is not None and self.vae_batch < 1:
            raise ValueError(f"vae_batch must be >= 1 (or null: the micro-batch), got {self.vae_batch}")
        for name in ("ring", "ulysses", "eval_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run, or replace it")
        for name in ("max_steps", "checkpoint_every", "eval_every", "max_skipped_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) (0: no EMA), got {self.ema_decay}")
        if self.dp is not None and self.dp < 1:
            raise ValueError(f"dp must be >= 1, got {self.dp}")
        if self.vae_split == "samples" and not self.parallel_vae:
            raise ValueError("vae_split: samples splits the decode over the SP ranks, and parallel_vae: false "
                             "decodes on the first rank alone: drop one of them")  # fmt: skip

    @property
    def world_size(self) -> int:
        """Processes a local launch starts: ``dp * ring * ulysses``."""
        return (self.dp or 1) * self.ring * self.ulysses

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, where: str = "config") -> TrainConfig:
        """A config from a (nested) mapping, every key and type checked (``dit_sp.io.schema.ConfigError``)."""
        return from_mapping(cls, values, where=where)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """A YAML file (a path or a bundled config name), then ``overrides`` by dotted key
        (``{"optim.lr": 1e-4, "ulysses": 2}``)."""
        from dit_sp.io.bundled import config_path

        values = load_yaml(config_path(path)) if path is not None else {}
        for key, value in (overrides or {}).items():
            set_dotted(values, key, value)
        return cls.from_dict(values, where=str(path) if path is not None else "config")
