"""GRPO training throughput: time per training sample and peak memory per process, one process (sp=1)
vs. sequence parallel on two (Ulysses 2, Ring 2), side by side in one run.

    python benchmarks/bench_grpo.py                 # tiny Wan, 9 frames of 64x64 (a few minutes)
    python benchmarks/bench_grpo.py --height 96 --width 96

Each method runs ``--steps`` GRPO iterations (rollout, reward, one update) after one warm-up iteration; a
"sample" is one rollout + its share of the training forward/backward. The time per sample is split into
sampling (the transformer's rollout), reward (decoding and scoring) and training, as the trainer logs them
(``seconds/*``). "ulysses2, serial VAE" decodes on one process of the two (``parallel_vae: false``), as
before the parallel VAE. Memory is the growth of the peak resident set during the timed iterations (CPU has
no allocator statistics).

The last rows score with the ``remote`` reward: a reward server on this machine (``pipelines.reward_server``)
whose scorer pauses ``--scorer-seconds`` per video, like a reward model on another node, with the rollout
in micro-batches of one sample; "overlapped" scores each micro-batch while the next one samples
(``grpo.overlap_rewards``), "serial" after the whole rollout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from measure import benchmark_parser, peak_rss_mib, rss_mib  # benchmarks/measure.py

from dit_sp import GRPOTrainer, TrainConfig, spawn

PARTS = ("sample", "reward", "train")


def worker(cfg: TrainConfig, steps: int) -> dict[str, float]:
    trainer = GRPOTrainer(cfg)

    trainer.step()  # warm-up
    base = rss_mib()
    dist.barrier()
    start = time.perf_counter()
    parts = dict.fromkeys(PARTS, 0.0)
    for _ in range(steps):
        row = trainer.step()
        for part in PARTS:
            parts[part] += row[f"seconds/{part}"]
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    samples = steps * cfg.grpo.prompts_per_step * cfg.grpo.group_size
    peak = peak_rss_mib() - base
    return {"s_per_sample": elapsed.item() / samples, "peak_mib": peak} | {p: t / samples for p, t in parts.items()}


def main() -> None:
    parser = benchmark_parser(__doc__, height=64, width=64, frames=9, steps=2)
    parser.add_argument("--scorer-seconds", type=float, default=0.05, help="the remote scorer's pause per video")
    args = parser.parse_args()
    base = {"model": "tiny-wan", "checkpoint_every": 0, "output_dir": "outputs/bench_grpo", "overwrite": True,
            "sample": {"frames": args.frames, "height": args.height, "width": args.width, "guidance": 4.0},
            "grpo": {"steps": 4, "group_size": 2, "prompts_per_step": 2, "train_fraction": 0.5}}  # fmt: skip
    layouts = {"sp=1": (1, {}), "ulysses2": (2, {"ulysses": 2}), "ring2": (2, {"ring": 2}),
               "ulysses2, serial VAE": (2, {"ulysses": 2, "parallel_vae": False})}  # fmt: skip
    rows = {}
    for name, (world, extra) in layouts.items():
        cfg = TrainConfig.from_dict(base | extra)
        rows[name] = spawn(worker, world, args=(cfg, args.steps), threads=1, timeout=3600)
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parent), "SLOW_SCORER_SECONDS": str(args.scorer_seconds)}
    server = subprocess.Popen([sys.executable, "-m", "pipelines.reward_server", "--reward",
                               "slow_scorer:brightness_after_pause", "--port", "0"], stdout=subprocess.PIPE, text=True,
                              env=env)  # fmt: skip
    try:
        url = server.stdout.readline().split(" on ")[1].strip()
        remote = {"reward": [{"name": "remote", "url": url, "timeout": 600}]}
        for name, overlap in (("remote reward, serial", False), ("remote reward, overlapped", True)):
            grpo = base["grpo"] | {"micro_batch": 1, "overlap_rewards": overlap}
            cfg = TrainConfig.from_dict(base | remote | {"grpo": grpo})
            rows[name] = spawn(worker, 1, args=(cfg, args.steps), threads=1, timeout=3600)
    finally:
        server.kill()
    tokens = (args.frames - 1) // 4 + 1
    tokens *= (args.height // 16) * (args.width // 16)
    print(f"\nGRPO on tiny-wan, {args.frames} frames of {args.height}x{args.width} ({tokens} tokens), guidance 4, "
          "1 thread per process")  # fmt: skip
    print(f"{'layout':26s} {'procs':>5s} {'s/sample':>9s} {'speedup':>8s} {'sample':>8s} {'reward':>8s} {'train':>8s} "
          f"{'peak MiB/proc':>14s}")  # fmt: skip
    single = rows["sp=1"][0]["s_per_sample"]
    for name, results in rows.items():
        r = results[0]
        print(
            f"{name:26s} {len(results):5d} {r['s_per_sample']:9.3f} {single / r['s_per_sample']:7.2f}x "
            + " ".join(f"{r[part]:8.3f}" for part in PARTS)
            + f" {max(x['peak_mib'] for x in results):14.1f}"
        )
    print("sample / reward / train: seconds per sample in rollout sampling, decoding + scoring, and training")
    print(f"ratio: sp=1 / ulysses2 time per sample = {single / rows['ulysses2'][0]['s_per_sample']:.2f}")
    serial, overlapped = (rows[f"remote reward, {kind}"][0]["s_per_sample"] for kind in ("serial", "overlapped"))
    print(f"remote scorer pausing {args.scorer_seconds:g} s per video: overlapped / serial time per sample = "
          f"{overlapped / serial:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
