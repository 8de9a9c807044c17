"""GRPO fine-tuning of a video DiT, sequence-parallel (USP) inside FSDP2, with exact resume.

    python -m pipelines.train_grpo --config grpo_tiny_wan              # one process (a bundled config)
    python -m pipelines.train_grpo --config grpo_tiny_wan --ulysses 2  # 2 local workers
    torchrun --nnodes 4 --nproc-per-node 8 -m pipelines.train_grpo --config my_run.yaml \\
        --ulysses 4 --ring 2                                           # dp = the rest

The config is a YAML file (a path, or a bundled config name: configs/) of ``dit_sp.TrainConfig``;
flags override it. The trainer is ``dit_sp.GRPOTrainer``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dit_sp import TrainConfig
from dit_sp.io.cli import launch, parse_key_values, run_main
from dit_sp.io.runlock import run_lock
from dit_sp.io.schema import ConfigError
from dit_sp.rl.preflight import check_before_loading
from dit_sp.rl.trainer import train

FLAGS = {  # flag: (type, help); each sets the TrainConfig key of the same name
    "model": (str, "built-in model name or local diffusers pipeline directory"),
    "output_dir": (str, "where metrics, checkpoints and the final export go"),
    "max_steps": (int, "GRPO iterations"),
    "checkpoint_every": (int, "checkpoint every N steps (0: only at the end)"),
    "eval_every": (int, "eval video and eval_reward every N steps (0: never)"),
    "ulysses": (int, "Ulysses degree"),
    "ring": (int, "ring degree"),
    "dp": (int, "data-parallel degree (local launch: processes = dp*ring*ulysses)"),
    "prompts": (str, "a .txt (one prompt per line) or .jsonl ({'prompt': ...}) file"),
    "seed": (int, "run seed"),
}


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML training config (a path or a bundled name)")
    for name, (kind, text) in FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=text)
    parser.add_argument("--resume", action="store_true", default=None, help="continue from the latest checkpoint")
    parser.add_argument("--overwrite", action="store_true", default=None, help="replace the run in --output-dir")
    parser.add_argument("--allow-change", dest="allow_change", action="append", metavar="KEY",
                        help="with --resume: let the run continue with a changed setting (e.g. optim.lr), "
                             "recorded in OUTPUT_DIR/config_changes.jsonl; repeatable")  # fmt: skip
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any config value by dotted key, e.g. --set grpo.group_size=4 (a YAML value)")  # fmt: skip
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    path, settings = args.pop("config", None), args.pop("settings")
    try:
        args |= parse_key_values(settings, "--set", "grpo.group_size=4")
        return TrainConfig.load(path, args)
    except (ConfigError, FileNotFoundError) as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    with run_lock(config.output_dir, enabled=os.environ.get("RANK", "0") == "0"):  # one run per directory
        check_before_loading(config, int(os.environ.get("WORLD_SIZE", config.world_size)))
        results = launch(train, config.world_size, args=(config,))
    rows = results[0]["rows"]
    if rows:
        first, last = rows[0], rows[-1]
        reward = [f"{r['reward_mean']:.4f}" if r["reward_mean"] is not None else "n/a" for r in (first, last)]
        print(f"steps {first['step']}..{last['step']}: reward {reward[0]} -> {reward[1]}")
        print(f"metrics: {Path(config.output_dir) / 'metrics.jsonl'}, final weights: {results[0]['final']}")


if __name__ == "__main__":
    run_main(main)
