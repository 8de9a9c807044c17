"""``parallelize``: make a diffusers video transformer, or a whole pipeline, sequence-parallel.

Nothing in diffusers is edited: hooks split the video tokens after patch embedding (with the rotary
embeddings) and gather them before the output projection, following the family's plan; the attention
modules over the video get processors that route their attention through USP; the pipeline gets
classifier-free-guidance parallelism and decodes once per sample. ``undo`` (or leaving the ``with``
block, or ``unparallelize``) restores the exact original processors, hooks and methods.
"""

from __future__ import annotations

import fnmatch
import inspect
from typing import Any

import torch
import torch.distributed as dist
from diffusers.models.modeling_outputs import Transformer2DModelOutput

from dit_sp._compat import model_parallel_config
from dit_sp.cache import SEQUENCE_ATTR, CacheSpec, cache_context_of, enable_cache, set_cache_context
from dit_sp.errors import ConfigError
from dit_sp.models import ModelFamily, family_of, supported_vaes, vae_plan_of
from dit_sp.models.context import SequenceContext
from dit_sp.models.plan import apply_plan
from dit_sp.models.processor import sequence_parallel_processor
from dit_sp.parallel.comm import GatherGrad
from dit_sp.parallel.state import ParallelState
from dit_sp.vae import split_forward
from dit_sp.vae_tiles import share_tiles
from dit_sp.zoo import TRANSFORMERS

_HANDLE_ATTR = "_dit_sp_parallel"


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output.sample


def _like(output: Any, sample: torch.Tensor) -> Any:
    return (sample,) if isinstance(output, (tuple, list)) else Transformer2DModelOutput(sample=sample)


class _GuidancePair:
    """Runs the two guidance branches of one denoising step on the two cfg ranks at once.

    ``sequential`` pipelines call the transformer twice per step, conditional first, and read the first
    result only after the second call. So the first call is only recorded and returns a placeholder
    filled with NaN (a pipeline that reads it early computes NaN, never stale numbers); the second call
    runs the branch of this rank (cfg rank 0: the recorded conditional call, cfg rank 1: the
    unconditional one), the two results are exchanged, and the placeholder is filled in place.
    ``batched`` pipelines call once on ``[unconditional, conditional]``: each rank runs its half.
    The recorded call runs in the step-cache context it was made in (``cond``), so each branch's cache
    keeps its own state, as in one process.
    """

    def __init__(self, parallel: ParallelState, family: ModelFamily):
        self.parallel, self.family = parallel, family
        self.pending: tuple | None = None

    def reset(self) -> None:
        self.pending = None

    def _exchange(self, mine: torch.Tensor) -> list[torch.Tensor]:
        both = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(both, mine.contiguous(), group=self.parallel.cfg_group)
        return both

    def sequential(self, model: torch.nn.Module, forward, args: tuple, kwargs: dict) -> Any:
        if self.pending is None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            channels = model.config.get("out_channels") or hidden.shape[1]
            placeholder = hidden.new_full((hidden.shape[0], channels, *hidden.shape[2:]), float("nan"))
            self.pending = (forward, args, kwargs, placeholder, cache_context_of(model))
            return (placeholder,) if not kwargs.get("return_dict", True) else Transformer2DModelOutput(placeholder)
        cond_forward, cond_args, cond_kwargs, placeholder, cond_context = self.pending
        self.pending = None
        if self.parallel.cfg_rank == 0:
            context = cache_context_of(model)
            set_cache_context(model, cond_context)
            try:
                out = cond_forward(*cond_args, **cond_kwargs)
            finally:
                set_cache_context(model, context)
        else:
            out = forward(*args, **kwargs)
        cond, uncond = self._exchange(_first(out))
        if cond.shape != placeholder.shape:
            raise RuntimeError(f"guidance branch output {tuple(cond.shape)} != expected {tuple(placeholder.shape)}")
        placeholder.copy_(cond)
        return _like(out, uncond)

    def batched(self, forward, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(forward).bind(*args, **kwargs)
        for name in self.family.cfg_batched_args:
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if value.shape[0] % 2:
                    raise ValueError(f"cfg parallelism needs an even guidance batch; {name} has {value.shape[0]}")
                bound.arguments[name] = value.chunk(2)[self.parallel.cfg_rank]
        out = forward(*bound.args, **bound.kwargs)
        return _like(out, torch.cat(self._exchange(_first(out)), 0))


class Parallelized:
    """Handle of a parallelized transformer or pipeline; ``undo()`` or use it as a context manager."""

    def __init__(self, target: Any):
        self.target = target
        self.cache = None
        """The ``StepCache`` of ``parallelize(..., cache=...)``: what it skipped (``cache.stats``)."""
        self._undo: list = []

    def add_undo(self, fn) -> None:
        self._undo.append(fn)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()
        if getattr(self.target, _HANDLE_ATTR, None) is self:
            delattr(self.target, _HANDLE_ATTR)

    def __enter__(self) -> Parallelized:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def _set_instance_attr(obj: Any, name: str, value: Any, handle: Parallelized) -> None:
    """Shadow ``obj.name`` on the instance; the handle restores exactly what was there."""
    had, old = name in obj.__dict__, obj.__dict__.get(name)
    setattr(obj, name, value)
    handle.add_undo(lambda: setattr(obj, name, old) if had else delattr(obj, name))


def _verify_identical_inputs(parallel: ParallelState, ctx: SequenceContext):
    """Pre-hook that checks, by a checksum collective, that every rank of a sample got the same input."""

    def hook(module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        local = hidden.detach().double().sum().reshape(1).to(parallel.device)
        sums = [torch.empty_like(local) for _ in range(dist.get_world_size(parallel.sp_group))]
        dist.all_gather(sums, local, group=parallel.sp_group)
        if any(not torch.equal(s, sums[0]) for s in sums):
            raise RuntimeError(
                f"the ranks of one sample got different latents (checksums {[s.item() for s in sums]}): seed "
                "them by dp rank (ParallelState.dp_seed), not by global rank"
            )

    return hook


def _parallelize_transformer(
    model: torch.nn.Module,
    parallel: ParallelState,
    handle: Parallelized,
    *,
    gather_grad: GatherGrad,
    kernel: str | None,
    verify: bool,
    guidance: _GuidancePair | None,
) -> None:
    family = family_of(model)
    family.check(model)
    if model_parallel_config(model) is not None:
        raise ValueError("this model already uses diffusers' own context parallelism; do not enable both")
    ctx = SequenceContext(parallel, family.joint_position, gather_grad, kernel)
    handles = apply_plan(model, family.plan(model), ctx)
    handle.add_undo(lambda: [h.remove() for h in handles])
    _set_instance_attr(model, SEQUENCE_ATTR, ctx, handle)  # what a step cache reduces over
    if verify and parallel.sp > 1:
        h = model.register_forward_pre_hook(_verify_identical_inputs(parallel, ctx), with_kwargs=True)
        handle.add_undo(h.remove)

    matched = [
        (name, module)
        for name, module in model.named_modules()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in family.attention_modules)
    ]
    if not matched:
        raise ValueError(f"no attention modules of {type(model).__name__} match {family.attention_modules}")
    for name, module in matched:
        original = module.processor
        module.processor = sequence_parallel_processor(original, ctx, name)
        handle.add_undo(lambda module=module, original=original: setattr(module, "processor", original))

    if guidance is not None:
        forward = model.forward  # the class's bound forward
        if family.cfg_mode == "sequential":
            wrapped = lambda *args, **kwargs: guidance.sequential(model, forward, args, kwargs)
        else:
            wrapped = lambda *args, **kwargs: guidance.batched(forward, args, kwargs)
        _set_instance_attr(model, "forward", wrapped, handle)


def _decode_once_per_sample(vae: torch.nn.Module, parallel: ParallelState, handle: Parallelized, send: bool) -> None:
    """The sample's leader rank decodes; the result is broadcast to the other ranks of the sample (``send``),
    or they get an uninitialised tensor of its shape."""
    decode = vae.decode
    leader = dist.get_global_rank(parallel.sample_group, 0)

    def decode_once(z: torch.Tensor, *args, **kwargs):
        out = decode(z, *args, **kwargs) if parallel.rank == leader else None
        meta = [None if out is None else (type(out), tuple(_first(out).shape), _first(out).dtype)]
        dist.broadcast_object_list(meta, src=leader, group=parallel.sample_group)
        kind, shape, dtype = meta[0]
        sample = _first(out).contiguous() if out is not None else torch.empty(shape, dtype=dtype, device=z.device)
        if send:
            dist.broadcast(sample, src=leader, group=parallel.sample_group)
        return out if out is not None else ((sample,) if kind is tuple else kind(sample=sample))

    _set_instance_attr(vae, "decode", decode_once, handle)


def parallelize_vae(vae: torch.nn.Module, group: dist.ProcessGroup | ParallelState, *,
                    gather_to: int | None = None) -> Parallelized:  # fmt: skip
    """Split a diffusers video VAE's decode and encode over ``group`` (a process group, or a layout's
    ``sample_group``): each process runs its share of every frame's rows, and the result equals a
    one-process run (``dit_sp.vae``). Every rank of the group calls ``decode``/``encode`` with the same input.

    Args:
        vae: ``AutoencoderKLWan``, ``AutoencoderKLHunyuanVideo`` or ``AutoencoderKLCogVideoX``; with tiling
            (``vae.enable_tiling()``) the tiles are shared out whole, tile ``t`` on group rank ``t % N``.
        group: the processes that share the work.
        gather_to: assemble the decoded frames only on this rank of the group (the others get their own
            rows); by default on every rank. Encoded latents are always assembled on every rank.

    Returns:
        A handle whose ``undo()`` restores the VAE.
    """
    plan = vae_plan_of(vae)
    if plan is None:
        raise TypeError(f"{type(vae).__name__} has no parallel VAE plan; supported VAEs: {', '.join(supported_vaes())}")
    if isinstance(group, ParallelState):
        group = group.sample_group
    handle = Parallelized(vae)
    if group is None or dist.get_world_size(group) == 1:
        return handle
    for name in plan.parts:
        part = getattr(vae, name, None)
        if part is not None:
            # encoded latents condition every rank's sampling: only decoded frames stay on gather_to
            handle.add_undo(split_forward(part, plan, group, gather_to if name == "decoder" else None))
    if plan.tiles is not None:
        handle.add_undo(share_tiles(vae, plan.tiles, group, gather_to))
    return handle


def _swap_pipeline_class(pipe: Any, family: ModelFamily, parallel: ParallelState, guidance, handle) -> None:
    """Give the pipeline a subclass whose ``__call__`` checks guidance and starts each run cleanly."""
    stock = type(pipe)
    signature = inspect.signature(stock.__call__)

    class SequenceParallelPipeline(stock):
        def __call__(self, *args, **kwargs):
            if parallel.cfg == 2:
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                scale = bound.arguments.get(family.guidance_arg)
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
        obj: a supported transformer (``dit_sp.models.supported_classes()``) or a pipeline holding one
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
        compile: compile each transformer block (``dit_sp.compile.compile_blocks``), USP attention included
            as one opaque op; before the cache, which then wraps the compiled blocks. Inference.

    Returns:
        A handle whose ``undo()`` (or ``with`` exit, or ``unparallelize(obj)``) restores ``obj`` exactly.
    """
    if getattr(obj, _HANDLE_ATTR, None) is not None:
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
            _parallelize_transformer(obj, parallel, handle, guidance=None, **options)
            if shard_weights:
                _shard_weights(obj, parallel, handle)
        else:
            transformers = [getattr(obj, n, None) for n in TRANSFORMERS]
            transformers = [t for t in transformers if t is not None]
            if not transformers:
                raise TypeError(
                    f"{type(obj).__name__} is neither a diffusers transformer nor a pipeline with a `transformer`"
                )
            family = family_of(transformers[0])
            guidance = _GuidancePair(parallel, family) if parallel.cfg == 2 else None
            for transformer in transformers:
                _parallelize_transformer(transformer, parallel, handle, guidance=guidance, **options)
            if shard_weights:
                for transformer in transformers:
                    _shard_weights(transformer, parallel, handle)
            vae = getattr(obj, "vae", None)
            if vae is not None and parallel.sample_group is not None:
                if parallel_vae and vae_plan_of(vae) is not None:
                    gather_to = 0 if frames_on == "leader" else None
                    handle.add_undo(parallelize_vae(vae, parallel.sample_group, gather_to=gather_to).undo)
                else:
                    _decode_once_per_sample(vae, parallel, handle, send=frames_on == "every_rank")
            _swap_pipeline_class(obj, family, parallel, guidance, handle)
        transformers = [obj] if isinstance(obj, torch.nn.Module) else [getattr(obj, n, None) for n in TRANSFORMERS]
        if compile:
            from dit_sp.compile import compile_blocks

            for transformer in filter(None, transformers):
                handle.add_undo(compile_blocks(transformer))
        if cache is not None:
            handle.cache = enable_cache(obj, cache)
            handle.add_undo(handle.cache.undo)
    except BaseException:
        handle.undo()
        raise
    setattr(obj, _HANDLE_ATTR, handle)
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
    _set_instance_attr(transformer, "sharded_weights", sharded, handle)  # what each rank holds; gone after undo
    handle.add_undo(sharded.unshard)


def unparallelize(obj: Any) -> None:
    """Undo ``parallelize(obj, ...)``."""
    handle = getattr(obj, _HANDLE_ATTR, None)
    if handle is None:
        raise ValueError(f"{type(obj).__name__} is not parallelized")
    handle.undo()
