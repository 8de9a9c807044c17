"""Parallel VAE: a video VAE's decoder and encoder run with each frame's rows split over a process group.

A video VAE is convolutions, normalisations, nearest upsampling, per-pixel ops and, at its lowest
resolution, attention over whole frames. With the rows of every activation split over N processes, each
op runs on its own rows given:

- convolutions: the rows of the neighbours that the kernel reaches (a halo, ``dit_sp.parallel.rows``), in
  place of the padding at the inner edges; the image's own edges keep the convolution's padding;
- group normalisation: statistics of the whole frame, summed over the processes;
- whole-frame modules (attention): the frame gathered, run whole, and the output's own rows kept;
- modules that draw per-pixel noise (``torch.randn`` of an activation's height): the whole frame's noise
  drawn on every rank, group rank 0's taken, and the own rows kept.

Each process then holds 1/N of every activation (the decode's memory peak) and does 1/N of the work. While a
split call runs, the modules get instance-level adapters, removed after the call; the stock code does the
rest unchanged: temporal causal caches (they hold each process's own rows), frame chunks, clamping and
patchify. With tiling on, whole tiles are shared out instead (``dit_sp.vae.tiles``). Inference only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dit_sp._compat import conv_forward_attr
from dit_sp.parallel.rows import RowSplit, exchange_rows, gather_rows, post_rows, receive_rows
from dit_sp.vae.tiles import TileProtocol, check_inference

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn

Padding = tuple[int, int, str]
"""Rows a module adds above and below a convolution's input before it runs, and how (``F.pad`` mode)."""


@dataclass(frozen=True)
class VAEPlan:
    """What the split needs to know about one VAE family beyond the generic ops."""

    class_names: tuple[str, ...]
    """diffusers VAE classes of the family."""
    padded_inputs: Callable[[nn.Module], dict[nn.Module, Padding]] = lambda part: {}
    """The convolutions of a decoder or encoder whose input its caller pads in height (the rest pad
    through their own ``padding``)."""
    whole_frame: tuple[str, ...] = ()
    """Classes of modules that need whole frames (attention over the frame), input and output
    ``(B, C, T, H, W)``."""
    whole_frame_of: Callable[[nn.Module], list[nn.Module]] = lambda part: []
    """The modules of a decoder or encoder that need whole frames, picked by more than their class (Cosmos' spatial
    attention: a ``CosmosCausalAttention`` with the spatial processor; the temporal one, per pixel, runs split)."""
    unchunked: tuple[str, ...] = ()
    """Convolution classes that cut big inputs into chunks by their own size: while split they run in
    one piece, so that every process makes the same calls (each input is 1/N as big)."""
    noise: Callable[[nn.Module], list[nn.Module]] = lambda part: []
    """The modules of a decoder or encoder that draw per-pixel noise (``torch.randn`` whose last two dims are
    their activation's rows and columns), drawn for the whole frame while split."""
    downsampling: Callable[[nn.Module], int] = lambda part: 1
    """How many times a part's reshapes (patchify, space-to-depth) shrink its height, beyond its strided
    convolutions: the part's input is split in blocks of rows of both factors."""
    parts: tuple[str, ...] = ("decoder", "encoder")
    """The VAE's attributes that run split."""
    tiles: TileProtocol | None = None
    """How its tiled methods call the parts, to share whole tiles out over the processes
    (``dit_sp.vae.tiles``); without it, each tile is split by rows."""


class _Run:
    """One split call: the split, the group, and whether the adapters stand aside (inside a whole-frame
    module, which runs on gathered frames)."""

    def __init__(self, split: RowSplit, group: dist.ProcessGroup):
        import torch.distributed as dist

        self.split, self.group, self.rank = split, group, dist.get_rank(group)
        self.bypass = 0

    def scale(self, rows: int) -> int:
        return self.split.scale_of(rows, self.rank)


Adapter = Callable[[_Run], tuple["nn.Module", str, Callable]]


def _conv(conv: nn.Module, padded: Padding | None) -> Adapter:
    """A convolution over its rows plus the halo its kernel reaches.

    ``_conv_forward`` gets the input after any padding its module (or the caller) added. The outputs of this
    rank need the input rows ``[o0*s - top, (o1-1)*s + k - top)``; those the peers hold are received, and
    rows outside the image are padded as the module pads them. Without copying the input where possible:
    a stride-1 convolution that keeps the height runs as it is while the halo travels (its rows at inner
    edges come out of the module's padding, wrong), then recomputes those edge rows from a small slab (halo
    plus ``k-1`` own rows); a strided one overwrites its module's padding rows at inner edges with the halo
    in place (the padded input is the module's own temporary) before it runs. A convolution that pads by
    reflection or replication (``padding_mode``: ``_conv_forward`` pads with ``F.pad``) gets its rows with the
    halo and the image's edges padded that way, and its other dims padded as it pads them."""
    import torch
    import torch.nn.functional as F

    pre_top, pre_bottom, mode = padded or (0, 0, "constant")
    kernel, stride, own = conv.kernel_size[-2], conv.stride[-2], conv.padding[-2]
    pads_itself = conv.padding_mode in ("reflect", "replicate")
    supported = conv.padding_mode == "zeros" or (pads_itself and not padded)
    if not supported or conv.dilation[-2] != 1 or isinstance(conv.padding, str):
        raise NotImplementedError(f"parallel VAE: {type(conv).__name__} with padding_mode={conv.padding_mode}, "
                                  f"dilation={conv.dilation}, padding={conv.padding}")  # fmt: skip
    top, bottom = pre_top + own, pre_bottom + own
    mode = conv.padding_mode if pads_itself else mode if pre_top or pre_bottom else "constant"
    padding = (*conv.padding[:-2], 0, conv.padding[-1])
    same = stride == 1 and kernel == top + bottom + 1 and kernel > 1 and not pads_itself
    op = F.conv2d if conv.weight.dim() == 4 else F.conv3d
    # F.pad's order: the last dim first; the rows (0, 0): they come padded
    other_pads = sum(((p, p) for p in reversed(padding)), ())

    def run_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if pads_itself:
            return op(F.pad(x, other_pads, mode=mode), weight, bias, conv.stride, 0, conv.dilation, conv.groups)
        return op(x, weight, bias, conv.stride, padding, conv.dilation, conv.groups)

    def adapter(run: _Run):
        original = getattr(conv, conv_forward_attr())

        def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if run.bypass:
                return original(x, weight, bias)
            rows = x.shape[-2] - pre_top - pre_bottom
            scale = run.scale(rows)
            height = scale * run.split.height
            out_scale, rest = divmod(scale, stride)
            if rest or (height + top + bottom - kernel) // stride + 1 != out_scale * run.split.height:
                raise RuntimeError(f"parallel VAE: a stride-{stride} convolution of {height} rows does not keep the "
                                   "row split aligned; use heights divisible by the VAE's compression")  # fmt: skip

            def need(rank: int) -> tuple[int, int]:
                first, last = run.split.bounds(rank, out_scale)
                return first * stride - top, (last - 1) * stride + kernel - top

            start, stop = run.split.bounds(run.rank, scale)
            lo, hi = need(run.rank)
            # rows outside the image only where this rank holds the image's edge (so its padding is right)
            edges_padded = (lo >= 0 or start == 0) and (hi <= height or stop == height)
            mine = x[..., pre_top : pre_top + rows, :]
            if same and rows >= kernel and edges_padded:
                wait = post_rows(mine, run.split, scale, run.group, need)
                out = original(x, weight, bias)  # right but for the rows next to inner edges
                pieces = wait()
                above = [piece for first, piece in pieces if first < start]
                below = [piece for first, piece in pieces if first >= stop]
                if above:
                    out[..., :top, :] = run_conv(torch.cat([*above, mine[..., : kernel - 1, :]], -2), weight, bias)
                if below:
                    slab = torch.cat([mine[..., rows - kernel + 1 :, :], *below], -2)
                    out[..., out.shape[-2] - bottom :, :] = run_conv(slab, weight, bias)
                return out
            covered = start - pre_top
            if (pre_top or pre_bottom) and covered <= lo and hi <= stop + pre_bottom and edges_padded:
                for first, piece in receive_rows(mine, run.split, scale, run.group, need):
                    x[..., first - covered : first - covered + piece.shape[-2], :] = piece
                return run_conv(x[..., lo - covered : hi - covered, :], weight, bias)
            x = exchange_rows(mine, run.split, scale, run.group, need, mode)
            return run_conv(x, weight, bias)

        return conv, conv_forward_attr(), conv_forward

    return adapter


def _group_norm(norm: nn.GroupNorm) -> Adapter:
    """Group normalisation with the mean and variance of the whole frame (two all-reduces)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    def adapter(run: _Run):
        original = norm.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            if run.bypass:
                return original(x)
            batch, groups = x.shape[0], norm.num_groups
            grouped = x.reshape(batch, groups, -1)
            stats = torch.stack([grouped.sum(-1, dtype=torch.float64),
                                 torch.linalg.vector_norm(grouped, dim=-1, dtype=torch.float64).square(),
                                 torch.full((batch, groups), grouped.shape[-1], dtype=torch.float64,
                                            device=x.device)])  # fmt: skip
            dist.all_reduce(stats, group=run.group)
            mean = stats[0] / stats[2]
            var = (stats[1] / stats[2] - mean.square()).clamp_min(0)
            # (x - mean) / sqrt(var + eps) for every (sample, group) in one kernel
            y = F.batch_norm(grouped.reshape(1, batch * groups, -1), mean.flatten().to(torch.float32),
                             var.flatten().to(torch.float32), eps=norm.eps).reshape(x.shape)  # fmt: skip
            if norm.affine:
                shape = (1, -1) + (1,) * (x.dim() - 2)
                y = y.mul_(norm.weight.view(shape)).add_(norm.bias.view(shape))
            return y

        return norm, "forward", forward

    return adapter


def _batch_norm(norm: nn.Module) -> Adapter:
    """A batch norm with running statistics in eval mode is per channel, local to the rows; one that normalises with
    its input's statistics (training mode, or none kept) would see only this rank's rows: refused in one line."""

    def adapter(run: _Run):
        original = norm.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not run.bypass and (norm.training or norm.running_mean is None):
                raise RuntimeError(f"parallel VAE: {type(norm).__name__} in training mode (or without running "
                                   "statistics) normalises with its input's statistics, and each process holds its "
                                   "own rows; put the VAE in eval mode (vae.eval())")  # fmt: skip
            return original(x)

        return norm, "forward", forward

    return adapter


def _whole_frame(module: nn.Module) -> Adapter:
    """A module run on the gathered frames; each rank keeps its own rows of the output."""

    def adapter(run: _Run):
        original = module.forward

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if run.bypass:
                return original(x, *args, **kwargs)
            scale = run.scale(x.shape[-2])
            run.bypass += 1
            try:
                out = original(gather_rows(x, run.split, scale, run.group), *args, **kwargs)
            finally:
                run.bypass -= 1
            start, stop = run.split.bounds(run.rank, scale)
            return out[..., start:stop, :].contiguous()

        return module, "forward", forward

    return adapter


def _whole_noise(module: nn.Module) -> Adapter:
    """A module whose ``torch.randn`` calls of shape ``(..., rows, W)`` (its activation's own rows) draw the
    whole frame's noise instead: every rank draws it, so that its generator advances as one process's does,
    takes group rank 0's draw (the ranks' generators may differ) and keeps its own rows."""
    import torch
    import torch.distributed as dist
    from torch.overrides import TorchFunctionMode

    class WholeNoise(TorchFunctionMode):
        def __init__(self, run: _Run):
            super().__init__()
            self.run = run

        def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is not torch.randn or self.run.bypass:
                return func(*args, **kwargs)
            size = kwargs.pop("size", None) or (args[0] if len(args) == 1 and not isinstance(args[0], int) else args)
            size = tuple(size)
            scale = self.run.scale(size[-2])
            noise = func((*size[:-2], scale * self.run.split.height, size[-1]), **kwargs)
            dist.broadcast(noise, src=dist.get_global_rank(self.run.group, 0), group=self.run.group)
            start, stop = self.run.split.bounds(self.run.rank, scale)
            return noise[..., start:stop, :].contiguous()

    def adapter(run: _Run):
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            with WholeNoise(run):
                return original(*args, **kwargs)

        return module, "forward", forward

    return adapter


def _unchunked(conv: nn.Module) -> Adapter:
    from torch import nn

    base = next(cls for cls in type(conv).__mro__ if cls in (nn.Conv2d, nn.Conv3d))
    return lambda run: (conv, "forward", lambda x: base.forward(conv, x))


def _adapters(part: nn.Module, plan: VAEPlan) -> list[Adapter]:
    from torch import nn

    padded = plan.padded_inputs(part)
    adapters = [_whole_noise(module) for module in plan.noise(part)]
    whole = set(plan.whole_frame_of(part))
    for module in part.modules():
        names = {cls.__name__ for cls in type(module).__mro__}
        if names & set(plan.whole_frame) or module in whole:
            adapters.append(_whole_frame(module))
        elif isinstance(module, nn.GroupNorm):
            adapters.append(_group_norm(module))
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            adapters.append(_batch_norm(module))
        elif isinstance(module, (nn.Conv2d, nn.Conv3d)):
            top, bottom, _ = padded.get(module, (0, 0, ""))
            if module.kernel_size[-2] > 1 or module.stride[-2] > 1 or top or bottom:
                adapters.append(_conv(module, padded.get(module)))
            if names & set(plan.unchunked):
                adapters.append(_unchunked(module))
    return adapters


@contextlib.contextmanager
def _adapted(adapters: list[Adapter], run: _Run) -> Iterator[None]:
    installed = []
    try:
        for adapter in adapters:
            module, name, fn = adapter(run)
            if name in module.__dict__:
                raise RuntimeError(f"parallel VAE: {type(module).__name__}.{name} is already replaced on the instance")
            setattr(module, name, fn)
            installed.append((module, name))
        yield
    finally:
        for module, name in installed:
            delattr(module, name)


def _downsampling(part: nn.Module) -> int:
    """How many times finer the part's input rows are than its output rows (its strides in height)."""
    from torch import nn

    factor = 1
    for module in part.modules():
        if isinstance(module, (nn.Conv2d, nn.Conv3d)):
            factor *= module.stride[-2]
    return factor


def split_forward(part: nn.Module, plan: VAEPlan, group: dist.ProcessGroup, gather_to: int | None = None):
    """Replace ``part.forward`` (a VAE's ``decoder`` or ``encoder``, input ``(B, C, T, H, W)`` first) by a
    split one: each rank runs its rows, and the output is assembled on every rank (or only on the group
    rank ``gather_to``; the others get their own rows). An input too small to give every rank a row at the
    output's height runs whole on every rank (a part that draws noise: group rank 0's output). Returns the undo."""
    import torch
    import torch.distributed as dist

    if "forward" in part.__dict__:
        raise ValueError(f"the VAE's {type(part).__name__} is already split (or its forward replaced); undo that first")
    adapters = _adapters(part, plan)
    factor = _downsampling(part) * plan.downsampling(part)
    ranks = dist.get_world_size(group)
    original = part.forward
    noisy = bool(plan.noise(part))

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        rows = x.shape[-2]
        if rows % factor or rows // factor < ranks:
            if not noisy:
                return original(x, *args, **kwargs)
            check_inference(x)
            with torch.no_grad():
                out = original(x, *args, **kwargs)
            # each rank drew its own noise: take group rank 0's output, as a split call does
            first = (out[0] if isinstance(out, tuple) else out).contiguous()
            dist.broadcast(first, src=dist.get_global_rank(group, 0), group=group)
            return (first, *out[1:]) if isinstance(out, tuple) else first
        check_inference(x)
        run = _Run(RowSplit.even(rows // factor, ranks), group)
        start, stop = run.split.bounds(run.rank, factor)
        with torch.no_grad(), _adapted(adapters, run):
            out = original(x[..., start:stop, :].contiguous(), *args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        whole = gather_rows(first, run.split, run.scale(first.shape[-2]), group, gather_to)
        return (whole, *out[1:]) if isinstance(out, tuple) else whole

    part.forward = forward
    return lambda: part.__dict__.pop("forward", None)
