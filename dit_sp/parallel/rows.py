"""Tensors whose rows (dim -2, the height of ``(..., H, W)`` images and ``(B, C, T, H, W)`` videos) are split
over the ranks of a group in contiguous ranges: the split, the exchange of the rows a rank needs from its
peers (a convolution's halo), and the assembly of the whole.

The split is fixed at a base height ``H0`` (``sizes[r]`` rows on rank ``r``); a tensor at ``scale`` s (an
activation s times finer, ``H = s * H0``) holds rows ``[s * start_r, s * stop_r)`` on rank r. Every rank can
compute every other rank's rows, so an exchange needs no size negotiation. Inference only (no autograd).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dit_sp._compat import all_gather_single, p2p_op

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


@dataclass(frozen=True)
class RowSplit:
    sizes: tuple[int, ...]
    """Rows of the base height on each rank (every rank at least one)."""

    @classmethod
    def even(cls, height: int, parts: int) -> RowSplit:
        if height < parts:
            raise ValueError(f"cannot split {height} rows over {parts} ranks with at least one row each")
        return cls(tuple(height // parts + (r < height % parts) for r in range(parts)))

    @property
    def height(self) -> int:
        return sum(self.sizes)

    def bounds(self, rank: int, scale: int = 1) -> tuple[int, int]:
        """Rows ``[start, stop)`` of ``rank`` at ``scale``."""
        start = sum(self.sizes[:rank])
        return scale * start, scale * (start + self.sizes[rank])

    def scale_of(self, local_rows: int, rank: int) -> int:
        """The scale of a tensor that holds ``local_rows`` rows on ``rank``."""
        scale, rest = divmod(local_rows, self.sizes[rank])
        if rest or scale < 1:
            raise RuntimeError(
                f"rank {rank} holds {local_rows} rows, not a whole multiple of its {self.sizes[rank]} base rows: "
                "an operation changed the height by a factor that the split does not follow"
            )
        return scale


Need = Callable[[int], tuple[int, int]]
"""``need(rank) -> (lo, hi)``: the global rows (may reach outside ``[0, H)``) that ``rank`` needs."""


def post_rows(x: torch.Tensor, split: RowSplit, scale: int, group: dist.ProcessGroup,
              need: Need) -> Callable[[], list[tuple[int, torch.Tensor]]]:  # fmt: skip
    """Start sending each peer the part of this rank's rows ``x`` that ``need(peer)`` asks for, and receiving
    the rows of ``need(rank)`` that the peers hold; returns ``wait() -> [(first global row, rows), ...]`` (in
    row order), so that work can run while the rows travel."""
    import torch.distributed as dist

    rank, parts = dist.get_rank(group), len(split.sizes)
    start, stop = split.bounds(rank, scale)
    lo, hi = need(rank)
    ops, received = [], []
    for peer in range(parts):
        if peer == rank:
            continue
        peer_start, peer_stop = split.bounds(peer, scale)
        peer_lo, peer_hi = need(peer)
        first, last = max(peer_lo, start), min(peer_hi, stop)
        if first < last:  # gloo needs contiguous buffers
            ops.append(p2p_op(dist.isend, x[..., first - start : last - start, :].contiguous(), group, peer))
        first, last = max(lo, peer_start), min(hi, peer_stop)
        if first < last:
            buffer = x.new_empty((*x.shape[:-2], last - first, x.shape[-1]))
            ops.append(p2p_op(dist.irecv, buffer, group, peer))
            received.append((first, buffer))
    works = dist.batch_isend_irecv(ops) if ops else []

    def wait() -> list[tuple[int, torch.Tensor]]:
        for work in works:
            work.wait()
        ops.clear()  # the send buffers live until here
        return sorted(received, key=lambda piece: piece[0])

    return wait


def receive_rows(x: torch.Tensor, split: RowSplit, scale: int, group: dist.ProcessGroup,
                 need: Need) -> list[tuple[int, torch.Tensor]]:  # fmt: skip
    """``post_rows`` and wait: the rows of ``need(rank)`` that the peers hold."""
    return post_rows(x, split, scale, group, need)()


def exchange_rows(x: torch.Tensor, split: RowSplit, scale: int, group: dist.ProcessGroup, need: Need,
                  pad_mode: str = "constant") -> torch.Tensor:  # fmt: skip
    """The rows ``need(rank)`` of the split tensor whose local part is ``x``, as one tensor: this rank's own
    rows plus those received from its peers, and rows outside the image padded with ``pad_mode``
    (``"constant"``: zeros, ``"replicate"``: the edge row)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank = dist.get_rank(group)
    height = split.height * scale
    start, stop = split.bounds(rank, scale)
    lo, hi = need(rank)
    pieces = receive_rows(x, split, scale, group, need)
    first, last = max(lo, start), min(hi, stop)
    if first < last:
        pieces = sorted([*pieces, (first, x[..., first - start : last - start, :])], key=lambda piece: piece[0])
    rows = torch.cat([piece for _, piece in pieces], dim=-2) if len(pieces) > 1 else pieces[0][1]
    top, bottom = max(0, -lo), max(0, hi - height)
    if top or bottom:
        # replicate padding of 5D tensors takes the last three dims: pad (0, 0) in front of H as well
        rows = F.pad(rows, (0, 0, top, bottom) + (0, 0) * (rows.dim() == 5), mode=pad_mode)
    if rows.shape[-2] != hi - lo:
        raise RuntimeError(f"rank {rank} assembled {rows.shape[-2]} rows for the range [{lo}, {hi})")
    return rows


def gather_rows(x: torch.Tensor, split: RowSplit, scale: int, group: dist.ProcessGroup,
                dst: int | None = None) -> torch.Tensor:  # fmt: skip
    """The whole tensor from each rank's rows ``x``: on every rank, or (``dst``, a group rank) only there,
    the other ranks getting their own ``x`` back."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, parts = dist.get_rank(group), len(split.sizes)
    most = max(split.sizes) * scale
    padded = F.pad(x, (0, 0, 0, most - x.shape[-2])).contiguous()
    if dst is None:
        out = torch.empty((parts * padded.shape[0], *padded.shape[1:]), dtype=x.dtype, device=x.device)
        all_gather_single(out, padded, group)
        chunks = list(out.unflatten(0, (parts, -1)))
    else:
        chunks = [torch.empty_like(padded) for _ in range(parts)] if rank == dst else None
        dist.gather(padded, chunks, dst=dist.get_global_rank(group, dst), group=group)
        if rank != dst:
            return x
    return torch.cat([chunk[..., : size * scale, :] for chunk, size in zip(chunks, split.sizes)], dim=-2)
