"""End-to-end sampling with a stock ``WanPipeline`` whose VAE is Wan 2.1's at its real width: one process vs.
Ulysses 2 with the parallel VAE vs. Ulysses 2 with one process decoding, side by side in one run, the time
split into denoising and decoding.

    python benchmarks/bench_generate.py                          # 17 frames of 128 x 128, 4 steps (~4 min)
    python benchmarks/bench_generate.py --layers 8 --heads 12    # a wider transformer

The pipeline is the tiny Wan's (tiny text encoder) with ``AutoencoderKLWan()`` (96 base channels, random
weights) and a Wan transformer of ``--layers`` blocks of ``--heads`` heads of 64 (random weights), through
``dit_sp.parallelize``. "denoise" runs from the call to the last step's end (text encoding included),
"decode" from there to the frames (decoding and post-processing). One thread per process; the slowest
rank's time after one warm-up call.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from measure import benchmark_parser, tiny_wan_pipeline  # benchmarks/measure.py

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn


def worker(args: argparse.Namespace, parallel_vae: bool) -> dict:
    from diffusers import AutoencoderKLWan

    torch.set_num_threads(1)
    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    pipe = tiny_wan_pipeline(args.layers, args.heads, in_channels=16, out_channels=16)
    pipe.register_modules(vae=AutoencoderKLWan())
    if parallel.sp > 1:
        parallelize(pipe, parallel, parallel_vae=parallel_vae)
    marks = {}

    def on_step_end(pipeline, step, timestep, tensors):
        marks["denoised"] = time.perf_counter()
        return tensors

    def call(steps: int, frames: int) -> float:
        begin = time.perf_counter()
        out = pipe("a red circle moving left", num_frames=frames, height=args.height, width=args.width,
                   num_inference_steps=steps, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                   output_type="np", callback_on_step_end=on_step_end).frames[0]  # fmt: skip
        return {"denoise": marks["denoised"] - begin, "decode": time.perf_counter() - marks["denoised"], "frames": out}

    call(1, 1)  # warm-up
    return call(args.steps, args.frames)


def main() -> None:
    parser = benchmark_parser(__doc__, frames=17, height=128, width=128, steps=4, layers=2, heads=4)
    args = parser.parse_args()
    rows = {"1 process": (1, True), "Ulysses 2": (2, True), "Ulysses 2, serial VAE": (2, False)}
    results = {}
    for name, (world, parallel_vae) in rows.items():
        per_rank = spawn(worker, world, args=(args, parallel_vae), timeout=3600)
        results[name] = {part: max(r[part] for r in per_rank) for part in ("denoise", "decode")}
        results[name]["frames"] = per_rank[0]["frames"]
        print(f"  {name}: {results[name]['denoise'] + results[name]['decode']:.1f} s", flush=True)
    tokens = ((args.frames - 1) // 4 + 1) * (args.height // 16) * (args.width // 16)
    print(
        f"\nWanPipeline, Wan 2.1 VAE at real width, transformer {args.layers} x {args.heads} heads of 64, "
        f"{args.frames} frames of {args.height} x {args.width} ({tokens} tokens), {args.steps} steps with CFG"
    )
    print(f"{'':24}{'total s':>9}{'speed-up':>10}{'denoise s':>11}{'decode s':>10}{'decode share':>14}{'max diff':>10}")
    base = results["1 process"]
    for name, r in results.items():
        total = r["denoise"] + r["decode"]
        diff = abs(r["frames"] - base["frames"]).max()
        print(f"{name:24}{total:>9.1f}{(base['denoise'] + base['decode']) / total:>9.2f}x{r['denoise']:>11.1f}"
              f"{r['decode']:>10.1f}{r['decode'] / total:>13.0%}{diff:>10.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
