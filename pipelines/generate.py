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
import sys
import typing

from dit_sp.inference.config import GenerateConfig
from dit_sp.io.cli import ArgumentParser, launch, run_main
from dit_sp.io.runlock import run_lock
from dit_sp.io.schema import ConfigError, help_of, to_yaml
from dit_sp.io.usage import HelpFormatter, prog, shown, with_default
from dit_sp.parallel.state import collective_timeout
from dit_sp.zoo import CHECKPOINT_DEFAULTS, builtin_models, model_defaults, models_help, random_weights_note


def parse_args(argv: list[str] | None = None) -> tuple[GenerateConfig, bool]:
    """The settings, and whether ``--print-config`` asks for them to be printed instead of run."""
    defaults, decided = GenerateConfig.load(), _model_settings()  # the default model's: what --help shows
    parser = ArgumentParser(prog=prog("pipelines.generate"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--config", help="YAML file of settings, or a bundled config name (flags override it)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved settings as YAML (a --config file) and exit")  # fmt: skip
    hints = typing.get_type_hints(GenerateConfig)
    for field in dataclasses.fields(GenerateConfig):
        if str(field.type).startswith(("dict", "list")):
            continue  # a model config's tables (cache_thresholds, ...): YAML only
        flag, value = "--" + field.name.replace("_", "-"), getattr(defaults, field.name)
        if field.name == "model":
            text = f"{models_help()}; or a local diffusers directory (default: {value})"
        elif field.name in decided:  # the model's defaults come before the file and the flags
            text = f"{help_of(GenerateConfig, field.name)} (default: the model's; {defaults.model}: {shown(value)})"
        else:
            text = with_default(help_of(GenerateConfig, field.name), value)
        text = text.replace("%", "%%")  # argparse formats help with %
        if field.type in ("bool", bool):  # on by default: --no-NAME turns it off
            action = argparse.BooleanOptionalAction if field.default is True else "store_true"
            parser.add_argument(flag, dest=field.name, action=action, default=None, help=text)
        else:  # typed and range-checked by GenerateConfig.load
            kind = hints[field.name]  # a Literal's values as the metavar, checked by GenerateConfig.load
            metavar = "{" + ",".join(typing.get_args(kind)) + "}" if typing.get_origin(kind) is typing.Literal else None
            parser.add_argument(flag, dest=field.name, help=text, metavar=metavar)
    parser.add_argument(
        "--lora", action="append", metavar="PATH[:SCALE]", help=help_of(GenerateConfig, "lora") + " (default: none)"
    )  # a list: the loop skips it
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    print_config = args.pop("print_config")
    try:
        config = GenerateConfig.load(args.pop("config", None), args)
        collective_timeout(config.collective_timeout)  # refused before any worker starts
        return config, print_config
    except (ConfigError, FileNotFoundError, ValueError) as e:
        parser.error(str(e))


def _model_settings() -> set[str]:
    """The settings a model's defaults give (a built-in model's, a checkpoint's by its pipeline class)."""
    tables = [model_defaults(name) for name in builtin_models()] + list(CHECKPOINT_DEFAULTS.values())
    return set().union(*tables)


def main(argv: list[str] | None = None) -> None:
    config, print_config = parse_args(argv)
    if print_config:
        print(to_yaml(config), end="")
        return
    if "RANK" not in os.environ and config.world_size > 1:
        from dit_sp.parallel.launch import prestart

        prestart("dit_sp.inference.run")  # the workers' imports overlap this process's checks
    from dit_sp.inference.batch import batch_layout, read_batch
    from dit_sp.inference.checks import check_before_loading

    note = random_weights_note(config.model)
    if note and os.environ.get("RANK", "0") == "0":  # once: under torchrun every rank runs this
        print(note, file=sys.stderr, flush=True)
    batch = config.prompts is not None and os.environ.get("RANK", "0") == "0"
    with run_lock(batch_layout(config)[0], enabled=batch):  # one batch per output directory
        if config.prompts is None:
            check_before_loading(config)  # one line for a bad size or output, before any worker starts
        else:
            for video in read_batch(config):
                check_before_loading(video)
        reports = launch("dit_sp.inference.run:generate", config.world_size, args=(config,))
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
        if "refiner_layout" in reports[0]:
            print(f"refiner on {reports[0]['refiner_layout']}")
        return
    for report in reports:
        if "out" in report:
            print(f"wrote {report['out']}" + (f" and {report['latents']}" if "latents" in report else ""))
            if config.compile and config.steps > 1:  # the first step compiles: the steps after it are the speed
                print(f"layout {report['layout']}: {report['seconds']:.1f} s; compile: "
                      f"{report['first_step_seconds']:.1f} s (first step), then {report['later_seconds_per_step']:.3f} "
                      "s/step")  # fmt: skip
            else:
                print(f"layout {report['layout']}: {report['seconds']:.1f} s, {report['seconds_per_step']:.3f} s/step")
            if "refiner_layout" in report:
                print(f"refiner on {report['refiner_layout']}: {report['refine_seconds']:.1f} s")


if __name__ == "__main__":
    run_main(main)
