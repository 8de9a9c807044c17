"""What a generation checks before weights load or workers start (sizes, outputs, image inputs against the
model's pipeline), the image files it reads, and the guidance arguments a pipeline takes."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.families import FAMILIES, python_only_pipelines, refused_pipelines, video_tensor_pipelines
from dit_sp.inference.config import GenerateConfig
from dit_sp.inference.guidance import GUIDER, guidance_arguments  # noqa: F401 (imported from here too)
from dit_sp.inference.inpaint import takes_inpaint
from dit_sp.inference.media import read_image, read_video
from dit_sp.io.video import check_output, check_writable


def check_before_loading(config: GenerateConfig) -> None:
    """What can be checked from files alone, before weights load or workers start: the output locations
    (that each takes a file: not read-only, not full), the model directory's files (``zoo.check_checkpoint``:
    its index, configs and safetensors headers), and frames, sizes and text length against the model's
    config files (``ConfigError`` naming the flag or file)."""
    from dit_sp.zoo import check_checkpoint, check_shape_from_files

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
    check_checkpoint(config.model)
    for path, _ in config.lora_adapters:
        from dit_sp.train.lora_io import lora_file

        lora_file(path, "--lora")
    if config.refine:  # a model with a stage-2 refiner, the refiner's files, the Ulysses degree it runs on
        from dit_sp.zoo.refiner import check_refiner, check_refiner_layout

        check_refiner(config.model)
        why = f"--cfg-parallel x --ulysses {config.ulysses}: its calls are unguided" if config.cfg_parallel else ""
        check_refiner_layout(config.model, config.ulysses * (2 if config.cfg_parallel else 1), why or "--ulysses")
    info = check_shape_from_files(config.model, dataclasses.asdict(config))
    check_image_inputs(config, info)


def check_modular(config: GenerateConfig, name: str) -> bool:
    """For a Modular Diffusers pipeline ``name`` (MiniMax-H3, Wan-Animate-2; ``--cfg-parallel`` is refused before
    this, as for every pipeline whose family refuses it): ``--workflow`` one of its family's (``ModelFamily
    .workflows``), the input files the workflow takes (``ModelFamily.inputs_for``: MiniMax-H3's ``fl2va`` its
    first and last frame, ``ref2va`` a reference image) required where its blocks require them (a workflow other
    than the family's default: one of them at least) and readable, the others refused, and so are ``--camera`` /
    ``--intrinsics``, ``--causal-block-size`` / ``--ar-step`` and ``--negative-prompt`` where the blocks' inputs do
    not take them; ``False`` for other pipelines."""
    family = next((f for f in FAMILIES if name in f.modular_pipelines), None)
    if family is None:
        return False
    workflow = family.workflow_for(dataclasses.asdict(config))
    if config.workflow and workflow not in family.workflows:
        runs = f"its workflows are {', '.join(family.workflows)}" if family.workflows else "it has one workflow"
        raise ConfigError(f"--workflow {config.workflow}: {config.model} ({name}) has no such workflow ({runs}); "
                          f"{'name one of them' if family.workflows else 'drop --workflow'}")  # fmt: skip
    inputs = ("image", "last_image", "video", "control_video", *MOTION_VIDEOS)
    taken = [key for key in inputs if key in family.inputs_for(workflow)]
    given = [key for key in inputs if getattr(config, key, None) and key not in taken]
    if given:
        flag = "--" + given[0].replace("_", "-")
        flow = f" in its {workflow} workflow" if family.workflows else ""
        if not taken:
            raise ConfigError(f"{flag}: {config.model} ({name}) takes no input files{flow} (text only); drop {flag}"
                              + (" or --workflow" if config.workflow else ""))  # fmt: skip
        raise ConfigError(f"{flag}: {config.model} ({name}) takes no {given[0].replace('_', ' ')}{flow}, only "
                          f"{' and '.join('--' + k.replace('_', '-') for k in taken)}; drop {flag}"
                          + (" or --workflow" if config.workflow else ""))  # fmt: skip
    if workflow != family.modular_workflow and not any(getattr(config, key) for key in taken):
        raise ConfigError(f"--workflow {workflow}: {config.model} ({name}) needs "
                          f"{' or '.join('--' + k.replace('_', '-') for k in taken)} in it; add one")  # fmt: skip
    import diffusers

    from dit_sp.zoo.modular import check_fixed

    blocks = getattr(diffusers, getattr(diffusers, name).default_blocks_name)()
    params = {param.name: param for param in blocks.inputs}
    check_diffusion_forcing(config, name, params)  # flags the blocks do not take, refused as for other pipelines
    check_fixed(name, config, GenerateConfig.load(overrides={"model": config.model}))  # what its blocks fix
    check_camera(config, name, params)
    if config.negative_prompt and "negative_prompt" not in params:  # MiniMax-H3's: it would be passed over silently
        raise ConfigError(f"--negative-prompt: {config.model} ({name}) takes no negative prompt (its blocks have no "
                          "such input); drop --negative-prompt")  # fmt: skip
    for key in taken:
        flag, param = "--" + key.replace("_", "-"), params[family.inputs_for(workflow)[key]]
        if not getattr(config, key) and param.required:
            what = param.description.split(",")[0].split(".")[0]
            raise ConfigError(f"{config.model} ({name}) needs {flag} PATH: its {param.name}, "
                              f"{what[:1].lower()}{what[1:]}")  # fmt: skip
        if (path := getattr(config, key)) and key in ("image", "last_image"):
            read_image(path, flag)
        elif path:
            read_video(path, flag)
    if workflow != family.modular_workflow:
        from dit_sp.zoo import checkpoint_dir  # a repository: its workflow's components too (MiniMax-H3's ref2va)
        from dit_sp.zoo.modular import check_repository

        if (path := checkpoint_dir(config.model)) is not None:
            check_repository(path, workflow)
    return True


def check_image_inputs(config: GenerateConfig, info: Any | None = None) -> None:
    """The model's pipeline against the flags, before loading: a pipeline ``generate`` refuses or leaves to Python, a
    ring its family refuses (``ModelFamily.ring_refusal``, from the transformer's config files), and the inputs it
    takes (``--image`` / ``--last-image``, videos, references, ``--camera``, ...) given and readable (``ConfigError``
    saying which flag to add or drop)."""
    import inspect

    import diffusers

    from dit_sp.zoo import pipeline_class_name, pipeline_index

    name = pipeline_class_name(config.model, image=bool(config.image))
    if name is None or not hasattr(diffusers, name):
        return  # the full load reports what the model is
    if name in refused_pipelines():
        raise ConfigError(f"{config.model} ({name}): {refused_pipelines()[name]}")
    if name in python_only_pipelines():  # LTX-2's DFR temporal refine: it refines another pass's latent output
        raise ConfigError(f"{config.model} ({name}): generate does not run it: {python_only_pipelines()[name]}")
    from dit_sp.zoo.table import family_of_pipeline

    family = family_of_pipeline(name)
    transformer = info.transformer.config if info is not None else {}  # its config.json: NABLA refuses a ring
    if config.ring > 1 and family is not None and (ring_refused := family.ring_refusal(transformer or {})):
        raise ConfigError(f"--ring {config.ring} for {name}: {ring_refused}")
    if config.cfg_parallel and family is not None and family.cfg_refused:  # no guidance pair (Kandinsky 6 SR, ...)
        raise ConfigError(f"--cfg-parallel for {name}: {family.cfg_refused}")
    if (
        config.cfg_parallel
        and family is not None
        and name in family.modular_pipelines
        and family.cfg_mode != "sequential"
    ):
        from dit_sp.sp.pipeline import MODULAR_BATCHED_REFUSED  # (LTX-2's modular blocks: parallelize refuses it too)

        raise ConfigError(f"--cfg-parallel for {name}: {MODULAR_BATCHED_REFUSED}")
    check_cache(config, name, family)
    if check_modular(config, name):
        return
    if config.workflow:
        raise ConfigError(f"--workflow {config.workflow}: {config.model} ({name}) is not a Modular Diffusers pipeline "
                          "with workflows (MiniMax-H3's); drop --workflow")  # fmt: skip
    takes = inspect.signature(getattr(diffusers, name).__call__).parameters
    if "cond_image" in takes and "image" not in takes:  # LTX-Video long multi-prompt: --image is its cond_image
        takes = {**takes, "image": takes["cond_image"]}
    check_fixed_schedule(config, name, takes)
    check_control_video(config, name, takes)
    check_diffusion_forcing(config, name, takes)
    if "reference_conditions" in takes:
        check_reference_input(config, name, takes)
        return
    if takes_inpaint(takes):  # EasyAnimate's inpaint pipeline: --image, or --video with --mask-video
        check_inpaint_inputs(config, name)
        return
    if takes_conditions(takes):
        check_condition_inputs(config, name)
        return
    check_video_input(config, name, takes, info)
    check_motion_videos(config, name, takes)
    check_camera(config, name, takes)
    if "image" not in takes:
        if config.image or config.last_image:
            raise ConfigError(f"--image: {config.model} is a text-to-video model ({name}) and takes no image; use an "
                              "image-to-video model (e.g. tiny-wan-i2v, a Wan I2V or CogVideoX I2V checkpoint), "
                              "or drop --image/--last-image")  # fmt: skip
        return
    if config.image and name == "Cosmos2_5_PredictBasePipeline" and importlib.util.find_spec("torchvision") is None:
        raise ConfigError(f"--image: {name} reads the image with torchvision, which is not installed: pip install "
                          "torchvision, or condition on a video instead (--video, 5 frames or more)")  # fmt: skip
    if not config.image and takes["image"].default is inspect.Parameter.empty:
        raise ConfigError(f"{config.model} is an image-to-video model ({name}): give its first frame with --image PATH")
    if config.last_image:
        # the class it runs as (a text-to-video checkpoint's image-to-video class: SkyReels-V2 DF's) takes it, and
        # the checkpoint uses it (its family's last_image_refused: Wan 2.2 TI2V's WanImageToVideoPipeline ignores it)
        index = pipeline_index(config.model)
        why = family.last_image_refused(index[1]) if family is not None and index is not None else ""
        if "last_image" not in takes or why:
            raise ConfigError(f"--last-image: {config.model} takes the first frame only{f' ({why})' if why else ''}; "
                              "drop --last-image")  # fmt: skip
        if transformer.get("image_dim") is not None and transformer.get("pos_embed_seq_len") is None:
            raise ConfigError(f"--last-image: {config.model} encodes one image (Wan2.1-I2V); first-last-frame video "
                              "needs a Wan2.1-FLF2V or Wan 2.2 I2V checkpoint, or drop --last-image")  # fmt: skip
    elif info is not None and info.transformer.config.get("pos_embed_seq_len") is not None:
        raise ConfigError(f"{config.model} is a first-last-frame model (Wan2.1-FLF2V): give the last frame too "
                          "with --last-image PATH")  # fmt: skip
    for flag, path in (("--image", config.image), ("--last-image", config.last_image)):
        if path is not None:
            read_image(path, flag)


def check_cache(config: GenerateConfig, name: str, family: Any) -> None:
    """``--cache`` for pipeline class ``name`` of ``family`` (a ``ModelFamily`` or None), before loading: refused in
    one line with the reason of a family whose blocks the step caches cannot run on (``step_cache_refused``)."""
    if not config.cache:
        return
    from dit_sp.cache.step_cache import step_cache_refusal

    if family is not None and family.step_cache_refused:
        raise ConfigError(f"--cache {config.cache}: {step_cache_refusal(name, family)}")


def check_inpaint_inputs(config: GenerateConfig, name: str) -> None:
    """``--image`` or ``--video`` with ``--mask-video`` for an inpaint pipeline (``name``: its class), each file
    readable and the videos ``frames`` long at least; the flags it takes none of are refused in one line."""
    others = {"--last-image": config.last_image, "--pose-video": config.pose_video,
              "--face-video": config.face_video, "--background-video": config.background_video}  # fmt: skip
    for flag, path in others.items():
        if path:
            raise ConfigError(f"{flag}: {config.model} ({name}) inpaints a video under a mask and takes no "
                              f"{flag[2:].replace('-', ' ')}; drop {flag}")  # fmt: skip
    if config.image and config.video:
        raise ConfigError(f"--image with --video: {config.model} ({name}) keeps either an image (its first frame) or "
                          "the parts of a video that --mask-video leaves black; give one of them")  # fmt: skip
    if bool(config.video) != bool(config.mask_video):
        raise ConfigError(f"--video and --mask-video come together for {config.model} ({name}): the video and, per "
                          "frame, what to make anew (white) or keep (black); give both, or --image PATH to animate "
                          "an image")  # fmt: skip
    if config.image:
        read_image(config.image, "--image")
    for flag, path in (("--video", config.video), ("--mask-video", config.mask_video)):
        if path and len(frames := read_video(path, flag)) < config.frames:
            raise ConfigError(f"{flag} {path}: {len(frames)} frames, fewer than the {config.frames} to make; give a "
                              f"longer video or --frames {len(frames)} or fewer")  # fmt: skip


def takes_conditions(takes: Any) -> bool:
    """Whether a pipeline whose ``__call__`` parameters are ``takes`` gets its images and videos as a list of
    ``conditions`` (LTX-2's condition pipeline, ``LTX2VideoCondition``), not as ``image`` / ``video``."""
    return "conditions" in takes and "image" not in takes and "video" not in takes


def check_condition_inputs(config: GenerateConfig, name: str) -> None:
    """``--image`` / ``--video`` (the first frame) and ``--last-image`` (the last) of a pipeline that takes them as
    conditions, and the files readable; none is text-to-video."""
    if config.image and config.video:
        raise ConfigError(f"--image with --video: both would condition the first frame of {config.model} ({name}); "
                          "give one of them")  # fmt: skip
    for flag, path in (("--image", config.image), ("--last-image", config.last_image)):
        if path is not None:
            read_image(path, flag)
    if config.video:
        read_video(config.video)


def check_fixed_schedule(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--steps`` of a pipeline that takes no step count but a fixed schedule of sigmas (LTX-2's DFR pass: its
    distilled 8): the steps must be the schedule's, since the pipeline would run those whatever ``--steps`` said."""
    sigmas = takes["sigmas"].default if "sigmas" in takes and "num_inference_steps" not in takes else None
    if isinstance(sigmas, (list, tuple)) and config.steps != len(sigmas):
        raise ConfigError(f"--steps {config.steps}: {config.model} ({name}) runs its fixed distilled schedule of "
                          f"{len(sigmas)} steps; use --steps {len(sigmas)}")  # fmt: skip


def check_reference_input(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--video`` of a pipeline that takes a reference video (``reference_conditions``: LTX-2's HDR and IC-LoRA
    pipelines), which it needs, and ``--image`` / ``--last-image`` where it also takes frame conditions; the files."""
    check_motion_videos(config, name, takes)
    if not config.video:
        raise ConfigError(f"{config.model} follows a reference video ({name}): give it with --video PATH")
    read_video(config.video)
    if not takes_conditions(takes) and (config.image or config.last_image):
        raise ConfigError(f"--image/--last-image: {config.model} ({name}) takes a reference video (--video) and no "
                          "images; drop --image/--last-image")  # fmt: skip
    for flag, path in (("--image", config.image), ("--last-image", config.last_image)):
        if path is not None:
            read_image(path, flag)


def check_control_video(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--control-video`` against the pipeline's ``__call__`` parameters ``takes`` (``name``: its class), and the
    file: a control pipeline needs one (it takes its length from it), the others take none. Cosmos-Transfer2.5 takes
    it as ``controls`` (edge, depth, segmentation or blur frames, made beforehand) and makes no more frames than it
    has: it must hold ``--frames`` frames."""
    if "control_video" not in takes and "controls" not in takes:
        if config.control_video:
            raise ConfigError(f"--control-video: {config.model} ({name}) takes no control video; use a control model "
                              "(e.g. tiny-cogvideox-fun-control, tiny-cosmos2.5-transfer), or drop "
                              "--control-video")  # fmt: skip
        return
    if not config.control_video:
        raise ConfigError(f"{config.model} is a control model ({name}): give its control video with "
                          "--control-video PATH")  # fmt: skip
    frames = read_video(config.control_video, "--control-video")
    if "controls" in takes and len(frames) < config.frames:
        raise ConfigError(f"--control-video {config.control_video}: {len(frames)} frames, fewer than the "
                          f"{config.frames} to make ({name} makes no more than its control video has); give a longer "
                          f"video or --frames {len(frames)} or fewer")  # fmt: skip


def check_diffusion_forcing(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--causal-block-size`` / ``--ar-step`` against the pipeline's ``__call__`` parameters ``takes`` (SkyReels-V2
    diffusion forcing's), and block-causal attention against the layout: a ring cannot split it exactly."""
    for flag in ("causal_block_size", "ar_step"):
        if getattr(config, flag) is not None and flag not in takes:
            raise ConfigError(f"--{flag.replace('_', '-')}: {config.model} ({name}) takes none; it is SkyReels-V2 "
                              "diffusion forcing's (e.g. tiny-skyreels-v2-df)")  # fmt: skip
    if (config.causal_block_size or 1) > 1 and config.ring > 1:
        raise ConfigError(f"--causal-block-size {config.causal_block_size} attends block-causally over frames, a mask "
                          f"that only Ulysses splits exactly, not a ring of {config.ring}: use --ulysses instead of "
                          "--ring")  # fmt: skip


def check_video_input(config: GenerateConfig, name: str, takes: Any, info: Any | None = None) -> None:
    """``--video`` against the pipeline's ``__call__`` parameters ``takes`` (``name``: its class), and the file; with
    ``info`` (``shape_info``: its VAE's factors, its transformer's config), for a pipeline that keeps the video's latent
    frames as the first of the video it makes (``ModelFamily.video_prefix``: AnyFlow's), no more of them than
    ``--frames`` makes, and for one that takes it as one tensor (``ModelFamily.video_tensor``: AnyFlow FAR's), a length
    it takes."""
    if "video" not in takes:
        if config.video:
            raise ConfigError(f"--video: {config.model} ({name}) takes no input video; use a video-to-video model "
                              "(e.g. tiny-skyreels-v2-df-v2v), or drop --video")  # fmt: skip
        return
    # without num_frames the pipeline takes its length from the video (Wan, CogVideoX V2V): it needs one too
    if not config.video and (takes["video"].default is inspect.Parameter.empty or "num_frames" not in takes):
        raise ConfigError(f"{config.model} is a video-to-video model ({name}): give the input video with "
                          "--video PATH")  # fmt: skip
    if not config.video:
        return
    frames = len(read_video(config.video))
    if name in video_tensor_pipelines() and info is not None and info.transformer.config:
        fits, why = video_tensor_pipelines()[name](info.transformer.config, info.vae_scale_factor_temporal)
        if frames not in fits:
            raise ConfigError(f"--video {config.video}: {frames} frames; {name} takes a video of "
                              f"{' or '.join(map(str, fits)) or 'no'} frames ({why}): trim it to one of "
                              "them")  # fmt: skip
    if info is not None and any(name in family.video_prefix for family in FAMILIES):  # AnyFlow: the output's first
        temporal = info.vae_scale_factor_temporal  # a causal VAE: the first frame, then one latent per `temporal`
        given, made = (frames - 1) // temporal + 1, (config.frames - 1) // temporal + 1
        if given > made:
            raise ConfigError(f"--video {config.video}: {frames} frames encode to {given} latent frames, more than the "
                              f"{made} of the --frames {config.frames} to make ({name} keeps the video's latent frames "
                              f"as the first of its output); give --frames {(given - 1) * temporal + 1} or more, or a "
                              f"video of at most {made * temporal} frames")  # fmt: skip


MOTION_VIDEOS = ("pose_video", "face_video", "background_video", "mask_video")
"""The input videos of Wan Animate's pipeline (``WanAnimatePipeline``), by their setting's (and argument's) name:
the driving pose and face videos, and replace mode's background and mask (which come together)."""


def check_motion_videos(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--pose-video`` / ``--face-video`` (and replace mode's ``--background-video`` / ``--mask-video``) against the
    pipeline's ``__call__`` parameters ``takes``, and the files."""
    if "background_video" in takes and bool(config.background_video) != bool(config.mask_video):
        raise ConfigError("--background-video and --mask-video come together (Wan Animate's replace mode: the video "
                          "and where its person is); give both, or neither to animate the image")  # fmt: skip
    for key in MOTION_VIDEOS:
        flag, path = "--" + key.replace("_", "-"), getattr(config, key)
        if key not in takes and path:
            inpaint = ", or an EasyAnimate inpaint one, tiny-easyanimate-inpaint" if key == "mask_video" else ""
            raise ConfigError(f"{flag}: {config.model} ({name}) takes no {key.replace('_', ' ')}; use a Wan Animate "
                              f"model (e.g. tiny-wan-animate{inpaint}), or drop {flag}")  # fmt: skip
        if key in takes and not path and takes[key].default is inspect.Parameter.empty:
            raise ConfigError(f"{config.model} animates an image by pose and face videos ({name}): give {flag} PATH")
        if path:
            read_video(path, flag)


def check_camera(config: GenerateConfig, name: str, takes: Any) -> None:
    """``--camera`` and ``--intrinsics`` go to a camera-controlled pipeline (Sana-WM's ``action`` and ``intrinsics``),
    which needs both (or its built-in model's spec fixes them)."""
    from dit_sp.zoo import call_arguments

    given = {"--camera": config.camera, "--intrinsics": config.intrinsics}
    if "intrinsics" not in takes:  # Cosmos 3 takes an `action` too: a robot's, not a camera path
        if flags := [flag for flag, value in given.items() if value is not None]:
            raise ConfigError(f"{flags[0]}: {config.model} ({name}) takes no camera; it is Sana-WM's "
                              f"(SanaWMPipeline): drop {'/'.join(flags)}")  # fmt: skip
        return
    fixed = call_arguments(config.model)
    if config.camera is None and not {"action", "c2w"} & fixed.keys():
        raise ConfigError(f"{config.model} ({name}) is camera-controlled: give its path with --camera KEYS-FRAMES,... "
                          "(WASD move, IJKL turn, e.g. w-80,jw-40: one pose a frame after the first)")  # fmt: skip
    if config.intrinsics is None and "intrinsics" not in fixed:
        raise ConfigError(f"{config.model} ({name}) is camera-controlled: give --intrinsics fx,fy,cx,cy (the first "
                          "frame's pinhole intrinsics, in its pixels)")  # fmt: skip
    if (path := config.camera if config.camera is not None else fixed.get("action")) is not None:
        _check_camera_path(path, config.frames)


def _check_camera_path(path: str, frames: int) -> None:
    """A camera path must pose every frame: the pipeline silently cuts the video to its poses (its frames + 1)."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    try:
        poses = len(action_string_to_c2w(path))
    except ValueError as error:
        raise ConfigError(f"--camera {path!r}: {error}") from None
    if frames > poses:
        raise ConfigError(f"--camera {path!r} poses {poses} frames (its {poses - 1} moves and the first), fewer than "
                          f"--frames {frames}, and the pipeline would cut the video to them: give a path of at least "
                          f"{frames - 1} frames, or fewer --frames")  # fmt: skip
