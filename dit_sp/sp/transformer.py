"""One transformer made sequence-parallel: the family's split/gather plan as hooks, a ``SequenceContext``,
USP processors on the attention modules over the video, and the guidance pair's forward under CFG parallelism."""

from __future__ import annotations

import fnmatch
import inspect

import torch
import torch.distributed as dist

from dit_sp._compat import model_parallel_config
from dit_sp.cache import SEQUENCE_ATTR
from dit_sp.errors import LayoutRefused
from dit_sp.families import ModelFamily, family_of
from dit_sp.parallel.comm import GatherGrad
from dit_sp.parallel.state import ParallelState
from dit_sp.sp.context import SequenceContext
from dit_sp.sp.guidance import GuidancePair
from dit_sp.sp.handle import Parallelized, set_instance_attr
from dit_sp.sp.plan import apply_plan
from dit_sp.sp.processor import sequence_parallel_processor


def _verify_identical_inputs(parallel: ParallelState, ctx: SequenceContext):
    """Pre-hook that checks, by a checksum collective, that every rank of a sample got the same input."""

    def hook(module, args, kwargs):
        if "hidden_states" in kwargs or args:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if isinstance(hidden, (list, tuple)):  # per-sample latents (Wan-Animate-2)
                hidden = torch.stack([t.detach().double().sum() for t in hidden])
        else:  # no hidden_states (Cosmos 3 takes its latents as lists per modality): every float tensor given
            tensors = [t for v in kwargs.values() for t in (v if isinstance(v, (list, tuple)) else [v])]
            floats = [t for t in tensors if torch.is_tensor(t) and t.is_floating_point()]
            if not floats:
                raise ValueError(
                    f"verify_inputs checksums a model's latents, and this {type(module).__name__} call passed no "
                    "hidden_states and no floating-point tensor: run it without verify_inputs"
                )
            hidden = torch.stack([t.detach().double().sum() for t in floats])
        local = hidden.detach().double().sum().reshape(1).to(parallel.device)
        sums = [torch.empty_like(local) for _ in range(dist.get_world_size(parallel.sp_group))]
        dist.all_gather(sums, local, group=parallel.sp_group)
        if any(not torch.equal(s, sums[0]) for s in sums):
            raise RuntimeError(
                f"the ranks of one sample got different latents (checksums {[s.item() for s in sums]}): seed "
                "them by dp rank (ParallelState.dp_seed), not by global rank"
            )

    return hook


def parallelize_transformer(
    model: torch.nn.Module,
    parallel: ParallelState,
    handle: Parallelized,
    *,
    gather_grad: GatherGrad,
    kernel: str | None,
    verify: bool,
    guidance: GuidancePair | None,
    family: ModelFamily | None = None,
) -> None:
    family = family or family_of(model)  # given: a pipeline's ControlNet, split by its transformer family's plan

    def check(module: torch.nn.Module, *args: object) -> None:
        family.check(module)
        if parallel.ring > 1 and (why := family.ring_refusal(getattr(module, "config", {}))):
            raise LayoutRefused(f"{why} (got ring {parallel.ring})")
        family.layout_check(module, parallel)

    check(model)
    if family.gathered_key_modules and gather_grad == "slice":
        raise NotImplementedError(
            f"gather_grad='slice' keeps each rank's share of the split output's gradient, but {type(model).__name__} "
            "also computes a stream whole on every rank (LTX-2's audio), whose gradient would count once per rank: "
            "use gather_grad='sum'"
        )
    if model_parallel_config(model) is not None:
        raise ValueError("this model already uses diffusers' own context parallelism; do not enable both")
    ctx = SequenceContext(parallel, family.joint_position, gather_grad, kernel)
    handles = apply_plan(model, family.plan(model), ctx)
    # and at every call: a pipeline may reconfigure its model (SkyReels-V2's causal_block_size)
    handles.append(model.register_forward_pre_hook(check))
    handle.add_undo(lambda: [h.remove() for h in handles])  # before the family's hooks, which may raise (Cosmos 3)
    if family.hooks is not None:
        handles += family.hooks(model, ctx)
    set_instance_attr(model, SEQUENCE_ATTR, ctx, handle)  # what a step cache reduces over
    if verify and parallel.sp > 1:
        # before the plan's root hook: a family that splits at the root (LTX) must be checked on its whole input
        h = model.register_forward_pre_hook(_verify_identical_inputs(parallel, ctx), with_kwargs=True, prepend=True)
        handle.add_undo(h.remove)

    streams = family.stream_modules(model)
    for patterns, gather_keys in ((family.attention_modules, False), (family.gathered_key_modules, True)):
        matched = [
            (name, module)
            for name, module in model.named_modules()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        ]
        if patterns and not matched:
            raise ValueError(f"no attention modules of {type(model).__name__} match {patterns}")
        if not gather_keys and (stray := sorted(streams.keys() - {name for name, _ in matched})):
            raise ValueError(f"stream modules {stray} of {type(model).__name__} are not among its attention modules")
        for name, module in matched:
            original = module.processor
            count = 1 if gather_keys else streams.get(name, 1)
            module.processor = sequence_parallel_processor(original, ctx, name, gather_keys, count)
            handle.add_undo(lambda module=module, original=original: setattr(module, "processor", original))

    if guidance is not None:
        forward = model.forward  # the class's bound forward
        if family.cfg_mode == "sequential":
            wrapped = lambda *args, **kwargs: guidance.sequential(model, forward, args, kwargs)
        else:
            wrapped = lambda *args, **kwargs: guidance.batched(forward, args, kwargs)
        wrapped.__signature__ = inspect.signature(forward)  # blocks that pass what it takes read it (Helios' modular)
        set_instance_attr(model, "forward", wrapped, handle)
