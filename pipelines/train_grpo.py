"""GRPO fine-tuning of a video DiT, sequence-parallel (USP) inside FSDP2, with exact resume.

    python -m pipelines.train_grpo --config grpo_tiny_wan              # one process (a bundled config)
    python -m pipelines.train_grpo --config grpo_tiny_wan --ulysses 2  # 2 local workers
    torchrun --nnodes 4 --nproc-per-node 8 -m pipelines.train_grpo --config my_run.yaml \\
        --ulysses 4 --ring 2                                           # dp = the rest

The config is a YAML file (a path, or a bundled config name: configs/) of ``dit_sp.TrainConfig``;
flags override it. The trainer is ``dit_sp.GRPOTrainer``.
"""

from __future__ import annotations

import os
from pathlib import Path

from dit_sp.io.cli import ArgumentParser, launch, parse_key_values, run_main
from dit_sp.io.runlock import run_lock
from dit_sp.io.schema import ConfigError, help_of, to_yaml
from dit_sp.io.usage import HelpFormatter, prog, with_default
from dit_sp.parallel.state import collective_timeout
from dit_sp.rl.config import TrainConfig

FLAGS = {  # flag: type; each sets the TrainConfig key of the same name (help: the field's ``setting``)
    "model": str, "output_dir": str, "max_steps": int, "checkpoint_every": int, "eval_every": int, "ulysses": int,
    "ring": int, "dp": int, "collective_timeout": float, "prompts": str, "seed": int,
}  # fmt: skip
SWITCHES = ("resume", "overwrite")


def _help(name: str) -> str:
    """A flag's help and TrainConfig's default, which applies where the --config file says nothing."""
    return with_default(help_of(TrainConfig, name), getattr(TrainConfig(), name))


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, bool]:
    """The run's settings, and whether ``--print-config`` asks for them to be printed instead of run."""
    parser = ArgumentParser(prog=prog("pipelines.train_grpo"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "--config",
        default=None,
        help="YAML training config, a path or a bundled name (default: none); the flags override it, and the "
        "defaults below apply where it says nothing",
    )
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML (a --config file) and exit")  # fmt: skip
    for name, kind in FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=_help(name))
    for name in SWITCHES:
        parser.add_argument(f"--{name}", action="store_true", default=None, help=_help(name))
    parser.add_argument("--allow-change", dest="allow_change", action="append", metavar="KEY",
                        help="with --resume: let the run continue with a changed setting (e.g. optim.lr), "
                             "recorded in OUTPUT_DIR/config_changes.jsonl; repeatable (default: none)")  # fmt: skip
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any config value by dotted key, e.g. --set grpo.group_size=4 (a YAML value; "
                        "repeatable; default: none)")  # fmt: skip
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    path, settings, print_config = args.pop("config", None), args.pop("settings"), args.pop("print_config")
    try:
        args |= parse_key_values(settings, "--set", "grpo.group_size=4")
        config = TrainConfig.load(path, args)
        collective_timeout(config.collective_timeout)  # refused before any worker starts
        return config, print_config
    except (ConfigError, FileNotFoundError) as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> None:
    config, print_config = parse_args(argv)
    if print_config:
        print(to_yaml(config), end="")
        return
    if "RANK" not in os.environ and config.world_size > 1:
        from dit_sp.parallel.launch import prestart

        prestart("dit_sp.rl.trainer")  # the workers' imports overlap this process's checks
    from dit_sp.rl.preflight import check_before_loading

    with run_lock(config.output_dir, enabled=os.environ.get("RANK", "0") == "0"):  # one run per directory
        check_before_loading(config, int(os.environ.get("WORLD_SIZE", config.world_size)))
        results = launch("dit_sp.rl.trainer:train", config.world_size, args=(config,))
    rows = results[0]["rows"]
    if rows:
        first, last = rows[0], rows[-1]
        reward = [f"{r['reward_mean']:.4f}" if r["reward_mean"] is not None else "n/a" for r in (first, last)]
        print(f"steps {first['step']}..{last['step']}: reward {reward[0]} -> {reward[1]}")
        print(f"metrics: {Path(config.output_dir) / 'metrics.jsonl'}, final weights: {results[0]['final']}")


if __name__ == "__main__":
    run_main(main)
