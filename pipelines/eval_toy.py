"""Prompt faithfulness of a text-to-video model of the synthetic shape world, per attribute.

    python -m pipelines.eval_toy                                   # the shipped model, held-out prompts
    python -m pipelines.eval_toy --model outputs/grpo_toy/final --baseline assets/toy-wan

Each prompt is sampled with ``--seeds`` seeds (ODE sampling, guidance), and ``dit_sp.toyworld.evaluate``
reads colour, shape and direction back from the pixels. With ``--baseline``, both models are sampled
from the same noise and the gain in faithfulness is reported with a 95% confidence interval of the
paired per-sample differences.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from tqdm import tqdm

from dit_sp import toyworld
from pipelines.models import load_pipeline

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "assets" / "toy-wan"
ATTRIBUTES = ("color", "shape", "direction")


@torch.no_grad()
def sample_scores(model: str | Path, prompts: list[str], seeds: int, steps: int = 20, guidance: float = 4.0,
                  frames: int = 9, size: int = 32) -> list[dict[str, bool]]:  # fmt: skip
    """Per sample (seed-major, then prompt): which attributes the generated video shows as asked."""
    pipe = load_pipeline(str(model), torch.float32)
    pipe.set_progress_bar_config(disable=True)
    scores = []
    for seed in tqdm(range(seeds), desc=f"eval {Path(model).name}", leave=False):
        videos = pipe(prompt=prompts, negative_prompt=[""] * len(prompts), height=size, width=size, num_frames=frames,
                      num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=16,
                      generator=torch.Generator().manual_seed(seed), output_type="pt").frames  # fmt: skip
        for video, prompt in zip(videos, prompts):
            scores.append(dict(zip(ATTRIBUTES, toyworld.matches(video, toyworld.Attributes.parse(prompt)))))
    return scores


def summarize(scores: list[dict[str, bool]]) -> dict[str, float]:
    accuracy = {key: sum(s[key] for s in scores) / len(scores) for key in ATTRIBUTES}
    return accuracy | {"faithfulness": sum(accuracy.values()) / 3, "samples": len(scores)}


def paired_gain(scores: list[dict[str, bool]], baseline: list[dict[str, bool]]) -> dict[str, float]:
    """Mean per-sample faithfulness difference and its 95% confidence interval (normal approximation)."""
    diffs = [sum(a.values()) / 3 - sum(b.values()) / 3 for a, b in zip(scores, baseline)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1))
    half = 1.96 * sd / math.sqrt(len(diffs))
    return {"gain": mean, "gain_ci95": [mean - half, mean + half]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--baseline", help="a second model, sampled from the same noise; reports the paired gain")
    parser.add_argument("--prompts", default=str(REPO / "assets" / "toy_prompts_heldout.txt"))
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.0)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        parser.error(f"--seeds and --steps must be at least 1, got {args.seeds} and {args.steps}")
    if not Path(args.prompts).is_file():
        parser.error(f"prompt file {args.prompts} does not exist (one toy caption per line)")
    prompts = [p.strip() for p in Path(args.prompts).read_text().splitlines() if p.strip()]
    if not prompts:
        parser.error(f"prompt file {args.prompts} has no prompts")
    try:
        for prompt in prompts:
            toyworld.Attributes.parse(prompt)
    except ValueError as e:
        parser.error(f"{args.prompts}: {e}")
    scores = sample_scores(args.model, prompts, args.seeds, args.steps, args.guidance)
    result: dict = summarize(scores)
    if args.baseline:
        base = sample_scores(args.baseline, prompts, args.seeds, args.steps, args.guidance)
        result = {"model": result, "baseline": summarize(base)} | paired_gain(scores, base)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
