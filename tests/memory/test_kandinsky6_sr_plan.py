"""The sampling planner on Kandinsky 6 SR (``kandinsky-6.0-vsr``): one denoising call's tiles, one tile's decode in
causal segments (rows split) and the output canvas and input video whole, not the whole video's tokens. The tile
arithmetic (``tile_call``) is checked against what the stock pipeline itself passes (the tiny pipeline on one process,
at the pipeline's own defaults), and the real-size plan against the pipeline's own tile settings."""

from __future__ import annotations

import inspect

import pytest
import torch

from dit_sp.errors import ConfigError
from dit_sp.families.kandinsky6_sr import tile_call
from dit_sp.memory.planner import ARCHITECTURES
from dit_sp.memory.sampling import DECODING, DENOISING, SamplingSettings, plan_sampling, vae_decode_bytes

ARCH = "kandinsky-6.0-vsr"
GiB = 2**30


def _defaults() -> dict:
    from diffusers import Kandinsky6SRPipeline

    call = inspect.signature(Kandinsky6SRPipeline.__call__).parameters
    return {name: call[name].default for name in ("resolution_scale", "min_overlap", "tiles_batch_size")}


def test_tile_call_is_what_the_stock_pipeline_passes():
    """The tiny pipeline at its defaults (2.25x: a 1.125x pre-upscale, then tiles of its one trained size) on a
    13-frame video of 16 x 40 (a grid of 1 x 2 tiles): each transformer call holds ``tile_call``'s tiles of the tile
    size, every latent frame of the video; each decode runs in causal segments, the first of ``segment_frames`` pixel
    frames; the output is ``tile_call``'s canvas."""
    import numpy as np
    from PIL import Image

    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-kandinsky6-sr")
    rng = np.random.default_rng(0)
    video = [Image.fromarray(rng.integers(0, 256, (16, 40, 3), dtype=np.uint8)) for _ in range(13)]
    calls, segments = [], []
    hooks = [pipe.transformer.register_forward_pre_hook(lambda m, a, k: calls.append(k["hidden_states"].shape[:4]),
                                                        with_kwargs=True),
             pipe.vae.decoder.register_forward_pre_hook(lambda m, a: segments.append(a[0].shape))]  # fmt: skip
    try:
        with torch.no_grad():
            out = pipe(video=video, num_inference_steps=1, output_type="pt")
    finally:
        for hook in hooks:
            hook.remove()
    vae = pipe.vae
    spatial = vae.spatial_compression_ratio
    tiled = tile_call(dict(pipe.transformer.config), 13, 16, 40, spatial)
    frames, rows, columns = tiled["tile"]
    assert (frames, rows, columns) == (13, 32, 64) and tiled["output"] == (13, 32, 88)  # 16 x 44 after 1.125x
    latent_frames = sum(segment[2] for segment in segments[: len(segments) // len(calls)])  # one decode's segments
    assert {tuple(c) for c in calls} == {(tiled["tiles"], latent_frames, rows // spatial, columns // spatial)}
    assert len(calls) == 2  # 1 x 2 tiles, one call each (tiles_batch_size 1)
    first = segments[0]
    assert 1 + (first[2] - 1) * vae.temporal_compression_ratio == tiled["segment_frames"]  # 17: the first segment
    assert first[0] == tiled["tiles"] and len(segments) == 2 * len(calls)  # each decode in two segments
    assert (out.frames.shape[1], *out.frames.shape[-2:]) == tiled["output"]


def test_a_480p_video_plans_one_tile_call_its_segmented_decode_and_the_canvas():
    """121 frames of 480 x 848 on Ulysses 2: the tokens are those of ``tiles_batch_size`` tiles of the trained tile
    size closest to the pre-upscaled input's aspect (from the pipeline's own settings), not the video's."""
    spec = ARCHITECTURES[ARCH]
    temporal, spatial = spec["compression"]
    settings = _defaults()
    assert settings["resolution_scale"] == 2.25  # the 2x path after a 1.125x pre-upscale to multiples of 16
    height, width = round(480 * 1.125 / spatial) * spatial, round(848 * 1.125 / spatial) * spatial
    sizes = spec["transformers"]["transformer"][1]["tile_sizes"]
    tile = min(sizes, key=lambda hw: abs(hw[1] / hw[0] - width / height))
    tiles = settings["tiles_batch_size"]
    tokens = tiles * ((121 - 1) // temporal + 1) * (tile[0] // spatial) * (tile[1] // spatial)
    assert tokens == 31 * 32 * 48  # 544 x 960 -> tiles of 512 x 768 (over 3 x 3 of them)
    plan = plan_sampling(SamplingSettings(ARCH, frames=121, height=480, width=848, ulysses=2, guidance=False), 2)
    denoising, decoding = plan.phases[DENOISING], plan.phases[DECODING]
    assert f"activations (one block, 1 seq x {tokens // 2} tokens)" in denoising
    canvas = {"output canvas (float32, whole)": 121 * height * 2 * width * 2 * 3 * 4,
              "input video (float32, whole)": 121 * height * width * 3 * 4}  # fmt: skip
    assert canvas.items() <= denoising.items() and canvas.items() <= decoding.items()
    (label,) = [k for k in decoding if k.startswith("VAE decode activations")]
    assert decoding[label] == tiles * vae_decode_bytes(121, *tile, 2, 2, 17)  # rows 1/2, 17 frames at once
    assert "17 frames at once, rows 1/2" in label
    # a larger input: the same call and tile decode, a larger canvas
    larger = plan_sampling(SamplingSettings(ARCH, frames=121, height=960, width=1696, ulysses=2, guidance=False), 2)
    assert larger.phases[DENOISING].keys() == denoising.keys()
    assert larger.phases[DECODING][label] == decoding[label]
    assert larger.phases[DENOISING]["output canvas (float32, whole)"] > 3.9 * canvas["output canvas (float32, whole)"]
    assert plan.fits and 15 * GiB < plan.peak < 25 * GiB


def test_the_k_vae_counts_the_planned_parameters_on_meta():
    """The K-VAE at diffusers' defaults (the released one): 1.74e9 parameters counted on meta, the plan's VAE."""
    import diffusers

    from dit_sp.weights import parameters_on_meta

    with parameters_on_meta(), torch.device("meta"):
        vae = diffusers.Kandinsky6SRVAE()
    assert abs(sum(p.numel() for p in vae.parameters()) - ARCHITECTURES[ARCH]["vae"]) < 0.005e9
    assert (vae.temporal_compression_ratio, vae.spatial_compression_ratio) == ARCHITECTURES[ARCH]["compression"]


def test_a_ring_and_an_input_smaller_than_a_tile_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="^ring 2: Kandinsky 6 SR's NABLA") as e:
        plan_sampling(SamplingSettings(ARCH, frames=121, height=480, width=848, ring=2, guidance=False), 2)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"at least 256x384 pixels \(one tile\), got 208x368$"):
        plan_sampling(SamplingSettings(ARCH, frames=121, height=184, width=328, guidance=False), 1)
