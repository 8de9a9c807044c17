"""GRPO on a long clip with sequence parallelism: the per-process peak memory of GRPO iterations on 1, 2 and 4
processes (Ulysses or Ring: every process holds 1/N of each sample's tokens), and the reward before and after
them, so that the memory that falls is that of a run that still learns.

    python benchmarks/bench_long_clip.py              # 33 frames of 128x128 (576 tokens)
    python benchmarks/bench_long_clip.py --frames 65  # 1088 tokens: docs/sde-recipes.md's table
    python benchmarks/bench_long_clip.py --frames 81 --height 256 --width 256     # 5376 tokens: far longer
    python benchmarks/bench_long_clip.py --layout ring --worlds 1 2
    python benchmarks/bench_long_clip.py --quick      # 17 frames of 64x64, 1 and 2 processes, 1 iteration

The model is a Wan-like transformer (``--layers`` blocks of ``--heads`` heads of 64; tiny VAE and text encoder,
saved with ``save_pretrained`` first, so set-up takes the real path) trained in full on the ``brightness``
reward. Every run has the same samples, noise and seeds whatever the number of processes (the layouts agree
up to float rounding), so the reward columns should match across rows.

Columns: "iteration growth" is, for each of the ``--iters`` GRPO iterations that follow ``--warmup`` ones, the
process's peak resident set during the iteration (VmHWM, reset before it; glibc told to return freed buffers at
once) minus its resident set before it: what an iteration holds (activations, the rollout, the frames being
scored, gradients), the part that sequence parallelism divides; the largest over those iterations and over the
ranks. "first iteration" is the same for the first iteration, which also allocates once what every later one
reuses (optimizer state, lazily imported modules, communication buffers, the allocator's arenas: the resident set
settles after a few iterations, hence the warm-up). "peak" is the last iteration's VmHWM, the largest over the
ranks. "training reward": the mean ``brightness`` of each iteration's rollouts, warm-up included; "eval": that of
ODE samples of the first prompts from fixed noise (``GRPOTrainer.evaluate``) before the first and after the last
iteration.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from measure import benchmark_parser, peak_rss_mib, reset_peak_rss, rss_mib, steady_malloc, tiny_wan_pipeline

from dit_sp import GRPOTrainer, TrainConfig, spawn


def worker(config: TrainConfig, warmup: int, iters: int) -> dict[str, Any]:
    steady_malloc()
    trainer = GRPOTrainer(config)
    before = trainer.evaluate()
    rewards, growth = [], []
    for _ in range(warmup + iters):
        base = rss_mib()
        reset_peak_rss()
        rewards.append(trainer.step()["reward_mean"])
        growth.append(peak_rss_mib() - base)
    return {"peak": peak_rss_mib(), "first": growth[0], "growth": max(growth[warmup:]), "before": before,
            "after": trainer.evaluate(), "rewards": rewards}  # fmt: skip


def tokens_of(frames: int, height: int, width: int) -> int:
    """Transformer tokens of a clip: Wan's VAE (4x in time, 8x in space) and 2x2 patches."""
    return ((frames - 1) // 4 + 1) * (height // 16) * (width // 16)


def main() -> None:
    parser = benchmark_parser(__doc__, frames=33, height=128, width=128, layers=2, heads=4, iters=2, steps=3)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--warmup", type=int, default=2, help="iterations before the measured ones (default: 2)")
    parser.add_argument("--layout", choices=["ulysses", "ring"], default="ulysses")
    parser.add_argument("--lr", type=float, default=5e-2)
    parser.add_argument("--quick", action="store_true", help="17 frames of 64x64 on 1 and 2 processes, 1 iteration")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.height, args.width, args.worlds, args.iters = 17, 64, 64, [1, 2], 1
    if args.layout == "ulysses" and any(args.heads % world for world in args.worlds):
        parser.error(f"Ulysses splits the {args.heads} heads over the processes: give --heads a multiple of each "
                     "of --worlds, or --layout ring")  # fmt: skip
    tokens = tokens_of(args.frames, args.height, args.width)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_long_clip_") as tmp:
        pipe = tiny_wan_pipeline(args.layers, args.heads)
        pipe.save_pretrained(Path(tmp) / "model")
        params = sum(p.numel() for p in pipe.transformer.parameters())
        del pipe
        print(f"model: {params / 1e6:.1f} M parameters, {args.layers} blocks of {args.heads} heads of 64; clip: "
              f"{args.frames} frames of {args.height}x{args.width} = {tokens} tokens")  # fmt: skip
        for world in args.worlds:
            config = TrainConfig.from_dict({
                "model": str(Path(tmp) / "model"), "prompts": "toy_prompts_train.txt", "reward": "brightness",
                "checkpoint_every": 0, "eval_prompts": 2, "output_dir": str(Path(tmp) / f"run{world}"),
                "max_steps": args.warmup + args.iters, args.layout: world, "seed": 0,
                "sample": {"frames": args.frames, "height": args.height, "width": args.width, "guidance": 1.0,
                           "max_sequence_length": 16},
                "grpo": {"steps": args.steps, "group_size": 2, "prompts_per_step": 2, "train_fraction": 1.0,
                         "micro_batch": 1, "clip_range": 0.2},
                "optim": {"lr": args.lr},
            })  # fmt: skip
            results = spawn(worker, world, args=(config, args.warmup, args.iters), threads=1, timeout=7200)
            rows.append({"processes": world, "layout": args.layout if world > 1 else "-",
                         **{key: max(r[key] for r in results) for key in ("peak", "first", "growth")},
                         "growth_by_rank": [r["growth"] for r in results],
                         "before": results[0]["before"], "after": results[0]["after"],
                         "rewards": results[0]["rewards"]})  # fmt: skip
    base = rows[0] if rows[0]["processes"] == 1 else None
    print(f"\nper-process memory (MiB, the largest over the ranks; in brackets: the ratio to 1 process): what a GRPO "
          f"iteration holds, over {args.iters} after {args.warmup} warm-up ones, and the first one; the mean training "
          "reward (brightness) of each iteration, and the eval reward before and after")  # fmt: skip
    print(f"{'processes':>12} {'peak':>14} {'first iteration':>16} {'iteration growth':>18}  {'training reward':<30}"
          f" {'eval before':>11} {'eval after':>10}")  # fmt: skip
    for row in rows:
        cells = [f"{row[key]:.0f}" + (f" ({row[key] / base[key]:.2f}x)" if base else "")
                 for key in ("peak", "first", "growth")]  # fmt: skip
        label = str(row["processes"]) + ("" if row["processes"] == 1 else f" {row['layout']}")
        trend = " ".join(f"{r:.4f}" for r in row["rewards"])
        print(f"{label:>12} {cells[0]:>14} {cells[1]:>16} {cells[2]:>18}  {trend:<30} {row['before']:>11.4f}"
              f" {row['after']:>10.4f}")  # fmt: skip
    print("iteration growth by rank (rank 0 also gathers and scores one decode chunk's frames):")
    for row in rows:
        print(f"{row['processes']:>12}  " + "  ".join(f"{g:.0f}" for g in row["growth_by_rank"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
