"""Train the tiny text-to-video model of the synthetic shape world, shipped as the default model.

    python -m pipelines.train_toy       # VAE, then transformer; writes assets/toy-wan (~20 min, 2 CPUs)
    python -m pipelines.train_toy --stage transformer   # reuse the VAE in --work-dir

The model and its training are ``dit_sp.toy.model``; deterministic for a given torch version and --threads.
"""

from __future__ import annotations

from pathlib import Path

from dit_sp.io.bundled import ASSET_DIR
from dit_sp.io.cli import ArgumentParser, run_main
from dit_sp.io.usage import HelpFormatter, prog


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=prog("pipelines.train_toy"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--stage", choices=["all", "vae", "transformer"], default="all",
                        help="what to train: all (the VAE, then the transformer), or one of them")  # fmt: skip
    parser.add_argument("--vae-steps", type=int, default=1500, help="VAE optimiser steps")
    parser.add_argument("--transformer-steps", type=int, default=2500, help="transformer optimiser steps")
    parser.add_argument("--seeds-per-caption", type=int, default=12, help="training videos rendered per caption")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the initial weights")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the result depends on it)")
    parser.add_argument(
        "--work-dir", type=Path, default=Path("outputs/toy"), help="intermediate files (the VAE stage's)"
    )
    parser.add_argument("--out", type=Path, default=ASSET_DIR / "toy-wan", help="where the trained pipeline is saved")
    args = parser.parse_args(argv)
    for name in ("vae_steps", "transformer_steps", "seeds_per_caption", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    import torch

    from dit_sp.toy.model import train_toy_model

    torch.set_num_threads(args.threads)
    seconds = train_toy_model(args.out, work_dir=args.work_dir, stage=args.stage, vae_steps=args.vae_steps,
                              transformer_steps=args.transformer_steps, seeds_per_caption=args.seeds_per_caption,
                              seed=args.seed)  # fmt: skip
    print(f"wrote {args.work_dir / 'vae' if args.stage == 'vae' else args.out} in {seconds:.0f} s")


if __name__ == "__main__":
    run_main(main)
