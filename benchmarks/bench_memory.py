"""Per-process peak memory of GRPO set-up, rollout and update, and of weight-sharded sampling, on 1, 2 and 4
processes, side by side in one run, with each column's ratio to one process.

    python benchmarks/bench_memory.py                 # a 390 M-parameter Wan-width model (8 blocks), ~10 min
    python benchmarks/bench_memory.py --layers 4 --worlds 1 2
    python benchmarks/bench_memory.py --layers 6 --worlds 1 2 --layouts ulysses dp --no-generate

The model is saved with ``save_pretrained`` to a temporary directory first (Wan 2.1 1.3B's width: 12 heads
of 128, ffn 8960; tiny VAE and text encoder), so set-up measures the real path: built on the meta device,
sharded, each rank reading its own shards. Peaks are VmHWM, reset between phases (Linux ``clear_refs``);
glibc is told to return freed buffers at once, so that the peaks measure what the code holds.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch
from measure import benchmark_parser, peak_rss_mib, reset_peak_rss, steady_malloc  # benchmarks/measure.py

from dit_sp import GenerateConfig, GRPOTrainer, TrainConfig, generate, spawn
from dit_sp.zoo import build_tiny


def train_worker(config: TrainConfig) -> dict[str, float]:
    steady_malloc()
    trainer = GRPOTrainer(config)
    peaks = {"setup": peak_rss_mib()}
    reset_peak_rss()
    data = trainer.collect(0)
    peaks["rollout"] = peak_rss_mib()
    del data
    reset_peak_rss()
    trainer.step()
    peaks["step"] = peak_rss_mib()
    return peaks


def generate_worker(config: GenerateConfig) -> dict[str, float]:
    steady_malloc()
    generate(config)
    return {"generate": peak_rss_mib()}


def save_model(path: Path, layers: int) -> int:
    from diffusers import WanTransformer3DModel

    pipe = build_tiny("tiny-wan")
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                                        in_channels=4, out_channels=4, text_dim=16, freq_dim=256, ffn_dim=8960,
                                        num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=32)  # fmt: skip
    pipe.register_modules(transformer=transformer)
    pipe.save_pretrained(path)
    return sum(p.numel() for p in transformer.parameters())


def main() -> None:
    parser = benchmark_parser(__doc__, layers=8)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--layouts", nargs="+", choices=["ulysses", "dp"], default=["ulysses"],
                        help="how several processes split the work: sequence parallelism, or data parallelism "
                        "(--dp N: each process its own samples; sampling stays weight-sharded Ulysses)")  # fmt: skip
    parser.add_argument("--no-generate", dest="generate", action="store_false", help="GRPO phases only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        params = save_model(Path(tmp) / "model", args.layers)
        print(f"model: {params / 1e6:.0f} M parameters ({params * 4 / 2**30:.2f} GiB in fp32), {args.layers} blocks")
        train = {"model": str(Path(tmp) / "model"), "prompts": "toy_prompts_train.txt", "checkpoint_every": 0,
                 "sample": {"frames": 5, "height": 32, "width": 32, "guidance": 1.0, "max_sequence_length": 16},
                 "grpo": {"steps": 2, "group_size": 2, "prompts_per_step": 1, "train_fraction": 1.0}}  # fmt: skip
        sample = GenerateConfig(model=str(Path(tmp) / "model"), steps=2, frames=5, height=32, width=32,
                                max_sequence_length=16, out=str(Path(tmp) / "v.mp4"))  # fmt: skip
        rows: dict[str, dict[str, float]] = {}
        runs = [(world, kind) for world in args.worlds for kind in (args.layouts if world > 1 else ["ulysses"])]
        for world, kind in runs:
            label = str(world) if world == 1 else f"{world} ({kind})"
            config = TrainConfig.from_dict(train | {kind: world, "output_dir": str(Path(tmp) / f"run{world}{kind}")})
            peaks = spawn(train_worker, world, args=(config,), timeout=3600)
            layout = {"ulysses": world, "shard_weights": world > 1}
            if args.generate:
                peaks = [p | g for p, g in zip(peaks, spawn(generate_worker, world,
                                                            args=(dataclasses.replace(sample, **layout),),
                                                            timeout=3600))]  # fmt: skip
            rows[label] = {key: max(p[key] for p in peaks) for key in peaks[0]}
    phases = list(next(iter(rows.values())))
    print("\nper-process peak RSS, MiB (the largest over the ranks); in brackets: the ratio to 1 process")
    print(f"{'processes':>12}" + "".join(f"{phase:>20}" for phase in phases))
    base = rows.get("1")
    for label, row in rows.items():
        cells = [f"{row[p]:>9.0f}" + (f" ({row[p] / base[p]:.2f}x)" if base else "") for p in phases]
        print(f"{label:>12}" + "".join(f"{c:>20}" for c in cells))
    print("setup: load + shard + embeddings; rollout: sampling + rewards; step: one full GRPO iteration (update "
          "included); generate: one video, --shard-weights on several processes")  # fmt: skip


if __name__ == "__main__":
    main()
