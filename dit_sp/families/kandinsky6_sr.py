"""Kandinsky 6 SR (``Kandinsky6SRTransformer3DModel``; ``Kandinsky6SRPipeline``: video super-resolution, no text).

Latents are channels-last, ``(B, T, H, W, C)``: the noisy latent, the anchor latent and the anchor mask in channels.
The model flattens the token grid in NABLA's fractal order (``8 x 8`` spatial neighbourhoods, 64 consecutive tokens
each: ``(T, H/8, W/8, 8, 8)``) and every block's self-attention is NABLA sparse attention: per head, the 64-token
blocks' mean queries and keys give a softmax map over key blocks, each query block keeps the key blocks that carry
the top ``nabla_threshold`` of that row's mass, OR a static sliding-tile prior (``sta_mask``), and flex attention
runs with that ``BlockMask``. Nothing mixes heads, so the mask of one head needs that head's whole sequence only.

Under Ulysses, each block's self-attention runs ``attend_whole_sequence`` (``dit_sp.families.nabla``, shared with
Kandinsky 5): the projections, RMS norms and rotary embedding on this rank's tokens (per token), then one all-to-all
gives this rank's head group the whole sequence, in the fractal order, where it builds exactly the one-process mask
of its heads (``nabla_block_mask``) and attends (flex attention, as the stock processor does), and the result
returns to the token shards. The sequence is split in that fractal order where the first block takes it, each
block's rotary table (``(S, 1, D/2, 2, 2)``) where its self-attention takes it; the tokens are gathered after the
last block (the model restores the grid there). The sequence is ``T * H * W`` tokens with ``H`` and ``W`` multiples
of 8, whole NABLA blocks of 64; a Ulysses degree that does not divide it pads the last shard (cut off before the
attention, as everywhere: checked by hand exact on 128 tokens over Ulysses 3); heads that ``ulysses`` does not
divide are padded (zeros, dropped). The processor replaced must be diffusers' own ``Kandinsky6SRAttnProcessor``, which
``SequenceParallelNablaProcessor`` restates: any other is refused in one line, not silently replaced.

A ring is refused at ``parallelize`` (``RING_REFUSAL``): a ring rank would hold one block of keys, and the mask's
per-row top mass needs the scores of every key block. CFG parallelism is refused too (``CFG_REFUSAL``): the pipeline
does not guide (one transformer call a step).

Its VAE (``Kandinsky6SRVAE``, the causal K-VAE) runs split by rows (``KANDINSKY6_SR_VAE``): the pipeline calls it on
one tile at a time (each tile encoded, then decoded right after its denoising, inside the loop over tiles), a call
every rank needs before the next transformer call, so each call is split rather than calls shared out. Its causal
convolutions pad rows with zeros before their ``conv`` (halos, ``VAEPlan.padded_inputs``; the temporal caches hold each
rank's own rows), the encoder's strided convolution and pixel-unshuffle pair rows inside each rank's even block, the
RMS norms are per pixel, and ``Kandinsky6SRSpatialNorm3D`` resizes the latent (``zq``, the decoder's own input rows)
by nearest neighbour to an activation exactly ``2^k`` times finer, which maps each rank's latent rows onto its own
activation rows: nothing is gathered. The decoded tiles are blended by the pipeline itself, so they assemble on every
rank (``frames_used``).

Step caches: each block takes the video as ``hidden_states`` and returns it alone (``block_outputs``). The pipeline
calls the transformer once a step outside any cache context, tile after tile (each chunk of tiles its own schedule):
every call is one context (``BranchCalls(prompt=None)``), and a call whose timestep is not below the previous call's
(the next chunk's first step) or of another shape first resets the state, so no tile reuses another's residual.
TeaCache's probe: the time embedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.families.family import BranchCalls, ModelFamily, generation_defaults
from dit_sp.families.head_group import replace_stock_processors
from dit_sp.families.nabla import NablaOps, SequenceParallelNablaProcessor
from dit_sp.vae import Padding, VAEPlan

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


RING_REFUSAL = (
    "Kandinsky 6 SR's NABLA sparse attention keeps, per head and query block, the key blocks with the top share of "
    "a softmax over every key block, so it splits exactly under Ulysses alone (each rank holds the whole sequence of "
    "its heads); a ring rank would hold one block of keys: use ring 1"
)
"""Why ``parallelize`` refuses a ring for Kandinsky 6 SR (one line)."""

CFG_REFUSAL = (
    "Kandinsky6SRPipeline does not guide (one transformer call a denoising step, no guidance scale), so there are no "
    "guidance branches to run on two process groups; use cfg=1"
)
"""Why ``parallelize`` refuses CFG parallelism for Kandinsky 6 SR (one line)."""


def _plan(model: torch.nn.Module) -> dict:
    cp_input, _ = context_parallel_types()
    plan: dict[str, Any] = {"visual_transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)}}
    for i in range(len(model.visual_transformer_blocks)):  # each takes the whole table (S, 1, D/2, 2, 2): split there
        plan[f"visual_transformer_blocks.{i}.self_attention"] = {"rotary_emb": cp_input(split_dim=0, expected_dims=5)}
    return plan


def _rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    from diffusers.models.transformers import transformer_kandinsky6_sr as k6sr

    return k6sr.apply_rotary(x, rope)


NABLA = NablaOps(module="diffusers.models.transformers.transformer_kandinsky6_sr", mask="nabla_block_mask",
                 heads_first=True, threshold="threshold", rotary=_rotary, ring_refusal=RING_REFUSAL)  # fmt: skip
"""The SR model's NABLA steps (``dit_sp.families.nabla``): its module's ``apply_rotary`` and ``nabla_block_mask``."""


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Each block's self-attention on ``SequenceParallelNablaProcessor`` (where each runs the stock processor, else
    refused); the tokens gathered after the last block (a hook rather than the plan, which cannot both split and
    gather at one module: a one-block model)."""
    from dit_sp.parallel.comm import gather_sequence

    def gather(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return gather_sequence(output, ctx.parallel, dim=1, seq_len=ctx.seq_len, grad=ctx.gather_grad)

    from diffusers.models.transformers.transformer_kandinsky6_sr import Kandinsky6SRAttnProcessor

    blocks = model.visual_transformer_blocks
    attentions = {f"visual_transformer_blocks.{i}.self_attention": b.self_attention for i, b in enumerate(blocks)}
    undo = replace_stock_processors("Kandinsky 6 SR", attentions, Kandinsky6SRAttnProcessor,
                                    lambda stock: SequenceParallelNablaProcessor(ctx, NABLA))  # fmt: skip
    return [blocks[-1].register_forward_hook(gather), undo]


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:  # Kandinsky6SRVAE: x2 per encoder level in space
    return vae.get("temporal_compression_ratio", 4), 2 ** (len(vae.get("encoder_block_out_channels", (0,) * 5)) - 1)


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``Kandinsky6SRCausalConv3d`` zero-pads ``height_pad`` rows above and below (``F.pad``, with the columns) before
    its ``conv``; the first segment's repeated first frame and the cached frames of the next carry those rows too."""
    return {module.conv: (module.height_pad, module.height_pad, "constant")
            for module in part.modules() if type(module).__name__ == "Kandinsky6SRCausalConv3d"}  # fmt: skip


KANDINSKY6_SR_VAE = VAEPlan(
    class_names=("Kandinsky6SRVAE",),
    padded_inputs=_vae_padded_inputs,
    # it cuts an input above 2e9 elements into frame chunks by its own size: split, every rank makes the same calls
    unchunked=("Kandinsky6SRSafeConv3d",),
)
"""How ``Kandinsky6SRVAE`` decodes and encodes with its rows split (``dit_sp.vae``); no tiled methods (the pipeline
tiles)."""

PIPELINE = "Kandinsky6SRPipeline"


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[Tensor, bool]:
    """TeaCache's probe: the time embedding the blocks modulate with (``temb``, ``(B, time_dim)``: whole on every
    rank)."""
    return block_argument(meta, "temb", args, kwargs), False


def tile_call(config: dict[str, Any], frames: int, height: int, width: int, spatial: int) -> dict[str, Any]:
    """What one call of ``Kandinsky6SRPipeline`` holds for a ``frames x height x width`` input video, at the pipeline's
    own defaults (``resolution_scale``, ``min_overlap``, ``tiles_batch_size``, read from its ``__call__``): its tile
    grid (``_tile_positions``, called) over the input (pre-upscaled 1.125x on the 2.25x route, to multiples of
    ``spatial``, the K-VAE's spatial factor), and the trained tile size (``config["tile_sizes"]``, the transformer's
    default where absent) closest to its aspect. An input smaller than a tile is refused in one line.

    Returns ``tiles`` (a denoising call's tiles: ``min(tiles_batch_size, grid)``), ``tile`` (one tile's
    ``(frames, rows, columns)`` pixels: the trained tile size, the video's frames), ``input`` and ``output`` (the
    ``(frames, rows, columns)`` of the input video as denoised and of the output canvas, ``tiling_scale`` x its size)
    and ``segment_frames``: the pixel frames the K-VAE decodes at once (its first causal segment, ``SEGMENT_FRAMES +
    1``)."""
    import inspect

    from diffusers import Kandinsky6SRPipeline, Kandinsky6SRTransformer3DModel
    from diffusers.models.autoencoders.autoencoder_kandinsky6_sr import SEGMENT_FRAMES

    from dit_sp._compat import kandinsky6_sr_tile_positions as _tile_positions

    call = inspect.signature(Kandinsky6SRPipeline.__call__).parameters
    scale, overlap, batch = (call[name].default for name in ("resolution_scale", "min_overlap", "tiles_batch_size"))
    tiling, snap = (2 if scale == 2.25 else int(scale)), spatial
    if scale == 2.25:  # the pipeline's bilinear pre-upscale
        height, width = round(height * 1.125 / snap) * snap, round(width * 1.125 / snap) * snap
    sizes = config.get("tile_sizes") or inspect.signature(Kandinsky6SRTransformer3DModel.__init__).parameters[
        "tile_sizes"].default  # fmt: skip
    base_height, base_width = min((tuple(s) for s in sizes), key=lambda hw: abs(hw[1] / hw[0] - width / height))
    if height < base_height // tiling or width < base_width // tiling:
        from dit_sp.errors import ConfigError

        raise ConfigError(
            f"Kandinsky 6 SR at resolution_scale {scale}: the input video must be at least "
            f"{base_height // tiling}x{base_width // tiling} pixels (one tile), got {height}x{width}"
        )
    grid = len(_tile_positions(height, base_height // tiling, overlap, snap))
    grid *= len(_tile_positions(width, base_width // tiling, overlap, snap))
    return {
        "tiles": min(batch, grid),
        "tile": (frames, base_height, base_width),
        "input": (frames, height, width),
        "output": (frames, height * tiling, width * tiling),
        "segment_frames": SEGMENT_FRAMES + 1,
    }


_ARCHITECTURES = {
    # Kandinsky 6.0 VSR (kandinskylab/Kandinsky-6.0-VSR-distilled2steps-5s-Diffusers): the SR DiT at diffusers' defaults
    # (1.41e9 parameters counted on meta; published: 1.4B), the K-VAE at its defaults (1.74e9 counted on meta); no text.
    # Planned per denoising call and per tile's decode (``tile_call``), not over the whole video.
    "kandinsky-6.0-vsr": {
        "transformers": {"transformer": ("Kandinsky6SRTransformer3DModel", {
            "patch_size": [1, 1, 1], "model_dim": 1792, "ff_dim": 7168, "num_visual_blocks": 32,
            "axes_dims": [16, 24, 24], "tile_sizes": [[512, 512], [512, 768], [768, 512]]})},
        "text_encoders": 0, "vae": 1.74e9, "compression": (4, 16), "text_tokens": 0, "joint": False,
        "tile_call": tile_call,
    },
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""


KANDINSKY6_SR = ModelFamily(
    name="kandinsky6_sr",
    class_names=("Kandinsky6SRTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=(),  # not SDPA, which the stock routing intercepts: the hooks install their own processor
    channels_last=True,
    block_outputs={"Kandinsky6SRTransformerBlock": (0, None)},  # each block returns the video alone
    # no guidance, one call a step outside any cache context; each tile's schedule starts again (its state reset)
    cache_branches=BranchCalls(prompt=None),
    teacache_probe=_teacache_probe,
    ring_refused=RING_REFUSAL,
    cfg_refused=CFG_REFUSAL,
    tiny_models=("tiny-kandinsky6-sr",),
    # the pipeline's own defaults: 4 steps (the distilled checkpoints: 2), no guidance, no text; the video's size and
    # length are the input's (the sizes here: the TI2VA stage's output, which the SR stage takes)
    checkpoint_defaults={PIPELINE: generation_defaults(121, 512, 768, 4, 1.0, 512) | {"fps": 24}},
    vae_factors={PIPELINE: _vae_factors},
    vae=KANDINSKY6_SR_VAE,
    architectures=_ARCHITECTURES,
    frames_used=(PIPELINE,),  # it blends its decoded tiles (Hann windows) on every rank
    policy_refused={
        "Kandinsky6SRPipeline": (
            "it is a super-resolution pass of a given low-resolution video (no text), which a GRPO prompt "
            "file (a prompt and at most one image) cannot supply, denoised and decoded tile by tile inside "
            "its loop, never one latent video"
        ),
    },
)
"""Kandinsky 6's super-resolution stage, a family of its own (its pipeline and VAE, ``Kandinsky6SRVAE``, are its
alone)."""
