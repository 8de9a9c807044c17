"""Plan a GRPO run's memory before launching it: per GPU and per component, for the layout it would choose.

    python -m pipelines.plan --config grpo_hunyuanvideo --gpus 32
    python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 8 --gpu-memory 40 --ulysses 2
    python -m pipelines.plan --config my_run.yaml --gpus 16 --arch wan2.2-t2v-a14b

The transformer is built on the meta device from the checkpoint's config (a local ``--model`` directory, or
the architecture named by ``--arch`` or found in the model path), so counts are exact; activations follow a
per-token model measured on real forward/backward passes (``dit_sp.memory.planner``).
"""

from __future__ import annotations

import argparse

from dit_sp.io.cli import run_main
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.memory.planner import ARCHITECTURES, plan_training
from dit_sp.rl.config import TrainConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog("pipelines.plan"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--config", required=True, help="a GRPO config: YAML file or bundled name")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs of the run, over all nodes")
    parser.add_argument("--gpu-memory", type=float, default=80, help="memory per GPU in GiB")
    parser.add_argument(
        "--arch",
        choices=sorted(ARCHITECTURES),
        help="the model's architecture (default: read from the model directory or its name)",
    )
    parser.add_argument("--ring", type=int, help="ring degree (default: the smallest sequence parallelism that fits)")
    parser.add_argument(
        "--ulysses", type=int, help="Ulysses degree (default: the smallest sequence parallelism that fits)"
    )
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be >= 1, got {args.gpus}")
    config = TrainConfig.load(args.config)
    plan = plan_training(config, args.gpus, args.gpu_memory, arch=args.arch, ring=args.ring, ulysses=args.ulysses)
    print(plan.report())


if __name__ == "__main__":
    run_main(main)
