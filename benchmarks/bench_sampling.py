"""End-to-end sampling, eager vs. compiled vs. step-cached vs. both, in one process and on Ulysses 2, side
by side in one run; with the transformer block evaluations per step and the per-process peak memory.

    python benchmarks/bench_sampling.py                             # 17 frames of 192 x 192, 10 steps (~5 min)
    python benchmarks/bench_sampling.py --cache first_block:0.1 --layers 8

The pipeline is the tiny Wan's (tiny text encoder and VAE) with a Wan transformer of ``--layers`` blocks of
``--heads`` heads of 64 (random weights), through ``dit_sp.parallelize`` on two processes. Compiled: every
block by ``dit_sp.sp.compile.compile_blocks`` (inductor), its compile time reported apart (the first call).
Each mode's time is the median of ``--repeats`` calls after a warm-up; the slowest rank's; one thread per
process, so Ulysses 2 uses twice the cores of one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from measure import benchmark_parser, peak_rss_mib, tiny_wan_pipeline

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn
from dit_sp.cache import enable_cache
from dit_sp.sp.compile import compile_blocks

MODES = ("eager", "cached", "compiled", "compiled+cached")


def worker(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    pipe = tiny_wan_pipeline(args.layers, args.heads)
    if parallel.sp > 1:
        parallelize(pipe, parallel)

    def call():
        return pipe("a red circle moving left", num_frames=args.frames, height=args.height, width=args.width,
                    num_inference_steps=args.steps, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                    output_type="np").frames[0]  # fmt: skip

    def timed(calls: int) -> tuple[float, object]:
        times, frames = [], None
        for _ in range(calls):
            begin = time.perf_counter()
            frames = call()
            times.append(time.perf_counter() - begin)
        return statistics.median(times), frames

    results = {}
    for mode in MODES:
        if mode == "compiled":
            compile_blocks(pipe.transformer)
            results["compile_seconds"] = timed(1)[0]  # the first call compiles
        cache = enable_cache(pipe, args.cache) if mode.endswith("cached") else None
        if mode == "eager":
            timed(1)  # warm-up
        seconds, frames = timed(args.repeats)
        blocks = cache.stats.blocks_run / (args.repeats * args.steps) if cache else 2 * args.layers
        results[mode] = {"seconds": seconds, "frames": frames, "blocks_per_step": blocks}
        if cache is not None:
            cache.undo()
    results["peak_mib"] = peak_rss_mib()
    return results


def main() -> None:
    parser = benchmark_parser(__doc__, frames=17, height=192, width=192, steps=10, layers=4, heads=4)
    parser.add_argument("--cache", default="first_block:0.2")  # random weights: their own thresholds
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {}
    for name, world in (("1 process", 1), ("Ulysses 2", 2)):
        per_rank = spawn(worker, world, args=(args,), timeout=3600)
        runs[name] = {mode: max(r[mode]["seconds"] for r in per_rank) for mode in MODES}
        runs[name] |= {"frames": {m: per_rank[0][m]["frames"] for m in MODES},
                       "blocks": {m: per_rank[0][m]["blocks_per_step"] for m in MODES},
                       "compile": max(r["compile_seconds"] for r in per_rank),
                       "peak": max(r["peak_mib"] for r in per_rank)}  # fmt: skip
        print(f"  {name} done", flush=True)
    tokens = ((args.frames - 1) // 4 + 1) * (args.height // 16) * (args.width // 16)
    print(f"\nWanPipeline, transformer {args.layers} x {args.heads} heads of 64, {args.frames} frames of "
          f"{args.height} x {args.width} ({tokens} tokens), {args.steps} steps with CFG; {args.cache}")  # fmt: skip
    base = runs["1 process"]["eager"]
    print(
        f"{'':18}{'blocks/step':>12}" + "".join(f"{n + ' s':>14}{'speed-up':>10}" for n in runs) + f"{'max diff':>10}"
    )
    for mode in MODES:
        line = f"{mode:18}{runs['1 process']['blocks'][mode]:>12.1f}"
        for run in runs.values():
            line += f"{run[mode]:>14.2f}{base / run[mode]:>9.2f}x"
        diff = max(abs(run["frames"][mode] - runs["1 process"]["frames"][mode]).max() for run in runs.values())
        print(line + f"{diff:>10.1e}")
    print("compile (first call): " + ", ".join(f"{n} {r['compile']:.0f} s" for n, r in runs.items()))
    print("peak RSS per process: " + ", ".join(f"{n} {r['peak']:.0f} MiB" for n, r in runs.items()))


if __name__ == "__main__":
    main()
