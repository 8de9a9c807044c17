"""Attention processors that run a model's own (stock diffusers) processor with its attention made
sequence-parallel.

The stock processor keeps doing everything model-specific (projections, norms, RoPE, image branches,
joint text concatenation), so nothing of diffusers is restated here and it cannot drift. Only its call
to ``scaled_dot_product_attention`` is routed, through a ``TorchFunctionMode`` active during that one
processor call, to ``usp_attention``: the local tokens are this rank's video shard, plus the joint (text)
tokens the processor concatenated in front or behind.

Under ``torch.compile`` the routed call is one custom op, ``dit_sp::usp_attention``, opaque to the
compiler: a compiled block has no graph break inside attention, and its collectives run as they do eagerly
(the gathered-key attention below too).

Attention whose queries are whole on every rank while its keys and values are this rank's shard of the split
sequence (LTX-2's audio queries over the video, ``ModelFamily.gathered_key_modules``) gathers the keys and values
instead (``_attend_gathered_keys``).

A mask over the whole split sequence that is more than padding (SkyReels-V2's block-causal frames) goes to
``usp_attention`` whole: exact under Ulysses, where every rank attends over the whole sequence of its heads; a ring
refuses it.

An attention module whose tokens are several split sequences side by side (Motif-Video's decoder layers: a copy of
the video, then the encoder's video as the "joint" stream; ``ModelFamily.stream_modules``) attends them as
``usp_attention``'s ``streams``: each rank's shard of each, no joint tokens.

A processor call that routed no attention raises: its stock processor reached attention some other way
(a non-native diffusers attention backend, a custom kernel, a hand-written softmax), which would have
attended over this rank's shard of the sequence only.
"""

from __future__ import annotations

import copy
import functools
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dit_sp._compat import is_python_tensor_method, use_native_attention
from dit_sp.attention import usp_attention
from dit_sp.parallel.comm import gather_sequence
from dit_sp.sp.context import SequenceContext

Tensor = torch.Tensor


def _key_padding(mask: Tensor) -> tuple[Tensor, bool]:
    """The key mask ``(B, S)`` of a boolean padding mask, and whether padded tokens are padded as queries too.

    Two forms: keys only, ``(B, 1, 1, S)``; or keys and queries, ``(B, 1, S, S)`` = ``keep_q & keep_k``
    (HunyuanVideo-1.5), whose padded queries attend to nothing, so their outputs are zero."""
    if mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        return mask[:, 0, 0], False
    if mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == mask.shape[3]:
        keys = mask[:, 0].any(dim=1)
        if torch.equal(mask[:, 0], keys[:, :, None] & keys[:, None, :]):
            return keys, True
    raise NotImplementedError(
        f"sequence-parallel attention supports a boolean padding mask, (B, 1, 1, S) over keys or (B, 1, S, S) "
        f"over keys and queries, and, under Ulysses without joint tokens, any mask (B|1, H|1, S, S) over the whole "
        f"split sequence; got {tuple(mask.shape)} of {mask.dtype}"
    )


def _joint_valid(
    mask: Tensor | None, local_len: int, joint_len: int, ctx: SequenceContext
) -> tuple[tuple[int, ...] | None, bool]:
    """Real joint tokens per sample from a boolean padding mask over ``[video (local_len), joint]`` (or the
    reverse): the only kind of mask a DiT passes (padding of the prompt); and whether the padding is of
    queries too (``_key_padding``)."""
    if mask is None:
        return None, False
    cached = ctx._mask_cache.get(id(mask))
    if cached is not None and cached[0] is mask:
        return cached[1]
    keys, queries_too = _key_padding(mask)
    # a mask built before the split covers the whole video (HunyuanVideo Framepack), one built after, the shard
    video_len = ctx.seq_len if keys.shape[1] == ctx.seq_len + joint_len else local_len
    video, joint = (
        (keys[:, joint_len:], keys[:, :joint_len])
        if ctx.joint_position == "front"
        else (keys[:, :video_len], keys[:, video_len:])
    )
    valid = joint.sum(1)
    prefix = torch.arange(joint_len, device=mask.device) < valid.unsqueeze(1)
    if not bool(video.all()) or not torch.equal(prefix, joint):
        raise NotImplementedError("the attention mask must keep every video token and a prefix of the text tokens")
    result = (tuple(valid.tolist()), queries_too)
    ctx._mask_cache[id(mask)] = (mask, result)
    return result


def _whole_sequence_mask(mask: Tensor | None, ctx: SequenceContext, joint_len: int) -> Tensor | None:
    """``mask`` if it is a mask over the whole split sequence, ``(B|1, H|1, S, S)``, that is more than padding
    (SkyReels-V2's block-causal frames): ``usp_attention`` takes it under Ulysses; ``None`` otherwise."""
    if mask is None or joint_len or mask.dim() != 4 or tuple(mask.shape[2:]) != (ctx.seq_len, ctx.seq_len):
        return None
    key = ("whole", id(mask))
    cached = ctx._mask_cache.get(key)
    if cached is None or cached[0] is not mask:
        try:
            _key_padding(mask)
            cached = (mask, False)
        except NotImplementedError:
            cached = (mask, True)
        ctx._mask_cache[key] = cached
    return mask if cached[1] else None


def _attend(ctx: SequenceContext, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
            scale: float | None, streams: int = 1) -> Tensor:  # fmt: skip
    """USP attention of this rank's queries, ``(B, H, S, D)`` in and out, as ``scaled_dot_product_attention``
    (``streams > 1``: ``S`` is that many shards of split sequences side by side)."""
    local_len = ctx.local_len
    if streams > 1:
        if attn_mask is not None or key.shape[2] != query.shape[2] or query.shape[2] != streams * local_len:
            raise RuntimeError(
                f"attention over {query.shape[2]} queries and {key.shape[2]} keys (mask: {attn_mask is not None}) is "
                f"not {streams} streams of this rank's {local_len} tokens without a mask, as this module's are"
            )
        out = usp_attention(*(x.transpose(1, 2) for x in (query, key, value)), ctx.parallel, seq_len=ctx.seq_len,
                            scale=scale, kernel=ctx.kernel, streams=streams)  # fmt: skip
        return out.transpose(1, 2)
    joint_len = query.shape[2] - local_len
    if joint_len < 0 or key.shape[2] != query.shape[2]:
        raise RuntimeError(
            f"attention over {query.shape[2]} queries and {key.shape[2]} keys does not fit this rank's "
            f"{local_len} video tokens; is this module's sequence really split?"
        )
    whole_mask = _whole_sequence_mask(attn_mask, ctx, joint_len)
    joint_valid, queries_too = _joint_valid(None if whole_mask is not None else attn_mask, local_len, joint_len, ctx)
    out = usp_attention(
        *(x.transpose(1, 2) for x in (query, key, value)),
        ctx.parallel,
        seq_len=ctx.seq_len,
        joint_len=joint_len,
        joint_position=ctx.joint_position,
        joint_valid=joint_valid,
        scale=scale,
        kernel=ctx.kernel,
        mask=whole_mask,
    )
    if queries_too:  # padded joint queries attend to nothing: zero, as torch gives for an empty mask row
        real = torch.arange(joint_len, device=out.device) < torch.tensor(joint_valid, device=out.device)[:, None]
        video = torch.ones(len(joint_valid), local_len, dtype=torch.bool, device=out.device)
        keep = torch.cat([real, video] if ctx.joint_position == "front" else [video, real], dim=1)
        out = out * keep[:, :, None, None].to(out.dtype)
    return out.transpose(1, 2)


def _attend_gathered_keys(ctx: SequenceContext, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                          scale: float | None) -> Tensor:  # fmt: skip
    """Whole queries ``(B, H, Lq, D)`` (the same on every rank) over this rank's shard of the split keys and values
    ``(B, H, S_local, D)``: the shards are gathered (padding dropped) and attended as in one process. The gather's
    backward is the output gather's (``ctx.gather_grad``), so the key and value gradients of every rank's copy of
    the queries reach the shard that holds them."""
    if attn_mask is not None:
        raise NotImplementedError("attention over gathered keys takes no mask: its keys are the split video tokens")
    key, value = (gather_sequence(x.contiguous(), ctx.parallel, dim=2, seq_len=ctx.seq_len, grad=ctx.gather_grad)
                  for x in (key, value))  # fmt: skip
    return F.scaled_dot_product_attention(query, key, value, scale=scale)


_CONTEXTS: weakref.WeakValueDictionary[int, SequenceContext] = weakref.WeakValueDictionary()
"""The compiled op's handle to its model's context (a custom op takes no Python objects): ``id(ctx)``,
registered by ``sequence_parallel_processor``; an entry goes when its model does."""


@torch.library.custom_op("dit_sp::usp_attention", mutates_args=())
def _usp_attention_op(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, context: int,
                      scale: float | None, streams: int = 1, gather_keys: bool = False) -> Tensor:  # fmt: skip
    ctx = _CONTEXTS[context]
    if gather_keys:  # whole queries: the output is the queries' shape, as for the split ones
        return _attend_gathered_keys(ctx, query, key, value, attn_mask, scale).contiguous()
    return _attend(ctx, query, key, value, attn_mask, scale, streams).contiguous()  # the fake's layout


@_usp_attention_op.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, context: int, scale: float | None,
      streams: int = 1, gather_keys: bool = False):  # fmt: skip
    return torch.empty_like(query, memory_format=torch.contiguous_format)


class RouteAttention(TorchFunctionMode):
    """Sends ``F.scaled_dot_product_attention`` calls to ``usp_attention`` (counting them in ``routed``);
    all else runs unchanged."""

    def __init__(self, ctx: SequenceContext, gather_keys: bool = False, streams: int = 1):
        super().__init__()
        self.ctx = ctx
        self.gather_keys = gather_keys
        self.streams = streams
        self.routed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            if torch.compiler.is_compiling() and is_python_tensor_method(func):
                # Tensor methods written in Python (unflatten, ...) end in super(), which dynamo cannot follow
                # under a mode; the torch function of the same name is what that call reaches
                same = getattr(torch, func.__name__, None)
                if same is not None:
                    return same(*args, **kwargs)
            return func(*args, **kwargs)
        self.routed += 1
        return self.attention(*args, **kwargs)

    def attention(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """``(B, H, S, D)`` in and out, as ``scaled_dot_product_attention``."""
        if is_causal or dropout_p or enable_gqa:
            raise NotImplementedError("sequence-parallel attention is non-causal, without dropout or GQA")
        if not torch.compiler.is_compiling():
            if self.gather_keys:
                return _attend_gathered_keys(self.ctx, query, key, value, attn_mask, scale)
            return _attend(self.ctx, query, key, value, attn_mask, scale, self.streams)
        if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
            raise NotImplementedError(
                "compiled sequence-parallel attention is for inference (no autograd through the compiled op): "
                "sample under torch.no_grad(), or train without compile"
            )
        return torch.ops.dit_sp.usp_attention(query, key, value, attn_mask, id(self.ctx), scale, self.streams,
                                              self.gather_keys)  # fmt: skip


@functools.cache
def _sequence_parallel_class(stock: type) -> type:
    """A subclass of the stock processor class whose call routes attention (same signature, so the
    attention module passes it the same arguments)."""

    class SequenceParallelProcessor(stock):
        @functools.wraps(stock.__call__)
        def __call__(self, attn, *args, **kwargs):
            route = RouteAttention(self._dit_sp_context, self._dit_sp_gather_keys, self._dit_sp_streams)
            with route:
                out = super().__call__(attn, *args, **kwargs)
            if not route.routed:
                raise RuntimeError(
                    f"{stock.__name__} of the {type(attn).__name__} module {self._dit_sp_name!r} computed its "
                    "attention without torch's scaled_dot_product_attention, so dit-sp could not make it "
                    "sequence-parallel: it attended over this rank's shard of the sequence only. Run the "
                    "parallelized modules with diffusers' native attention backend (no set_attention_backend, "
                    "attention_backend() context or DIFFUSERS_ATTN_BACKEND for them), or give them a processor "
                    "that calls torch.nn.functional.scaled_dot_product_attention."
                )
            return out

    SequenceParallelProcessor.__name__ = SequenceParallelProcessor.__qualname__ = f"SequenceParallel{stock.__name__}"
    return SequenceParallelProcessor


def sequence_parallel_processor(
    stock: object, ctx: SequenceContext, name: str = "", gather_keys: bool = False, streams: int = 1
) -> object:
    """A copy of ``stock`` (left untouched) that computes its attention with USP (``gather_keys``: whole queries
    over the gathered split keys, ``_attend_gathered_keys``; ``streams > 1``: its tokens are that many split
    sequences side by side); ``name`` (the attention module's) is for error messages."""
    processor = copy.copy(stock)
    processor.__class__ = _sequence_parallel_class(type(stock))
    processor._dit_sp_context = ctx
    _CONTEXTS[id(ctx)] = ctx
    processor._dit_sp_name = name
    processor._dit_sp_gather_keys = gather_keys
    processor._dit_sp_streams = streams
    use_native_attention(processor)  # the stock call must reach torch SDPA
    return processor
