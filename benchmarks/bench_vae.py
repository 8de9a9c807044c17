"""Parallel VAE decode and encode: time and per-process peak memory on 1, 2 and 4 processes, and diffusers'
tiled decode on one process, side by side in one run, with each row's ratio to one process.

    python benchmarks/bench_vae.py                       # Wan 2.1's VAE at its real width, 9 x 128 x 128, ~6 min
    python benchmarks/bench_vae.py --frames 9 --height 128 --width 128 --worlds 1 2

The VAE is ``AutoencoderKLWan()`` (Wan 2.1's architecture: 96 base channels, random weights), each process on
``--threads`` threads. Memory: the peak RSS (VmHWM, reset before each phase) and, since every process holds
the whole VAE, the peak above the loaded model: what the decode itself adds, the part that splits. Time
and memory come from two passes (the memory pass makes glibc return freed buffers at once, which costs
time). Every row's output is checked against the one-process run.
"""

from __future__ import annotations

import os
import time

import torch
from measure import benchmark_parser, peak_rss_mib, reset_peak_rss, rss_mib, steady_malloc  # benchmarks/measure.py

from dit_sp import ParallelConfig, init_parallel, parallelize_vae, spawn
from dit_sp.parallel.rows import RowSplit


def worker(frames: int, height: int, width: int, tiled: bool, threads: int, encode: bool, memory: bool,
           independent: bool = False) -> dict:  # fmt: skip
    """Decode (and encode) once; ``memory``: with glibc returning freed buffers at once, so that the peaks
    measure what the code holds (slower: every large buffer is a fresh mapping), else for time.
    ``independent``: no parallel VAE; each process decodes its share of the rows on its own (the machine's
    limit for this split: the same work at once with no communication)."""
    from diffusers import AutoencoderKLWan

    torch.set_num_threads(threads)
    if memory:
        steady_malloc()
    parallel = init_parallel(ParallelConfig(ulysses=int(os.environ["WORLD_SIZE"])))
    torch.manual_seed(0)
    vae = AutoencoderKLWan().eval().requires_grad_(False)
    if tiled:  # diffusers' tiles are 256 px by default: smaller ones, so that a 128 px clip is tiled
        vae.enable_tiling(64, 64, 48, 48)
    if not independent:
        parallelize_vae(vae, parallel)
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8, generator=generator)
    pixels = torch.rand(1, 3, frames, height, width, generator=generator) * 2 - 1
    if independent:
        start, stop = RowSplit.even(height // 8, parallel.world_size).bounds(parallel.rank)
        latents, pixels = latents[..., start:stop, :], pixels[..., 8 * start : 8 * stop, :]
    result = {}
    with torch.no_grad():
        vae.decode(latents[:, :, :1, :16, :16])  # warm-up: first-call allocations and kernels
        model = rss_mib()
        phases = [("decode", lambda: vae.decode(latents).sample)]
        if encode:
            phases.append(("encode", lambda: vae.encode(pixels).latent_dist.mean))
        for name, run in phases:
            reset_peak_rss()
            start = time.perf_counter()
            out = run()
            seconds, peak = time.perf_counter() - start, peak_rss_mib()
            result[name] = {"seconds": seconds, "peak": peak, "above": peak - model,
                            "out": out if parallel.rank == 0 else None}  # fmt: skip
    return result


def main() -> None:
    parser = benchmark_parser(__doc__, frames=9, height=128, width=128)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--no-encode", action="store_true")
    args = parser.parse_args()
    encode = not args.no_encode
    rows = [(f"{n} process{'es' * (n > 1)}", n, False, False) for n in args.worlds]
    rows += [("2 halves, no comms", 2, False, True), ("1 process, tiled", 1, True, False)]
    if 2 in args.worlds:
        rows.append(("2 processes, tiled", 2, True, False))
    results = {}
    for memory in (False, True):  # a pass for time, then one for memory
        for name, world, tiled, independent in rows:
            per_rank = spawn(worker, world, args=(args.frames, args.height, args.width, tiled, args.threads, encode,
                                                  memory, independent), timeout=3600)  # fmt: skip
            if memory:
                for timed, measured in zip(results[name][0], per_rank):
                    for phase in timed:
                        timed[phase] |= {"peak": measured[phase]["peak"], "above": measured[phase]["above"]}
            else:
                results[name] = (per_rank, tiled, independent)
            print(f"  {name} ({'memory' if memory else 'time'}): decode {per_rank[0]['decode']['seconds']:.1f} s",
                  flush=True)  # fmt: skip

    print(f"\nWan 2.1 VAE (real width, random weights), {args.frames} frames of {args.height} x {args.width}, "
          f"{args.threads} thread(s) per process")  # fmt: skip
    for phase in ["decode"] + ["encode"] * encode:
        print(f"\n{phase:<22}{'seconds':>9}{'speed-up':>10}{'peak MiB':>10}{'x':>7}{'above model':>13}{'x':>7}"
              f"{'max diff':>10}")  # fmt: skip
        base = results[rows[0][0]][0][0][phase]
        for name, (per_rank, tiled, independent) in results.items():
            r = per_rank[0][phase] | {"seconds": max(p[phase]["seconds"] for p in per_rank)}
            peak = max(p[phase]["peak"] for p in per_rank)
            above = max(p[phase]["above"] for p in per_rank)
            reference = results[f"1 process{', tiled' * tiled}"][0][0][phase]["out"]
            diff = float("nan") if independent else (r["out"] - reference).abs().max().item()
            print(f"{name:<22}{r['seconds']:>9.2f}{base['seconds'] / r['seconds']:>9.2f}x{peak:>10.0f}"
                  f"{peak / base['peak']:>7.2f}{above:>13.0f}{above / base['above']:>7.2f}{diff:>10.1e}")  # fmt: skip
    print("\nspeed-up and x: against 1 process (untiled); peak: the largest over the processes; max diff: against "
          "the one-process run of the same kind (tiled or not); 2 halves, no comms: two processes decoding half "
          "the rows each, independently (this machine's limit for 2 processes)")  # fmt: skip


if __name__ == "__main__":
    main()
