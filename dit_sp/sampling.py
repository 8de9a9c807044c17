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
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from dit_sp.errors import ConfigError
from dit_sp.models import check_shape, family_of
from dit_sp.parallel import ParallelConfig, check_ranks_agree, init_parallel
from dit_sp.parallelizer import parallelize
from dit_sp.schema import from_mapping, load_yaml
from dit_sp.video import check_output, check_writable, save_video
from dit_sp.zoo import default_model, model_defaults


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
    max_sequence_length: int = 16
    seed: int = 0
    """Random seed (per data-parallel rank: seed + dp rank)."""
    ulysses: int = 1
    ring: int = 1
    cfg_parallel: bool = False
    """Run the two guidance branches on two halves of the processes."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    out: str = "outputs/video.mp4"
    """``FILE.mp4``, ``FILE.gif`` or a directory of PNG frames."""
    save_latents: str | None = None
    """Also save the final latents to this ``.pt`` file (for exact comparisons)."""
    verify_inputs: bool = False
    """Debug: checksum the latents across the sequence-parallel ranks at every forward."""

    def __post_init__(self) -> None:
        for name in ("frames", "height", "width", "steps", "ulysses", "ring", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cfg_parallel and not self.guidance > 1:
            raise ConfigError(
                f"cfg_parallel runs the two guidance branches in parallel, but guidance {self.guidance} turns "
                "guidance off; use guidance > 1 or drop cfg_parallel"
            )

    @property
    def world_size(self) -> int:
        """Processes of one sample: ``(2 if cfg_parallel) * ring * ulysses``."""
        return self.ring * self.ulysses * (2 if self.cfg_parallel else 1)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GenerateConfig:
        """The model's defaults, then the YAML file ``path`` (a path or a bundled config name), then
        ``overrides``; every key and type checked (``dit_sp.schema.ConfigError``)."""
        from dit_sp.bundled import config_path

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
    return arguments


def check_before_loading(config: GenerateConfig) -> None:
    """What can be checked from files alone, before weights load or workers start: the output locations,
    and frames, sizes and text length against the model's config files (``ConfigError`` naming the flag)."""
    from dit_sp.zoo import shape_info

    check_output(config.out)
    if config.save_latents:
        check_writable(config.save_latents, "--save-latents")
    info = shape_info(config.model)
    if info is not None:
        check_shape(info, dataclasses.asdict(config))


def _save_latents(latents: torch.Tensor, path: Path) -> Path:
    """``torch.save`` under a temporary name, read back, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(latents, tmp)
    if not torch.equal(torch.load(tmp), latents):
        raise OSError(f"{path}: the latents did not read back")
    os.replace(tmp, path)
    return path


def generate(config: GenerateConfig, return_frames: bool = False) -> dict[str, Any]:
    """One rank's part of generating ``config.prompt``: loads the pipeline, parallelizes it over the running
    world (torchrun's, ``spawn``'s, or one process) and samples. Returns ``{"layout", "seconds",
    "seconds_per_step"}`` and, on the rank that writes the sample, ``"out"`` (and ``"latents"``, and the
    float ``"frames"`` ``(F, H, W, 3)`` with ``return_frames``)."""
    from dit_sp.zoo import load_pipeline

    check_before_loading(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = 2 if config.cfg_parallel else 1
    layout = ParallelConfig.for_world(world, ring=config.ring, ulysses=config.ulysses, cfg=cfg)
    parallel = init_parallel(layout)
    check_ranks_agree(parallel, dataclasses.asdict(config), "settings")
    pipe = load_pipeline(config.model, getattr(torch, config.dtype)).to(parallel.device)
    check_shape(pipe, dataclasses.asdict(config))
    guidance = guidance_arguments(pipe, config)
    pipe.set_progress_bar_config(disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    if world > 1:
        parallelize(pipe, parallel, verify_inputs=config.verify_inputs)

    step_times: list[float] = []
    final: dict[str, torch.Tensor] = {}

    def on_step_end(pipeline, step, timestep, tensors):
        step_times.append(time.perf_counter())
        final["latents"] = tensors["latents"].detach().cpu()
        return tensors

    generator = torch.Generator(parallel.device).manual_seed(parallel.dp_seed(config.seed))
    start = time.perf_counter()
    result = pipe(
        prompt=config.prompt,
        negative_prompt=config.negative_prompt or "",  # HunyuanVideo: no negative prompt, no guidance
        height=config.height,
        width=config.width,
        num_frames=config.frames,
        num_inference_steps=config.steps,
        generator=generator,
        max_sequence_length=config.max_sequence_length,
        output_type="np",
        callback_on_step_end=on_step_end,
        **guidance,
    )
    total = time.perf_counter() - start
    steps = [b - a for a, b in zip([start, *step_times[:-1]], step_times)]
    per_step = sum(steps) / max(len(steps), 1)
    report: dict[str, Any] = {"layout": str(layout), "seconds": total, "seconds_per_step": per_step}
    if parallel.is_sample_leader:
        suffix = f"_dp{parallel.dp_rank}" if layout.dp > 1 else ""
        report["out"] = str(save_video(result.frames[0], config.out, suffix))
        if return_frames:
            report["frames"] = result.frames[0]
        if config.save_latents:
            path = Path(config.save_latents)
            path = path.with_name(f"{path.stem}{suffix}{path.suffix}")
            report["latents"] = str(_save_latents(final["latents"], path))
    return report
