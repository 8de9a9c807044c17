"""Collectives with autograd: Ulysses all-to-all, sequence shard/gather, ring P2P, all-reduce (sum) and the halo of
a contiguous split (a convolution's neighbouring positions).

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

from dit_sp._compat import all_gather_single, p2p_op
from dit_sp.parallel.state import ParallelState


def _group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def exchange_chunks(send: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk ``j`` of ``send`` (along dim 0, one per rank) goes to rank ``j``; chunk ``j`` of the result came
    from rank ``j``. ``send`` must be contiguous (gloo silently corrupts other buffers)."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


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
    recv = exchange_chunks(x.unflatten(scatter_dim, (world, -1)).movedim(scatter_dim, 0).contiguous(), group)
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


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    world = dist.get_world_size(group)
    # gloo wants the output as the inputs concatenated along dim 0; view it as (world, *x.shape).
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    all_gather_single(out, x.contiguous(), group)
    return out.unflatten(0, (world, -1)).movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """Sum over the group of chunk ``rank`` of ``x`` along ``dim`` (an all-to-all then a local sum:
    the same traffic as a reduce-scatter, which gloo lacks)."""
    world = dist.get_world_size(group)
    return exchange_chunks(x.unflatten(dim, (world, -1)).movedim(dim, 0).contiguous(), group).sum(0)


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


def true_length(seq_len: int | None, local_len: int, parallel: ParallelState, caller: str) -> int:
    """Check ``seq_len``, the true length ``S`` of a sequence cut into shards of ``local_len`` positions,
    and return it.

    With ``sp > 1`` it is required (the shards may hide zero padding, see ``shard_sequence``) and must be
    one that ``shard_sequence`` cuts into shards of ``local_len``: ``ceil(S / sp) == local_len``. That
    catches a forgotten ``seq_len`` and the length of one shard passed for the whole. In one process
    (``sp == 1``) it defaults to ``local_len``, and a smaller value marks the tail as padding.
    """
    sp = parallel.sp
    if seq_len is None:
        if sp == 1:
            return local_len
        raise ValueError(
            f"{caller} over {sp} sequence-parallel ranks needs seq_len=S, the true length of the sequence cut into "
            f"these shards of {local_len} ({local_len * sp} if it divides evenly): when S is not a multiple of "
            f"{sp}, shard_sequence zero-pads the last shards, and without seq_len that padding would be taken for "
            "tokens"
        )
    low = max(1, (local_len - 1) * sp + 1) if sp > 1 else 1
    if not low <= seq_len <= local_len * sp:
        hint = (
            f" (shard_sequence cuts S tokens into shards of ceil(S/{sp}): seq_len is the length of the whole "
            "sequence, not of one shard)"
            if sp > 1
            else ""
        )
        raise ValueError(
            f"seq_len={seq_len} does not fit {sp} shards of {local_len} tokens: it must be in "
            f"[{low}, {local_len * sp}]{hint}"
        )
    return seq_len


def shard_sequence(x: torch.Tensor, parallel: ParallelState, dim: int = 1) -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim``.

    Shard ``i`` (held by SP rank ``i``) is ``x[..., i*L:(i+1)*L, ...]`` with ``L = ceil(S / sp)``. When
    ``S`` is not a multiple of ``sp`` the tail is zero-padded, so every rank holds ``L`` positions. The
    shard does not remember ``S``: ``usp_attention`` and ``gather_sequence`` take it as ``seq_len`` (required
    when ``sp > 1``) to mask and drop the padding.
    The backward gives this rank's partial gradient of ``x`` (zeros outside its shard).

    When autograd records the shard (``x`` requires grad), it is a tensor of its own, a copy of ``1/sp`` of
    ``x``: a view would keep the whole of ``x`` alive until backward, as the first layer saves its input.
    Otherwise it is a view (nothing saves it, and a copy would only add to the peak).
    """
    if parallel.sp == 1:
        return x
    dim %= x.dim()
    total = x.shape[dim]
    length = shard_len(total, parallel)
    start = min(parallel.sp_rank * length, total)
    real = min(length, total - start)
    shard = x.narrow(dim, start, real)
    if real < length:  # the tail of an uneven sequence: only this shard is padded, not the whole tensor
        return F.pad(shard, [0, 0] * (x.dim() - dim - 1) + [0, length - real])
    if x.requires_grad and torch.is_grad_enabled():
        return shard.clone(memory_format=torch.contiguous_format)
    return shard


def gather_sequence(
    x: torch.Tensor,
    parallel: ParallelState,
    dim: int = 1,
    *,
    seq_len: int | None = None,
    grad: GatherGrad = "sum",
) -> torch.Tensor:
    """Rebuild the full sequence from every SP rank's shard along ``dim``, dropping padding.

    ``seq_len`` is the true length given to ``shard_sequence``; required when ``sp > 1`` (see
    ``true_length``), since a padded shard cannot be told from an unpadded one.
    ``grad`` chooses the backward: ``"sum"`` (default, the exact adjoint; use it when parameter
    gradients are *averaged* over the SP group, as FSDP does over ``dp*sp``) or ``"slice"`` (each rank
    keeps its own chunk; gradients then equal a single process's when every rank computes the same
    loss and parameter gradients are *summed* over the SP group).
    """
    dim %= x.dim()
    seq_len = true_length(seq_len, x.shape[dim], parallel, "gather_sequence")  # checked before any traffic
    full = all_gather(x, parallel.sp_group, dim, grad)
    return full if seq_len == full.shape[dim] else full.narrow(dim, 0, seq_len)


class RingComm:
    """Sends tensors to the next ring peer while receiving as many from the previous peer.

    One ``step`` posts the exchange and returns at once; ``wait`` returns the received tensors. Keep
    computing between the two: that is the overlap of communication and attention. ``step`` takes one
    tensor or a tuple of them (e.g. a block's keys and values, sent as they are: no stacked copy); ``wait``
    returns the same kind.
    """

    def __init__(self, parallel: ParallelState, tag: int = 0):
        self.group = parallel.ring_group
        self.tag = tag
        self.next = (parallel.ring_rank + 1) % parallel.ring
        self.prev = (parallel.ring_rank - 1) % parallel.ring
        self._works: list[dist.Work] = []
        self._send: tuple[torch.Tensor, ...] = ()  # kept alive until the sends complete
        self._recv: tuple[torch.Tensor, ...] = ()
        self._single = False

    def step(
        self,
        send: torch.Tensor | tuple[torch.Tensor, ...],
        recv: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    ) -> None:
        if self._works:
            raise RuntimeError("RingComm.step called twice without wait()")
        self._single = isinstance(send, torch.Tensor)
        sends = (send,) if self._single else tuple(send)
        recvs = (recv,) if isinstance(recv, torch.Tensor) else recv
        self._send = tuple(x.contiguous() for x in sends)  # gloo needs contiguous buffers
        self._recv = tuple(torch.empty_like(x) for x in self._send) if recvs is None else tuple(recvs)
        if len(self._recv) != len(self._send):
            raise ValueError(f"RingComm.step got {len(self._send)} tensors to send and {len(self._recv)} buffers")
        ops = []
        for i, (out, into) in enumerate(zip(self._send, self._recv)):
            tag = self.tag + 1024 * i  # one tag per tensor: matching never depends on message order
            ops.append(p2p_op(dist.isend, out, self.group, self.next, tag))
            ops.append(p2p_op(dist.irecv, into, self.group, self.prev, tag))
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        for work in self._works:
            work.wait()
        self._works = []
        recv, self._recv, self._send = self._recv, (), ()
        if not recv:
            raise RuntimeError("RingComm.wait called without step()")
        return recv[0] if self._single else recv


class AllReduce(torch.autograd.Function):
    """Sum over the group, every rank getting the total. Backward: the sum of the gradients over the group (each
    rank's copy of the total is one variable, and every rank's input reaches every copy)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup):
        ctx.group = group
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Differentiable sum of ``x`` over ``group`` (e.g. the token sums of a linear attention over a split
    sequence); the identity for a group of one."""
    if _group_size(group) == 1:
        return x
    return AllReduce.apply(x, group)


class AverageGradient(torch.autograd.Function):
    """The identity. Backward: the mean over the group of the ranks' gradients (each rank then holds the same share
    of the total; their sum is unchanged). With a power-of-two group the mean is exact, so a gradient that a model
    rounds further down (Kandinsky 5's bf16 rotary) rounds as one process's total would, scaled."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total / dist.get_world_size(ctx.group), None


def average_gradient(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``x``, its gradient averaged over ``group`` in backward (``AverageGradient``); identity for a group of one."""
    if _group_size(group) == 1:
        return x
    return AverageGradient.apply(x, group)


def _swap_edges(first: torch.Tensor, last: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, ...]:
    """Send ``first`` to the previous rank and ``last`` to the next one; returns what the previous rank sent as its
    ``last`` and the next rank as its ``first``, zeros at the ends of the group (rank 0 and the last rank)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    before = last.new_zeros(last.shape)  # contiguous (gloo), whatever the strides of the edges
    after = first.new_zeros(first.shape)
    ops = []
    if rank > 0:
        ops += [
            p2p_op(dist.isend, first.contiguous(), group, rank - 1, 1),
            p2p_op(dist.irecv, before, group, rank - 1, 2),
        ]
    if rank < world - 1:
        ops += [
            p2p_op(dist.isend, last.contiguous(), group, rank + 1, 2),
            p2p_op(dist.irecv, after, group, rank + 1, 1),
        ]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return before, after


class Halo(torch.autograd.Function):
    """``x`` of a sequence split in contiguous ranges over the group (rank order), extended along ``dim`` by
    ``width`` positions of each neighbour: ``[previous rank's last width, x, next rank's first width]``, zeros
    beyond the ends of the whole sequence (a convolution's zero padding). Backward: each halo's gradient goes
    back to the rank it came from and is added to its edge."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int, width: int):
        ctx.group, ctx.dim, ctx.width = group, dim, width
        length = x.shape[dim]
        before, after = _swap_edges(x.narrow(dim, 0, width), x.narrow(dim, length - width, width), group)
        return torch.cat([before, x, after], dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dim, width = ctx.dim, ctx.width
        length = grad.shape[dim] - 2 * width
        # the gradient of my "before" halo belongs to the previous rank's last positions, and so on
        to_prev, to_next = grad.narrow(dim, 0, width), grad.narrow(dim, width + length, width)
        from_prev, from_next = _swap_edges(to_prev, to_next, ctx.group)
        dx = grad.narrow(dim, width, length).clone()
        dx.narrow(dim, 0, width).add_(from_prev)
        dx.narrow(dim, length - width, width).add_(from_next)
        return dx, None, None, None


def halo(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int, width: int = 1) -> torch.Tensor:
    """``x`` with ``width`` positions of each neighbour rank along ``dim`` around it (zeros past the ends of the
    sequence), differentiable (``Halo``). Every rank must hold at least ``width`` positions."""
    dim %= x.dim()
    if x.shape[dim] < width:
        raise ValueError(f"a halo of {width} needs at least {width} positions per rank along dim {dim}, got {x.shape}")
    if _group_size(group) == 1:
        pad = [0, 0] * (x.dim() - dim - 1) + [width, width]
        return F.pad(x, pad)
    if torch.compiler.is_compiling() and not (torch.is_grad_enabled() and x.requires_grad):
        # in a compiled block: one opaque op (Dynamo does not compile point-to-point sends; with autograd it runs
        # them eagerly, a graph break)
        return torch.ops.dit_sp.halo(x, group.group_name, dim, width)
    return Halo.apply(x, group, dim, width)


@torch.library.custom_op("dit_sp::halo", mutates_args=())
def _halo_op(x: torch.Tensor, group_name: str, dim: int, width: int) -> torch.Tensor:
    from dit_sp._compat import process_group_named

    return Halo.apply(x, process_group_named(group_name), dim, width)


@_halo_op.register_fake
def _(x: torch.Tensor, group_name: str, dim: int, width: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] += 2 * width
    return x.new_empty(shape)
