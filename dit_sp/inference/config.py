"""``GenerateConfig``: the settings of one generation (or a batch), from the model's defaults, then a YAML
file, then overrides; each checked on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dit_sp.cache import CacheSpec
from dit_sp.errors import ConfigError
from dit_sp.io.schema import SEED_RANGE, check_ranges, from_mapping, load_yaml, merge, setting
from dit_sp.zoo import default_model, model_defaults
from dit_sp.zoo.sample import DEFAULT_FPS

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""Short dtype names ``GenerateConfig.dtype`` accepts, and the torch names they stand for."""


@dataclass(frozen=True)
class GenerateConfig:
    """One generation's settings; each field's one-line ``setting`` help is its flag's in ``pipelines.generate``."""

    model: str = setting("tiny-wan", "a built-in model name, a local diffusers pipeline directory or a hub id")
    """A built-in model name, a local diffusers pipeline directory, or a hub id (``ORG/NAME``) downloaded to the
    local Hugging Face cache (``hf download ORG/NAME``; read offline)."""
    prompt: str = setting("a red circle moving left", "what the video shows")
    negative_prompt: str = setting("", "what it should not show (with guidance)")
    frames: int = setting(9, "video frames")
    height: int = setting(32, "frame height in pixels")
    width: int = setting(32, "frame width in pixels")
    steps: int = setting(20, "denoising steps")
    guidance: float = setting(4.0, "classifier-free guidance scale (<= 1: off)")
    """Classifier-free guidance scale (<= 1: off); HunyuanVideo: its ``true_cfg_scale``."""
    embedded_guidance: float | None = setting(None, "HunyuanVideo: its distilled guidance (default 6.0)")
    """HunyuanVideo: the guidance distilled into the model, its ``guidance_scale`` (6.0)."""
    guidance_2: float | None = setting(None, "Wan 2.2 A14B: the low-noise expert's guidance (default: --guidance)")
    """Wan 2.2 A14B: the guidance of the low-noise expert (``transformer_2``), its ``guidance_scale_2``;
    default ``guidance``."""
    max_sequence_length: int = setting(16, "text tokens of a prompt")
    seed: int = setting(0, "random seed (each data-parallel rank adds its rank)")
    ulysses: int = setting(1, "Ulysses (head all-to-all) degree of a sample")
    ring: int = setting(1, "ring-attention degree of a sample")
    dp: int | None = setting(None, "data-parallel groups (default 1; under torchrun: the processes left over)")
    cfg_parallel: bool = setting(False, "run the two guidance branches on two halves of the processes")
    collective_timeout: float = setting(
        600.0, "seconds a collective waits for a slow or lost peer before the run fails"
    )
    dtype: Literal["float32", "bfloat16", "float16", "fp32", "bf16", "fp16"] = setting(
        "float32", "compute dtype of the model (bf16, fp16, fp32: short names)"
    )
    """The weights' and compute dtype; ``bf16``, ``fp16`` and ``fp32`` are short for ``bfloat16``, ``float16``
    and ``float32`` (the config holds the long name)."""
    fps: float = setting(DEFAULT_FPS, "frame rate of the written video (default: the model's)")
    """Frame rate of the written video (mp4, gif); default the model's (a trained export: the one it
    recorded; Wan 16, HunyuanVideo 15, CogVideoX 8)."""
    out: str = setting("outputs/video.mp4", "FILE.mp4, FILE.gif or a directory of PNG frames")
    image: str | None = setting(None, "image-to-video: the first frame (default: none, text-to-video)")
    """Image-to-video: the first frame (PNG, JPEG, ...), for an image-to-video model (Wan I2V / FLF2V, Wan 2.2
    I2V and TI2V, CogVideoX I2V); resized to ``height`` x ``width`` by the pipeline. Wan Animate and Wan-Animate-2:
    the reference image of the character to animate."""
    refine: bool = setting(False, "Sana-WM: run its stage-2 refiner on the video's latents (DIR/refiner/)")
    """Run the model's stage-2 refiner (``ModelFamily.refiners``: Sana-WM's ``SanaWMLTX2Refiner``) on the latents the
    pipeline makes, and write the refiner's video (decoded by the same VAE; ``save_latents``: the refined latents). The
    refiner comes from the checkpoint's ``refiner/`` directory (a built-in model: its spec's), loaded once for a batch
    (``prompts``: each video refined with its own prompt and seed). Its transformer is split over a sample's processes
    (Ulysses only): with ``cfg_parallel``, whose two guidance groups hold the same latents, as one Ulysses group of
    both groups' processes (its calls are unguided: ``dit_sp.inference.refine``)."""
    camera: str | None = setting(None, "Sana-WM: the camera's path, KEYS-FRAMES,... (WASD move, IJKL turn: w-80,jw-40)")
    """Sana-WM's camera trajectory, its pipeline's ``action`` string: comma-separated ``KEYS-FRAMES`` segments, WASD
    moving and IJKL turning the camera for that many frames (``none`` holds it), at least ``frames - 1`` in all (the
    pipeline cuts the video to the path's poses: refused before loading); default: the model's (a built-in model's
    spec), else the pipeline requires it."""
    intrinsics: str | None = setting(None, "Sana-WM: the first frame's pinhole intrinsics fx,fy,cx,cy in its pixels")
    """Sana-WM's camera intrinsics, ``fx,fy,cx,cy`` in the pixels of ``--image`` (the pipeline rescales them for its
    resize and crop); default: the model's (a built-in model's spec), else the pipeline requires them."""
    last_image: str | None = setting(None, "first-last-frame: the last frame too (Wan FLF2V; default: none)")
    """First-last-frame: the last frame (Wan FLF2V, LTX-2; MiniMax-H3: selects its ``fl2va`` workflow, ``image`` then
    being the first frame, not a reference)."""
    workflow: str | None = setting(None, "MiniMax-H3: t2va, fl2va or ref2va (default: by --image / --last-image)")
    """MiniMax-H3's workflow (its Modular Diffusers blocks'): ``t2va`` (text only), ``fl2va`` (first and/or last frame:
    ``image`` the first, ``last_image`` the last) or ``ref2va`` (``image`` a reference image). Default: ``fl2va`` with
    ``last_image``, ``ref2va`` with ``image`` alone, else ``t2va``; naming ``fl2va`` runs it from a first frame alone.
    Inputs the workflow does not take are refused before loading."""
    video: str | None = setting(
        None, "video-to-video: the input video (SkyReels-V2 DF, Wan, CogVideoX V2V; Wan-Animate-2: the driving video)"
    )
    """Video-to-video: the input video (an .mp4 or .gif file, or a directory of image frames), for a model whose
    pipeline takes one (SkyReels-V2 diffusion-forcing video-to-video: its last frames, up to 17, are the history the
    ``frames`` new ones continue; the written video is the input followed by them. Wan and CogVideoX
    video-to-video: the video is noised and denoised again, SDEdit-like; its length sets the frames. Kandinsky 6 SR:
    the video to upscale; its length and size set the output's. Wan-Animate-2: the driving video whose motion the
    ``image``'s character follows, its ``driving_video``; the video written has its frame count, made in segments of
    ``frames`` frames)."""
    control_video: str | None = setting(
        None, "a control video (CogVideoX-Fun Control, Cosmos-Transfer2.5; default: none)"
    )
    """A control video (an .mp4 or .gif file, or a directory of image frames) for a model whose pipeline takes one
    (CogVideoX-Fun Control: its latents join the noise in channels; its length sets the frames. Cosmos-Transfer2.5:
    edge, depth, segmentation or blur frames, made beforehand, for its ControlNet; it holds ``frames`` at least)."""
    causal_block_size: int | None = setting(
        None, "SkyReels-V2 diffusion forcing: latent frames per causal block (default: the pipeline's, 1)"
    )
    """SkyReels-V2 diffusion forcing, asynchronous mode (with ``ar_step`` > 0): latent frames denoised as one block,
    each block attending to itself and the blocks before it. Exact under Ulysses; a ring refuses it."""
    ar_step: int | None = setting(
        None, "SkyReels-V2 diffusion forcing: steps a block lags the one before (0: synchronous; default: 0)"
    )
    pose_video: str | None = setting(None, "Wan Animate: the pose video whose motion is copied (default: none)")
    """Wan Animate: the skeleton pose video (an .mp4 or .gif file, or a directory of image frames) that the reference
    image (``image``) is animated to follow; the video written has its frame count, made in segments of ``frames``
    frames (the segment length, 77 for the real model)."""
    face_video: str | None = setting(None, "Wan Animate: the face video whose expressions are copied (default: none)")
    """Wan Animate: the face crops (as many frames as ``pose_video``), resized to the motion encoder's square."""
    background_video: str | None = setting(None, "Wan Animate replace mode: the video to put the character in")
    """Wan Animate's replace mode: the video whose person is replaced by the reference character (with
    ``mask_video``; as many frames as ``pose_video``)."""
    mask_video: str | None = setting(None, "Wan Animate replace mode, EasyAnimate inpaint: where to make anew (white)")
    """Wan Animate's replace mode: per frame, white where the person to replace is (read in grayscale). EasyAnimate's
    inpaint pipeline (with ``video``): per frame, white where the video is made anew, black where it is kept."""
    save_latents: str | None = setting(None, "also save the final latents to this .pt file (default: none)")
    """Also save the final latents to this ``.pt`` file (for exact comparisons): those of the last step (Wan 2.2
    TI2V with an image: before the pipeline puts the image's latents into the first frame; ``refine``: the refined
    ones). A batch (``prompts``) saves each video's as ``FILE_00000.pt``, ``FILE_00001.pt``, ... by index."""
    prompts: str | None = setting(None, "a batch: a .txt or .jsonl file of prompts (default: none, --prompt)")
    """A batch: a .txt (one prompt per line) or .jsonl file (per line ``prompt`` and optionally ``seed``,
    ``frames``, ``height``, ``width``, ``steps``, ``guidance``, ``negative_prompt``, ``image``, ``last_image``:
    image paths relative to the file); see ``generate_batch``."""
    verify_inputs: bool = setting(False, "debug: checksum the latents over the SP ranks at every forward")
    shard_weights: bool = setting(False, "keep the weights sharded over a sample's processes (big models)")
    """Keep each transformer's weights sharded over the processes of a sample (gathered block by block) and
    read only this rank's shards from the checkpoint: for models larger than one device."""
    parallel_vae: bool = setting(True, "decode with each frame's rows split over a sample's processes")
    """Decode with each frame's rows split over the processes of a sample (``dit_sp.parallelize_vae``);
    off (``--no-parallel-vae``), one process decodes and sends the frames to the others."""
    cache: str | None = setting(None, "step caching, NAME[:THRESHOLD]: first_block or teacache (default: off)")
    """Step caching, ``NAME[:THRESHOLD]``: ``first_block`` or ``teacache`` (``dit_sp.cache``); without a
    threshold, the model config's ``cache_thresholds`` or the policy's default. Same steps skipped on
    every layout."""
    cache_thresholds: dict[str, float] | None = setting(None, "per cache policy, the threshold --cache NAME uses")
    """Per policy, the threshold ``--cache NAME`` uses for this model (the real models' configs give the
    anchors' settings)."""
    teacache_coefficients: list[float] | None = setting(None, "TeaCache's rescaling polynomial, highest power first")
    """TeaCache's polynomial rescaling of the relative change, highest power first (default: none)."""
    free_text_encoders: bool = setting(True, "free the text encoders' weights once every prompt is encoded")
    """Free the text encoders' weights in the first denoising step of the last new prompt (one video: its
    own; a batch: the last line whose prompt or negative prompt is new), so that they do not sit beside the
    denoising steps' activations (``dit_sp.inference.encoders``)."""
    embedding_cache_mb: float = setting(512.0, "MiB of prompt embeddings kept for prompts that come again (0: off)")
    """MiB of text-encoder outputs kept for prompts that come again (a batch's repeated prompts and shared
    negative prompt): a repeated prompt does not run the encoders. 0 turns the cache off."""
    compile: bool = setting(False, "torch.compile each transformer block")
    lora: list[str] | None = setting(None, "a diffusers LoRA to load, PATH[:SCALE]; repeat for several")
    """Diffusers LoRAs loaded into the transformer as ``pipe.load_lora_weights(PATH)`` loads them, each at its
    ``SCALE`` (default 1; ``set_adapters``): a directory holding ``pytorch_lora_weights.safetensors`` (a LoRA
    run's ``final/lora``) or the file."""
    """``torch.compile`` each transformer block (regional), USP attention included (``dit_sp.sp.compile``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))  # bf16 -> bfloat16
        check_ranges(self, fps="finite")  # NaN is "not a finite number", as for every float setting
        check_ranges(self, fps="> 0")
        check_ranges(
            self,
            frames=">= 1",
            height=">= 1",
            width=">= 1",
            steps=">= 1",
            max_sequence_length=">= 1",
            seed=SEED_RANGE,
            ulysses=">= 1",
            ring=">= 1",
            dp=">= 1",
            guidance="finite",
            embedded_guidance="finite",
            guidance_2="finite",
            collective_timeout="finite",
            embedding_cache_mb="finite",
            causal_block_size=">= 1",
            ar_step=">= 0",
        )
        check_ranges(self, embedding_cache_mb=">= 0")  # fmt: skip
        if self.intrinsics is not None and not _numbers(self.intrinsics, 4):
            raise ConfigError(f"intrinsics {self.intrinsics!r}: expected fx,fy,cx,cy, four numbers (e.g. 40,40,24,16)")
        if self.guidance_2 is not None and not self.guidance > 1:
            raise ConfigError(f"guidance_2 {self.guidance_2} is the low-noise expert's classifier-free guidance, "
                              f"and guidance {self.guidance} turns guidance off for both experts; use guidance > 1 "
                              "or drop guidance_2")  # fmt: skip
        if self.cache is not None:
            self.cache_spec  # noqa: B018 (checks the name and threshold now, before anything loads)
        if self.lora:
            self.lora_adapters  # noqa: B018 (checks each scale now)
            if self.shard_weights:
                raise ConfigError("--lora loads adapters onto whole weights, and --shard-weights keeps them sharded: "
                                  "drop one of them (or merge the LoRA into the checkpoint)")  # fmt: skip
        if self.cfg_parallel and not self.guidance > 1:
            raise ConfigError(
                f"cfg_parallel runs the two guidance branches in parallel, but guidance {self.guidance} turns "
                "guidance off; use guidance > 1 or drop cfg_parallel"
            )

    @property
    def cache_spec(self) -> CacheSpec | None:
        """``cache`` with the model's thresholds and coefficients, or None."""
        if self.cache is None:
            return None
        return CacheSpec.parse(self.cache, self.teacache_coefficients, self.cache_thresholds)

    @property
    def lora_adapters(self) -> list[tuple[str, float]]:
        """``lora`` as ``(path, scale)`` pairs: ``PATH[:SCALE]``, the scale 1 unless what follows the last colon
        is a number."""
        adapters = []
        for spec in self.lora or []:
            path, colon, tail = spec.rpartition(":")
            try:
                scale = float(tail) if colon and path else None
            except ValueError:
                scale = None
            if scale is not None and not math.isfinite(scale):
                raise ConfigError(f"lora {spec!r}: the scale {tail} is not a finite number; give PATH[:SCALE], "
                                  "e.g. style_lora:0.8")  # fmt: skip
            adapters.append((path, scale) if scale is not None else (spec, 1.0))
        return adapters

    @property
    def world_size(self) -> int:
        """Processes a local launch starts: ``dp * (2 if cfg_parallel) * ring * ulysses``."""
        return (self.dp or 1) * self.ring * self.ulysses * (2 if self.cfg_parallel else 1)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GenerateConfig:
        """The model's defaults (``dit_sp.zoo.model_defaults``: a built-in's, or a checkpoint's family's and then
        the sample settings a trained export recorded), then the YAML file ``path`` (a path or a bundled config
        name), then ``overrides``; every key and type checked (``dit_sp.io.schema.ConfigError``).

        Each layer changes only the keys it names: the tables merge key by key (a file's
        ``cache_thresholds: {teacache: 0.1}`` keeps the model's ``first_block`` threshold), lists replace
        (``dit_sp.io.schema.merge``); a dotted override key sets one entry (``cache_thresholds.teacache``)."""
        from dit_sp.io.bundled import config_path

        values = merge(cls, load_yaml(config_path(path)) if path is not None else {}, overrides or {})
        model = values.get("model") or default_model()
        where = str(path) if path is not None else "settings"
        return from_mapping(cls, merge(cls, model_defaults(model), values | {"model": model}), where=where)


def _numbers(text: str, count: int) -> bool:
    """Whether ``text`` is ``count`` comma-separated finite numbers."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        return False
    return len(values) == count and all(math.isfinite(v) for v in values)
