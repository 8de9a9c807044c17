"""Demo: USP attention across local worker processes, checked against one process.

    python examples/usp_demo.py                        # ring 2 x ulysses 2, 4 local CPU workers
    python examples/usp_demo.py --ring 1 --ulysses 2 --seq 4096
    torchrun --nproc-per-node 4 examples/usp_demo.py   # the same under torchrun (any node count)

Each rank holds one shard of a (B, S, H, D) sequence (plus replicated joint "text" tokens), runs
``usp_attention`` forward and backward, and the gathered output and gradients are compared with
single-process ``scaled_dot_product_attention`` on the full sequence.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dit_sp import ParallelConfig, gather_sequence, init_parallel, shard_sequence, spawn, usp_attention


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring", type=int, default=2, help="ring degree (default 2)")
    parser.add_argument("--ulysses", type=int, default=2, help="Ulysses degree (default 2)")
    parser.add_argument("--seq", type=int, default=2047, help="video tokens; need not divide ring*ulysses")
    parser.add_argument("--joint", type=int, default=77, help="replicated joint (text) tokens in front")
    parser.add_argument("--heads", type=int, default=6, help="attention heads; need not divide ulysses")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("ring", "ulysses", "seq", "heads", "head_dim", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.joint < 0:
        parser.error("--joint must be >= 0")
    return args


def run(args: argparse.Namespace) -> dict[str, float]:
    parallel = init_parallel(ParallelConfig(ring=args.ring, ulysses=args.ulysses))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.seq + args.joint, args.heads, args.head_dim)
    full = [torch.randn(shape, generator=gen).to(dtype) for _ in range(4)]  # q, k, v, grad of output
    joint = [x[:, : args.joint] for x in full]
    local = [
        torch.cat([j, shard_sequence(x[:, args.joint :], parallel)], 1).to(parallel.device).requires_grad_()
        for x, j in zip(full[:3], joint[:3])
    ]
    grad_out = torch.cat([joint[3], shard_sequence(full[3][:, args.joint :], parallel)], 1).to(parallel.device)
    grad_out[:, : args.joint] /= parallel.sp  # the replicated joint output counts once over the group

    start = time.perf_counter()
    out = usp_attention(*local, parallel, seq_len=args.seq, joint_len=args.joint)
    forward_s = time.perf_counter() - start
    out.backward(grad_out)
    total_s = time.perf_counter() - start

    def full_of(x: torch.Tensor) -> torch.Tensor:
        """Full (joint + video) tensor: joint part summed over the group (partials), video gathered."""
        joint_part = x[:, : args.joint].double()
        if parallel.sp_group is not None:
            dist.all_reduce(joint_part, group=parallel.sp_group)
        video = gather_sequence(x[:, args.joint :].detach(), parallel, seq_len=args.seq).double()
        return torch.cat([joint_part, video], 1).cpu()

    result = {"forward_s": forward_s, "forward_backward_s": total_s}
    out_full = torch.cat([out[:, : args.joint].detach().double().cpu(), full_of(out)[:, args.joint :]], 1)
    grads = [full_of(x.grad) for x in local]
    ref_in = [x.double().requires_grad_() for x in full[:3]]
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in ref_in)).transpose(1, 2)
    ref.backward(full[3].double())
    result["out_err"] = (out_full - ref.detach()).abs().max().item()
    for name, g, r in zip("qkv", grads, ref_in):
        result[f"d{name}_err"] = (g - r.grad).abs().max().item()
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    world = args.ring * args.ulysses
    launched = "RANK" in os.environ
    results = [run(args)] if launched or world == 1 else spawn(run, world, args=(args,), timeout=600)
    if launched and int(os.environ["RANK"]) != 0:
        return
    res = results[0]
    errors = {k: v for k, v in res.items() if k.endswith("_err")}
    tol = 1e-5 if args.dtype == "float32" else 3e-2
    print(
        f"USP attention, ring {args.ring} x ulysses {args.ulysses} ({world} processes): {args.seq} video + "
        f"{args.joint} joint tokens, {args.heads} heads of {args.head_dim}, {args.dtype}"
    )
    print(f"  forward {res['forward_s'] * 1e3:.1f} ms, forward+backward {res['forward_backward_s'] * 1e3:.1f} ms")
    print("  max |error| vs single-process SDPA (fp64): " + ", ".join(f"{k[:-4]} {v:.2e}" for k, v in errors.items()))
    ok = all(v <= tol for v in errors.values())
    print(f"  parity: {'OK' if ok else 'FAILED'} (tolerance {tol:g})")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
