"""Plan a GRPO run's memory before launching it: per GPU and per component, for the layout it would choose,
where the peak is (set-up or training, and which component) and what would lower that peak.

    python -m pipelines.plan --config grpo_hunyuanvideo --gpus 32
    python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 8 --gpu-memory 40 --ulysses 2
    python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 8 --gpu-memory 24 --set grpo.micro_batch=2
    python -m pipelines.plan --config my_run.yaml --gpus 16 --arch wan2.2-t2v-a14b

The transformer is built on the meta device from the checkpoint's config (a local ``--model`` directory, or
the architecture named by ``--arch`` or found in the model path), so counts are exact; activations follow a
per-token model measured on real forward/backward passes (``dit_sp.memory.planner``). ``--set`` changes any
config value as train_grpo's does, so an override is planned without writing a YAML file.
"""

from __future__ import annotations

from dit_sp.io.cli import ArgumentParser, finite_float, parse_key_values, run_main
from dit_sp.io.schema import ConfigError
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.memory.planner import ARCHITECTURES, plan_training
from dit_sp.rl.config import TrainConfig


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=prog("pipelines.plan"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--config", help="a GRPO config: YAML file or bundled name (default: TrainConfig's defaults)")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs of the run, over all nodes")
    parser.add_argument("--gpu-memory", type=finite_float, default=80, help="memory per GPU in GiB")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES),
                        help="the model's architecture (default: read from the model directory or name)")  # fmt: skip
    parser.add_argument("--ring", type=int, help="ring degree (default: the smallest sequence parallelism that fits)")
    parser.add_argument("--ulysses", type=int,
                        help="Ulysses degree (default: the smallest sequence parallelism that fits)")  # fmt: skip
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any config value by dotted key, e.g. --set grpo.micro_batch=2")  # fmt: skip
    parser.add_argument("--embeddings-cached", action="store_true",
                        help="every prompt's embedding is already in the run's embedding_cache, so the text "
                             "encoder never loads (default: it loads at set-up to encode them)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be >= 1, got {args.gpus}")
    if not args.gpu_memory > 0:
        parser.error(f"--gpu-memory must be > 0 GiB, got {args.gpu_memory}")
    try:
        config = TrainConfig.load(args.config, parse_key_values(args.settings, "--set", "grpo.micro_batch=2"))
    except (ConfigError, FileNotFoundError) as e:
        parser.error(str(e))
    plan = plan_training(config, args.gpus, args.gpu_memory, arch=args.arch, ring=args.ring, ulysses=args.ulysses,
                         embeddings_cached=args.embeddings_cached)  # fmt: skip
    print(plan.report())


if __name__ == "__main__":
    run_main(main)
