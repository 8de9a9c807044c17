"""MiniMax-H3 (``MiniMaxH3Transformer3DModel``; Modular Diffusers only: ``MiniMaxH3ModularPipeline``).

One packed sequence per request: text, video and audio rows side by side, each row with its own ``(t, h, w)`` rotary
coordinates and its own ``(timestep, modality)`` modulation, under full non-causal self-attention (``attn``, through
USP) with no mask and no cross-attention; the text refiner before the blocks attends over text only (local). The
plan is the ``_cp_plan`` diffusers ships: the rotary tables, the packed rows at the first block, the per-row
modulation indices at every block and at the output norm, gathered at both output heads (the video and audio rows
are selected from the whole sequence after). Its length needs no divisibility here: an uneven tail is padded and
masked.

VAE: ``AutoencoderKLMiniMaxH3`` decodes in temporal clips (``_decode``: one decoder call per clip, the clips
cross-faded) and, tiled (its default), each clip in overlapping spatial tiles (one decoder call a tile, stitched per
clip); it encodes the same way (``_encode``). Its decoder is a ViT whose attention spans the whole clip (or tile), so
it is not split by rows (``parts=()``): every call is independent (no cache), and its plan (``MINIMAX_H3_VAE``) shares
the calls of the tiles and clips out over a sample's processes (``dit_sp.vae.tiles``, call ``t`` on rank ``t % N``),
the record pass running to the end on placeholders (``runs_through``: the method blends between calls). Untiled, a
video of one clip (7 latent frames or fewer) is one decoder call, attending over the whole clip: one rank runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, model_cp_plan
from dit_sp.families.family import BranchCalls, ModelFamily
from dit_sp.vae import TileProtocol, VAEPlan

_ARCHITECTURES = {
    # MiniMax-H3's t2va/fl2va partition (transformer/): diffusers' defaults, the conversion script's config: 3.31e10
    # parameters counted on meta (61.7 GiB in bfloat16, as published). Its Qwen3-VL conditioner: 62.1 GiB in
    # bfloat16 (3.33e10); the video VAE (a 36-layer ViT decoder: 2.60e9) and the audio VAE (1.5e8). VAE x16 in space;
    # in time 17 n + 5 frames -> 5 n + 2 latent frames. Beside the video rows the one packed sequence holds the
    # prompt's text rows and the stereo audio rows (40 a second per channel): 256 + 2 x 600 at the longest, 15 s.
    "minimax-h3": {"transformers": {"transformer": ("MiniMaxH3Transformer3DModel", {
        "num_attention_heads": 56, "attention_head_dim": 128, "hidden_size": 5376, "num_layers": 50,
        "num_refiner_layers": 2, "ffn_dim": 14336, "in_channels": 24, "audio_in_channels": 32, "patch_size": [1, 2, 2],
        "text_dim": 5120, "freq_dim": 256, "time_embed_hidden_dim": 5376, "time_embed_dim": 2688,
        "rope_freq_dim": 16})},
        "text_encoders": 33.3e9, "vae": 2.75e9, "compression": (4, 16, 17, 5), "text_tokens": 256 + 2 * 600,
        "joint": True,
        # its decoder's calls, shared out whole: a clip of 7 latent frames (28 pixel frames), tiled (its default) in
        # 256 x 256 pixel tiles
        "vae_call": (28, 256, 256)},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""

MINIMAX_H3_VAE = VAEPlan(
    class_names=("AutoencoderKLMiniMaxH3",),
    parts=(),  # a ViT decoder over the whole clip: its calls (tiles, clips) are shared out, not its rows
    tiles=TileProtocol(starts_tile=lambda kwargs: True, answer=lambda kwargs, out: out,  # no cache: a call a tile
                       methods=(("decoder", "_decode"), ("encoder", "_encode")), runs_through=True),
)  # fmt: skip

if TYPE_CHECKING:
    import torch


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """TeaCache's probe: the time embedding of the sequence's distinct timesteps the blocks modulate with (``temb``,
    ``(T, time_embed_dim)``: whole on every rank)."""
    return block_argument(meta, "temb", args, kwargs), False


def _references(arguments: dict[str, Any]) -> dict[str, Any]:
    """``generate``'s reference image (``--image``, a PIL image under the blocks' name ``references``) as the list of
    one ``MiniMaxH3ImageReference`` that the ``ref2va`` blocks take; the arguments as they are without one."""
    if arguments.get("references") is None:
        return arguments
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    return arguments | {"references": [MiniMaxH3ImageReference(image=arguments["references"])]}


MINIMAX_H3 = ModelFamily(
    name="minimax_h3",
    block_outputs={"MiniMaxH3TransformerBlock": (0, None)},  # each block returns the packed rows alone
    # guidance-distilled: one call a step outside any cache context, and a run resets no state (a modular pipeline);
    # its timesteps rise (flow time, 0 noise to 1 data), so a new run's first call is told by timesteps that fell
    cache_branches=BranchCalls(prompt=None, rising=True),
    teacache_probe=_teacache_probe,
    class_names=("MiniMaxH3Transformer3DModel",),
    modular_pipelines=("MiniMaxH3ModularPipeline",),
    modular_fixed={
        "MiniMaxH3ModularPipeline": {
            "guidance": "it is guidance-distilled: one transformer call a step, no guider",
            "max_sequence_length": "its blocks take no text length",
        }
    },
    modular_workflow="t2va",  # generate runs text to video and audio: a repository's transformer_ref is not loaded
    # ... with --last-image, first and last frame to video and audio (--image: the first frame), on transformer; and
    # with --image alone (a reference image: its `references`), reference to video and audio on transformer_ref;
    # --workflow names one (fl2va from a first frame alone)
    modular_inputs={"image": "references"},
    modular_workflows={"last_image": "fl2va", "image": "ref2va"},
    workflow_inputs={"t2va": {}, "fl2va": {"image": "image", "last_image": "last_image"}},
    modular_arguments=_references,
    # a repository's settings (configs/minimax-h3.yaml): 124 frames (5 s at 24 fps) of its 768 x 1344 canvas
    checkpoint_defaults={
        "MiniMaxH3ModularPipeline": {
            "frames": 124,
            "height": 768,
            "width": 1344,
            "steps": 50,
            "guidance": 1.0,
            "fps": 24,
        }
    },
    tiny_models=("tiny-minimax-h3",),
    architectures=_ARCHITECTURES,
    plan=model_cp_plan,
    attention_modules=("transformer_blocks.*.attn",),
    vae=MINIMAX_H3_VAE,
    cfg_refused=(
        "MiniMax-H3 is guidance-distilled: its modular denoise step makes one transformer call a step (no guider, "
        "no unconditional branch), so there is no guidance pair to split; use cfg=1"
    ),
    policy_refused={
        "MiniMaxH3ModularPipeline": (
            "it denoises video and audio rows jointly in one packed sequence under full attention, each down "
            "its own schedule (shift 12 for video, 3 for audio), so the video's velocity depends on audio at "
            "another noise level: a video-only single-velocity policy is not its sampler"
        ),
    },
)
