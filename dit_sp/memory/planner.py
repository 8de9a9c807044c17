"""Memory planning before the OOM: what each GPU holds for a GRPO run (or weight-sharded sampling) on a
layout, per component, and whether it fits.

The transformers are built on the meta device from the real checkpoints' configs (``ARCHITECTURES``, or a
local checkpoint's ``config.json``), so parameter counts and block sizes are exact. Activations follow a
per-token model measured on this machine (``activation_bytes``): a transformer block saves about
``24 * dim + 2 * ffn`` values per token for backward (attention inputs and outputs, norms, modulation,
the MLP's two wide tensors), checked against the peak memory of real forward/backward passes.

    plan = plan_training(TrainConfig.load("grpo_hunyuanvideo"), gpus=32, gpu_memory_gb=80)
    print(plan.report())
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_sp.families import TRANSFORMERS, architectures, family_named, ring_refusal
from dit_sp.memory.advice import advise_plan

if TYPE_CHECKING:
    from dit_sp.parallel.state import ParallelState

GiB = 2**30

SAVED_PER_TOKEN = {"dim": 24, "ffn": 2}
"""Values one transformer block saves per token for backward, per unit of width and of MLP width
(measured with saved-tensor hooks on WanTransformer3DModel blocks of several widths, fp32, CPU)."""

HEAD_LAYOUT_SAVED = 4
"""Of those values, the ones in the attention's head layout: q, k, v and the attention's output. Under Ulysses a
rank holds ``ceil(H / U)`` heads of every token of its ring block (``ulysses.padded_heads``: a head group short of
heads is zero-padded), so per token of its share these 4 take the padded width ``ceil(H / U) U x head_dim``, not
``dim`` (``TransformerShape.attention_width``)."""

EXCHANGE_PER_TOKEN = 10
"""Ulysses' working set inside one attention, per token of a rank's share and unit of the padded width: q, k and v's
send and receive buffers (6), the output and its buffers back (3), and one buffer a collective's thread may still
hold when the next is made (1). Measured as live tensor bytes of ``usp_attention`` on Ulysses 2
(``tests/memory/test_padded_heads.py``): 9 at 4 heads; at 3 heads padded to 4, 8.25 and, on a loaded machine, 9.25;
7.5 at 1 head padded to 2."""

ARCHITECTURES: dict[str, dict[str, Any]] = architectures()
"""The real checkpoints' transformer configs (their ``config.json``), text-encoder and VAE parameter counts
(approximate), VAE compression (temporal, spatial) and text length: each family's ``architectures``."""


@dataclass
class TransformerShape:
    """What memory planning needs of one transformer: exact counts from a meta-device build."""

    params: int
    block_params: int
    layers: int
    dim: int
    ffn: int
    heads: int
    patch: tuple[int, int, int]
    stream_blocks: int = 0
    """Blocks that attend over ``streams`` split copies of the video and no text (Motif-Video's decoder layers,
    ``ModelFamily.stream_modules``): they hold ``streams`` x the video's tokens."""
    streams: int = 1

    def padded_heads(self, ulysses: int) -> int:
        """The heads Ulysses ``ulysses`` runs: ``ceil(H / U) U`` (``dit_sp.attention.ulysses.padded_heads``)."""
        return -(-self.heads // ulysses) * ulysses

    def attention_width(self, ulysses: int) -> int:
        """Values per token of a rank's share in the attention's head layout: the padded heads x head_dim."""
        return self.padded_heads(ulysses) * (self.dim // self.heads)

    @classmethod
    def of(cls, class_name: str, config: dict[str, Any]) -> TransformerShape:
        """Counted once per config (a plan's advice plans again, and a meta build of 13 B parameters takes seconds)."""
        key = (class_name, json.dumps(config, sort_keys=True, default=str))
        if key not in _SHAPES:
            _SHAPES[key] = cls._count(class_name, config)
        return _SHAPES[key]

    @classmethod
    def _count(cls, class_name: str, config: dict[str, Any]) -> TransformerShape:
        from dit_sp.train.fsdp import BLOCK_LISTS

        model = _meta_model(class_name, config)
        # (Cosmos-Transfer2.5's ControlNet holds its blocks as control_blocks)
        blocks = [b for name in (*BLOCK_LISTS, "control_blocks") for b in getattr(model, name, [])]
        if "num_attention_heads" in config:  # Cosmos 3: a Qwen-style head_dim (its heads x head_dim may differ from
            # hidden_size: the attention's width is what its activations take)
            heads = config["num_attention_heads"]  # Sana-WM: its linear attention's head (hidden_size / heads)
            head_dim = config.get("attention_head_dim") or config.get("linear_head_dim") or config["head_dim"]
        elif "num_heads" in config:  # Wan-Animate-2: the original Wan names (num_heads over dim)
            heads, head_dim = config["num_heads"], config["dim"] // config["num_heads"]
        else:  # Kandinsky 5: the width is model_dim, a head the rotary axes' sum
            head_dim = sum(config["axes_dims"])
            heads = config["model_dim"] // head_dim
        dim = heads * head_dim
        ffn = (config.get("ffn_dim") or config.get("ff_dim") or config.get("intermediate_size")
               or int(config.get("mlp_ratio", 4.0) * dim))  # fmt: skip
        size = config.get("patch_size", config.get("latent_patch_size", 2))
        patch = tuple(size) if isinstance(size, (list, tuple)) else (config.get("patch_size_t") or 1, size, size)
        family = family_named(class_name)
        streams = family.stream_modules(model) if family is not None else {}
        return cls(params=sum(p.numel() for p in model.parameters()),
                   block_params=max(sum(p.numel() for p in b.parameters()) for b in blocks), layers=len(blocks),
                   dim=dim, ffn=ffn, heads=heads, patch=patch, stream_blocks=len(streams),
                   streams=max(streams.values(), default=1))  # fmt: skip


_SHAPES: dict[tuple[str, str], TransformerShape] = {}
_REFUSALS: dict[tuple[str, str, int, int], str] = {}
"""``ulysses_refusal``'s answers (the advice tries many layouts of one model, each a meta model to build)."""


def layout_state(ring: int, ulysses: int) -> ParallelState:
    """A ``ParallelState`` of rank 0 of these degrees with no process groups: what a family's ``layout_check`` reads
    (the degrees), to check a layout before any process starts. Not for running collectives."""
    import torch

    from dit_sp.parallel import ParallelConfig
    from dit_sp.parallel.state import ParallelState

    groups = dict.fromkeys(("mesh", "dp_group", "cfg_group", "ring_group", "ulysses_group", "sp_group"))
    ranks = dict.fromkeys(("rank", "dp_rank", "cfg_rank", "ring_rank", "ulysses_rank"), 0)
    return ParallelState(ParallelConfig(ring=ring, ulysses=ulysses), torch.device("cpu"), sample_group=None,
                         **groups, **ranks)  # fmt: skip


def ulysses_refusal(class_name: str, config: dict[str, Any], ring: int, ulysses: int) -> str:
    """Why ``parallelize`` would refuse this layout of the transformer (its family's ``layout_check``, run on the model
    built on meta with a stand-in ``ParallelState`` of these degrees: Sana-WM's scans refuse a Ulysses degree that
    leaves the last rank no head); empty where it accepts it. Any other Ulysses degree is accepted: heads it does not
    divide are zero-padded (``padding_note``)."""
    family = family_named(class_name)
    if family is None or family.layout_check is type(family).__dataclass_fields__["layout_check"].default:
        return ""
    key = (class_name, json.dumps(config, sort_keys=True, default=str), ring, ulysses)
    if key not in _REFUSALS:
        try:
            family.layout_check(_meta_model(class_name, config), layout_state(ring, ulysses))
            _REFUSALS[key] = ""
        except (NotImplementedError, ValueError) as e:
            _REFUSALS[key] = str(e)
    return _REFUSALS[key]


def padding_note(shape: TransformerShape, ulysses: int) -> str:
    """What padding the heads costs on Ulysses ``ulysses`` ("ulysses 8 pads 12 heads to 16 ...: 33% more attention
    work"); empty where ``ulysses`` divides the heads."""
    padded = shape.padded_heads(ulysses)
    if padded == shape.heads:
        return ""
    idle = ulysses - -(-shape.heads // (padded // ulysses))  # ranks past the last real head
    return (f"ulysses {ulysses} pads {shape.heads} heads to {padded} ({padded // ulysses} a rank): "
            f"{round(100 * (padded - shape.heads) / shape.heads)}% more attention work"
            + (f", and {idle} of its ranks hold padding only" if idle else ""))  # fmt: skip


def _meta_model(class_name: str, config: dict[str, Any]) -> Any:
    """The diffusers model ``class_name`` built from ``config`` with its parameters on the meta device (no memory)."""
    import diffusers
    import torch

    from dit_sp.weights import parameters_on_meta

    with parameters_on_meta(), torch.device("meta"):
        return getattr(diffusers, class_name).from_config(config)


def tokens(shape: TransformerShape, frames: int, height: int, width: int, compression: tuple[int, ...]) -> int:
    """Video tokens of one sample: latent frames x the patch grid. ``compression``: the VAE's ``(temporal, spatial)``,
    or ``(temporal, spatial, clip, kept)`` for a VAE that encodes clips of ``clip`` frames to ``kept`` latent frames
    after ``kept`` leading ones (MiniMax-H3: ``17 n + 5`` frames, the count rounded up to that, to ``5 n + 2``)."""
    temporal, spatial, *clips = compression
    if clips:
        clip, kept = clips
        latent_frames = math.ceil(max(frames - kept, 0) / clip) * kept + 2
    else:
        latent_frames = (frames - 1) // temporal + 1
    pt, ph, pw = shape.patch
    return math.ceil(latent_frames / pt) * (height // spatial // ph) * (width // spatial // pw)


IMAGE_ENCODER = "image encoder"
"""An image-to-video architecture's image encoder (``image_encoder`` parameters: HunyuanVideo-1.5 I2V's SigLIP), in the
compute dtype, whole on every rank, never freed (the trainer frees ``dit_sp.zoo.TEXT_ENCODERS`` only)."""


def conditioning_tokens(spec: dict[str, Any], max_sequence_length: int | None = None, policy: bool = False) -> int:
    """Tokens every block carries jointly beside the video (replicated on every rank); 0 where text enters by
    cross-attention: the text (``text_tokens``, and a second encoder's ``text_tokens_2``, each capped at
    ``max_sequence_length``), an image encoder's ``image_tokens`` (HunyuanVideo-1.5 I2V's 729 SigLIP tokens) and
    ``masked_image_tokens``: all-zero image tokens a text-to-video pipeline passes, which the transformer masks out but
    carries through every block like the text's padding (HunyuanVideo-1.5 T2V's 729); ``policy``: the GRPO policy's
    count of those, one (``HunyuanVideo15Policy``)."""
    if not spec["joint"]:
        return 0
    cap = max_sequence_length or spec["text_tokens"] + spec.get("text_tokens_2", 0)
    masked = min(1, spec.get("masked_image_tokens", 0)) if policy else spec.get("masked_image_tokens", 0)
    text = min(cap, spec["text_tokens"]) + min(cap, spec.get("text_tokens_2", 0))
    return text + spec.get("image_tokens", 0) + masked


def block_values(shape: TransformerShape, ulysses: int = 1) -> int:
    """Values one block saves per token of a rank's share: ``SAVED_PER_TOKEN``, its ``HEAD_LAYOUT_SAVED`` head-layout
    tensors at the padded width where Ulysses pads the heads."""
    plain = SAVED_PER_TOKEN["dim"] * shape.dim + SAVED_PER_TOKEN["ffn"] * shape.ffn
    return plain + HEAD_LAYOUT_SAVED * (shape.attention_width(ulysses) - shape.dim)


def exchange_bytes(shape: TransformerShape, ulysses: int, tokens_per_rank: int, sequences: int,
                   element_bytes: int) -> int:  # fmt: skip
    """Ulysses' all-to-all buffers of one attention on a rank (``EXCHANGE_PER_TOKEN`` at the padded width); 0 without
    Ulysses. One attention at a time: counted once, not per block."""
    if ulysses == 1:
        return 0
    return EXCHANGE_PER_TOKEN * shape.attention_width(ulysses) * tokens_per_rank * sequences * element_bytes


def stream_tokens(shape: TransformerShape, video_per_rank: int) -> int:
    """Tokens a rank holds in a block over several split streams of the video (``shape.stream_blocks``)."""
    return shape.streams * video_per_rank


def activation_bytes(shape: TransformerShape, tokens_per_rank: int, sequences: int, element_bytes: int,
                     checkpointing: bool, *, ulysses: int = 1, streamed: int | None = None) -> int:  # fmt: skip
    """Peak activation memory of one forward + backward on a rank: the values saved for backward, by all
    blocks, or with activation checkpointing each block's input plus the one block being recomputed
    (backward frees saved values as fast as its gradients need room: measured, the peak is the saved set).
    ``ulysses``: the head-layout values at the padded width (``block_values``). ``streamed``: the tokens a rank holds
    in each of ``shape.stream_blocks`` blocks over several streams of the video (``stream_tokens``; Motif-Video's
    decoder layers: its two split copies of the video, no text), default ``tokens_per_rank``."""
    streamed = tokens_per_rank if streamed is None else streamed
    per_token = block_values(shape, ulysses) * element_bytes * sequences
    tokens = (shape.layers - shape.stream_blocks) * tokens_per_rank + shape.stream_blocks * streamed
    if checkpointing:
        return shape.dim * element_bytes * sequences * tokens + per_token * max(tokens_per_rank, streamed)
    return per_token * tokens


@dataclass
class Plan:
    """Bytes per GPU by component, for one layout: while training (or sampling) and at set-up, where the
    text encoders are loaded to encode the prompts before the transformer fills."""

    what: str
    layout: dict[str, int]
    components: dict[str, int] = field(default_factory=dict)
    setup: dict[str, int] = field(default_factory=dict)
    gpu_bytes: int = 80 * GiB
    advice: list[str] = field(default_factory=list)
    """What would lower the peak, each with the peak it gives (``dit_sp.memory.advice``); empty when it fits."""
    notes: list[str] = field(default_factory=list)
    """What the layout costs beyond memory (``padding_note``: the heads Ulysses pads)."""

    @property
    def peak(self) -> int:
        return max(sum(self.components.values()), sum(self.setup.values()))

    @property
    def fits(self) -> bool:
        return self.peak <= 0.9 * self.gpu_bytes  # 10% for the allocator's fragmentation and CUDA context

    @property
    def peak_phase(self) -> str:
        """When the peak happens: ``"set-up"`` (prompts being encoded) or ``"training"``."""
        return "set-up" if sum(self.setup.values()) > sum(self.components.values()) else "training"

    @property
    def peak_component(self) -> str:
        """The largest component of the peak's phase (e.g. the text encoder at set-up, or activations)."""
        parts = self.setup if self.peak_phase == "set-up" else self.components
        return max(parts, key=parts.__getitem__)

    def report(self) -> str:
        layout = " x ".join(f"{k} {v}" for k, v in self.layout.items())
        lines = [f"{self.what} on {layout}: per GPU", *(f"  ({note})" for note in self.notes)]
        for title, parts in (("while training" if "GRPO" in self.what else "while sampling", self.components),
                             ("at set-up (before the transformer fills)", self.setup)):  # fmt: skip
            if parts:
                lines.append(f"  {title}: {sum(parts.values()) / GiB:.1f} GiB")
                lines += [f"    {name:<48}{value / GiB:8.2f} GiB" for name, value in parts.items()]
        parts = self.setup if self.peak_phase == "set-up" else self.components
        verdict = "fits" if self.fits else "does NOT fit"
        short = self.peak_component.split(" (")[0]
        lines.append(f"  peak {self.peak / GiB:.1f} GiB at {self.peak_phase}, mostly the {short} "
                     f"({parts[self.peak_component] / GiB:.1f} GiB), of {self.gpu_bytes / GiB:.0f} GiB "
                     f"(90% usable): {verdict}")  # fmt: skip
        if self.advice:
            lines.append(f"  to lower the {self.peak_phase} peak ({short}):")
            lines += [textwrap.fill(line, 112, initial_indent="    - ", subsequent_indent="      ")
                      for line in self.advice]  # fmt: skip
        return "\n".join(lines)


def architecture(model: str, name: str | None = None) -> dict[str, Any]:
    """The architecture of a local checkpoint directory (its config files) or of ``name`` (or the
    ``ARCHITECTURES`` key found in the model path, e.g. ``Wan2.1-T2V-14B``)."""
    if name is None:
        path = Path(model)
        if (path / "model_index.json").is_file():
            return _from_directory(path)
        name = architecture_name(model)
        if name is None:
            from dit_sp.errors import ConfigError

            raise ConfigError(f"cannot tell the architecture of {model!r}: pass --arch, one of {list(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def architecture_name(model: str) -> str | None:
    """The ``ARCHITECTURES`` key in the name of ``model`` (a path or name: ``Wan2.1-T2V-14B-Diffusers``), the longest
    found (HunyuanVideo-1.5's ``480p_i2v`` over ``hunyuanvideo``), or whose ``names`` are the whole name (``LTX-2``)."""
    lowered = Path(model).name.lower().replace("-diffusers", "")
    found = [key for key, arch in ARCHITECTURES.items() if key in lowered or key.replace("-t2v", "") in lowered
             or lowered in arch.get("names", ())]  # fmt: skip
    return max(found, key=lambda key: len(key if key in lowered else key.replace("-t2v", "")), default=None)


def _from_directory(path: Path) -> dict[str, Any]:
    index = json.loads((path / "model_index.json").read_text())
    transformers = {}
    for name in TRANSFORMERS:
        if (index.get(name) or [None])[0] is not None:
            config = json.loads((path / name / "config.json").read_text())
            transformers[name] = (config.pop("_class_name"), {k: v for k, v in config.items() if not k.startswith("_")})
    sizes = {}
    for name in ("text_encoder", "text_encoder_2", "vae"):
        files = list((path / name).glob("*.safetensors")) if (path / name).is_dir() else []
        sizes[name] = sum(f.stat().st_size for f in files) / 4  # parameters, taking the files as fp32
    pipeline = index.get("_class_name", "")
    joint = "Hunyuan" in pipeline or "CogVideoX" in pipeline
    text = sizes["text_encoder"] + sizes["text_encoder_2"]
    return {"transformers": transformers, "text_encoders": text, "vae": sizes["vae"], "compression": (4, 8),
            "text_tokens": 256 if joint else 512, "joint": joint}  # fmt: skip


def _layouts(gpus: int, heads: int, ring: int | None, ulysses: int | None, no_ring: str = "",
             refused: Callable[[int, int], str] = lambda ring, ulysses: "") -> list[tuple[int, int]]:  # fmt: skip
    """``(ring, ulysses)`` candidates, smallest sequence-parallel degree first (more data parallelism is
    faster); Ulysses takes the largest share that divides the heads (no padded heads), ring the rest. ``no_ring``:
    why the model refuses a ring (``ModelFamily.ring_refusal``): Ulysses alone, a ring given is refused, and a degree
    that does not divide the heads is taken with them padded. ``refused(ring, ulysses)``: why ``parallelize`` refuses a
    layout (``ulysses_refusal``): a given one is refused with it, others are left out."""
    from dit_sp.errors import ConfigError

    if ring or ulysses:
        if (ring or 1) > 1 and no_ring:
            raise ConfigError(f"ring {ring}: {no_ring}")
        if why := refused(ring or 1, ulysses or 1):
            raise ConfigError(why)
        return [(ring or 1, ulysses or 1)]
    out = []
    for sp in (d for d in range(1, gpus + 1) if gpus % d == 0):
        u = max(d for d in range(1, sp + 1) if sp % d == 0 and heads % d == 0)
        if sp != u and no_ring:
            u = sp  # Ulysses alone: its heads padded
        if not refused(sp // u, u):
            out.append((sp // u, u))
    return out


TEXT_ENCODER = "text encoder(s)"
"""How the set-up component of the text encoders starts (``embedding_cache``: loaded only for prompts without an
embedding); ``text_encoder_part`` gives its whole name and size."""


def text_encoder_part(params: float, mixed_precision: str | None, gpus: int) -> tuple[str, int]:
    """The text encoders at GRPO set-up: loaded in the compute dtype (fp32 without mixed precision), sharded
    over every GPU of the run (``dit_sp.weights.encoder``), freed once the prompts are encoded."""
    dtype, size = ("bf16", 2) if mixed_precision else ("fp32", 4)
    return f"{TEXT_ENCODER} ({dtype}, 1/{gpus}, freed after encoding)", int(params * size) // gpus


def plan_training(config: Any, gpus: int, gpu_memory_gb: float = 80, *, arch: str | None = None,
                  ring: int | None = None, ulysses: int | None = None, embeddings_cached: bool = False,
                  advise: bool = True) -> Plan:  # fmt: skip
    """The plan of GRPO run ``config`` (a ``TrainConfig``) on ``gpus`` GPUs: for the given ``ring x
    ulysses``, or the smallest sequence parallelism whose training fits (and splits the step's samples over
    dp); set-up does not depend on the layout.

    ``embeddings_cached``: every prompt's embedding is already in the run's ``embedding_cache`` (an earlier
    run's, same model, prompts and text settings), so the trainer never loads the text encoders. ``advise``:
    when it does not fit, ``Plan.advice`` says what addresses the peak's phase and component, each with the
    peak it would give (``dit_sp.memory.advice``)."""
    spec = architecture(config.model, arch)
    name, (class_name, transformer_config) = next(iter(spec["transformers"].items()))
    shape = TransformerShape.of(class_name, transformer_config)
    experts = list(spec["transformers"])  # Wan 2.2 A14B: two of one shape
    trained_experts = len([e for e in experts if config.experts is None or e in config.experts]) or 1
    sample, grpo = config.sample, config.grpo
    video = tokens(shape, sample.frames, sample.height, sample.width, spec["compression"])
    total_tokens = video + conditioning_tokens(spec, sample.max_sequence_length, policy=True)
    samples = grpo.prompts_per_step * grpo.group_size
    compute = 2 if config.mixed_precision else 4
    setup = {"VAE (fp32)": int(spec["vae"] * 4)}
    if not embeddings_cached:
        setup = dict([text_encoder_part(spec["text_encoders"], config.mixed_precision, gpus)]) | setup
    image_encoder = {IMAGE_ENCODER + f" ({'bf16' if compute == 2 else 'fp32'}, whole, kept)":
                     int(spec["image_encoder"] * compute)} if "image_encoder" in spec else {}  # fmt: skip
    setup |= image_encoder
    plan = None
    layouts = _layouts(gpus, shape.heads, ring, ulysses, ring_refusal(transformer_config, class_name=class_name),
                       lambda r, u: ulysses_refusal(class_name, transformer_config, r, u))  # fmt: skip
    layouts = [(r, u) for r, u in layouts if samples % (gpus // (r * u)) == 0] or layouts  # dp splits the step
    for r, u in layouts:
        sp, dp = r * u, gpus // (r * u)
        shard = sp if config.hsdp else gpus
        lora = config.lora.rank
        trained = (8 * shape.layers * lora * 2 * shape.dim if lora else shape.params) * trained_experts
        micro = grpo.micro_batch or max(samples // dp, 1)
        sequences = micro * (2 if sample.guidance > 1 else 1)
        parts = {
            f"{' + '.join(experts)} weights (fp32, 1/{shard})": len(experts) * shape.params * 4 // shard,
            "gradients (fp32)": trained * 4 // (shard if not lora else 1),
            "AdamW state (2 x fp32)": 2 * trained * 4 // (shard if not lora else 1),
        }
        if grpo.kl_coef and not lora:
            parts["KL reference (fp32, sharded)"] = trained_experts * shape.params * 4 // shard
        parts["gathered block (2 x params + grads)"] = shape.block_params * (2 * compute + 4)
        per_rank = math.ceil(total_tokens / sp)
        streamed = stream_tokens(shape, math.ceil(video / sp))  # Motif-Video's decoder layers: two video streams
        parts[f"activations ({sequences} seq x {per_rank} tokens)"] = activation_bytes(
            shape, per_rank, sequences, compute, config.activation_checkpointing, ulysses=u, streamed=streamed
        )
        if u > 1:
            exchange = exchange_bytes(shape, u, max(per_rank, streamed), sequences, compute)
            parts[f"all-to-all buffers (Ulysses, {shape.padded_heads(u)} heads)"] = exchange
        parts["VAE (fp32, decoding ranks)"] = int(spec["vae"] * 4)
        parts |= image_encoder
        notes = [note] if (note := padding_note(shape, u)) else []
        plan = Plan(f"GRPO ({Path(str(config.model)).name})", {"dp": dp, "ring": r, "ulysses": u}, parts,
                    dict(setup), int(gpu_memory_gb * GiB), notes=notes)  # fmt: skip
        if sum(parts.values()) <= 0.9 * plan.gpu_bytes:
            break
    assert plan is not None
    if advise and not plan.fits:

        def replan(changed: Any, **changes: Any) -> Plan:
            options = {"arch": arch, "ring": ring, "ulysses": ulysses, "embeddings_cached": embeddings_cached}
            options |= {k: v for k, v in changes.items() if k != "gpus"}
            return plan_training(changed, changes.get("gpus", gpus), gpu_memory_gb, advise=False, **options)

        plan.advice = advise_plan(plan, config, TEXT_ENCODER, gpus, replan, fixed_layout=bool(ring or ulysses))
    return plan
