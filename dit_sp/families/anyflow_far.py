"""AnyFlow FAR (``AnyFlowFARTransformer3DModel``; ``AnyFlowFARPipeline``): AnyFlow's flow-map transformer made
chunk-wise autoregressive. Its self-attention (``attn1``) attends causally over frame chunks through a flex-attention
``BlockMask`` over the whole (128-padded) sequence of compressed context frames and full frames, and in the pipeline
through a per-layer KV cache: a prefill call (``kv_cache_flag["is_cache_step"]``, under the mask) writes the finished
chunks' keys and values, and each denoising call of the next chunk attends, unmasked, to the cached keys and its own.

Split under Ulysses alone, exactly: the tokens (and every block's per-token modulation ``temb`` ``(B, S, 6, C)``) are
split at the blocks and gathered after ``norm_out`` (its final shift and scale are per token). ``attn1`` gets
``FARProcessor``: it projects and normalises its shard of q, k, v (as the stock processor does) and
hands them to ``attend_whole_sequence``; after the all-to-all a rank holds the whole sequence of its head group, where
the stock processor's per-head part (the cache's write or read, the rotary tables over cached and new keys, the
128-padding, the block mask) runs as it is. So the cache holds this rank's head group (and, under CFG parallelism, its
guidance half): the pipeline allocates every head of every layer (``(2, B, H, T, D)``), and the processor replaces
each layer's tensors with its own ``(2, B_local, H_pad/U, T, D)`` part at their first use, which frees the whole ones
(the peak, before the first call, still holds every layer's whole cache: the stock pipeline allocates it).
A ring, which holds one block of keys at a time, cannot apply the mask or the cache: refused. Cross-attention to text
(``attn2``) stays local. Its VAE is Wan's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, Undo, generation_defaults
from dit_sp.families.head_group import HeadGroupAttention
from dit_sp.families.wan import wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch

    from dit_sp.parallel.state import ParallelState

RING_REFUSAL = (
    "AnyFlow FAR (AnyFlowFARTransformer3DModel) attends causally over frame chunks with a block mask and a KV cache, "
    "which only Ulysses splits exactly (every rank attends over the whole sequence of its heads), not a ring; use "
    "ring 1 and Ulysses for the sequence parallelism"
)
_CACHES = ("full_cache", "compressed_cache")


def own_cache(kv_cache: dict[str, torch.Tensor], parallel: ParallelState, heads: int, batch: int) -> dict:
    """This rank's part of one layer's KV cache, ``(2, batch, H_pad/U, T, D)`` per tensor: its Ulysses head group
    (zero-padded behind the real heads, as ``attend_whole_sequence`` pads them) and, when the pipeline's guidance batch
    was halved over the CFG group, its half. A tensor laid out otherwise (the pipeline's whole ``(2, B, H, T, D)``) is
    replaced in ``kv_cache`` by that part (copied), so the pipeline's next calls pass this rank's."""
    from dit_sp.attention import head_group
    from dit_sp.attention.ulysses import padded_heads

    width, real = padded_heads(heads, parallel) // parallel.ulysses, head_group(heads, parallel)
    for name in _CACHES:
        whole = kv_cache[name]
        if tuple(whole.shape[1:3]) == (batch, width):
            continue
        rows = slice(None)
        if whole.shape[1] == batch * parallel.cfg:  # batched guidance: cfg rank r runs half r of the batch
            rows = slice(parallel.cfg_rank * batch, (parallel.cfg_rank + 1) * batch)
        elif whole.shape[1] != batch or whole.shape[2] != heads:
            raise ValueError(
                f"AnyFlow FAR's {name} is laid out {tuple(whole.shape)}, not (2, batch {batch}, heads {heads}, tokens, "
                "head dim) as its pipeline allocates it"
            )
        own = whole.new_zeros(whole.shape[0], batch, width, *whole.shape[3:])
        own[:, :, : real.stop - real.start] = whole[:, rows, real]
        kv_cache[name] = own
    return kv_cache


class FARProcessor:
    """``attn1`` of a sequence-parallel AnyFlow FAR block: q, k, v of this rank's tokens, the stock causal processor's
    per-head part over the whole sequence of this rank's head group (``attend_whole_sequence``), the output projection
    on this rank's tokens. Shards ``(B, S_local, H, D)``; the cache per layer ``own_cache``'s."""

    def __init__(self, stock: Any, ctx: Any):
        self.stock, self.ctx = stock, ctx

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: Any = None,
        rotary_emb: dict[str, torch.Tensor] | None = None,
        kv_cache: dict[str, torch.Tensor] | None = None,
        kv_cache_flag: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        from dit_sp.attention import attend_whole_sequence

        if encoder_hidden_states is not None:
            raise ValueError("AnyFlow FAR's sequence-parallel self-attention takes no encoder_hidden_states")
        dtype, parallel = hidden_states.dtype, self.ctx.parallel
        # the stock processor's projections and norms (the norms upcast to fp32: cast back), per token
        q = attn.norm_q(attn.to_q(hidden_states)).to(dtype).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).to(dtype).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if kv_cache is not None:
            kv_cache = own_cache(kv_cache, parallel, attn.heads, q.shape[0])

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # (B, S, H_pad/U, D) each
            out = self.stock(HeadGroupAttention(q, k, v), q.flatten(2), attention_mask=attention_mask,
                             rotary_emb=rotary_emb, kv_cache=kv_cache, kv_cache_flag=kv_cache_flag)  # fmt: skip
            return out.unflatten(2, (q.shape[2], -1))

        out = attend_whole_sequence(attend, [q, k, v], parallel, self.ctx.seq_len).flatten(2).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


@functools.cache
def _processor_class() -> type:
    """``FARProcessor`` run eagerly in compiled blocks (a graph break around attention: its collectives and the flex
    call stay out of the graph); named ``SequenceParallel...`` as every processor ``parallelize`` installs."""
    import torch

    class SequenceParallelFARProcessor(FARProcessor):
        @torch.compiler.disable
        def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return super().__call__(*args, **kwargs)

    return SequenceParallelFARProcessor


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Every block's ``attn1`` gets a ``SequenceParallelFARProcessor`` around its stock processor."""
    stock = [block.attn1.processor for block in model.blocks]
    for block, processor in zip(model.blocks, stock):
        block.attn1.processor = _processor_class()(processor, ctx)

    def undo() -> None:
        for block, processor in zip(model.blocks, stock):
            block.attn1.processor = processor

    return [Undo(undo)]


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    temb = {"temb": cp_input(split_dim=1, expected_dims=4)}  # (B, S, 6, C); the rotary tables stay whole
    plan: dict = {f"blocks.{i}": temb for i in range(len(model.blocks))}
    plan["blocks.0"] = temb | {"hidden_states": cp_input(split_dim=1, expected_dims=3)}
    plan["norm_out"] = cp_output(gather_dim=1, expected_dims=3)  # the final shift/scale is per token
    return plan


def _shape_check(config: Any, settings: dict[str, Any], name: Any, vae: tuple[int, int]) -> None:
    """The pipeline denoises the frame chunks of ``chunk_partition`` (the transformer's config: ``generate`` passes
    none), which must add up to the video's latent frames."""
    from dit_sp.errors import ConfigError

    if "chunk_partition" not in config or "compressed_patch_size" not in config:  # another family's transformer
        return
    chunks, frames = list(config["chunk_partition"]), (settings["frames"] - 1) // vae[0] + 1
    if sum(chunks) != frames:
        raise ConfigError(f"{name('frames')} {settings['frames']}: AnyFlow FAR denoises the chunks of its "
                          f"chunk_partition {chunks}, {sum(chunks)} latent frames, not {frames}; use "
                          f"{name('frames')} {(sum(chunks) - 1) * vae[0] + 1}")  # fmt: skip


def video_lengths(config: dict[str, Any], temporal: int) -> tuple[tuple[int, ...], str]:
    """The ``--video`` lengths ``AnyFlowFARPipeline`` takes (its ``video``: ``(B, T, 3, H, W)`` in [0, 1]), from the
    transformer's ``config``: a video's latent frames (``(T - 1) / temporal + 1``, ``T = temporal * n + 1``) are kept
    as the first chunks of ``chunk_partition`` (chunks it covers are not denoised, so it must fill each whole: the
    rest of one would stay zero), and at least the last chunk is made; with why."""
    chunks = list(config["chunk_partition"])
    lengths = tuple((sum(chunks[:k]) - 1) * temporal + 1 for k in range(1, len(chunks)))
    return lengths, (f"it keeps the video's latent frames as whole chunks of its chunk_partition {chunks} and makes "
                     "the rest, at least the last")  # fmt: skip


def kv_cache(config: dict[str, Any], latent_frames: int, height: int, width: int, guidance: bool,
             ulysses: int) -> tuple[str, int]:  # fmt: skip
    """The KV cache ``AnyFlowFARPipeline`` allocates before its first transformer call, in elements (of the
    transformer's dtype), from the transformer's ``config`` and the latents' ``height`` x ``width``: per layer a
    ``full_cache`` and a ``compressed_cache``, each ``(2, B, H, T, D)`` with ``B`` the batch doubled under guidance,
    ``T`` ``full_chunk_limit`` (or the chunks past it, plus one) times the longest chunk of ``chunk_partition`` times
    a full (or compressed) frame's tokens. Whole on every rank, whatever ``ulysses``: the stock pipeline allocates
    every head (the split processor replaces a layer's tensors with its head group's at their first use)."""
    chunks, limit = list(config["chunk_partition"]), config["full_chunk_limit"]
    full, compressed = (
        height // p[1] * (width // p[2]) for p in (config["patch_size"], config["compressed_patch_size"])
    )
    tokens = limit * max(chunks) * full + (len(chunks) - limit + 1) * max(chunks) * compressed
    per_layer = 2 * (2 if guidance else 1) * config["num_attention_heads"] * tokens * config["attention_head_dim"]
    return "KV cache, whole on every rank", config["num_layers"] * per_layer


# nvidia/AnyFlow-FAR-Wan2.1-1.3B-Diffusers: Wan 2.1 1.3B's shape, a compressed patch embedding; its chunks and cache
# sizes are diffusers' defaults (the chunk partition "matched to the released 81-frame checkpoints")
_FAR_1_3B = {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30, "chunk_partition": [1, 3, 3, 3, 3, 3, 3, 2],
             "full_chunk_limit": 3, "compressed_patch_size": [1, 4, 4]}  # fmt: skip

ANYFLOW_FAR = ModelFamily(
    name="anyflow_far",
    step_cache_refused=(
        "its blocks read and fill per-block KV caches of the frames already made (kv_cache, kv_cache_flag), "
        "which a skipped block would leave unfilled for the next chunk"
    ),
    class_names=("AnyFlowFARTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=(),  # SequenceParallelFARProcessor (_hooks) runs attn1 over the whole sequence of its heads
    shape_check=_shape_check,
    ring_refused=RING_REFUSAL,
    cfg_mode="batched",  # one call on [unconditional, conditional]
    cfg_batched_args=("hidden_states", "timestep", "r_timestep", "encoder_hidden_states"),
    video_tensor={"AnyFlowFARPipeline": video_lengths},  # --video: (1, T, 3, H, W) in [0, 1] of whole chunks
    compile_note=(
        "its FAR attention runs eagerly (dit-sp wraps its SequenceParallelFARProcessor in "
        "torch.compiler.disable: the block-mask flex call, KV cache and collectives stay out of the graph)"
    ),
    tiny_models=("tiny-anyflow-far",),
    checkpoint_defaults={"AnyFlowFARPipeline": generation_defaults(81, 480, 832, 4, 1.0, 512) | {"fps": 16}},
    vae_factors={"AnyFlowFARPipeline": wan_vae_factors},
    architectures={
        "anyflow-far-wan2.1-1.3b": wan_architecture({"transformer": _FAR_1_3B}, "AnyFlowFARTransformer3DModel")
        | {"kv_cache": kv_cache}
    },
    policy_refused={
        "AnyFlowFARPipeline": (
            "it generates the video chunk by chunk, causally, each chunk sampled by AnyFlow's flow map while "
            "attending to the cached keys and values of the finished chunks, so the video is never one latent"
            " at one noise level (and each step is a flow-map step, as AnyFlowPipeline's)"
        ),
    },
)
