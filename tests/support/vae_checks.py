"""Workers of the parallel VAE tests: tiny VAEs of every family decode and encode on one process and split
over the group, with and without tiling; the results and the work each rank actually did are returned."""

from __future__ import annotations

import os

import diffusers
import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    AutoencoderKLWan,
)

from dit_sp import ParallelConfig, init_parallel, parallelize_vae

VAES = {
    "wan2.1": lambda: AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                       attn_scales=[], temperal_downsample=[False, True, True]),
    # Wan 2.2 TI2V's VAE: residual blocks, patchify 2, x16 in space
    "wan2.2": lambda: AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, is_residual=True,
                                       in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
                                       temperal_downsample=[False, True, True]),
    "hunyuan_video": lambda: AutoencoderKLHunyuanVideo(latent_channels=4, block_out_channels=(8, 8, 16, 16),
                                                       layers_per_block=1, norm_num_groups=4),
    "cogvideox": lambda: AutoencoderKLCogVideoX(block_out_channels=(8, 8, 16, 16), latent_channels=4,
                                                layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4),
    # its norms have 32 groups (fixed): 32 channels; x4 in time (the cases' pixel frames) and space, attention over
    # time in the encoder
    "mochi": lambda: diffusers.AutoencoderKLMochi(latent_channels=4, encoder_block_out_channels=(32, 32, 32),
                                                  decoder_block_out_channels=(32, 32, 32),
                                                  layers_per_block=(1, 1, 1, 1), temporal_expansions=(2, 2),
                                                  spatial_expansions=(2, 2),
                                                  add_attention_block=(False, True, True, True)),
    # EasyAnimate's: per-frame group norms (the real config's); frame by frame, with causal caches on the modules
    "magvit": lambda: diffusers.AutoencoderKLMagvit(block_out_channels=(8, 8, 8, 8), latent_channels=4,
                                                    layers_per_block=1, norm_num_groups=2),
    # LTX-Video 0.9.1's kind: timestep-conditioned decoder that injects noise, residual pixel-shuffle upsampling,
    # strided-convolution encoder; patchify 2
    "ltx0.9.1": lambda: AutoencoderKLLTXVideo(latent_channels=4, block_out_channels=(8, 8, 8, 8),
                                              decoder_block_out_channels=(8, 16), layers_per_block=(1, 1, 1, 1, 1),
                                              decoder_layers_per_block=(1, 1, 1),
                                              spatio_temporal_scaling=(True, True, False, False),
                                              decoder_spatio_temporal_scaling=(True, True),
                                              decoder_inject_noise=(True, True, True), upsample_residual=(True, True),
                                              upsample_factor=(2, 2), timestep_conditioning=True, patch_size=2),
    # LTX-Video 0.9.5's kind: space-to-depth encoder (spatial, temporal, spatio-temporal), no timestep
    "ltx0.9.5": lambda: AutoencoderKLLTXVideo(latent_channels=4, block_out_channels=(8, 8, 16, 16),
                                              down_block_types=("LTXVideo095DownBlock3D",) * 3,
                                              downsample_type=("spatial", "temporal", "spatiotemporal"),
                                              spatio_temporal_scaling=(True, True, True),
                                              layers_per_block=(1, 1, 1, 1), decoder_block_out_channels=(8, 8, 16),
                                              decoder_layers_per_block=(1, 1, 1, 1),
                                              decoder_spatio_temporal_scaling=(True, True, False),
                                              decoder_inject_noise=(False,) * 4, upsample_residual=(False,) * 3,
                                              upsample_factor=(1,) * 3, patch_size=2, spatial_compression_ratio=8,
                                              temporal_compression_ratio=4),
    # LTX-2's: a decoder that pads by reflection, timestep-conditioned; space-to-depth and strided encoder
    "ltx2": lambda: AutoencoderKLLTX2Video(latent_channels=4, block_out_channels=(8, 16, 16),
                                           down_block_types=("LTX2VideoDownBlock3D",) * 3, layers_per_block=(1,) * 4,
                                           spatio_temporal_scaling=(True, True, True),
                                           downsample_type=("spatial", "temporal", "conv"),
                                           decoder_block_out_channels=(8, 16, 16), decoder_layers_per_block=(1,) * 4,
                                           decoder_spatio_temporal_scaling=(True, True, False),
                                           upsample_type=("spatiotemporal",) * 3, upsample_residual=(True, True, False),
                                           upsample_factor=(2, 2, 1), timestep_conditioning=True,
                                           decoder_inject_noise=(False,) * 4, patch_size=2, spatial_compression_ratio=8,
                                           temporal_compression_ratio=4),
    # HunyuanVideo-1.5's: x8 in space (a spatial-only and two spatio-temporal depth-to-space steps), RMS norms,
    # frame-causal attention over all frames in the mid-blocks
    "hunyuan_video15": lambda: diffusers.AutoencoderKLHunyuanVideo15(latent_channels=4,
                                                                     block_out_channels=(8, 8, 16, 16),
                                                                     layers_per_block=1, spatial_compression_ratio=8,
                                                                     temporal_compression_ratio=4),
    # Cosmos 1's wavelet VAE: Haar patches of 2, then x4 in space (two strided downsamplers and two upsamplers) and x2
    # in time; attention over the frame and over time in the mid-blocks and in a block at each end
    "cosmos": lambda: diffusers.AutoencoderKLCosmos(latent_channels=4, encoder_block_out_channels=(8, 8, 8, 8),
                                                    decode_block_out_channels=(8, 8, 8, 8), attention_resolutions=(16,),
                                                    resolution=64, num_layers=1, patch_size=2,
                                                    spatial_compression_ratio=8, temporal_compression_ratio=4),
    # decodes and encodes only in tiles, blended in space and time (the tiles are set in _run)
    "allegro": lambda: diffusers.AutoencoderKLAllegro(block_out_channels=(8, 8, 8, 8), latent_channels=4,
                                                      layers_per_block=1, norm_num_groups=2),
    # the 2D image VAE (Latte's, Kandinsky 5's image pipelines'): x8, attention over the frame in the mid-blocks; tiles
    # of 4 latent rows (sample_size 32), overlapping by one
    "kl": lambda: diffusers.AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4,
                                          up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 16, 16),
                                          norm_num_groups=4, sample_size=32),
    # the deep-compression AE (Sana-Video's pipelines accept it), here x8: pixel-unshuffle and strided-convolution
    # downsamplers, pixel-shuffle and nearest upsamplers (two tiny variants), multiscale linear attention in the lower
    # levels, RMS and batch norms
    "dc": lambda: diffusers.AutoencoderDC(latent_channels=4, attention_head_dim=4,
                                          encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock",
                                                               "EfficientViTBlock"),
                                          decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock",
                                                               "EfficientViTBlock"),
                                          encoder_block_out_channels=(8, 16, 16, 32),
                                          decoder_block_out_channels=(8, 16, 16, 32),
                                          encoder_layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                                          encoder_qkv_multiscales=((), (), (5,), (5,)),
                                          decoder_qkv_multiscales=((), (), (5,), (5,)),
                                          decoder_norm_types=("batch_norm", "batch_norm", "rms_norm", "rms_norm")),
    "dc-conv": lambda: diffusers.AutoencoderDC(latent_channels=4, attention_head_dim=4,
                                               encoder_block_types=("ResBlock",) + ("EfficientViTBlock",) * 2,
                                               decoder_block_types=("ResBlock",) + ("EfficientViTBlock",) * 2,
                                               encoder_block_out_channels=(8, 16, 16),
                                               decoder_block_out_channels=(8, 16, 16),
                                               encoder_layers_per_block=(0, 1, 1), decoder_layers_per_block=(0, 1, 1),
                                               encoder_qkv_multiscales=((), (3,), (3,)),
                                               decoder_qkv_multiscales=((), (3,), (3,)),
                                               downsample_block_type="Conv", upsample_block_type="interpolate"),
    # MiniMax-H3's: a causal CNN encoder and a ViT decoder (register tokens, rotary), x4 in space and time here; the
    # released clip geometry (17 n + 5 frames -> 5 n + 2 latent frames, clips cross-faded); tiled by default
    "minimax_h3": lambda: diffusers.AutoencoderKLMiniMaxH3(latent_channels=4, block_out_channels=(4, 8, 8),
                                                           layers_per_block=1, spatial_downsample_factors=(1, 2, 2),
                                                           temporal_downsample_factors=(1, 2, 2), norm_num_groups=2,
                                                           decoder_num_layers=1, decoder_num_attention_heads=2,
                                                           decoder_attention_head_dim=8,
                                                           decoder_num_register_tokens=2, decoder_ffn_mult=2),
    # Kandinsky 6 SR's causal K-VAE: x4 in space and time, latent-conditioned spatial norms in the decoder; no tiled
    # methods (its pipeline tiles the video itself)
    "kandinsky6_sr": lambda: diffusers.Kandinsky6SRVAE(latent_channels=4, encoder_block_out_channels=(8, 8, 8),
                                                       decoder_block_out_channels=(8, 8, 8), layers_per_block=1),
}  # fmt: skip
SPATIAL = {
    "wan2.1": 8,
    "wan2.2": 16,
    "hunyuan_video": 8,
    "cogvideox": 8,
    "mochi": 4,
    "magvit": 8,
    "ltx0.9.1": 8,
    "ltx0.9.5": 8,
    "ltx2": 8,
    "hunyuan_video15": 8,
    "allegro": 8,
    "cosmos": 8,
    "kl": 8,
    "dc": 8,
    "dc-conv": 4,
    "minimax_h3": 4,
    "kandinsky6_sr": 4,
}
PATCH = dict.fromkeys(("wan2.2", "ltx0.9.1", "ltx0.9.5", "ltx2", "cosmos"), 2)
"""How many pixel rows the encoder's patchify folds into one before its first convolution (the rest: 1)."""
DECODE_ARGS = dict.fromkeys(("ltx0.9.1", "ltx2"), lambda latents: {"temb": torch.full((latents.shape[0],), 0.05)})
"""Arguments of a VAE's decode besides the latents (a timestep-conditioned decoder's timestep)."""
TILES_SPLIT = {"ltx0.9.1": ("decoder",)}
"""Parts whose tiles are split by rows, not shared out (a decoder that draws noise tile after tile)."""
UNTILED = {"ltx2", "cosmos", "kandinsky6_sr"}
"""VAEs checked untiled only: LTX-2's reflection-padded decoder fails on one process on a last tile of one latent row
or column, which these sizes' tiles of 4 (stride 3) leave (its tiles are LTX-Video's, shared out the same way);
Cosmos 1's has no tiled methods (its ``enable_tiling`` sets flags that nothing reads), nor has Kandinsky 6 SR's."""
NO_TILING = {"kandinsky6_sr"}
"""VAEs without tiling methods at all (no ``enable_tiling``/``disable_tiling``)."""
TILED_ONLY = {"allegro"}
"""VAEs that decode and encode only tiled (their pixel frames: 4 a latent frame, no first frame of its own)."""
CALLS_SHARED = {"minimax_h3"}
"""VAEs whose parts run whole, call by call, tiled and untiled (MiniMax-H3's ViT decoder attends over a whole clip or
tile, one call each): the calls are shared out, not the rows."""
IMAGE = {"kl", "dc", "dc-conv"}
"""Image VAEs: ``(B, C, H, W)``, a case's frames folded into the batch (as Latte decodes its frames)."""
CASES = [(3, 7, 5), (1, 5, 6), (2, 9, 4)]
"""(latent frames, latent height, latent width): odd heights and widths, one or more latent frames."""
CASES_OF = {"minimax_h3": [(12, 5, 3), (7, 5, 6)], "kandinsky6_sr": [(6, 7, 5), (1, 5, 6), (2, 2, 3)]}
"""A VAE's own cases: MiniMax-H3 decodes at least 7 latent frames (one clip); 12 are two clips (encoded: 39 frames, 3
clips), in tiles of 4 latent rows and columns (2 x 1 and 2 x 2 tiles a clip). Kandinsky 6 SR decodes 6 latent frames
in two segments of its own (5 + 1 latent frames, the causal caches carried from one to the next) and encodes their 21
pixel frames in two (17 + 4); 2 latent rows are too few for 4 processes (run whole)."""


def cases(name: str) -> list[tuple[int, int, int]]:
    return CASES_OF.get(name, CASES)


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    vae = VAES[name]()
    with torch.no_grad():  # affine norms and biases away from their 1/0 initialisation
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return vae.eval()


def _inputs(name: str, frames: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    spatial = SPATIAL[name]
    generator = torch.Generator().manual_seed(frames * 100 + height * 10 + width)
    latents = torch.randn(1, 4, frames, height, width, generator=generator)
    if name in IMAGE:
        pixels = torch.rand(frames, 3, height * spatial, width * spatial, generator=generator) * 2 - 1
        return latents[0].transpose(0, 1), pixels
    pixel_frames = 4 * frames if name in TILED_ONLY else 4 * (frames - 1) + 1
    if name == "minimax_h3":  # 5 n + 2 latent frames <- 17 n + 5 frames
        pixel_frames = (frames - 2) // 5 * 17 + 5
    pixels = torch.rand(1, 3, pixel_frames, height * spatial, width * spatial, generator=generator) * 2 - 1
    return latents, pixels


def decode(vae: torch.nn.Module, name: str, latents: torch.Tensor) -> torch.Tensor:
    """``vae.decode(latents).sample``, with the VAE's other decode arguments (``DECODE_ARGS``)."""
    return vae.decode(latents, **DECODE_ARGS.get(name, lambda _: {})(latents)).sample


def _run(vae: torch.nn.Module, name: str, tiled: bool) -> dict[str, torch.Tensor]:
    if tiled and name in UNTILED:
        return {}
    if tiled:  # tiles of 4 latent rows and columns, overlapping by one
        size = 4 * SPATIAL[name]
        if name == "cogvideox":
            vae.enable_tiling(size, size, tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25)
        elif name == "hunyuan_video15":  # its latent tile size is set apart from the sample's
            vae.enable_tiling(size, size, 4, 4, tile_overlap_factor=0.25)
        elif name == "minimax_h3":  # its minimum overlap: 2 latent rows and columns
            vae.enable_tiling(size, size, size // 2, size // 2)
        elif name == "kl":  # its tiles: sample_size (32), overlapping by a quarter
            vae.enable_tiling()
        elif name == "allegro":  # tiles of 8 pixel frames (2 latent), overlapping by 4 (its kernel and stride: fixed)
            vae.enable_tiling()
            vae.kernel, vae.stride = (8, size, size), (4, size * 3 // 4, size * 3 // 4)
        else:
            vae.enable_tiling(
                size, size, tile_sample_stride_height=size * 3 // 4, tile_sample_stride_width=size * 3 // 4
            )
    elif name in TILED_ONLY:
        return {}
    elif name not in NO_TILING:
        vae.disable_tiling()
    out = {}
    with torch.no_grad():
        for frames, height, width in cases(name):
            latents, pixels = _inputs(name, frames, height, width)
            key = f"{frames}x{height}x{width}" + (" tiled" if tiled else "")
            torch.manual_seed(frames)  # the same noise (a decoder that injects it) on one process and split
            out["decode " + key] = decode(vae, name, latents)
            encoded = vae.encode(pixels)  # a distribution, or the deep-compression AE's latents
            out["encode " + key] = encoded.latent if name.startswith("dc") else encoded.latent_dist.mode()
    return out


def check_vae(name: str, parallel) -> dict:
    """Every case on one process (rank 0's run), then split over the world (the processes of one sample); the largest
    differences, the rows this rank's decoder and encoder ran untiled (their first convolution's input
    height per call; MiniMax-H3's ViT decoder: its tokens), and how many part calls ran, tiled and untiled, on one
    process and on this rank."""
    vae = build(name)
    calls: dict[str, list[int]] = {}
    for part in ("decoder", "encoder"):
        convs = [m for m in getattr(vae, part).modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))]
        first = convs[0] if convs else getattr(vae, part).proj_in  # (MiniMax-H3's ViT decoder: a linear)
        first.register_forward_pre_hook(lambda m, args, part=part: calls[part].append(args[0].shape[-2]))

    def run(tiled: bool) -> tuple[dict, dict]:
        calls.update(decoder=[], encoder=[])
        return _run(vae, name, tiled), {part: list(heights) for part, heights in calls.items()}

    # the one-process run on rank 0 alone, sent to the others (every rank built the same VAE from the same seed,
    # and runs as many threads): the ranks share the machine's cores, so each running it would cost them all
    one_process = [None]
    if parallel.rank == 0:
        (untiled, untiled_calls), (tiled, tiled_calls) = run(False), run(True)
        one_process = [(untiled | tiled, untiled_calls, tiled_calls)]
    torch.distributed.broadcast_object_list(one_process, src=0)
    reference, untiled_calls, tiled_calls = one_process[0]
    handle = parallelize_vae(vae, parallel)
    (untiled, rows), (tiled, split_tiled_calls) = run(False), run(True)
    split = untiled | tiled
    errors = {key: (split[key] - reference[key]).abs().max().item() for key in reference}
    shapes = {key: split[key].shape == reference[key].shape for key in reference}
    handle.undo()
    key = f"decode {'x'.join(map(str, cases(name)[0]))}" + (" tiled" if name in TILED_ONLY else "")
    if name not in TILED_ONLY | NO_TILING:
        vae.disable_tiling()
    latents = _inputs(name, *cases(name)[0])[0]
    torch.manual_seed(cases(name)[0][0])
    undone = decode(vae, name, latents) - reference[key]
    return {"errors": errors, "shapes": shapes, "rows": rows, "undone": undone.abs().max().item(),
            "tiled_calls": {part: len(c) for part, c in split_tiled_calls.items()},
            "one_process_tiled_calls": {part: len(c) for part, c in tiled_calls.items()},
            "untiled_calls": {part: len(c) for part, c in rows.items()},
            "one_process_untiled_calls": {part: len(c) for part, c in untiled_calls.items()}}  # fmt: skip


def check_vaes(names: list[str]) -> dict[str, dict]:
    """``check_vae`` of every named VAE on one layout (the whole world)."""
    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    return {name: check_vae(name, parallel) for name in names}
