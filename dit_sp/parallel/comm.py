"""Collectives with autograd: Ulysses all-to-all, sequence shard/gather, ring P2P.

Gradient convention: a tensor that every rank of a group holds a copy of ("replicated") is treated as
one variable per rank. Backward passes compute the exact adjoint of the distributed forward, so the
gradient a replicated input receives on one rank is a *partial*; summing it over the group gives the
full gradient. That is what FSDP/DDP reduction does for parameters, so training needs no special case.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dit_sp.parallel.state import ParallelState


def _group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split ``x`` along ``scatter_dim`` into one chunk per rank, send chunk j to rank j, and
    concatenate the chunks received along ``gather_dim`` (in rank order)."""
    world = dist.get_world_size(group)
    scatter_dim %= x.dim()
    gather_dim %= x.dim()
    if x.shape[scatter_dim] % world:
        raise ValueError(
            f"all-to-all over {world} ranks needs dim {scatter_dim} of shape {tuple(x.shape)} "
            f"to be a multiple of {world}"
        )
    # (.., world*n, ..) -> (world, .., n, ..): chunk j is contiguous. gloo silently corrupts
    # non-contiguous or unevenly sized buffers, so both sides are exact contiguous tensors.
    send = x.unflatten(scatter_dim, (world, -1)).movedim(scatter_dim, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] is rank j's chunk: put the rank index just before gather_dim and merge the two.
    return recv.movedim(0, gather_dim).flatten(gather_dim, gather_dim + 1)


class AllToAll(torch.autograd.Function):
    """All-to-all whose backward is the inverse all-to-all (scatter and gather dims swapped)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Differentiable all-to-all: ``x`` split along ``scatter_dim``, gathered along ``gather_dim``."""
    if _group_size(group) == 1:
        return x
    return AllToAll.apply(x, group, scatter_dim, gather_dim)


# torch >= 2.12 renamed all_gather_into_tensor; keep working on the older releases we support.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    world = dist.get_world_size(group)
    # gloo wants the output as the inputs concatenated along dim 0; view it as (world, *x.shape).
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather_single(out, x.contiguous(), group=group)
    return out.unflatten(0, (world, -1)).movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """Sum over the group of chunk ``rank`` of ``x`` along ``dim`` (an all-to-all then a local sum:
    the same traffic as a reduce-scatter, which gloo lacks)."""
    world = dist.get_world_size(group)
    send = x.unflatten(dim, (world, -1)).movedim(dim, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.sum(0)


GatherGrad = Literal["sum", "slice"]


class AllGather(torch.autograd.Function):
    """All-gather along ``dim``. Backward: ``"sum"`` reduces the incoming gradients over the group
    (the exact adjoint: every rank's copy of the output counts), ``"slice"`` keeps this rank's own
    chunk of its own gradient (right when every rank computes the same loss from its copy and
    parameter gradients are then *summed*, not averaged, over the group)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int, grad: GatherGrad):
        ctx.group, ctx.dim, ctx.grad = group, dim, grad
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.grad == "sum":
            dx = _reduce_scatter(grad, ctx.group, ctx.dim)
        else:
            dx = grad.chunk(dist.get_world_size(ctx.group), ctx.dim)[dist.get_rank(ctx.group)]
        return dx, None, None, None


def all_gather(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int, grad: GatherGrad = "sum") -> torch.Tensor:
    """Differentiable all-gather along ``dim``; see ``AllGather`` for the ``grad`` modes."""
    if grad not in ("sum", "slice"):
        raise ValueError(f"grad must be 'sum' or 'slice', got {grad!r}")
    if _group_size(group) == 1:
        return x
    return AllGather.apply(x, group, dim % x.dim(), grad)


def shard_len(seq_len: int, parallel: ParallelState) -> int:
    """Length of every rank's shard of a sequence of ``seq_len`` tokens (the last shards are padded)."""
    return -(-seq_len // parallel.sp)


def shard_sequence(x: torch.Tensor, parallel: ParallelState, dim: int = 1) -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim``.

    Shard ``i`` (held by SP rank ``i``) is ``x[..., i*L:(i+1)*L, ...]`` with ``L = ceil(S / sp)``. When
    ``S`` is not a multiple of ``sp`` the tail is zero-padded, so every rank holds ``L`` positions;
    pass ``seq_len=S`` to ``usp_attention`` and ``gather_sequence`` to mask and drop the padding.
    The backward gives this rank's partial gradient of ``x`` (zeros outside its shard).
    """
    dim %= x.dim()
    length = shard_len(x.shape[dim], parallel)
    pad = length * parallel.sp - x.shape[dim]
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - dim - 1) + [0, pad])
    return x.narrow(dim, parallel.sp_rank * length, length)


def gather_sequence(
    x: torch.Tensor,
    parallel: ParallelState,
    dim: int = 1,
    *,
    seq_len: int | None = None,
    grad: GatherGrad = "sum",
) -> torch.Tensor:
    """Rebuild the full sequence from every SP rank's shard along ``dim``, dropping padding.

    ``seq_len`` is the true length given to ``shard_sequence`` (``None``: no padding to drop).
    ``grad`` chooses the backward: ``"sum"`` (default, the exact adjoint; use it when parameter
    gradients are *averaged* over the SP group, as FSDP does over ``dp*sp``) or ``"slice"`` (each rank
    keeps its own chunk; gradients then equal a single process's when every rank computes the same
    loss and parameter gradients are *summed* over the SP group).
    """
    dim %= x.dim()
    full = all_gather(x, parallel.sp_group, dim, grad)
    if seq_len is not None:
        if not 0 < seq_len <= full.shape[dim]:
            raise ValueError(
                f"seq_len={seq_len} does not fit the gathered length {full.shape[dim]} "
                f"({parallel.sp} shards of {x.shape[dim]})"
            )
        full = full.narrow(dim, 0, seq_len)
    return full


class RingComm:
    """Sends a tensor to the next ring peer while receiving one from the previous peer.

    One ``step`` posts the exchange and returns at once; ``wait`` returns the received tensor. Keep
    computing between the two: that is the overlap of communication and attention.
    """

    def __init__(self, parallel: ParallelState, tag: int = 0):
        self.group = parallel.ring_group
        self.tag = tag
        self.next = (parallel.ring_rank + 1) % parallel.ring
        self.prev = (parallel.ring_rank - 1) % parallel.ring
        self._works: list[dist.Work] = []
        self._send: torch.Tensor | None = None  # kept alive until the send completes
        self._recv: torch.Tensor | None = None

    def step(self, send: torch.Tensor, recv: torch.Tensor | None = None) -> None:
        if self._works:
            raise RuntimeError("RingComm.step called twice without wait()")
        self._send = send.contiguous()
        self._recv = torch.empty_like(self._send) if recv is None else recv
        ops = [
            dist.P2POp(dist.isend, self._send, group=self.group, tag=self.tag, group_peer=self.next),
            dist.P2POp(dist.irecv, self._recv, group=self.group, tag=self.tag, group_peer=self.prev),
        ]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        self._works = []
        recv, self._recv, self._send = self._recv, None, None
        assert recv is not None
        return recv
