"""``parallelize``: make a diffusers video transformer, or a whole pipeline, sequence-parallel.

Nothing in diffusers is edited: hooks split the video tokens after patch embedding (with the rotary
embeddings) and gather them before the output projection, following the family's plan; the attention
modules over the video get processors that route their attention through USP; the pipeline gets
classifier-free-guidance parallelism and decodes once per sample. ``undo`` (or leaving the ``with``
block, or ``unparallelize``) restores the exact original processors, hooks and methods.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from dit_sp.cache import CacheSpec, enable_cache
from dit_sp.errors import ConfigError
from dit_sp.families import PARALLELIZED_TRANSFORMERS, ModelFamily, family_of, refused_pipelines, vae_plan_of
from dit_sp.parallel.comm import GatherGrad
from dit_sp.parallel.state import ParallelState
from dit_sp.sp.guidance import GuidancePair
from dit_sp.sp.handle import HANDLE_ATTR, Parallelized, set_instance_attr
from dit_sp.sp.transformer import parallelize_transformer
from dit_sp.sp.vae import decode_once_per_sample, parallelize_vae


def _swap_pipeline_class(pipe: Any, family: ModelFamily, parallel: ParallelState, guidance, handle) -> None:
    """Give the pipeline a subclass whose ``__call__`` checks guidance and starts each run cleanly."""
    stock = type(pipe)
    signature = inspect.signature(stock.__call__)

    class SequenceParallelPipeline(stock):
        def __call__(self, *args, **kwargs):
            if parallel.cfg == 2 and _is_modular(self):  # it takes keywords and guides through its guider component
                if why := _modular_guider_refusal(self):
                    raise ConfigError(f"cfg parallelism (cfg=2) for {stock.__name__}: {why}")
                guidance.reset()  # a step its guider runs unguided (one call) runs whole on both ranks
                guidance.unpaired = lambda: getattr(self.guider, "num_conditions", 2) == 1
            elif parallel.cfg == 2:
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                scale = bound.arguments.get(family.guidance_arg)
                if family.guidance_arg == "guider":  # HunyuanVideo-1.5: guidance is its guider's scale
                    scale = getattr(getattr(self, "guider", None), "guidance_scale", None)
                if scale is None or not scale > 1:
                    raise ValueError(
                        f"cfg parallelism (cfg=2) runs the two guidance branches on two device groups, but "
                        f"{family.guidance_arg}={scale} turns guidance off; set it > 1 or use cfg=1"
                    )
                needs = family.guidance_needs_any
                if needs and all(bound.arguments.get(name) is None for name in needs):
                    raise ValueError(
                        f"cfg parallelism (cfg=2): {stock.__name__} runs guidance only when one of {list(needs)} "
                        "is given (an empty negative prompt is fine); pass one or use cfg=1"
                    )
                guidance.reset()
            result = super().__call__(*args, **kwargs)
            if parallel.cfg == 2 and guidance.pending is not None:
                raise RuntimeError(
                    "cfg parallelism (cfg=2): the pipeline made an odd number of transformer calls, so they were not "
                    "pairs of guidance branches; its output is wrong. Run it with cfg=1."
                )
            return result

    SequenceParallelPipeline.__name__ = SequenceParallelPipeline.__qualname__ = f"SequenceParallel{stock.__name__}"
    pipe.__class__ = SequenceParallelPipeline
    handle.add_undo(lambda: setattr(pipe, "__class__", stock))


def _is_modular(pipe: Any) -> bool:
    """A Modular Diffusers pipeline (its ``blocks`` run; call arguments are the blocks' inputs, by keyword)."""
    return getattr(pipe, "blocks", None) is not None


def _modular_guider_refusal(pipe: Any) -> str:
    """Why the guider of a modular pipeline does not make the guidance pair cfg parallelism runs (empty: it does): a
    ``ClassifierFreeGuidance`` guider (its blocks call the transformer once per guider batch, conditional first, and
    combine after both) that guides at every step; one line."""
    guider = getattr(pipe, "guider", None)
    name = type(guider).__name__
    if name != GUIDER:
        return (f"its guider is {name}, not {GUIDER}, so its transformer calls are not the conditional and "
                f"unconditional pair cfg parallelism runs on two groups; use a {GUIDER} guider or cfg=1")  # fmt: skip
    config = guider.config
    if not config.get("enabled", True) or config.get("start", 0.0) > 0 or config.get("stop", 1.0) < 1:
        return (f"its {GUIDER} guider (enabled={config.get('enabled', True)}, start={config.get('start', 0.0)}, "
                f"stop={config.get('stop', 1.0)}) skips the unconditional call at some steps, so they are not all "
                "pairs; guide at every step (enabled, start 0, stop 1) or use cfg=1")  # fmt: skip
    off = 0.0 if config.get("use_original_formulation") else 1.0
    if math.isclose(guider.guidance_scale, off):
        return (f"its guider's guidance_scale={guider.guidance_scale} turns guidance off (one call a step); set it "
                "above 1 (guider.new(guidance_scale=...)) or use cfg=1")  # fmt: skip
    return ""


GUIDER = "ClassifierFreeGuidance"
"""The Modular Diffusers guider whose two calls a step (conditional, then unconditional) cfg parallelism splits."""

MODULAR_BATCHED_REFUSED = (
    "its blocks run each guidance pass as its own transformer call of batch 1 (the guider's), while cfg parallelism "
    "for this family splits the one batched [unconditional, conditional] call of its classic pipelines (LTX-2's "
    "blocks also read each pass's output before the next call); use cfg=1, or the classic pipeline on cfg=2"
)
"""Why ``parallelize`` refuses cfg=2 for a modular pipeline of a ``batched`` family (LTX, LTX-2)."""


def parallelize(
    obj: Any,
    parallel: ParallelState,
    *,
    gather_grad: GatherGrad = "sum",
    kernel: str | None = None,
    verify_inputs: bool = False,
    shard_weights: bool = False,
    parallel_vae: bool = True,
    frames_on: str = "every_rank",
    cache: str | CacheSpec | None = None,
    compile: bool = False,
) -> Parallelized:
    """Make a diffusers transformer or pipeline run on the layout ``parallel``.

    Args:
        obj: a supported transformer (``dit_sp.families.supported_classes()``) or a pipeline holding one
            (``transformer`` and, for Wan 2.2, ``transformer_2``).
        parallel: from ``init_parallel``; every rank of a sample must run the same calls with the same
            inputs (seed by ``parallel.dp_seed``).
        gather_grad: backward of the output gather, see ``gather_sequence`` (training only).
        kernel: local attention kernel override (``dit_sp.attention.KERNELS``).
        verify_inputs: debug check, by a checksum collective per forward, that the sequence-parallel
            ranks got identical latents.
        shard_weights: inference with each transformer's weights sharded over the processes of one
            sample (``cfg x ring x ulysses``) and gathered module by module as it runs, so a model larger
            than one device's memory samples on several (``dit_sp.weights.ShardedWeights``). A transformer
            built by ``load_pipeline(..., empty_transformers=True)`` is filled here, each rank reading only
            its own shards from the checkpoint. Inference only; ``undo()`` gathers the weights back.
        parallel_vae: a pipeline's VAE decodes (and encodes) with each frame's rows split over the
            processes of a sample (``parallelize_vae``); off, or for a VAE of no supported family, one
            process decodes and sends the frames to the others.
        frames_on: where a pipeline's decoded frames are assembled: ``"every_rank"`` (a drop-in: every rank
            returns the video) or ``"leader"``, only on the sample's leader (``parallel.is_sample_leader``),
            which saves the other ranks the transfer and the memory; what they return must not be used.
        cache: step caching, ``"first_block[:THRESHOLD]"`` or ``"teacache[:THRESHOLD]"`` (``dit_sp.cache``),
            with decisions every process of a guidance branch shares; its stats are ``handle.cache.stats``.
        compile: compile each transformer block (``dit_sp.sp.compile.compile_blocks``), USP attention included
            as one opaque op; before the cache, which then wraps the compiled blocks. Inference.

    Returns:
        A handle whose ``undo()`` (or ``with`` exit, or ``unparallelize(obj)``) restores ``obj`` exactly.
    """
    if getattr(obj, HANDLE_ATTR, None) is not None:
        raise ValueError(f"{type(obj).__name__} is already parallelized; call unparallelize() first")
    if frames_on not in ("every_rank", "leader"):
        raise ValueError(f"frames_on={frames_on!r}: expected 'every_rank' or 'leader'")
    if shard_weights and compile:
        raise ConfigError("shard_weights gathers each module's weights in hooks as it runs, which compiled blocks "
                          "cannot hold: use one of shard_weights and compile")  # fmt: skip
    if shard_weights and cache is not None and parallel.cfg == 2:
        raise ConfigError("with cfg parallelism each guidance branch's step cache decides on its own, but sharded "
                          "weights are gathered across both branches (a skipped block on one would leave the other "
                          "waiting): drop shard_weights, the cache, or cfg parallelism")  # fmt: skip
    handle = Parallelized(obj)
    options = {"gather_grad": gather_grad, "kernel": kernel, "verify": verify_inputs}
    try:
        if isinstance(obj, torch.nn.Module):
            parallelize_transformer(obj, parallel, handle, guidance=None, **options)
            if shard_weights:
                _shard_weights(obj, parallel, handle)
        else:
            transformers = [getattr(obj, n, None) for n in PARALLELIZED_TRANSFORMERS]
            transformers = [t for t in transformers if t is not None]
            if type(obj).__name__ in refused_pipelines():  # also one without a transformer (a decode stage)
                raise ConfigError(f"{type(obj).__name__}: {refused_pipelines()[type(obj).__name__]}")
            if not transformers:
                raise TypeError(
                    f"{type(obj).__name__} is neither a diffusers transformer nor a pipeline with a `transformer`"
                )
            family = family_of(transformers[0])
            if parallel.cfg == 2 and family.cfg_refused:
                raise ConfigError(f"cfg parallelism (cfg=2) for {type(obj).__name__}: {family.cfg_refused}")
            if parallel.cfg == 2 and _is_modular(obj) and family.cfg_mode != "sequential":
                raise ConfigError(f"cfg parallelism (cfg=2) for {type(obj).__name__}: {MODULAR_BATCHED_REFUSED}")
            family.prepare_pipeline(obj)  # a pipeline built outside dit_sp.zoo (Cosmos: a resize without torchvision)
            guidance = GuidancePair(parallel, family) if parallel.cfg == 2 else None
            for transformer in transformers:
                parallelize_transformer(transformer, parallel, handle, guidance=guidance, **options)
            controlnet = getattr(obj, "controlnet", None)
            if family.controlnet is not None and type(controlnet).__name__ in family.controlnet.class_names:
                # (a family with a ControlNet refuses cfg=2: no guidance pair; its input is the transformer's, which
                # verify_inputs checks)
                parallelize_transformer(controlnet, parallel, handle, guidance=None, family=family.controlnet,
                                        **(options | {"verify": False}))  # fmt: skip
            if shard_weights:
                for transformer in transformers:
                    _shard_weights(transformer, parallel, handle)
            vae = getattr(obj, "vae", None)
            if vae is not None and parallel.sample_group is not None:
                if parallel_vae and vae_plan_of(vae) is not None:
                    used = type(obj).__name__ in family.frames_used  # the pipeline computes with its frames
                    gather_to = 0 if frames_on == "leader" and not used else None
                    handle.add_undo(parallelize_vae(vae, parallel.sample_group, gather_to=gather_to).undo)
                else:
                    decode_once_per_sample(vae, parallel, handle, send=frames_on == "every_rank")
            _swap_pipeline_class(obj, family, parallel, guidance, handle)
        components = PARALLELIZED_TRANSFORMERS
        transformers = [obj] if isinstance(obj, torch.nn.Module) else [getattr(obj, n, None) for n in components]
        if compile:
            from dit_sp.sp.compile import compile_blocks

            for transformer in filter(None, transformers):
                handle.add_undo(compile_blocks(transformer))
        if cache is not None:
            handle.cache = enable_cache(obj, cache)
            handle.add_undo(handle.cache.undo)
    except BaseException:
        handle.undo()
        raise
    setattr(obj, HANDLE_ATTR, handle)
    return handle


def _shard_weights(transformer: torch.nn.Module, parallel: ParallelState, handle: Parallelized) -> None:
    """Each large weight sharded over the processes of one sample (``dit_sp.weights.ShardedWeights``); an
    empty transformer (``load_pipeline(..., empty_transformers=True)``) reads only this rank's shards."""
    from dit_sp.weights import SafetensorsCheckpoint, ShardedWeights, has_meta_parameters

    if parallel.cfg * parallel.sp == 1:
        raise ConfigError(
            "shard_weights shards over the processes of one sample (cfg x ring x ulysses), and this layout has "
            f"one ({parallel.config}); use ring/ulysses/cfg parallelism, or drop shard_weights"
        )
    checkpoint = None
    if has_meta_parameters(transformer):
        source = getattr(transformer, "weights_dir", None)
        if source is None:
            raise ConfigError(f"{type(transformer).__name__} has parameters on the meta device and no weights_dir to "
                              "read them from: build it with load_pipeline(..., empty_transformers=True)")  # fmt: skip
        checkpoint = SafetensorsCheckpoint(source)
    transformer.requires_grad_(False)
    sharded = ShardedWeights(transformer, parallel.sample_group, parallel.device, checkpoint)
    set_instance_attr(transformer, "sharded_weights", sharded, handle)  # what each rank holds; gone after undo
    handle.add_undo(sharded.unshard)


def unparallelize(obj: Any) -> None:
    """Undo ``parallelize(obj, ...)``."""
    handle = getattr(obj, HANDLE_ATTR, None)
    if handle is None:
        raise ValueError(f"{type(obj).__name__} is not parallelized")
    handle.undo()
