"""Plan a GRPO run's memory before launching it: per GPU and per component, for the layout it would choose,
where the peak is (set-up or training, and which component) and what would lower that peak. With
``--generate``, plan sampling instead (``generate``'s memory: weights, text encoders, denoising and VAE decode):

    python -m pipelines.plan --config grpo_hunyuanvideo --gpus 32
    python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 8 --gpu-memory 40 --ulysses 2
    python -m pipelines.plan --config grpo_wan2.1_1.3b --gpus 8 --gpu-memory 24 --set grpo.micro_batch=2
    python -m pipelines.plan --config my_run.yaml --gpus 16 --arch wan2.2-t2v-a14b
    python -m pipelines.plan --generate --config wan2.1-t2v-14b --gpus 8 --gpu-memory 40
    python -m pipelines.plan --generate --arch hunyuanvideo --gpus 2 --ulysses 2 --frames 61 --shard-weights

The transformer is built on the meta device from the checkpoint's config (a local ``--model`` directory, or
the architecture named by ``--arch`` or found in the model path), so counts are exact; activations follow a
per-token model measured on real forward/backward passes (``dit_sp.memory.planner``). ``--set`` changes any
config value as train_grpo's does, so an override is planned without writing a YAML file. With
``--generate``, ``--config`` is a generate config and the video and layout flags are generate's; the
architecture is ``--arch``, the config's name or the model's (``dit_sp.memory.sampling``).
"""

from __future__ import annotations

from typing import Any

from dit_sp.io.cli import ArgumentParser, finite_float, parse_key_values, run_main
from dit_sp.io.schema import ConfigError
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.memory.planner import ARCHITECTURES, architecture_name, plan_training
from dit_sp.rl.config import TrainConfig

SAMPLING_FLAGS = (
    "frames",
    "height",
    "width",
    "dtype",
    "cfg_parallel",
    "shard_weights",
    "parallel_vae",
    "free_text_encoders",
)


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
    sampling = parser.add_argument_group("sampling (--generate)")
    sampling.add_argument("--generate", action="store_true",
                          help="plan generate (sampling) instead of GRPO training; --config is then a generate "
                               "config (default: --arch's bundled config if there is one, else generate's "
                               "defaults)")  # fmt: skip
    sampling.add_argument("--frames", type=int, help="video frames (default: the generate config's)")
    sampling.add_argument("--height", type=int, help="frame height in pixels (default: the generate config's)")
    sampling.add_argument("--width", type=int, help="frame width in pixels (default: the generate config's)")
    sampling.add_argument("--dtype", help="compute dtype: bf16, fp16, fp32 (default: the generate config's)")
    sampling.add_argument("--cfg-parallel", action="store_true", default=None,
                          help="the two guidance branches on two halves of a sample's processes "
                               "(default: the generate config's)")  # fmt: skip
    sampling.add_argument("--shard-weights", action="store_true", default=None,
                          help="weights and text encoders sharded over a sample's processes "
                               "(default: the generate config's)")  # fmt: skip
    sampling.add_argument("--no-parallel-vae", dest="parallel_vae", action="store_false", default=None,
                          help="one process decodes the whole video "
                               "(default: each frame's rows split over a sample's processes)")  # fmt: skip
    sampling.add_argument(
        "--no-free-text-encoders",
        dest="free_text_encoders",
        action="store_false",
        default=None,
        help="keep the text encoders through sampling (default: freed before denoising)",
    )
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be >= 1, got {args.gpus}")
    if not args.gpu_memory > 0:
        parser.error(f"--gpu-memory must be > 0 GiB, got {args.gpu_memory}")
    if args.generate:
        if args.settings or args.embeddings_cached:
            parser.error("--set and --embeddings-cached plan GRPO training: drop them with --generate")
        print(_sampling_plan(parser, args).report())
        return
    given = [name for name in SAMPLING_FLAGS if getattr(args, name) is not None]
    if given:
        parser.error(f"--{given[0].replace('_', '-')} plans sampling: add --generate")
    try:
        config = TrainConfig.load(args.config, parse_key_values(args.settings, "--set", "grpo.micro_batch=2"))
    except (ConfigError, FileNotFoundError) as e:
        parser.error(str(e))
    plan = plan_training(config, args.gpus, args.gpu_memory, arch=args.arch, ring=args.ring, ulysses=args.ulysses,
                         embeddings_cached=args.embeddings_cached)  # fmt: skip
    print(plan.report())


def _sampling_plan(parser: ArgumentParser, args: Any) -> Any:
    """The sampling plan of ``args``: the generate config (``--config``, or the model's defaults) with the given
    flags over it, on the architecture of ``--arch``, the config's name or the model's."""
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.io.bundled import bundled_configs
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    overrides = {name: getattr(args, name) for name in ("ring", "ulysses", *SAMPLING_FLAGS)}
    overrides = {name: value for name, value in overrides.items() if value is not None}
    name = args.config
    if name is None and args.arch is not None and args.arch in bundled_configs():
        name = args.arch  # the bundled generate config of the architecture: its published video size and layout
    try:
        config = GenerateConfig.load(name, overrides)
    except (ConfigError, FileNotFoundError) as e:
        parser.error(str(e))
    arch = args.arch or architecture_name(str(args.config or "")) or architecture_name(config.model)
    if arch is None:
        parser.error(f"cannot tell the architecture of {config.model!r}: pass --arch, one of {sorted(ARCHITECTURES)}")
    try:
        settings = SamplingSettings(arch, frames=config.frames, height=config.height, width=config.width,
                                    dtype=config.dtype, ring=config.ring, ulysses=config.ulysses,
                                    cfg_parallel=config.cfg_parallel, guidance=config.guidance > 1,
                                    shard_weights=config.shard_weights, parallel_vae=config.parallel_vae,
                                    free_text_encoders=config.free_text_encoders)  # fmt: skip
        return plan_sampling(settings, args.gpus, args.gpu_memory)
    except ConfigError as e:
        parser.error(str(e))


if __name__ == "__main__":
    run_main(main)
