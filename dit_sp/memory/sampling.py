"""Memory planning for sampling (``generate``): what each GPU holds, per component and phase, and what would
lower the peak.

``generate`` loads the whole pipeline onto every process (``dit_sp.inference.session.setup``): the
transformer(s) and the VAE stay resident from the prompt encoding to the last frame; the text encoders are
freed in the first denoising step once every prompt is encoded (``free_text_encoders``, the default;
``dit_sp.inference.encoders``), so they count in the prompt-encoding phase only. Each phase's memory is the
resident weights plus that phase's working set:

- **transformer weights**: whole in the compute dtype, or ``1/N`` with ``--shard-weights`` (``N`` = a sample's
  processes, ``ring x ulysses x cfg``) plus the one block gathered while it runs;
- **text encoders**: in the compute dtype, whole, or ``1/N`` with ``--shard-weights`` on ``N > 1`` processes
  (``load_pipeline(sharded_text_encoders=...)``); through sampling too with ``free_text_encoders=False``;
- **an image encoder** (an architecture's ``image_encoder``: HunyuanVideo-1.5 I2V's SigLIP): whole, resident;
- **VAE weights**: in the compute dtype (the prompt encoding's own activations, a few hundred tokens, are
  left out: they are gone before denoising starts);
- **denoising activations**: inference saves nothing for backward, so the working set is one block's at
  ``tokens / (ring x ulysses)`` tokens per rank. Approximation: the values one block would save for backward
  (``SAVED_PER_TOKEN``, measured for training) bound its no-grad working set from above; one sequence per
  forward with ``--cfg-parallel`` or no guidance, two without it (an upper bound for pipelines that run the
  two guidance branches one after the other, exact for those that batch them); its head-layout values (q, k, v,
  the attention's output) at ``ceil(H / U)`` heads a rank where Ulysses pads the heads, and Motif-Video's decoder
  layers at their two streams of the video (``TransformerShape.stream_blocks``);
- **Ulysses' all-to-all buffers** (``U > 1``): one attention's, at the padded heads (``exchange_bytes``);
- **a KV cache** (an architecture's ``kv_cache``, its family's formula), in the denoising phase: AnyFlow FAR's,
  whole on every rank (``AnyFlowFARPipeline`` allocates every head of every layer before the first call, so more
  Ulysses does not lower it); Wan-Animate-2's reference cache of one segment, ``1/U`` of its heads a rank;
- **VAE decode activations** (``vae_decode_bytes``): an estimate from the decoder's full-resolution width and
  the decoded size, rows split over a sample's processes with the parallel VAE; a VAE whose calls (tiles, clips)
  are shared out whole (an architecture's ``vae_call``: Allegro, MiniMax-H3) holds one call at a time on a rank.
- **tiles** (an architecture's ``tile_call``: Kandinsky 6 SR, which denoises and decodes one trained-size tile at a
  time): the tokens of one denoising call's tiles, not the video's; the decode of that call's tiles (each in the
  K-VAE's causal segments, rows split); the output canvas and the input video (float32), whole on every rank in both
  phases.
- **a ControlNet** (Cosmos-Transfer2.5, an architecture's ``controlnet``): its weights whole; it is split as the
  transformer is, so its working set is one of its blocks at the transformer's tokens per rank, one guidance branch
  at a time, plus what it holds whole: its control and base tokens before the split and its blocks' residuals,
  gathered whole and held through the transformer's call.

    plan = plan_sampling(SamplingSettings("wan2.1-t2v-14b", frames=81, height=720, width=1280, ulysses=8), 8, 80)
    print(plan.report())
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

from dit_sp.families import ring_refusal
from dit_sp.memory.planner import (
    ARCHITECTURES,
    TransformerShape,
    block_values,
    conditioning_tokens,
    exchange_bytes,
    padding_note,
    stream_tokens,
    tokens,
    ulysses_refusal,
)

GiB = 2**30

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

VAE_TOP_CHANNELS = 128
"""Channels of a video VAE decoder's last, full-resolution stage (HunyuanVideo, CogVideoX, LTX: 128; Wan: 96,
so Wan is over-counted by a third)."""

VAE_LIVE_TENSORS = 12
"""Full-resolution tensors of ``VAE_TOP_CHANNELS`` channels alive at once while the decoder's last stages run:
fitted to the live tensor bytes of real decodes (``tests/memory/test_sampling_plan.py``: HunyuanVideo's
decoder holds about 10 such tensors per decoded pixel, CogVideoX's about 13.5: the upsampler's input, padded
copies for the causal convolutions and outputs at twice the width, the ResNet blocks' normalised and convolved
values)."""

CAUSAL_CHUNK_VAES = ("wan", "skyreels", "chronoedit", "anyflow", "helios")
"""Architectures (by name prefix) whose VAE is Wan's causal ``AutoencoderKLWan``: it decodes one latent frame
at a time (``temporal`` frames), keeping the last two frames of each causal convolution's input as a cache, so
``temporal + 2`` frames are at full resolution at once however long the video."""

TEXT_ENCODERS = "text encoder(s)"
ENCODING, DENOISING, DECODING = "prompt encoding", "denoising", "VAE decode"


@dataclass(frozen=True)
class SamplingSettings:
    """``generate``'s settings that decide memory: the architecture (an ``ARCHITECTURES`` key), the video's
    size, the compute dtype and the layout of one sample (``ring x ulysses``, x 2 with ``cfg_parallel``)."""

    arch: str
    frames: int = 81
    height: int = 720
    width: int = 1280
    dtype: str = "bfloat16"
    ring: int = 1
    ulysses: int = 1
    cfg_parallel: bool = False
    guidance: bool = True
    shard_weights: bool = False
    parallel_vae: bool = True
    free_text_encoders: bool = True

    def __post_init__(self) -> None:
        from dit_sp.errors import ConfigError

        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"unknown architecture {self.arch!r}: pass one of {sorted(ARCHITECTURES)}")
        if self.dtype not in ELEMENT_BYTES:
            raise ConfigError(f"dtype {self.dtype!r}: use one of {sorted(ELEMENT_BYTES)}")
        for name in ("frames", "height", "width", "ring", "ulysses"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def sample_processes(self) -> int:
        return self.ring * self.ulysses * (2 if self.cfg_parallel else 1)


def vae_decode_bytes(frames: int, height: int, width: int, element_bytes: int, row_split: int,
                     frames_at_once: int | None = None, call: tuple[int, int, int] | None = None) -> int:  # fmt: skip
    """Peak working memory of decoding one video on one process, in bytes:

        VAE_LIVE_TENSORS * VAE_TOP_CHANNELS * frames_at_once * ceil(height / row_split) * width * element_bytes
        + frames * height * width * 3 * 4          (the decoded video, float32, whole on the leader)

    ``row_split``: the processes each frame's rows are split over (a sample's, with the parallel VAE; else 1).
    ``frames_at_once``: the frames the decoder works on together (default all; Wan's causal VAE:
    ``CAUSAL_CHUNK_VAES``).
    An estimate: the decoder's last stages, at full resolution, dominate (its lower stages have 2-4x the
    channels on 4-16x fewer pixels). Fitted to, and checked against, the peak of live tensor bytes of real
    decodes on CPU (HunyuanVideo's VAE within 25%; kernel workspaces such as cuDNN's are not tensors and not
    counted). All frames at once is right for decoders that take the whole video (HunyuanVideo, LTX) and an
    upper bound for those that decode a few latent frames at a time (CogVideoX: two). Tiling
    (``vae.enable_tiling()``, not a ``generate`` flag) is not modelled, except for
    ``call``: the ``(frames, height, width)`` pixels of one decoder call of a VAE whose calls (tiles, clips) are
    shared out whole over a sample's processes (an architecture's ``vae_call``: Allegro's, MiniMax-H3's): a rank runs
    one call at a time, whole, so its working set is one call's (clipped to the video), whatever ``row_split``."""
    at_once, rows, columns = min(frames, frames_at_once or frames), math.ceil(height / row_split), width
    if call is not None:
        at_once, rows, columns = min(frames, call[0]), min(height, call[1]), min(width, call[2])
    work = VAE_LIVE_TENSORS * VAE_TOP_CHANNELS * at_once * rows * columns * element_bytes
    return work + frames * height * width * 3 * 4


@dataclass
class SamplingPlan:
    """Bytes per GPU by phase (``denoising``, ``VAE decode``) and component, for one sample's layout."""

    what: str
    settings: SamplingSettings
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    gpu_bytes: int = 80 * GiB
    advice: list[str] = field(default_factory=list)
    """What lowers the peak's component, each with the peak it gives (the plan made again); empty when it fits."""
    notes: list[str] = field(default_factory=list)
    """What the layout costs beyond memory (``padding_note``: the heads Ulysses pads)."""

    @property
    def peak(self) -> int:
        return max(sum(parts.values()) for parts in self.phases.values())

    @property
    def fits(self) -> bool:
        return self.peak <= 0.9 * self.gpu_bytes  # 10% for the allocator's fragmentation and CUDA context

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda phase: sum(self.phases[phase].values()))

    @property
    def peak_component(self) -> str:
        parts = self.phases[self.peak_phase]
        return max(parts, key=parts.__getitem__)

    def report(self) -> str:
        s = self.settings
        layout = f"ring {s.ring} x ulysses {s.ulysses}" + (" x cfg 2" if s.cfg_parallel else "")
        lines = [f"{self.what}: {s.frames} x {s.height} x {s.width}, {s.dtype}, {layout} per sample: per GPU"]
        lines += [f"  ({note})" for note in self.notes]
        for phase, parts in self.phases.items():
            lines.append(f"  while {phase}: {sum(parts.values()) / GiB:.1f} GiB")
            lines += [f"    {name:<56}{value / GiB:8.2f} GiB" for name, value in parts.items()]
        short = self.peak_component.split(" (")[0]
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(f"  peak {self.peak / GiB:.1f} GiB at {self.peak_phase}, mostly the {short} "
                     f"({self.phases[self.peak_phase][self.peak_component] / GiB:.1f} GiB), of "
                     f"{self.gpu_bytes / GiB:.0f} GiB (90% usable): {verdict}")  # fmt: skip
        if self.advice:
            lines.append(f"  to lower the {self.peak_phase} peak ({short}):")
            lines += [textwrap.fill(line, 112, initial_indent="    - ", subsequent_indent="      ")
                      for line in self.advice]  # fmt: skip
        return "\n".join(lines)


def plan_sampling(
    settings: SamplingSettings, gpus: int, gpu_memory_gb: float = 80, *, advise: bool = True
) -> SamplingPlan:
    """The per-GPU memory of ``generate`` with ``settings`` on ``gpus`` GPUs (a multiple of a sample's processes;
    the rest is data parallelism, which changes nothing per GPU). ``advise``: when it does not fit,
    ``SamplingPlan.advice`` lists the changes that lower the peak's component, each planned again."""
    from dit_sp.errors import ConfigError

    s = settings
    n = s.sample_processes
    if gpus % n:
        raise ConfigError(f"{gpus} GPUs do not hold whole samples of {n} processes (ring x ulysses x cfg): "
                          f"use a multiple of {n}")  # fmt: skip
    spec = ARCHITECTURES[s.arch]
    experts = list(spec["transformers"])
    class_name, config = spec["transformers"][experts[0]]
    shape = TransformerShape.of(class_name, config)
    if s.ring > 1 and (why := ring_refusal(config, class_name=class_name)):  # only Ulysses splits it (NABLA too)
        raise ConfigError(f"ring {s.ring}: {why}")
    if why := ulysses_refusal(class_name, config, s.ring, s.ulysses):  # as parallelize would (Sana-WM's scans)
        raise ConfigError(why)
    size = ELEMENT_BYTES[s.dtype]
    sharded = s.shard_weights and n > 1
    resident = {}
    if sharded:
        resident[f"{' + '.join(experts)} weights ({s.dtype}, 1/{n})"] = len(experts) * shape.params * size // n
        resident["gathered block (one at a time)"] = shape.block_params * size
    else:
        resident[f"{' + '.join(experts)} weights ({s.dtype}, whole)"] = len(experts) * shape.params * size
    resident[f"VAE weights ({s.dtype})"] = int(spec["vae"] * size)
    if "image_encoder" in spec:  # HunyuanVideo-1.5 I2V's SigLIP: part of the pipeline, whole on every process
        resident[f"image encoder ({s.dtype}, whole)"] = int(spec["image_encoder"] * size)
    controlnet = TransformerShape.of(*spec["controlnet"]) if "controlnet" in spec else None
    if (
        controlnet is not None
    ):  # Cosmos-Transfer2.5: its ControlNet's weights are whole on every rank (its tokens split)
        resident[f"ControlNet weights ({s.dtype}, whole)"] = controlnet.params * size
    share = f"1/{n}" if sharded else "whole"
    kept = "kept through sampling" if not s.free_text_encoders else "freed before denoising"
    encoders = {
        f"{TEXT_ENCODERS} ({s.dtype}, {share}, {kept})": int(spec["text_encoders"] * size) // (n if sharded else 1)
    }
    encoders = encoders if spec["text_encoders"] else {}  # Kandinsky 6 SR: no text
    if not s.free_text_encoders:
        resident |= encoders
    # Kandinsky 6 SR: one denoising call's tiles at the trained tile size, not the whole video (``tile_call``)
    tiled = (
        spec["tile_call"](config, s.frames, s.height, s.width, spec["compression"][1]) if "tile_call" in spec else None
    )
    if tiled is not None:
        video = tiled["tiles"] * tokens(shape, *tiled["tile"], spec["compression"])
    else:
        video = tokens(shape, s.frames, s.height, s.width, spec["compression"])
    # Wan-Animate-2: a segment's latent frames and the reference image's (``extra_latent_frames``)
    video += spec.get("extra_latent_frames", 0) * tokens(shape, 1, s.height, s.width, spec["compression"])
    total = video + conditioning_tokens(spec)
    # Motif-Video's decoder layers hold two split copies of the video (no text): the larger block's tokens
    streamed = stream_tokens(shape, math.ceil(video / (s.ring * s.ulysses))) if shape.stream_blocks else 0
    per_rank = max(math.ceil(total / (s.ring * s.ulysses)), streamed)
    sequences = 2 if s.guidance and not s.cfg_parallel else 1
    block = block_values(shape, s.ulysses) * size * per_rank * sequences  # head-layout values at the padded width
    split = n if s.parallel_vae else 1
    chunk = spec["compression"][0] + 2 if s.arch.startswith(CAUSAL_CHUNK_VAES) else None
    call = spec.get("vae_call")  # a VAE whose calls are shared out whole: one call at a time on a rank, not 1/N
    decode = vae_decode_bytes(s.frames, s.height, s.width, size, split, chunk, call)
    at_once = "all frames" if chunk is None or chunk >= s.frames else f"{chunk} frames"
    decode_label = f"{at_once} at once, rows 1/{split}"
    if call is not None:
        extent = "x".join(str(min(a, b)) for a, b in zip(call, (s.frames, s.height, s.width)))
        decode_label = f"one call of {extent} frames x rows x columns at a time, whole on a rank"
    canvas = {}
    if tiled is not None:  # each call's tiles decoded, rows split, in causal segments; the canvas whole on every rank
        rows = tiled["tile"]
        decode = tiled["tiles"] * vae_decode_bytes(*rows, size, split, tiled["segment_frames"])
        extent = "x".join(map(str, rows))
        decode_label = f"{tiled['tiles']} tile(s) of {extent}, {tiled['segment_frames']} frames at once, rows 1/{split}"
        canvas = {"output canvas (float32, whole)": math.prod(tiled["output"]) * 3 * 4,
                  "input video (float32, whole)": math.prod(tiled["input"]) * 3 * 4}  # fmt: skip
    working = {f"activations (one block, {sequences} seq x {per_rank} tokens)": block}
    if s.ulysses > 1:
        exchange = exchange_bytes(shape, s.ulysses, per_rank, sequences, size)
        working[f"all-to-all buffers (Ulysses, {shape.padded_heads(s.ulysses)} heads)"] = exchange
    if "kv_cache" in spec:  # AnyFlow FAR's chunk cache (whole), Wan-Animate-2's reference cache (1/U of its heads)
        temporal, spatial = spec["compression"][:2]
        latent = ((s.frames - 1) // temporal + 1, s.height // spatial, s.width // spatial)
        label, elements = spec["kv_cache"](config, *latent, s.guidance, s.ulysses)
        working[f"{label} ({s.dtype})"] = elements * size
    if controlnet is not None:  # one of its blocks split, its inputs and residuals whole: one branch at a time
        per_token = block_values(controlnet, s.ulysses)
        whole = (controlnet.layers + 2) * controlnet.dim * size * video
        working[f"ControlNet (one block at {per_rank} tokens; residuals whole)"] = per_token * size * per_rank + whole
    phases = {
        ENCODING: resident | encoders,
        DENOISING: resident | canvas | working,
        DECODING: resident | canvas | {f"VAE decode activations ({decode_label})": decode},
    }
    plan = SamplingPlan(f"Sampling ({s.arch})", s, phases, int(gpu_memory_gb * GiB))
    plan.notes = [note] if (note := padding_note(shape, s.ulysses)) else []
    if advise and not plan.fits:
        plan.advice = _advise(plan, gpus, gpu_memory_gb)
    return plan


def _advise(plan: SamplingPlan, gpus: int, gpu_memory_gb: float) -> list[str]:
    """Changes to ``generate``'s flags that address the peak's component, kept when the plan made again with the
    change has a lower peak."""
    s, component = plan.settings, plan.peak_component
    options: list[tuple[str, dict[str, Any], int]] = []  # (text, changed settings, GPUs)
    more = {"ulysses": s.ulysses * 2}
    shape = TransformerShape.of(*next(iter(ARCHITECTURES[s.arch]["transformers"].values())))
    padded = padding_note(shape, s.ulysses * 2)  # offered after the other options (a ring pads nothing)
    more_text = f"--ulysses {s.ulysses * 2} (more processes per sample{'; ' + padded if padded else ''})"
    if component.startswith(TEXT_ENCODERS) or "weights (" in component and "VAE" not in component:
        if not s.shard_weights:
            options.append(("--shard-weights (weights and text encoders 1/N over a sample's processes)",
                            {"shard_weights": True} | ({} if s.sample_processes > 1 else more), gpus))  # fmt: skip
        else:
            options.append((f"{more_text}: a smaller shard each", more, gpus))
        if s.dtype == "float32":
            options.append(("--dtype bfloat16 (half the bytes)", {"dtype": "bfloat16"}, gpus))
    elif component.startswith("VAE decode"):
        if not s.parallel_vae and s.sample_processes > 1:
            options.append(("the parallel VAE (drop --no-parallel-vae: each frame's rows split over a sample)",
                            {"parallel_vae": True}, gpus))  # fmt: skip
        if s.parallel_vae:
            options.append((f"{more_text}: fewer rows each to decode", more, gpus))
            options.append((f"--ring {s.ring * 2} (more processes per sample): fewer rows each to decode",
                            {"ring": s.ring * 2}, gpus))  # fmt: skip
        if s.dtype == "float32":
            options.append(("--dtype bfloat16 (half the bytes)", {"dtype": "bfloat16"}, gpus))
    elif component.startswith(("activations", "all-to-all")):  # one block's working set, Ulysses' buffers
        options.append((f"{more_text}: fewer tokens per process", more, gpus))
        options.append((f"--ring {s.ring * 2} (more processes per sample)", {"ring": s.ring * 2}, gpus))
        if s.dtype == "float32":
            options.append(("--dtype bfloat16 (half the bytes)", {"dtype": "bfloat16"}, gpus))
    elif component.startswith("KV cache"):  # Wan-Animate-2's: 1/U of its heads a rank; AnyFlow FAR's: whole
        if "whole on every rank" not in component:
            options.append((f"{more_text}: fewer of the cache's heads each", more, gpus))
        if s.dtype == "float32":
            options.append(("--dtype bfloat16 (half the bytes)", {"dtype": "bfloat16"}, gpus))
    elif component.startswith("gathered block") and s.dtype == "float32":
        options.append(("--dtype bfloat16 (half the bytes)", {"dtype": "bfloat16"}, gpus))
    if padded:  # divisors first; never more Ulysses ranks than heads (ranks of padding only: wasted attention)
        options = [o for o in options if o[1] is not more] + [o for o in options if o[1] is more and not
                                                                 s.ulysses * 2 > shape.heads]  # fmt: skip
    lines = []
    for text, changes, count in options:
        changed = dataclasses.replace(s, **changes)
        count = max(count, math.lcm(count, changed.sample_processes))
        try:
            other = plan_sampling(changed, count, gpu_memory_gb, advise=False)
        except ValueError:  # ConfigError: a layout this model cannot take (heads, GPUs)
            continue
        if other.peak < plan.peak:
            gpus_note = f" on {count} GPUs" if count != gpus else ""
            verdict = "fits" if other.fits else "still does not fit"
            lines.append(f"{text}{gpus_note}: peak {other.peak / GiB:.1f} GiB at {other.peak_phase}: {verdict}")
    if component.startswith("KV cache") and "whole on every rank" in component:
        lines.append("(the KV cache is whole on every rank, as the stock pipeline allocates it: more --ulysses or "
                     "--ring does not lower it; bfloat16 halves it, or GPUs with more memory)")  # fmt: skip
    if not lines:
        lines.append(f"{component}: no generate flag lowers it; GPUs with more memory")
    return lines
