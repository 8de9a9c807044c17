"""What every generation shares, one video or a batch: load and parallelize the pipeline over the running
world (``setup``), sample one video (``sample``) and report the step cache (``cache_report``)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from dit_sp.cache import StepCache, enable_cache
from dit_sp.errors import ConfigError
from dit_sp.families import check_shape, video_tensor_pipelines
from dit_sp.inference.checks import MOTION_VIDEOS, guidance_arguments, takes_conditions
from dit_sp.inference.config import GenerateConfig
from dit_sp.inference.inpaint import frames_tensor, inpaint_inputs, takes_inpaint
from dit_sp.inference.media import VIDEO_HISTORY, read_image, read_video
from dit_sp.io.console import plain_tracebacks, quiet_followers
from dit_sp.parallel import ParallelState, check_ranks_agree, init_layout
from dit_sp.sp import parallelize
from dit_sp.zoo import TRANSFORMERS, call_arguments

STALE_CALLBACK_LATENTS = ("LTXI2VLongMultiPromptPipeline",)
"""Pipelines whose ``callback_on_step_end`` gets other latents than those it denoises, and writes what it returns
into them: diffusers 0.42.1's LTX-Video long pipeline hands the whole video's initial latents (``locals()``'s
``latents``) and puts them in place of the window's packed latents, which breaks the next step. ``sample`` records
their scheduler's steps instead."""


def save_latents(latents: torch.Tensor, path: Path) -> Path:
    """``torch.save`` under a temporary name, read back, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(latents, tmp)
    if not torch.equal(torch.load(tmp), latents):
        raise OSError(f"{path}: the latents did not read back")
    os.replace(tmp, path)
    return path


def setup(config: GenerateConfig, images: bool) -> tuple[ParallelState, Any, dict[str, float], StepCache | None]:
    """This rank's layout on the running world, the loaded (and, on several ranks, parallelized)
    pipeline with its guidance arguments (with ``images``, the pipeline that takes them), and its step
    cache, if any."""
    parallel, pipe, _, guidance, cache = _setup(config, images, image_view=False)
    return parallel, pipe, guidance, cache


def setup_with_image_view(config: GenerateConfig) -> tuple[ParallelState, Any, Any | None]:
    """``setup``'s layout and text-to-video pipeline, and its image-to-video view: for a checkpoint that is an
    image-to-video model too (``ModelFamily.image_to_video``: SANA-Video, Wan 2.2 TI2V, ...), that class built from the
    same components (``dit_sp.zoo.as_image_to_video``: the same modules, so the same parallelized transformer and VAE,
    adapters, step cache and compiled blocks; no second copy of any weight), else None. Without CFG parallelism: its
    guidance pair is bound to the text pipeline's class: None with it (the server refuses images on that layout)."""
    parallel, pipe, view, _, _ = _setup(config, images=False, image_view=not config.cfg_parallel)
    return parallel, pipe, view


Setup = tuple[ParallelState, Any, Any, dict[str, float], StepCache | None]
"""``_setup``'s layout, pipeline, image-to-video view (or None), guidance arguments and step cache."""


def _setup(config: GenerateConfig, images: bool, image_view: bool) -> Setup:
    from dit_sp.families import prepare_pipeline
    from dit_sp.zoo import as_image_to_video, load_pipeline, pipeline_class_name
    from dit_sp.zoo.modular import workflow_of

    cfg = 2 if config.cfg_parallel else 1
    with plain_tracebacks():
        parallel = init_layout(
            ring=config.ring, ulysses=config.ulysses, cfg=cfg, dp=config.dp, timeout=config.collective_timeout
        )
    quiet_followers(leader=parallel.rank == 0)  # one set of bars and warnings: the first sample leader's
    check_ranks_agree(parallel, dataclasses.asdict(config), "settings")
    dtype = getattr(torch, config.dtype)
    # with shard_weights the text encoders shard over a sample's processes too (they all encode its prompt)
    sample_size = parallel.world_size // parallel.dp
    encoders = (parallel.sample_group, dtype) if config.shard_weights and sample_size > 1 else None
    workflow = workflow_of(pipeline_class_name(config.model), dataclasses.asdict(config))  # MiniMax-H3's ref2va
    pipe = load_pipeline(config.model, dtype, parallel.device, empty_transformers=config.shard_weights,
                         sharded_text_encoders=encoders, workflow=workflow)  # fmt: skip
    if images:
        pipe = as_image_to_video(pipe)
    view = None
    if image_view:  # before parallelize: of the stock class
        with contextlib.suppress(ConfigError):  # its image class does not take its components: images are refused
            view = as_image_to_video(pipe)
        view = None if view is pipe else view
    if view is not None:
        prepare_pipeline(view)  # as parallelize prepares the pipeline it gets
        progress_bars(view, disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    if config.lora:  # before parallelize: the adapters are part of the model it splits, compiles and caches
        from dit_sp.train.lora_io import load_adapters

        load_adapters(pipe, config.lora_adapters)
    check_shape(pipe, dataclasses.asdict(config))
    guidance = guidance_arguments(pipe, config)
    progress_bars(pipe, disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    if parallel.world_size > 1:
        handle = parallelize(
            pipe,
            parallel,
            verify_inputs=config.verify_inputs,
            shard_weights=config.shard_weights,
            parallel_vae=config.parallel_vae,
            # the leader writes; a video-to-video pipeline joins the decoded frames to its input video after the
            # decode, on every rank, so each needs whole frames
            # (Wan Animate: each segment's last frames condition the next)
            frames_on="every_rank" if config.video or config.pose_video else "leader",
            compile=config.compile,
            cache=config.cache_spec,
        )
        return parallel, pipe, view, guidance, handle.cache
    if config.compile:
        from dit_sp.sp.compile import compile_blocks

        for transformer in filter(None, (getattr(pipe, name, None) for name in TRANSFORMERS)):
            compile_blocks(transformer)
    cache = enable_cache(pipe, config.cache_spec) if config.cache is not None else None
    return parallel, pipe, view, guidance, cache


def sample(pipe: Any, config: GenerateConfig, guidance: dict[str, float], seed: int, device: torch.device,
           on_step: Callable[[int, int], None] | None = None, output_type: str = "np") -> dict:  # fmt: skip
    """One video: ``{"frames": (F, H, W, 3) in [0, 1], "latents", "seconds", "seconds_per_step",
    "first_step_seconds", "later_seconds_per_step"}``: the first step apart from the others, since with
    ``compile`` it holds the compilation (a two-expert model compiles its second expert later, in its first step).
    ``on_step(done, total)`` is called after each denoising step (the server's progress and cancel point).
    ``output_type="latent"`` (``--refine``, Sana-WM): ``frames`` are the pipeline's latents, undecoded."""
    step_times: list[float] = []
    final: dict[str, torch.Tensor] = {}

    def on_step_end(pipeline, step, timestep, tensors):
        step_times.append(time.perf_counter())
        final["latents"] = tensors["latents"].detach().cpu()
        if on_step is not None:  # MiniMax-H3's steps count its sigmas with the terminal 0: one call fewer
            on_step(step + 1, len(pipe.scheduler.timesteps) if modular else config.steps)
        return tensors

    images = {key: read_image(path, "--" + key.replace("_", "-"))
              for key, path in (("image", config.image), ("last_image", config.last_image)) if path}  # fmt: skip
    stock = next(c for c in type(pipe).__mro__ if c.__module__.startswith("diffusers."))  # not parallelize's
    if config.video:  # video extension (SkyReels-V2 DF V2V): the video's last frames are the history
        images["video"] = read_video(config.video)
        if "overlap_history" in inspect.signature(stock.__call__).parameters:
            images["overlap_history"] = min(len(images["video"]), VIDEO_HISTORY)
        if stock.__name__ in video_tensor_pipelines():  # AnyFlow FAR: (1, T, 3, H, W) in [0, 1]
            images["video"] = frames_tensor(images["video"], config.height, config.width).transpose(1, 2)
    for key in MOTION_VIDEOS:  # Wan Animate: the input videos; the output is made in segments of `frames`
        if path := getattr(config, key):
            images[key] = read_video(path, "--" + key.replace("_", "-"))
            images["segment_frame_length"] = config.frames
    if config.background_video:  # and mask_video (checked): the character replaces the video's person
        images["mode"] = "replace"
    if config.control_video:  # CogVideoX-Fun Control: its latents join the noise in channels; Cosmos-Transfer2.5's
        # ControlNet takes it as `controls` (each pipeline gets the name it takes: _taken)
        images["control_video"] = images["controls"] = read_video(config.control_video, "--control-video")
    takes = inspect.signature(stock.__call__).parameters
    references = {}
    if "reference_conditions" in takes and "video" in images:  # LTX-2 HDR and IC-LoRA: --video is the reference
        images = dict(images)
        references = _as_references(stock, images.pop("video"))
    if takes_inpaint(takes):  # the video and mask as the tensors it takes
        images = inpaint_inputs(images, config.frames, config.height, config.width)
    if takes_conditions(takes):
        images = _as_conditions(stock, images)
    images |= references
    if "cond_image" in takes and "image" in images:  # LTX-Video long multi-prompt: its first frame
        images["cond_image"] = images.pop("image")
    arguments = dict(
        **images,
        prompt=config.prompt,
        negative_prompt=config.negative_prompt or "",  # HunyuanVideo: no negative prompt, no guidance
        height=config.height,
        width=config.width,
        num_frames=config.frames,
        video_length=config.frames,  # Latte's name for it (each pipeline gets the names it takes: _taken)
        num_inference_steps=config.steps,
        generator=torch.Generator(device).manual_seed(seed),
        seed=seed,  # LTX-Video long multi-prompt: each temporal window's noise is drawn from seed + its first frame
        max_sequence_length=config.max_sequence_length,
        output_type=output_type,
        # Sana-Video: the size asked, not the 480p/720p bucket its binning would move it to (and the shape checks
        # count the tokens of the size asked)
        use_resolution_binning=False,
        callback_on_step_end=on_step_end,
        **guidance,
    )
    for key in ("causal_block_size", "ar_step"):  # SkyReels-V2 diffusion forcing's asynchronous mode
        if getattr(config, key) is not None:
            arguments[key] = getattr(config, key)
    blocks = {param.name for param in pipe.blocks.inputs} if _is_modular(pipe) else set()  # a modular one's inputs
    if "pyramid_num_inference_steps_list" in {*inspect.signature(stock.__call__).parameters, *blocks}:  # Helios pyramid
        arguments["pyramid_num_inference_steps_list"] = [config.steps] * pipe.scheduler.config.stages  # per stage
    arguments |= call_arguments(config.model)  # a built-in model's fixed call arguments (its spec's ``call:``)
    if config.camera is not None:  # Sana-WM's camera path and intrinsics (a built-in model's spec has its own)
        arguments["action"] = config.camera
    if config.intrinsics is not None:
        arguments["intrinsics"] = [float(value) for value in config.intrinsics.split(",")]
    if stock.__name__ in STALE_CALLBACK_LATENTS:  # the scheduler's steps are recorded instead (_steps_recorded)
        del arguments["callback_on_step_end"]
    modular = _is_modular(pipe)
    arguments = _modular_inputs(pipe, arguments, dataclasses.asdict(config)) if modular else _taken(pipe, arguments)
    start = time.perf_counter()
    with _steps_recorded(pipe, on_step_end, "callback_on_step_end" not in arguments):
        result = pipe(**arguments)
    steps = [b - a for a, b in zip([start, *step_times[:-1]], step_times)]
    if modular:  # its outputs by name: the decoded videos and the final (unpacked) latents; Wan-Animate-2 frees its
        # segments' latents after decoding them: the scheduler's last step's (``_steps_recorded``)
        videos = result["videos"]  # a batch of videos; Cosmos 3's modular decoder gives the one video, (F, H, W, 3)
        frames = videos if getattr(videos, "ndim", 0) == 4 else videos[0]
        if result["latents"] is not None:
            final["latents"] = result["latents"].detach().cpu()
    elif hasattr(result, "frames"):  # (B, F, H, W, 3); Sana-WM's output (with its camera poses, c2w) is one video
        frames = result.frames if hasattr(result, "c2w") else result.frames[0]
    elif hasattr(result, "video"):  # Cosmos 3 (Cosmos3OmniPipelineOutput): the one sample's frames
        frames = result.video
    else:  # a text-to-image pipeline (Cosmos-Predict2 Text2Image; Kandinsky 5's, as ``image``) returns images: its
        # image is a one-frame video
        frames = (result.images if hasattr(result, "images") else result.image)[0][None]
    return {"frames": frames, "latents": final["latents"], "seconds": time.perf_counter() - start,
            "seconds_per_step": sum(steps) / max(len(steps), 1), "first_step_seconds": steps[0] if steps else 0.0,
            "later_seconds_per_step": sum(steps[1:]) / max(len(steps) - 1, 1)}  # fmt: skip


def _as_conditions(stock: type, images: dict[str, Any]) -> dict[str, Any]:
    """The inputs of a pipeline that takes them as ``conditions`` (LTX-2's ``LTX2VideoCondition``, from the
    pipeline's module): the image or video at the first latent frame, the last image at the last (index -1)."""
    import importlib

    module = importlib.import_module(stock.__module__)
    condition = next(getattr(module, n) for n in dir(module) if n.endswith("VideoCondition"))
    first = images.get("video", images.get("image"))
    conditions = [condition(frames=first, index=0)] if first is not None else []
    if "last_image" in images:
        conditions.append(condition(frames=images["last_image"], index=-1))
    return {"conditions": conditions}


def _as_references(stock: type, video: list[Any]) -> dict[str, Any]:
    """The input video of a pipeline that takes it as ``reference_conditions`` (LTX-2's HDR and IC-LoRA pipelines:
    its latent tokens are appended to the noisy ones, clean), with the condition class of the pipeline's module."""
    import importlib

    module = importlib.import_module(stock.__module__)
    reference = next(getattr(module, n) for n in dir(module) if n.endswith("ReferenceCondition"))
    return {"reference_conditions": [reference(frames=video)]}


@contextlib.contextmanager
def _steps_recorded(pipe: Any, on_step_end: Callable, needed: bool) -> Iterator[None]:
    """For a pipeline without ``callback_on_step_end`` (HunyuanVideo-1.5), ``on_step_end`` after each scheduler step,
    with the latents it returns: the scheduler's ``step`` is wrapped on this instance for the call. A pipeline without
    a scheduler (Echo's modular blocks re-noise in their own loop) records no steps: its latents are its output's."""
    if not needed or getattr(pipe, "scheduler", None) is None:
        yield
        return
    scheduler, done = pipe.scheduler, [0]
    stock = type(scheduler)

    class Recorded(stock):  # a class, not an instance attribute: a copy made in the call (LTX-2 modular blocks' audio
        def step(self, *args: Any, **kwargs: Any) -> Any:  # scheduler) steps itself and records nothing
            out = stock.step(self, *args, **kwargs)
            if self is scheduler:
                on_step_end(pipe, done[0], None, {"latents": out[0] if isinstance(out, tuple) else out.prev_sample})
                done[0] += 1
            return out

    scheduler.__class__ = Recorded
    try:
        yield
    finally:
        scheduler.__class__ = stock


def progress_bars(pipe: Any, disable: bool) -> None:
    """The pipeline's progress bars on or off (off on every rank but the first sample leader: one set of bars). A
    modular pipeline's blocks run as copies made per call, which do not keep what ``set_progress_bar_config`` set
    (MiniMax-H3's denoise loop), and some draw their bars with a bare ``tqdm`` (Wan-Animate-2's per-segment bars):
    turned off in this process where the blocks' modules import ``tqdm`` (``dit_sp._compat.quiet_bare_progress_bars``).
    """
    pipe.set_progress_bar_config(disable=disable)
    if disable and _is_modular(pipe):
        from dit_sp._compat import quiet_bare_progress_bars

        blocks, todo = [], [pipe.blocks]
        while todo:  # the tree of blocks: every workflow's
            blocks.append(todo.pop())
            todo.extend(getattr(blocks[-1], "sub_blocks", {}).values())
        quiet_bare_progress_bars(blocks)


def _is_modular(pipe: Any) -> bool:
    """Whether ``pipe`` is a Modular Diffusers pipeline (MiniMax-H3): called with its blocks' inputs by name, and
    asked for its outputs by name."""
    from diffusers import ModularPipeline

    return isinstance(pipe, ModularPipeline)


def _modular_inputs(pipe: Any, arguments: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The ``arguments`` a modular pipeline's blocks take, under the names its family gives them in the workflow of
    ``settings`` (``ModelFamily.inputs_for``: Wan-Animate-2's ``driving_video``, MiniMax-H3's ``references`` in
    ``ref2va``, its ``image`` and ``last_image`` keyframes in ``fl2va``; no step callback:
    ``_steps_recorded`` times its scheduler's steps) and as its family gives them (``ModelFamily.modular_arguments``),
    and the outputs ``sample`` reads: ``videos`` and ``latents``."""
    from dit_sp.families import PARALLELIZED_TRANSFORMERS, family_of

    # the transformer its workflow loaded (a MiniMax-H3 repository's ref2va: transformer_ref alone)
    family = family_of(next(t for t in (getattr(pipe, n, None) for n in PARALLELIZED_TRANSFORMERS) if t is not None))
    inputs = family.inputs_for(family.workflow_for(settings))
    arguments = {inputs.get(key, key): value for key, value in arguments.items()}
    names = {param.name for param in pipe.blocks.inputs}
    taken = {key: value for key, value in arguments.items() if key in names}
    return family.modular_arguments(taken) | {"output": ["videos", "latents"]}


def _taken(pipe: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """The ``arguments`` the pipeline's ``__call__`` takes: EasyAnimate's pipelines fix their text length (no
    ``max_sequence_length``). A class that passes ``**kwargs`` on (``parallelize``'s subclass) is looked through."""
    for cls in type(pipe).__mro__:
        if "__call__" in vars(cls):
            parameters = inspect.signature(vars(cls)["__call__"]).parameters
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
                taken = {key: value for key, value in arguments.items() if key in parameters}
                if "frames" in parameters and "num_frames" in arguments:  # Sana-Video's name for it
                    taken["frames"] = arguments["num_frames"]
                return taken
    return arguments


def cache_report(cache: StepCache) -> dict[str, Any]:
    """What a step cache did: ``{"cache", "saved_fraction", "blocks_run", "blocks", "computed"}``, where
    ``computed`` gives, per context (``cond``, ``uncond``, ...), whether each call ran the blocks."""
    stats = cache.stats
    contexts = dict.fromkeys(r.context for r in stats.records)
    return {"cache": str(cache.spec), "saved_fraction": stats.saved_fraction, "blocks_run": stats.blocks_run,
            "blocks": stats.blocks, "computed": {c: stats.decisions(c) for c in contexts}}  # fmt: skip
