"""Prompt faithfulness of a text-to-video model of the synthetic shape world, per attribute.

    python -m pipelines.eval_toy                                   # the shipped model, held-out prompts
    python -m pipelines.eval_toy --model outputs/grpo_toy/final --baseline toy-wan
    python -m pipelines.eval_toy --cache teacache:0.1 --baseline toy-wan --seeds 64  # cached vs uncached

Each prompt is sampled with ``--seeds`` seeds (ODE sampling, guidance), and ``dit_sp.toy.world.evaluate``
reads colour, shape and direction back from the pixels. With ``--baseline``, both models are sampled
from the same noise and the gain in faithfulness is reported with a 95% confidence interval of the
paired per-sample differences (``dit_sp.toy.model``). With ``--cache NAME[:THRESHOLD]`` the model samples
with that step cache (``dit_sp.cache``), and the fraction of transformer block evaluations it skipped
is reported as ``saved_fraction``.
"""

from __future__ import annotations

import json

from dit_sp.cache import CacheSpec
from dit_sp.io.bundled import asset_path
from dit_sp.io.cli import ArgumentParser, finite_float, run_main
from dit_sp.io.prompts import read_prompt_file
from dit_sp.io.usage import HelpFormatter, prog
from dit_sp.toy import world as toyworld
from dit_sp.zoo import model_defaults


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=prog("pipelines.eval_toy"), description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", default="toy-wan", help="the model evaluated: a built-in name or a local directory")
    parser.add_argument(
        "--baseline", help="a second model, sampled from the same noise; reports the paired gain (default: none)"
    )
    parser.add_argument("--prompts", default="toy_prompts_heldout.txt", help="one toy caption per line")
    parser.add_argument("--seeds", type=int, default=32, help="samples per prompt, each from its own noise")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps (ODE sampling)")
    parser.add_argument("--guidance", type=finite_float, default=4.0, help="classifier-free guidance scale")
    parser.add_argument(
        "--cache",
        help="sample the model with this step cache, NAME[:THRESHOLD]: first_block or teacache (default: off)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        parser.error(f"--seeds and --steps must be at least 1, got {args.seeds} and {args.steps}")
    path = asset_path(args.prompts)
    if path is None or not path.is_file():
        parser.error(f"prompt file {args.prompts} does not exist (one toy caption per line)")
    prompts = [p.strip() for p in read_prompt_file(path)[0] if p.strip()]  # UTF-8, or one line saying where
    if not prompts:
        parser.error(f"prompt file {args.prompts} has no prompts")
    try:
        for prompt in prompts:
            toyworld.Attributes.parse(prompt)
    except ValueError as e:
        parser.error(f"{args.prompts}: {e}")
    from dit_sp.toy.model import cached_sample_scores, paired_gain, sample_scores, summarize

    saved = None
    if args.cache:
        # a bad name or threshold: one line, before anything loads; no threshold: the one measured for the model
        cache = CacheSpec.parse(args.cache, thresholds=model_defaults(args.model).get("cache_thresholds"))
        scores, saved = cached_sample_scores(args.model, prompts, args.seeds, cache, args.steps, args.guidance)
    else:
        scores = sample_scores(args.model, prompts, args.seeds, args.steps, args.guidance)
    result: dict = summarize(scores) | ({} if saved is None else {"cache": str(cache), "saved_fraction": saved})
    if args.baseline:
        base = sample_scores(args.baseline, prompts, args.seeds, args.steps, args.guidance)
        result = {"model": result, "baseline": summarize(base)} | paired_gain(scores, base)
    print(json.dumps(result))


if __name__ == "__main__":
    run_main(main)
