"""Side-by-side attention benchmark: single-process SDPA vs. ours (Ulysses 2, Ring 2) vs. diffusers' and
yunchang's sequence parallelism, forward and forward+backward, at several sequence lengths.

    python benchmarks/bench_attention.py                  # 4k and 16k tokens (a few minutes on 2 cores)
    python benchmarks/bench_attention.py --seq 4096 --iters 3

Every parallel method runs in 2 spawned processes with 1 thread each (so two processes use two cores
and one process one core). Times are the slowest rank's median; "peak MiB" is the growth of the
process's peak resident memory during the timed runs, above the inputs (CPU has no allocator stats).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dit_sp import ParallelConfig, init_parallel, shard_sequence, spawn, usp_attention
from dit_sp.parallel import single_process_state

sys.path.insert(0, os.path.dirname(__file__))
import competitors  # noqa: E402  (benchmarks/competitors.py: diffusers and yunchang adapters)
from measure import median_seconds, peak_rss_mib, rss_mib  # noqa: E402

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def build(method: str, seq: int) -> tuple[Attention, int, object | None]:
    """The attention callable on (B, S_local, H, D) shards of ``seq`` tokens, its world size and its layout."""
    if method == "sdpa":
        return _sdpa, 1, None
    if method == "ours-1":
        p = single_process_state(torch.device("cpu"))
        return (lambda q, k, v: usp_attention(q, k, v, p, seq_len=seq)), 1, p
    if method in ("ours-ulysses2", "ours-ring2"):
        ring, uly = (1, 2) if method == "ours-ulysses2" else (2, 1)
        p = init_parallel(ParallelConfig(ring=ring, ulysses=uly))
        return (lambda q, k, v: usp_attention(q, k, v, p, seq_len=seq)), 2, p
    return competitors.build(method)


def worker(method: str, seq: int, heads: int, head_dim: int, iters: int) -> dict[str, float]:
    torch.manual_seed(0)
    attention, world, parallel = build(method, seq)
    full = [torch.randn(1, seq, heads, head_dim) for _ in range(4)]
    if world > 1:
        rank, size = dist.get_rank(), dist.get_world_size()
        full = (
            [x.chunk(size, dim=1)[rank].contiguous() for x in full]
            if parallel is None
            else [shard_sequence(x, parallel).contiguous() for x in full]
        )
    q, k, v, grad = full
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    base = rss_mib()
    with torch.no_grad():
        forward = median_seconds(lambda: attention(q, k, v), iters)
    fwd_bwd = median_seconds(lambda: attention(q, k, v).backward(grad), iters)
    result = torch.tensor([forward, fwd_bwd, peak_rss_mib() - base], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return dict(zip(("forward_s", "fwd_bwd_s", "peak_mib"), result.tolist()))


METHODS = ["sdpa", "ours-1", "ours-ulysses2", "ours-ring2", *competitors.METHODS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    args = parser.parse_args()

    for seq in args.seq:
        rows = {}
        for method in args.methods:
            world = 1 if method in ("sdpa", "ours-1") else 2
            try:
                rows[method] = spawn(
                    worker, world, args=(method, seq, args.heads, args.head_dim, args.iters), threads=1, timeout=1800
                )[0]
            except Exception as e:  # a competitor that cannot run here is reported, not fatal
                rows[method] = {"error": str(e).strip().splitlines()[-1][:90]}
        base = rows["sdpa"]
        print(f"\nS={seq} tokens, 1x{args.heads} heads of {args.head_dim}, fp32, CPU, 1 thread per process")
        print(f"{'method':24s} {'procs':>5s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'speedup fwd':>12s} "
              f"{'speedup f+b':>12s} {'peak MiB':>9s}")  # fmt: skip
        for method, r in rows.items():
            world = 1 if method in ("sdpa", "ours-1") else 2
            if "error" in r:
                print(f"{method:24s} {world:5d}   cannot run: {r['error']}")
                continue
            print(
                f"{method:24s} {world:5d} {r['forward_s'] * 1e3:9.1f} {r['fwd_bwd_s'] * 1e3:11.1f} "
                f"{base['forward_s'] / r['forward_s']:11.2f}x {base['fwd_bwd_s'] / r['fwd_bwd_s']:11.2f}x "
                f"{r['peak_mib']:9.1f}"
            )
        ratios = []
        if "ours-1" in rows and "error" not in rows["ours-1"]:
            ratios.append(f"ours(1)/sdpa f+b = {rows['ours-1']['fwd_bwd_s'] / base['fwd_bwd_s']:.3f}")
        if all(m in rows and "error" not in rows[m] for m in ("ours-ring2", "ours-ulysses2")):
            r, u = rows["ours-ring2"], rows["ours-ulysses2"]
            ratios.append(f"ring2/ulysses2 f+b = {r['fwd_bwd_s'] / u['fwd_bwd_s']:.3f}")
        for other in competitors.METHODS:
            mine = "ours-ulysses2" if "ulysses" in other else "ours-ring2"
            if other in rows and "error" not in rows[other] and "error" not in rows.get(mine, {"error": 1}):
                ratios.append(f"{other}/{mine} f+b = {rows[other]['fwd_bwd_s'] / rows[mine]['fwd_bwd_s']:.3f}")
        print("ratios: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
