"""A pipeline's VAE under sequence parallelism: split over the processes of a sample (``dit_sp.vae``), or
decoded by the sample's leader alone."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dit_sp.families import supported_vaes, vae_plan_of
from dit_sp.parallel.state import ParallelState
from dit_sp.sp.handle import Parallelized, first_output, set_instance_attr
from dit_sp.vae import split_forward
from dit_sp.vae.tiles import share_tiles


def decode_once_per_sample(vae: torch.nn.Module, parallel: ParallelState, handle: Parallelized, send: bool) -> None:
    """The sample's leader rank decodes; the result is broadcast to the other ranks of the sample (``send``),
    or they get an uninitialised tensor of its shape."""
    decode = vae.decode
    leader = dist.get_global_rank(parallel.sample_group, 0)

    def decode_once(z: torch.Tensor, *args, **kwargs):
        out = decode(z, *args, **kwargs) if parallel.rank == leader else None
        meta = [None if out is None else (type(out), tuple(first_output(out).shape), first_output(out).dtype)]
        dist.broadcast_object_list(meta, src=leader, group=parallel.sample_group)
        kind, shape, dtype = meta[0]
        sample = first_output(out).contiguous() if out is not None else torch.empty(shape, dtype=dtype, device=z.device)
        if send:
            dist.broadcast(sample, src=leader, group=parallel.sample_group)
        return out if out is not None else ((sample,) if kind is tuple else kind(sample=sample))

    set_instance_attr(vae, "decode", decode_once, handle)


def parallelize_vae(vae: torch.nn.Module, group: dist.ProcessGroup | ParallelState, *,
                    gather_to: int | None = None) -> Parallelized:  # fmt: skip
    """Split a diffusers video VAE's decode and encode over ``group`` (a process group, or a layout's
    ``sample_group``): each process runs its share of every frame's rows, and the result equals a
    one-process run (``dit_sp.vae``). Every rank of the group calls ``decode``/``encode`` with the same input.

    Args:
        vae: a VAE with a family's plan (``dit_sp.families.supported_vaes()``: Wan's, HunyuanVideo's,
            HunyuanVideo-1.5's, CogVideoX's, LTX-Video's, LTX-2's, Mochi's, EasyAnimate's, Cosmos 1's, the image VAEs
            ``AutoencoderKL`` and ``AutoencoderDC``, Kandinsky 6 SR's K-VAE; Allegro's, tiled only; MiniMax-H3's, its
            decoder calls, clips and tiles, shared out); with tiling (``vae.enable_tiling()``) the tiles are shared out
            whole, tile ``t`` on group rank ``t % N``.
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
