"""Generating a video with a diffusers text-to-video pipeline (Wan, CogVideoX, HunyuanVideo) on any
sequence-parallel layout: what ``python -m pipelines.generate`` runs on every rank.

    from dit_sp import GenerateConfig, generate, spawn

    report = generate(GenerateConfig.load(overrides={"model": "tiny-wan", "steps": 2}))  # this process
    reports = spawn(generate, 2, args=(GenerateConfig.load(overrides={"ulysses": 2}),))  # two local workers

Settings come from the model's defaults (``dit_sp.zoo.model_defaults``), then a YAML file, then overrides.
``guidance`` is classifier-free guidance in every family: HunyuanVideo's ``true_cfg_scale`` (with the
negative prompt), the others' ``guidance_scale``; HunyuanVideo's distilled guidance is ``embedded_guidance``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from tqdm import tqdm

from dit_sp.cache import CacheSpec, StepCache, enable_cache
from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.families import check_shape, family_of
from dit_sp.io.schema import from_mapping, load_yaml
from dit_sp.io.video import check_output, check_writable, save_video
from dit_sp.parallel import ParallelConfig, ParallelState, check_ranks_agree, init_parallel
from dit_sp.sp import parallelize
from dit_sp.zoo import TRANSFORMERS, default_model, model_defaults


@dataclass(frozen=True)
class GenerateConfig:
    model: str = "tiny-wan"
    """A built-in model name or a local diffusers pipeline directory."""
    prompt: str = "a red circle moving left"
    negative_prompt: str = ""
    frames: int = 9
    height: int = 32
    width: int = 32
    steps: int = 20
    guidance: float = 4.0
    """Classifier-free guidance scale (<= 1: off); HunyuanVideo: its ``true_cfg_scale``."""
    embedded_guidance: float | None = None
    """HunyuanVideo: the guidance distilled into the model, its ``guidance_scale`` (6.0)."""
    guidance_2: float | None = None
    """Wan 2.2 A14B: the guidance of the low-noise expert (``transformer_2``), its ``guidance_scale_2``;
    default ``guidance``."""
    max_sequence_length: int = 16
    seed: int = 0
    """Random seed (per data-parallel rank: seed + dp rank)."""
    ulysses: int = 1
    ring: int = 1
    dp: int | None = None
    """Data-parallel groups of a local launch (default 1; under torchrun: the processes left over)."""
    cfg_parallel: bool = False
    """Run the two guidance branches on two halves of the processes."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    out: str = "outputs/video.mp4"
    """``FILE.mp4``, ``FILE.gif`` or a directory of PNG frames."""
    image: str | None = None
    """Image-to-video: the first frame (PNG, JPEG, ...), for an image-to-video model (Wan I2V / FLF2V, Wan 2.2
    I2V and TI2V, CogVideoX I2V); resized to ``height`` x ``width`` by the pipeline."""
    last_image: str | None = None
    """First-last-frame: the last frame too (Wan2.1-FLF2V, Wan 2.2 I2V)."""
    save_latents: str | None = None
    """Also save the final latents to this ``.pt`` file (for exact comparisons): those of the last step (Wan 2.2
    TI2V with an image: before the pipeline puts the image's latents into the first frame)."""
    prompts: str | None = None
    """A batch: a .txt (one prompt per line) or .jsonl file (per line ``prompt`` and optionally ``seed``,
    ``frames``, ``height``, ``width``, ``steps``, ``guidance``, ``negative_prompt``, ``image``, ``last_image``:
    image paths relative to the file); see ``generate_batch``."""
    verify_inputs: bool = False
    """Debug: checksum the latents across the sequence-parallel ranks at every forward."""
    shard_weights: bool = False
    """Keep each transformer's weights sharded over the processes of a sample (gathered block by block) and
    read only this rank's shards from the checkpoint: for models larger than one device."""
    parallel_vae: bool = True
    """Decode with each frame's rows split over the processes of a sample (``dit_sp.parallelize_vae``);
    off (``--no-parallel-vae``), one process decodes and sends the frames to the others."""
    cache: str | None = None
    """Step caching, ``NAME[:THRESHOLD]``: ``first_block`` or ``teacache`` (``dit_sp.cache``); without a
    threshold, the model config's ``cache_thresholds`` or the policy's default. Same steps skipped on
    every layout."""
    cache_thresholds: dict[str, float] | None = None
    """Per policy, the threshold ``--cache NAME`` uses for this model (the real models' configs give the
    anchors' settings)."""
    teacache_coefficients: list[float] | None = None
    """TeaCache's polynomial rescaling of the relative change, highest power first (default: none)."""
    compile: bool = False
    """``torch.compile`` each transformer block (regional), USP attention included (``dit_sp.sp.compile``)."""

    def __post_init__(self) -> None:
        if self.dp is not None and self.dp < 1:
            raise ValueError(f"dp must be >= 1, got {self.dp}")
        for name in ("frames", "height", "width", "steps", "ulysses", "ring", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.guidance_2 is not None and not self.guidance > 1:
            raise ConfigError(f"guidance_2 {self.guidance_2} is the low-noise expert's classifier-free guidance, "
                              f"and guidance {self.guidance} turns guidance off for both experts; use guidance > 1 "
                              "or drop guidance_2")  # fmt: skip
        if self.cache is not None:
            self.cache_spec  # noqa: B018 (checks the name and threshold now, before anything loads)
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
    def world_size(self) -> int:
        """Processes a local launch starts: ``dp * (2 if cfg_parallel) * ring * ulysses``."""
        return (self.dp or 1) * self.ring * self.ulysses * (2 if self.cfg_parallel else 1)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GenerateConfig:
        """The model's defaults, then the YAML file ``path`` (a path or a bundled config name), then
        ``overrides``; every key and type checked (``dit_sp.io.schema.ConfigError``)."""
        from dit_sp.io.bundled import config_path

        values = load_yaml(config_path(path)) if path is not None else {}
        values |= overrides or {}
        model = values.get("model") or default_model()
        where = str(path) if path is not None else "settings"
        return from_mapping(cls, model_defaults(model) | values | {"model": model}, where=where)


def guidance_arguments(pipe: Any, config: GenerateConfig) -> dict[str, float]:
    """The pipeline's guidance arguments. ``guidance`` goes to the argument whose value > 1 runs
    classifier-free guidance, as dit-sp's model family records it (Wan, CogVideoX: ``guidance_scale``;
    HunyuanVideo: ``true_cfg_scale``, with the negative prompt). ``embedded_guidance`` is HunyuanVideo's
    ``guidance_scale``: the guidance distilled into the model (left at the pipeline's 6.0 if not given)."""
    try:
        cfg_argument = family_of(pipe.transformer).guidance_arg
    except TypeError:  # a transformer dit-sp does not know: single process only, the usual argument
        cfg_argument = "guidance_scale"
    arguments = {cfg_argument: config.guidance}
    if config.embedded_guidance is not None:
        if cfg_argument == "guidance_scale":
            raise ConfigError(
                "--embedded-guidance is the distilled guidance of HunyuanVideo; this model has none (its "
                "guidance_scale is classifier-free guidance): use --guidance"
            )
        arguments["guidance_scale"] = config.embedded_guidance
    if config.guidance_2 is not None:
        if pipe.config.get("boundary_ratio") is None:
            raise ConfigError("--guidance-2 is the guidance of Wan 2.2 A14B's low-noise expert; this model has one "
                              "transformer: use --guidance")  # fmt: skip
        arguments["guidance_scale_2"] = config.guidance_2
    return arguments


def check_before_loading(config: GenerateConfig) -> None:
    """What can be checked from files alone, before weights load or workers start: the output locations,
    and frames, sizes and text length against the model's config files (``ConfigError`` naming the flag)."""
    from dit_sp.zoo import shape_info

    if config.shard_weights and (2 if config.cfg_parallel else 1) * config.ring * config.ulysses == 1:
        raise ConfigError("--shard-weights shards the weights over the processes of one sample, and this layout "
                          "has one: add --ulysses/--ring/--cfg-parallel, or drop --shard-weights")  # fmt: skip
    if config.shard_weights and config.compile:
        raise ConfigError("--shard-weights gathers each module's weights in hooks as it runs, which compiled blocks "
                          "cannot hold: drop --compile or --shard-weights")  # fmt: skip
    if config.shard_weights and config.cache and config.cfg_parallel:
        raise ConfigError("--cache with --cfg-parallel lets each guidance branch skip on its own, but --shard-weights "
                          "gathers weights across both branches: drop one of the three")  # fmt: skip
    check_output(config.out)
    if config.save_latents:
        check_writable(config.save_latents, "--save-latents")
    info = shape_info(config.model)
    if info is not None:
        check_shape(info, dataclasses.asdict(config))
    check_image_inputs(config, info)


def check_image_inputs(config: GenerateConfig, info: Any | None = None) -> None:
    """``--image`` / ``--last-image`` against what the model's pipeline takes, and the files readable
    (``ConfigError`` saying which flag to add or drop)."""
    import inspect

    import diffusers

    from dit_sp.zoo import pipeline_class_name

    name = pipeline_class_name(config.model, image=bool(config.image))
    if name is None or not hasattr(diffusers, name):
        return  # the full load reports what the model is
    takes = inspect.signature(getattr(diffusers, name).__call__).parameters
    if "image" not in takes:
        if config.image or config.last_image:
            raise ConfigError(f"--image: {config.model} is a text-to-video model ({name}) and takes no image; use an "
                              "image-to-video model (e.g. tiny-wan-i2v, a Wan I2V or CogVideoX I2V checkpoint), "
                              "or drop --image/--last-image")  # fmt: skip
        return
    if not config.image and takes["image"].default is inspect.Parameter.empty:
        raise ConfigError(f"{config.model} is an image-to-video model ({name}): give its first frame with --image PATH")
    if config.last_image:
        if "last_image" not in takes or pipeline_class_name(config.model) != name:  # TI2V: first frame only
            raise ConfigError(f"--last-image: {config.model} takes the first frame only; drop --last-image")
        transformer = info.transformer.config if info is not None else {}
        if transformer.get("image_dim") is not None and transformer.get("pos_embed_seq_len") is None:
            raise ConfigError(f"--last-image: {config.model} encodes one image (Wan2.1-I2V); first-last-frame video "
                              "needs a Wan2.1-FLF2V or Wan 2.2 I2V checkpoint, or drop --last-image")  # fmt: skip
    elif info is not None and info.transformer.config.get("pos_embed_seq_len") is not None:
        raise ConfigError(f"{config.model} is a first-last-frame model (Wan2.1-FLF2V): give the last frame too "
                          "with --last-image PATH")  # fmt: skip
    for flag, path in (("--image", config.image), ("--last-image", config.last_image)):
        if path is not None:
            _read_image(path, flag)


def _read_image(path: str, flag: str) -> Any:
    """The image at ``path`` (or a bundled asset of that name, e.g. ``first_frame.png``) as RGB (PIL)."""
    from PIL import Image, UnidentifiedImageError

    from dit_sp.io.bundled import asset_path

    found = asset_path(path)
    if found is None or not found.is_file():
        raise MissingFileError(f"{flag} {path}: no such file")
    try:
        with Image.open(found) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise ConfigError(f"{flag} {path}: not an image this machine can read ({e})") from e


def _save_latents(latents: torch.Tensor, path: Path) -> Path:
    """``torch.save`` under a temporary name, read back, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(latents, tmp)
    if not torch.equal(torch.load(tmp), latents):
        raise OSError(f"{path}: the latents did not read back")
    os.replace(tmp, path)
    return path


def _setup(config: GenerateConfig, images: bool) -> tuple[ParallelState, Any, dict[str, float], StepCache | None]:
    """This rank's layout on the running world, the loaded (and, on several ranks, parallelized)
    pipeline with its guidance arguments (with ``images``, the pipeline that takes them), and its step
    cache, if any."""
    from dit_sp.zoo import as_image_to_video, load_pipeline

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = 2 if config.cfg_parallel else 1
    parallel = init_parallel(ParallelConfig.for_world(world, ring=config.ring, ulysses=config.ulysses, cfg=cfg))
    if config.dp is not None and config.dp != parallel.dp:
        raise ConfigError(f"dp={config.dp}, but {world} processes with this layout give dp={parallel.dp}")
    check_ranks_agree(parallel, dataclasses.asdict(config), "settings")
    dtype = getattr(torch, config.dtype)
    pipe = load_pipeline(config.model, dtype, parallel.device, empty_transformers=config.shard_weights)
    if images:
        pipe = as_image_to_video(pipe)
    check_shape(pipe, dataclasses.asdict(config))
    guidance = guidance_arguments(pipe, config)
    pipe.set_progress_bar_config(disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    if world > 1:
        handle = parallelize(
            pipe,
            parallel,
            verify_inputs=config.verify_inputs,
            shard_weights=config.shard_weights,
            parallel_vae=config.parallel_vae,
            frames_on="leader",  # the leader writes
            compile=config.compile,
            cache=config.cache_spec,
        )
        return parallel, pipe, guidance, handle.cache
    if config.compile:
        from dit_sp.sp.compile import compile_blocks

        for transformer in filter(None, (getattr(pipe, name, None) for name in TRANSFORMERS)):
            compile_blocks(transformer)
    cache = enable_cache(pipe, config.cache_spec) if config.cache is not None else None
    return parallel, pipe, guidance, cache


def _sample(pipe: Any, config: GenerateConfig, guidance: dict[str, float], seed: int, device: torch.device) -> dict:
    """One video: ``{"frames": (F, H, W, 3) in [0, 1], "latents", "seconds", "seconds_per_step"}``."""
    step_times: list[float] = []
    final: dict[str, torch.Tensor] = {}

    def on_step_end(pipeline, step, timestep, tensors):
        step_times.append(time.perf_counter())
        final["latents"] = tensors["latents"].detach().cpu()
        return tensors

    images = {key: _read_image(path, "--" + key.replace("_", "-"))
              for key, path in (("image", config.image), ("last_image", config.last_image)) if path}  # fmt: skip
    start = time.perf_counter()
    result = pipe(
        **images,
        prompt=config.prompt,
        negative_prompt=config.negative_prompt or "",  # HunyuanVideo: no negative prompt, no guidance
        height=config.height,
        width=config.width,
        num_frames=config.frames,
        num_inference_steps=config.steps,
        generator=torch.Generator(device).manual_seed(seed),
        max_sequence_length=config.max_sequence_length,
        output_type="np",
        callback_on_step_end=on_step_end,
        **guidance,
    )
    steps = [b - a for a, b in zip([start, *step_times[:-1]], step_times)]
    return {"frames": result.frames[0], "latents": final["latents"], "seconds": time.perf_counter() - start,
            "seconds_per_step": sum(steps) / max(len(steps), 1)}  # fmt: skip


def cache_report(cache: StepCache) -> dict[str, Any]:
    """What a step cache did: ``{"cache", "saved_fraction", "blocks_run", "blocks", "computed"}``, where
    ``computed`` gives, per context (``cond``, ``uncond``, ...), whether each call ran the blocks."""
    stats = cache.stats
    contexts = dict.fromkeys(r.context for r in stats.records)
    return {"cache": str(cache.spec), "saved_fraction": stats.saved_fraction, "blocks_run": stats.blocks_run,
            "blocks": stats.blocks, "computed": {c: stats.decisions(c) for c in contexts}}  # fmt: skip


def generate(config: GenerateConfig, return_frames: bool = False) -> dict[str, Any]:
    """One rank's part of generating ``config.prompt`` (or, with ``config.prompts``, a batch: see
    ``generate_batch``): loads the pipeline, parallelizes it over the running world (torchrun's, ``spawn``'s,
    or one process) and samples. Returns ``{"layout", "seconds", "seconds_per_step"}`` (with a step cache,
    ``"cache"``: ``cache_report``) and, on the rank that
    writes the sample, ``"out"`` (and ``"latents"``, and the float ``"frames"`` ``(F, H, W, 3)`` with
    ``return_frames``)."""
    if config.prompts is not None:
        return generate_batch(config, return_frames)
    check_before_loading(config)
    parallel, pipe, guidance, cache = _setup(config, images=bool(config.image))
    video = _sample(pipe, config, guidance, parallel.dp_seed(config.seed), parallel.device)
    report: dict[str, Any] = {"layout": str(parallel.config), "seconds": video["seconds"],
                              "seconds_per_step": video["seconds_per_step"]}  # fmt: skip
    if cache is not None:
        report["cache"] = cache_report(cache)
    if parallel.is_sample_leader:
        suffix = f"_dp{parallel.dp_rank}" if parallel.dp > 1 else ""
        report["out"] = str(save_video(video["frames"], config.out, suffix))
        if return_frames:
            report["frames"] = video["frames"]
        if config.save_latents:
            path = Path(config.save_latents)
            path = path.with_name(f"{path.stem}{suffix}{path.suffix}")
            report["latents"] = str(_save_latents(video["latents"], path))
    return report


PER_PROMPT = (
    "prompt",
    "seed",
    "negative_prompt",
    "frames",
    "height",
    "width",
    "steps",
    "guidance",
    "image",
    "last_image",
)
"""Settings a line of a ``prompts`` file may give for its own video."""


def read_batch(config: GenerateConfig) -> list[GenerateConfig]:
    """The videos of ``config.prompts``: a .txt (one prompt per line; seeds ``seed + index``) or a .jsonl
    (``{"prompt": ..., "seed": ..., "frames": ...}`` per line, any of ``PER_PROMPT``), each checked."""
    from dit_sp.io.bundled import asset_path

    path = asset_path(config.prompts)
    if path is None or not path.is_file():
        raise MissingFileError(f"--prompts {config.prompts}: no such file (a .txt, one prompt per line, or a .jsonl)")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    base = dataclasses.asdict(config) | {"prompts": None, "save_latents": None}
    videos = []
    for index, line in enumerate(lines):
        entry: Any = {"prompt": line.strip()}
        if path.suffix == ".jsonl":
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{path}:{index + 1}: not a JSON object ({e})") from e
            if not isinstance(entry, dict) or "prompt" not in entry or set(entry) - set(PER_PROMPT):
                raise ConfigError(f"{path}:{index + 1}: expected a JSON object with a 'prompt' and any of {PER_PROMPT}")
        entry = {"seed": config.seed + index} | entry
        for key in ("image", "last_image"):  # relative to the prompts file
            if isinstance(entry.get(key), str):
                entry[key] = str(path.parent / entry[key])
        videos.append(from_mapping(GenerateConfig, base | entry, where=f"{path}:{index + 1}"))
    if not videos:
        raise ConfigError(f"--prompts {config.prompts} holds no prompts")
    if any(video.image for video in videos) and not all(video.image for video in videos):
        raise ConfigError(f"--prompts {config.prompts}: some lines give an 'image' and some do not; one model runs "
                          "the whole batch: give every line an image (image-to-video) or none")  # fmt: skip
    return videos


def batch_layout(config: GenerateConfig) -> tuple[Path, str]:
    """The directory and the video format of a batch: ``--out outputs/video.mp4`` writes
    ``outputs/video/00000.mp4``, ``00001.mp4``, ... and ``outputs/video/manifest.jsonl``."""
    out = Path(config.out)
    return (out.with_suffix(""), out.suffix or ".mp4")


def _done(directory: Path) -> dict[int, dict]:
    """Manifest entries whose video is there: what a re-run skips."""
    manifest = directory / "manifest.jsonl"
    done = {}
    if manifest.exists():
        for line in manifest.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line: that video is redone
            if (directory / entry["path"]).is_file():
                done[entry["index"]] = entry
    return done


def _manifest_entry(index: int, video: GenerateConfig, name: str) -> dict:
    return {"index": index, **{key: getattr(video, key) for key in PER_PROMPT}, "model": video.model, "path": name}


def generate_batch(config: GenerateConfig, return_frames: bool = False) -> dict[str, Any]:
    """One rank's part of generating every prompt of ``config.prompts`` with one loaded model: prompt ``i``
    goes to data-parallel group ``i % dp``, whose sample leader writes ``DIR/{i:05d}.mp4`` and appends a line
    to ``DIR/manifest.jsonl`` (prompt, seed, settings, path). Videos already in the manifest (and on disk)
    with the same settings are skipped, so a re-run after a crash finishes only the missing ones. A
    prompt's seed is its own (not shifted per dp rank): every layout gives the same video for it.
    Returns ``{"layout", "seconds", "videos"}`` and, on sample leaders, ``"written"`` (paths) and, with
    ``return_frames``, ``"frames"`` by index."""
    videos = read_batch(config)
    directory, suffix = batch_layout(config)
    check_output(directory / f"00000{suffix}")
    for video in videos:
        check_before_loading(video)
    parallel, pipe, guidance, cache = _setup(config, images=any(video.image for video in videos))
    done = _done(directory)
    mine = [i for i in range(len(videos)) if i % parallel.dp == parallel.dp_rank]
    todo = [i for i in mine if done.get(i) != _manifest_entry(i, videos[i], f"{i:05d}{suffix}")]
    if parallel.world_size > 1:
        dist.barrier()  # every rank has read the manifest before any rank writes to it
    start = time.perf_counter()
    report: dict[str, Any] = {"layout": str(parallel.config), "videos": len(todo), "skipped": len(mine) - len(todo)}
    written, frames = [], {}
    for index in tqdm(todo, desc="videos", disable=not (parallel.is_sample_leader and parallel.dp_rank == 0)):
        video = _sample(pipe, videos[index], guidance_arguments(pipe, videos[index]), videos[index].seed,
                        parallel.device)  # fmt: skip
        if parallel.is_sample_leader:
            name = f"{index:05d}{suffix}"
            written.append(str(save_video(video["frames"], directory / name)))
            with (directory / "manifest.jsonl").open("a") as f:  # one short line per append: no interleaving
                f.write(json.dumps(_manifest_entry(index, videos[index], name)) + "\n")
            if return_frames:
                frames[index] = video["frames"]
    report["seconds"] = time.perf_counter() - start
    if cache is not None:
        report["cache"] = cache_report(cache)
    if parallel.is_sample_leader:
        report["written"] = written
        if return_frames:
            report["frames"] = frames
    return report
