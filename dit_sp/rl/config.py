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
from typing import Any, ClassVar, Literal

from dit_sp.io.schema import SEED_RANGE, allow_inf, check_ranges, from_mapping, load_yaml, merge, setting
from dit_sp.rl.grpo_config import GRPOConfig
from dit_sp.rl.metrics import WandbConfig
from dit_sp.rl.nft_config import NFTConfig, check_algorithm


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

    UNTRAINED: ClassVar[dict[str, str]] = dict.fromkeys(
        ("ar_step", "overlap_history", "base_num_frames"),
        "GRPO trains SkyReels-V2 diffusion forcing synchronously in one chunk (ar_step 0, no overlap_history: every "
        "latent frame at the same noise level, one trajectory from pure noise); ar_step > 0 puts the frames at "
        "different noise levels and a longer video is generated chunk by chunk on the previous chunk's frames; drop it",
    )
    """Pipeline settings a GRPO config may not give, each with why (``from_mapping`` refuses them by name)."""

    def __post_init__(self) -> None:
        check_ranges(self, frames=">= 1", height=">= 1", width=">= 1", max_sequence_length=">= 1",
                     guidance="finite", guidance_2="finite", embedded_guidance="finite")  # fmt: skip


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over this many steps."""
    max_grad_norm: float = allow_inf(1.0)
    """Clip the gradient's norm to this (``.inf``: measure it, never clip)."""

    def __post_init__(self) -> None:
        check_ranges(self, lr="> 0", weight_decay=">= 0", warmup_steps=">= 0", max_grad_norm="> 0")


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 0
    """LoRA rank of the attention projections; 0 trains all weights."""
    alpha: float | None = None
    """LoRA scaling numerator (default: the rank)."""
    init_from: str | None = None
    """Start the adapters of ``transformer`` from this diffusers LoRA (a directory holding
    ``pytorch_lora_weights.safetensors``, or the file; its rank and alpha must be ``rank`` and ``alpha``)."""
    init_from_2: str | None = None
    """The same for a two-expert model's ``transformer_2`` (Wan 2.2 A14B's low-noise expert)."""

    def __post_init__(self) -> None:
        check_ranges(self, rank=(">= 0", "0: full fine-tuning"), alpha="> 0")
        if (self.init_from or self.init_from_2) and not self.rank:
            raise ValueError("lora.init_from starts LoRA adapters from a file, and lora.rank 0 trains all weights "
                             "without adapters: set lora.rank to the LoRA's rank")  # fmt: skip


@dataclass(frozen=True)
class TrainConfig:
    model: str = setting("tiny-wan", "a built-in model name or a local diffusers pipeline directory")
    """A built-in model name (``dit_sp.zoo.builtin_models()``) or a local diffusers pipeline directory."""
    prompts: str = setting("prompts_demo.txt", "a .txt (a prompt per line) or .jsonl file, or a bundled one's name")
    """A .txt (one prompt per line) or .jsonl (``{"prompt": ...}``) file; bundled prompt files by name."""
    reward: Any = "brightness"
    """A reward name, ``{name: weight, ...}`` or a list of ``{name, weight, **options}`` (``build_reward``)."""
    output_dir: str = setting("outputs/grpo", "where metrics, checkpoints and the final export go")
    max_steps: int = setting(20, "GRPO iterations")
    checkpoint_every: int = setting(10, "checkpoint every N steps (0: only at the end)")
    eval_every: int = setting(0, "eval videos and eval_reward every N steps (0: never)")
    """Every N steps: ODE samples of the first ``eval_prompts`` prompts (video + ``eval_reward`` metric)."""
    eval_prompts: int = 4
    resume: bool = setting(False, "continue the run in --output-dir from its newest checkpoint")
    """Continue the run in ``output_dir`` from its newest complete checkpoint (on any layout)."""
    overwrite: bool = setting(False, "replace the run in --output-dir")
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
    seed: int = setting(0, "run seed")
    dp: int | None = setting(None, "data-parallel degree (default: the processes left after ring x ulysses)")
    ring: int = setting(1, "ring-attention degree of a sample")
    ulysses: int = setting(1, "Ulysses (head all-to-all) degree of a sample")
    collective_timeout: float = setting(
        600.0,
        "seconds a collective waits for a slow or lost peer before the run "
        "fails; raise it if one rank may work alone longer (loading, saving)",
    )
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
    algorithm: Literal["grpo", "nft"] = "grpo"
    """``grpo``: SDE rollouts and the clipped policy-ratio loss; ``nft``: DiffusionNFT, ODE rollouts and a
    forward-process loss (``nft``; ``dit_sp.rl.nft``, docs/nft.md), with the rollout settings of ``grpo``."""
    sample: SampleConfig = field(default_factory=SampleConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)

    def __post_init__(self) -> None:
        check_ranges(self, vae_batch=(">= 1", "or null: the micro-batch"), ring=">= 1", ulysses=">= 1", dp=">= 1",
                     eval_prompts=">= 1", max_steps=">= 0", checkpoint_every=">= 0", eval_every=">= 0",
                     max_skipped_steps=">= 0", ema_decay=("[0, 1)", "0: no EMA"), seed=SEED_RANGE,
                     collective_timeout="finite")  # fmt: skip
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run, or replace it")
        if self.vae_split == "samples" and not self.parallel_vae:
            raise ValueError("vae_split: samples splits the decode over the SP ranks, and parallel_vae: false "
                             "decodes on the first rank alone: drop one of them")  # fmt: skip
        check_algorithm(self)

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
        """A YAML file (a path or a bundled config name), then ``overrides`` by key or dotted key
        (``{"optim.lr": 1e-4, "ulysses": 2}``). An override changes only what it names: a section given as a
        mapping (``{"grpo": {"group_size": 4}}``) merges into the file's, key by key; lists and the ``reward``
        spec replace (``dit_sp.io.schema.merge``)."""
        from dit_sp.io.bundled import config_path

        values = merge(cls, load_yaml(config_path(path)) if path is not None else {}, overrides or {})
        return cls.from_dict(values, where=str(path) if path is not None else "config")
