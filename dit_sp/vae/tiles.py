"""Tiled VAE decode and encode with the tiles shared out over a process group.

diffusers' ``tiled_decode``/``tiled_encode`` cut the input into overlapping tiles, run the decoder (or
encoder) on each tile alone (for video, chunk by chunk with a causal cache that starts afresh per tile), and
blend the tiles. The tiles are independent, so each process runs whole tiles (tile ``t`` on rank
``t % N``) and the blend, which is cheap, runs on the assembled tiles. The stock method runs twice:

1. **record**: the part's calls that belong to this rank's tiles run; the others return a small placeholder
   at once. The pass stops where the blending starts (the placeholders cannot be blended).
2. **replay**: after the tile outputs are exchanged, the stock method runs again with every part call
   answered from the exchanged outputs, so the blending, cropping and clamping are diffusers' own.

A method that blends between calls (MiniMax-H3's: each clip's tiles are stitched before the next clip's calls, and
the clips cross-faded) has no point to stop at: its record pass runs to the end on placeholders only
(``TileProtocol.runs_through``).

A family's ``TileProtocol`` says how its tiled methods call the part: which call starts a tile, and what a
call that did not run returns. Inference only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dit_sp._compat import p2p_op

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn


@dataclass(frozen=True)
class TileProtocol:
    """How a VAE family's tiled methods call its decoder/encoder (``part(x, **kwargs)``)."""

    starts_tile: Callable[[dict], bool]
    """Whether a call with these keyword arguments is the first of a tile (its cache empty)."""
    answer: Callable[[dict, torch.Tensor], Any]
    """What a call that did not run returns, given its output tensor; it also leaves the call's cache
    looking used, so that the tile's next call is not taken for a new tile."""
    methods: tuple[tuple[str, str], ...] = (("decoder", "tiled_decode"), ("encoder", "tiled_encode"))
    """(part, the VAE's tiled method that calls it)."""
    tile_end: str | None = None
    """A VAE method that the tiled methods call after each tile, for a cache kept on the modules (no call
    argument shows a tile's start): the first call, and each call after it, start a tile."""
    shares: Callable[[nn.Module], bool] = lambda part: True
    """Whether a part's tiles can be shared out; if not (a part that draws noise tile after tile from one
    generator), each tile runs split by rows."""
    runs_through: bool = False
    """The tiled method blends between calls, so the record pass cannot stop where the blending starts: it runs the
    method to its end with every call answered by the 1x1x1 placeholder, the calls this rank ran too (their outputs
    kept for the exchange), so that the blending in between (cheap) sees placeholders only."""


def check_inference(x: torch.Tensor) -> None:
    """The parallel VAE has no backward (its exchanges are not autograd ops): refuse an input that wants one."""
    import torch

    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("the parallel VAE is inference-only: run it under torch.no_grad(), or turn it off "
                           "(parallelize(..., parallel_vae=False))")  # fmt: skip


class _BlendReached(Exception):
    """Raised in the record pass where the stock method starts blending tiles."""


_HEADS = ("conv_out", "proj_out")
"""A part's last layer, whose output channels a call that did not run answers with (Mochi's is a linear)."""


def _out_channels(part: nn.Module) -> int:
    from torch import nn

    head = next(getattr(part, name) for name in _HEADS if hasattr(part, name))
    layers = [m for m in head.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))]
    return layers[-1].out_features if isinstance(layers[-1], nn.Linear) else layers[-1].out_channels


class _Record:
    """The record pass: which rank runs each call, and this rank's outputs."""

    def __init__(self, part: nn.Module, protocol: TileProtocol, rank: int, ranks: int):

        self.part, self.protocol, self.rank, self.ranks = part, protocol, rank, ranks
        self.tile = -1
        self.ended = protocol.tile_end is not None
        self.owners: list[int] = []
        self.outputs: dict[int, torch.Tensor] = {}
        self.device: torch.device | None = None
        self.channels = _out_channels(part)

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.ended or self.protocol.starts_tile(kwargs):
            self.tile, self.ended = self.tile + 1, False
        if self.tile < 0:
            raise RuntimeError("parallel VAE tiles: a call came before any call that starts a tile")
        call, owner = len(self.owners), self.tile % self.ranks
        self.device = x.device
        self.owners.append(owner)
        if owner == self.rank:
            out = type(self.part).forward(self.part, x, *args, **kwargs)
            self.outputs[call] = out[0] if isinstance(out, tuple) else out
            if not self.protocol.runs_through:
                return out
        # a 1x1x1 tensor with the output's channels, for what the method does to outputs before blending
        return self.protocol.answer(kwargs, x.new_zeros((x.shape[0], self.channels, 1, 1, 1)))


def _exchange(record: _Record, group: dist.ProcessGroup, gather_to: int | None) -> list[torch.Tensor]:
    """Every call's output, from its owner: on every rank, or (``gather_to``) only there, the other ranks
    getting zeros for the calls they did not run."""
    import torch
    import torch.distributed as dist

    tables: list[Any] = [None] * record.ranks
    dist.all_gather_object(tables, {call: (tuple(t.shape), t.dtype) for call, t in record.outputs.items()},
                           group=group)  # fmt: skip
    outputs, ops = [], []
    for call, owner in enumerate(record.owners):
        if owner == record.rank:
            out = record.outputs[call].contiguous()  # gloo sends contiguous buffers (Mochi: a permuted output)
        else:
            shape, dtype = tables[owner][call]
            out = torch.zeros(shape, dtype=dtype, device=record.device)
        outputs.append(out)
        if owner == record.rank and gather_to is None:
            ops += [p2p_op(dist.isend, out, group, peer) for peer in range(record.ranks) if peer != owner]
        elif owner == record.rank and record.rank != gather_to:
            ops.append(p2p_op(dist.isend, out, group, gather_to))
        elif owner != record.rank and gather_to in (None, record.rank):
            ops.append(p2p_op(dist.irecv, out, group, owner))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return outputs


def _share(vae: nn.Module, part: nn.Module, method: str, protocol: TileProtocol, group: dist.ProcessGroup,
           gather_to: int | None) -> Callable[[], None]:  # fmt: skip
    import torch
    import torch.distributed as dist

    original = getattr(vae, method)
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)

    def with_part(forward: Callable, *args: Any, **kwargs: Any) -> Any:
        """The stock method with ``part.forward`` answered by ``forward`` (the row split stands aside)."""
        saved = part.__dict__.get("forward")
        part.forward = forward
        try:
            return original(*args, **kwargs)
        finally:
            if saved is None:
                del part.forward
            else:
                part.forward = saved

    def tiled(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        check_inference(x)
        record = _Record(part, protocol, rank, ranks)

        def reached(*_: Any, **__: Any) -> None:
            raise _BlendReached

        def ended(*args: Any, **kwargs: Any) -> Any:
            record.ended = True
            return getattr(type(vae), protocol.tile_end)(vae, *args, **kwargs)

        vae.blend_v = vae.blend_h = reached
        if protocol.tile_end:
            setattr(vae, protocol.tile_end, ended)
        try:
            with torch.no_grad():
                with_part(record, x, *args, **kwargs)
        except _BlendReached:
            pass
        finally:
            del vae.blend_v, vae.blend_h
            if protocol.tile_end:
                delattr(vae, protocol.tile_end)
        outputs = iter(_exchange(record, group, gather_to))
        with torch.no_grad():
            return with_part(lambda _, *a, **kw: protocol.answer(kw, next(outputs)), x, *args, **kwargs)

    setattr(vae, method, tiled)
    return lambda: vae.__dict__.pop(method, None)


def share_tiles(vae: nn.Module, protocol: TileProtocol, group: dist.ProcessGroup,
                gather_to: int | None = None) -> Callable[[], None]:  # fmt: skip
    """Make ``vae``'s tiled methods share their tiles out over ``group`` (see the module docstring); the
    result equals the one-process tiled run, assembled on every rank (decoded frames: or only on group rank
    ``gather_to``). Returns the undo."""
    undos = []
    for part_name, method in protocol.methods:
        part = getattr(vae, part_name, None)
        if part is None or not hasattr(vae, method) or not protocol.shares(part):
            continue
        if method in vae.__dict__:
            raise ValueError(f"the VAE's {method} is already replaced; undo that first")
        if not any(hasattr(part, name) for name in _HEADS):
            raise NotImplementedError(f"parallel VAE tiles: {type(part).__name__} has no {' or '.join(_HEADS)}")
        # encoded latents condition every rank's sampling: only decoded frames stay on gather_to
        undos.append(_share(vae, part, method, protocol, group, gather_to if part_name == "decoder" else None))
    return lambda: [undo() for undo in reversed(undos)]
