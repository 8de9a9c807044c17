"""Ulysses: trade sequence shards for head shards with one all-to-all over the Ulysses group.

``(B, S/N, H, D)`` on each of the ``N = ring*ulysses`` ranks becomes ``(B, S/R, H/U, D)``: the rank
then holds every head group ``ulysses_rank`` token of its ring block, so attention over the ring
needs no further Ulysses traffic. Heads that ``U`` does not divide are zero-padded (a zero head
attends uniformly to zero values: its output is zero and it is dropped again on the way back).

Several tensors (q, k, v) travel in one collective, and each is copied once, straight into its place
in the send buffer: the buffer is ``(U, B, S_local, n, H_pad/U, D)``, chunk ``j`` for rank ``j``. What
arrives is laid out so that each tensor is a view of the receive buffer (for ``B == 1``; a copy
otherwise), which attention reads as it is. No stacked, padded or reshaped copies in between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dit_sp.parallel.comm import all_gather, exchange_chunks, true_length
from dit_sp.parallel.state import ParallelState

Tensor = torch.Tensor


def padded_heads(heads: int, parallel: ParallelState) -> int:
    return -(-heads // parallel.ulysses) * parallel.ulysses


def pad_heads(x: Tensor, parallel: ParallelState, head_dim: int = -2) -> Tensor:
    """Zero-pad the head dimension of ``x`` to a multiple of the Ulysses degree."""
    pad = padded_heads(x.shape[head_dim], parallel) - x.shape[head_dim]
    if not pad:
        return x
    head_dim %= x.dim()
    return F.pad(x, [0, 0] * (x.dim() - head_dim - 1) + [0, pad])


def _buffer(like: Tensor, world: int, count: int, local_len: int, group_heads: int, zeros: bool) -> Tensor:
    """A ``(world, B, local_len, count, group_heads, D)`` exchange buffer."""
    shape = (world, like.shape[0], local_len, count, group_heads, like.shape[-1])
    return (torch.zeros if zeros else torch.empty)(shape, dtype=like.dtype, device=like.device)


def _to_heads(xs: Sequence[Tensor | None], group: dist.ProcessGroup, heads_padded: int) -> list[Tensor]:
    """``(B, S_local, H, D)`` each (``None``: zeros) -> ``(B, U*S_local, H_pad/U, D)`` each."""
    world = dist.get_world_size(group)
    like = next(x for x in xs if x is not None)
    batch, local_len, heads, _ = like.shape
    group_heads = heads_padded // world
    full, rest = divmod(heads, group_heads)
    send = _buffer(like, world, len(xs), local_len, group_heads, zeros=heads != heads_padded or None in xs)
    for i, x in enumerate(xs):
        if x is None:
            continue
        place = send[:, :, :, i].permute(1, 2, 0, 3, 4)  # (B, S_local, U, H_pad/U, D): head group j -> rank j
        place[:, :, :full].copy_(x[:, :, : full * group_heads].unflatten(2, (full, group_heads)))
        if rest:
            place[:, :, full, :rest].copy_(x[:, :, full * group_heads :])
    recv = exchange_chunks(send, group)  # recv[j]: rank j's sequence chunk of my head group
    del send  # freed before anything else is allocated
    return [recv[:, :, :, i].movedim(0, 1).reshape(batch, world * local_len, group_heads, -1) for i in range(len(xs))]


def _to_sequence(xs: Sequence[Tensor | None], group: dist.ProcessGroup, heads: int) -> list[Tensor]:
    """Inverse of ``_to_heads``: ``(B, U*S_local, H_pad/U, D)`` each -> ``(B, S_local, H, D)`` (padding dropped)."""
    world = dist.get_world_size(group)
    like = next(x for x in xs if x is not None)
    batch, length, group_heads, _ = like.shape
    local_len = length // world
    send = _buffer(like, world, len(xs), local_len, group_heads, zeros=None in xs)
    for i, x in enumerate(xs):
        if x is not None:  # sequence chunk j -> rank j
            send[:, :, :, i].copy_(x.unflatten(1, (world, local_len)).movedim(1, 0))
    recv = exchange_chunks(send, group)  # recv[j]: my sequence chunk of rank j's head group
    del send  # freed before the outputs are allocated: backward's peak is a pass through here
    return [recv[:, :, :, i].permute(1, 2, 0, 3, 4).reshape(batch, local_len, world * group_heads, -1)[:, :, :heads]
            for i in range(len(xs))]  # fmt: skip


class ScatterHeads(torch.autograd.Function):
    """``(B, S_local, H, D)`` tensors -> ``(B, U*S_local, H_pad/U, D)``, all in one all-to-all.
    Backward: the inverse exchange of the gradients (``GatherHeads``'s forward)."""

    @staticmethod
    def forward(ctx, group: dist.ProcessGroup, heads_padded: int, *xs: Tensor):
        ctx.group, ctx.heads = group, xs[0].shape[2]
        return tuple(_to_heads(xs, group, heads_padded))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        return None, None, *_to_sequence(grads, ctx.group, ctx.heads)


class GatherHeads(torch.autograd.Function):
    """``(B, U*S_local, H_pad/U, D)`` tensors -> ``(B, S_local, heads, D)`` (the padding heads dropped), in
    one all-to-all. Backward: ``ScatterHeads``'s forward of the gradients (zeros for the padding)."""

    @staticmethod
    def forward(ctx, group: dist.ProcessGroup, heads: int, *xs: Tensor):
        ctx.group, ctx.heads_padded = group, xs[0].shape[2] * dist.get_world_size(group)
        return tuple(_to_sequence(xs, group, heads))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        return None, None, *_to_heads(grads, ctx.group, ctx.heads_padded)


def scatter_heads(xs: Sequence[Tensor], parallel: ParallelState) -> list[Tensor]:
    """``(B, S_local, H, D)`` tensors (e.g. q, k, v: same shape) -> ``(B, U*S_local, H_pad/U, D)`` each:
    gather the sequence of the Ulysses group (in rank order) and keep head group ``ulysses_rank`` (of the
    heads zero-padded to ``H_pad``, a multiple of ``U``). One collective for all of them."""
    if parallel.ulysses == 1:
        return list(xs)
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) != 1 or len(next(iter(shapes))) != 4:
        raise ValueError(f"scatter_heads takes (B, S_local, H, D) tensors of one shape; got {sorted(shapes)}")
    return list(ScatterHeads.apply(parallel.ulysses_group, padded_heads(xs[0].shape[2], parallel), *xs))


def gather_heads(x: Tensor, parallel: ParallelState, heads: int | None = None) -> Tensor:
    """Inverse of ``scatter_heads``: ``(B, U*S_local, H_pad/U, D)`` -> ``(B, S_local, heads, D)``, the first
    ``heads`` (default all ``H_pad``) heads of the Ulysses group."""
    if parallel.ulysses == 1:
        return x if heads is None else x[:, :, :heads]
    heads = x.shape[2] * parallel.ulysses if heads is None else heads
    return GatherHeads.apply(parallel.ulysses_group, heads, x)[0]


def local_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """This rank's head group of a replicated, head-padded ``(B, T, H_pad, D)`` tensor (no traffic)."""
    group = x.shape[-2] // parallel.ulysses
    return x.narrow(-2, parallel.ulysses_rank * group, group)


def all_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """Every head group of a ``(B, T, H_pad/U, D)`` tensor computed per rank -> ``(B, T, H_pad, D)`` on
    every rank. Backward sums the copies' gradients (exact adjoint of the replication)."""
    return all_gather(x, parallel.ulysses_group, dim=-2, grad="sum")


def head_group(heads: int, parallel: ParallelState) -> slice:
    """The real heads (of ``heads``) in this rank's Ulysses head group, for per-head parameters (a decay, a gate)
    that an ``attend_whole_sequence`` function applies: the group's padding heads, if any, lie past its end."""
    group = padded_heads(heads, parallel) // parallel.ulysses
    start = min(parallel.ulysses_rank * group, heads)
    return slice(start, min(start + group, heads))


def attend_whole_sequence(
    attend: Callable[..., Tensor], tensors: Sequence[Tensor], parallel: ParallelState, seq_len: int | None = None
) -> Tensor:
    """Run ``attend``, any attention that treats heads independently (a flex-attention block mask, a sparse mask
    built from the queries and keys, a recurrent scan over the sequence), over the whole sequence under Ulysses.

    Args:
        attend: takes the tensors as ``(B, S, H_pad/U, *)``, the whole sequence (``S = seq_len``, the shards'
            padding cut off) of this rank's head group (``head_group``; zero-padded heads behind the real ones
            when ``U`` does not divide ``H``), and returns ``(B, S, H_pad/U, D_out)``.
        tensors: this rank's shards ``(B, S_local, H, D)``, one shape (e.g. q, k, v), sent in one all-to-all.
        seq_len: the true length of the split sequence (required when ``sp > 1``, as for ``usp_attention``).

    Returns:
        This rank's output shard ``(B, S_local, H, D_out)``. Exact for Ulysses alone: with a ring, a rank would
        hold one block of keys, which such an attention cannot be told about, so ``ring > 1`` raises.
    """
    if parallel.ring > 1:
        raise NotImplementedError(
            "this attention (not plain softmax attention over the sequence) is exact under Ulysses alone, where "
            f"every rank holds the whole sequence of its heads; use ring 1 (got ring {parallel.ring})"
        )
    if not tensors:
        raise ValueError(
            "attend_whole_sequence takes one or more (B, S_local, H, D) tensors (e.g. [q, k, v]); got none"
        )
    local_len = tensors[0].shape[1]
    seq_len = true_length(seq_len, local_len, parallel, "attend_whole_sequence")
    blocks = scatter_heads(tensors, parallel)
    out = attend(*[block[:, :seq_len] for block in blocks])  # a list: dynamo cannot pass on a generator
    expected = (blocks[0].shape[0], seq_len, blocks[0].shape[2])
    if not isinstance(out, Tensor) or out.dim() != 4 or tuple(out.shape[:3]) != expected:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"attend_whole_sequence: attend must return (B, S, h, D_out) with (B, S, h) = {expected}, the "
                         f"whole sequence of this rank's head group it was given; got {got}")  # fmt: skip
    padding = blocks[0].shape[1] - seq_len
    if padding:  # the shards' padding positions get zeros, which gather_heads sends back to be dropped
        out = torch.cat([out, out.new_zeros(out.shape[0], padding, *out.shape[2:])], 1)
    return gather_heads(out, parallel, tensors[0].shape[2])
