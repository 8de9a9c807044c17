"""Generate a video with a diffusers text-to-video pipeline (Wan, CogVideoX, HunyuanVideo), sequence-parallel
on any layout.

    python -m pipelines.generate                                   # the shipped toy model, one process
    python -m pipelines.generate --model tiny-hunyuanvideo --ring 2  # or tiny-cogvideox; 2 worker processes
    python -m pipelines.generate --ulysses 2 --ring 2 --out a.mp4  # 4 local worker processes
    python -m pipelines.generate --cfg-parallel --ulysses 2        # guidance branches on 2 x 2 processes
    torchrun --nnodes 2 --nproc-per-node 8 -m pipelines.generate --model /ckpt/Wan2.1-T2V-14B-Diffusers \\
        --config wan2.1-t2v-14b --ulysses 8 --cfg-parallel         # multi-node: dp = rest

Settings come from the model's defaults, then ``--config FILE.yaml`` (or a bundled config name), then the
flags given (``dit_sp.inference.GenerateConfig``). ``--guidance`` is classifier-free guidance in every family:
HunyuanVideo's ``true_cfg_scale`` (with the negative prompt), the others' ``guidance_scale``; HunyuanVideo's
distilled guidance is ``--embedded-guidance``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from dit_sp.inference import GenerateConfig, batch_layout, check_before_loading, generate, read_batch
from dit_sp.io.cli import launch, run_main
from dit_sp.io.runlock import run_lock
from dit_sp.io.schema import ConfigError
from dit_sp.zoo import builtin_models


def parse_args(argv: list[str] | None = None) -> GenerateConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of settings, or a bundled config name (flags override it)")
    for field in dataclasses.fields(GenerateConfig):
        if str(field.type).startswith(("dict", "list")):
            continue  # a model config's tables (cache_thresholds, ...): YAML only
        flag = "--" + field.name.replace("_", "-")
        help_text = f"built-in {builtin_models()} or a local diffusers directory" if field.name == "model" else None
        if field.type in ("bool", bool):  # on by default: --no-NAME turns it off
            action = argparse.BooleanOptionalAction if field.default is True else "store_true"
            parser.add_argument(flag, dest=field.name, action=action, default=None)
        else:  # typed and range-checked by GenerateConfig.load
            parser.add_argument(flag, dest=field.name, help=help_text)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    try:
        return GenerateConfig.load(args.pop("config", None), args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    batch = config.prompts is not None and os.environ.get("RANK", "0") == "0"
    with run_lock(batch_layout(config)[0], enabled=batch):  # one batch per output directory
        if config.prompts is None:
            check_before_loading(config)  # one line for a bad size or output, before any worker starts
        else:
            for video in read_batch(config):
                check_before_loading(video)
        reports = launch(generate, config.world_size, args=(config,))
    caches = [r["cache"] for r in reports if "cache" in r]
    if caches:  # every rank of a branch decides alike; the branches may differ
        run, total = sum(c["blocks_run"] for c in caches), sum(c["blocks"] for c in caches)
        print(
            f"cache {caches[0]['cache']} skipped {1 - run / total:.0%} of the transformer block evaluations "
            f"({total - run} of {total}, all ranks)"
        )
    if config.prompts is not None:
        leaders = [r for r in reports if "written" in r]
        videos, seconds = sum(len(r["written"]) for r in leaders), max(r["seconds"] for r in reports)
        skipped = sum(r["skipped"] for r in leaders)
        print(f"wrote {videos} videos to {batch_layout(config)[0]} ({skipped} already there, skipped); "
              f"{videos / max(seconds, 1e-9) * 3600:.0f} videos/hour on {reports[0]['layout']}")  # fmt: skip
        return
    for report in reports:
        if "out" in report:
            print(f"wrote {report['out']}" + (f" and {report['latents']}" if "latents" in report else ""))
            print(f"layout {report['layout']}: {report['seconds']:.1f} s, {report['seconds_per_step']:.3f} s/step")


if __name__ == "__main__":
    run_main(main)
