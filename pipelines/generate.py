"""Generate a video with a diffusers text-to-video pipeline (Wan, CogVideoX, HunyuanVideo), sequence-parallel
on any layout.

    python -m pipelines.generate                                   # the built-in tiny Wan model, one process
    python -m pipelines.generate --model tiny-hunyuanvideo --ring 2  # or tiny-cogvideox; 2 worker processes
    python -m pipelines.generate --ulysses 2 --ring 2 --out a.mp4  # 4 local worker processes
    python -m pipelines.generate --cfg-parallel --ulysses 2        # guidance branches on 2 x 2 processes
    torchrun --nnodes 2 --nproc-per-node 8 -m pipelines.generate --model /ckpt/Wan2.1-T2V-14B-Diffusers \\
        --config configs/wan2.1-t2v-14b.yaml --ulysses 8 --cfg-parallel   # multi-node: dp = rest

Settings come from the model's defaults, then ``--config FILE.yaml``, then the flags given. ``--guidance``
is classifier-free guidance in every family: HunyuanVideo's ``true_cfg_scale`` (with the negative prompt),
the others' ``guidance_scale``; HunyuanVideo's distilled guidance is ``--embedded-guidance``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dit_sp import ParallelConfig, init_parallel, spawn
from dit_sp.models import family_of
from dit_sp.parallelize import parallelize
from pipelines.models import builtin_models, check_shape, default_model, load_pipeline, model_defaults
from pipelines.video import save_video

SETTINGS = {
    # name: (type, help); the defaults come from the model
    "prompt": (str, "text prompt"),
    "negative_prompt": (str, "negative prompt (guidance)"),
    "frames": (int, "number of video frames"),
    "height": (int, "frame height in pixels"),
    "width": (int, "frame width in pixels"),
    "steps": (int, "denoising steps"),
    "guidance": (float, "classifier-free guidance scale (<= 1: off); HunyuanVideo: its true_cfg_scale"),
    "embedded_guidance": (float, "HunyuanVideo: the guidance distilled into the model, its guidance_scale (6.0)"),
    "seed": (int, "random seed (per data-parallel rank: seed + dp rank)"),
    "ulysses": (int, "Ulysses (all-to-all) sequence-parallel degree"),
    "ring": (int, "ring-attention sequence-parallel degree"),
    "dtype": (str, "float32, bfloat16 or float16"),
    "out": (str, "output: FILE.mp4, FILE.gif or a directory of PNG frames"),
    "save_latents": (str, "also save the final latents to FILE.pt (for exact comparisons)"),
    "max_sequence_length": (int, "text tokens"),
}
BASE_DEFAULTS = {"prompt": "a red circle moving left", "negative_prompt": "", "seed": 0, "ulysses": 1, "ring": 1,
                 "dtype": "float32", "out": "outputs/video.mp4", "save_latents": None, "cfg_parallel": False,
                 "verify_inputs": False, "embedded_guidance": None}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"built-in {builtin_models()} or a local diffusers directory")
    parser.add_argument("--config", type=Path, help="YAML file of settings (flags override it)")
    for name, (kind, text) in SETTINGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)
    parser.add_argument("--cfg-parallel", action="store_true", default=None, help="guidance branches in parallel")
    parser.add_argument("--verify-inputs", action="store_true", default=None, help="debug: checksum the latents")
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}

    from_file = {}
    if "config" in args:
        path = args.pop("config")
        if not path.is_file():
            parser.error(f"--config {path}: no such file")
        from_file = yaml.safe_load(path.read_text()) or {}
        valid = set(SETTINGS) | {"model", "cfg_parallel", "verify_inputs"}
        unknown = sorted(set(from_file) - valid)
        if unknown:
            parser.error(f"unknown keys in {path}: {unknown}; valid keys: {sorted(valid)}")
    model = args.get("model") or from_file.get("model") or default_model()
    settings = BASE_DEFAULTS | model_defaults(model) | from_file | args | {"model": model}
    for name in ("frames", "height", "width", "steps", "ulysses", "ring"):
        if settings[name] < 1:
            parser.error(f"--{name} must be >= 1, got {settings[name]}")
    if settings["dtype"] not in ("float32", "bfloat16", "float16"):
        parser.error(f"--dtype must be float32, bfloat16 or float16, got {settings['dtype']}")
    if settings["cfg_parallel"] and not settings["guidance"] > 1:
        parser.error(
            f"--cfg-parallel runs the two guidance branches in parallel, but --guidance {settings['guidance']} "
            "turns guidance off; use --guidance > 1 or drop --cfg-parallel"
        )
    return settings


def guidance_arguments(pipe: Any, settings: dict[str, Any]) -> dict[str, float]:
    """The pipeline's guidance arguments. ``--guidance`` goes to the argument whose value > 1 runs
    classifier-free guidance, as dit-sp's model family records it (Wan, CogVideoX: ``guidance_scale``;
    HunyuanVideo: ``true_cfg_scale``, with the negative prompt). ``--embedded-guidance`` is HunyuanVideo's
    ``guidance_scale``: the guidance distilled into the model (left at the pipeline's 6.0 if not given)."""
    try:
        cfg_argument = family_of(pipe.transformer).guidance_arg
    except TypeError:  # a transformer dit-sp does not know: single process only, the usual argument
        cfg_argument = "guidance_scale"
    arguments = {cfg_argument: settings["guidance"]}
    if settings.get("embedded_guidance") is not None:
        if cfg_argument == "guidance_scale":
            raise ValueError(
                "--embedded-guidance is the distilled guidance of HunyuanVideo; this model has none (its "
                "guidance_scale is classifier-free guidance): use --guidance"
            )
        arguments["guidance_scale"] = settings["embedded_guidance"]
    return arguments


def run(settings: dict[str, Any]) -> dict[str, Any]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = 2 if settings["cfg_parallel"] else 1
    config = ParallelConfig.for_world(world, ring=settings["ring"], ulysses=settings["ulysses"], cfg=cfg)
    parallel = init_parallel(config)
    dtype = getattr(torch, settings["dtype"])
    pipe = load_pipeline(settings["model"], dtype).to(parallel.device)
    check_shape(pipe, settings)
    guidance = guidance_arguments(pipe, settings)
    pipe.set_progress_bar_config(disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    if world > 1:
        parallelize(pipe, parallel, verify_inputs=settings["verify_inputs"])

    step_times: list[float] = []
    final: dict[str, torch.Tensor] = {}

    def on_step_end(pipeline, step, timestep, tensors):
        step_times.append(time.perf_counter())
        final["latents"] = tensors["latents"].detach().cpu()
        return tensors

    generator = torch.Generator(parallel.device).manual_seed(parallel.dp_seed(settings["seed"]))
    start = time.perf_counter()
    result = pipe(
        prompt=settings["prompt"],
        negative_prompt=settings["negative_prompt"] or "",  # HunyuanVideo: no negative prompt, no guidance
        height=settings["height"],
        width=settings["width"],
        num_frames=settings["frames"],
        num_inference_steps=settings["steps"],
        generator=generator,
        max_sequence_length=settings["max_sequence_length"],
        output_type="np",
        callback_on_step_end=on_step_end,
        **guidance,
    )
    total = time.perf_counter() - start
    steps = [b - a for a, b in zip([start, *step_times[:-1]], step_times)]
    report = {"layout": str(config), "seconds": total, "seconds_per_step": sum(steps) / max(len(steps), 1)}
    if parallel.is_sample_leader:
        suffix = f"_dp{parallel.dp_rank}" if config.dp > 1 else ""
        out = save_video(result.frames[0], settings["out"], suffix)
        report["out"] = str(out)
        if settings.get("return_frames"):  # tests compare the float frames of every layout
            report["frames"] = result.frames[0]
        if settings["save_latents"]:
            path = Path(settings["save_latents"])
            path = path.with_name(f"{path.stem}{suffix}{path.suffix}")
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(final["latents"], path)
            report["latents"] = str(path)
    return report


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    world = settings["ring"] * settings["ulysses"] * (2 if settings["cfg_parallel"] else 1)
    if "RANK" in os.environ:  # under torchrun: this process is one rank
        reports = [run(settings)]
    elif world > 1:
        reports = spawn(run, world, args=(settings,), timeout=3600)
    else:
        reports = [run(settings)]
    for report in reports:
        if "out" in report:
            print(f"wrote {report['out']}" + (f" and {report['latents']}" if "latents" in report else ""))
            print(f"layout {report['layout']}: {report['seconds']:.1f} s, {report['seconds_per_step']:.3f} s/step")


if __name__ == "__main__":
    main()
