"""Prompt faithfulness of a text-to-video model of the synthetic shape world, per attribute.

    python -m pipelines.eval_toy                                   # the shipped model, held-out prompts
    python -m pipelines.eval_toy --model outputs/grpo_toy/final --seeds 8

Each prompt is sampled with ``--seeds`` seeds (ODE sampling, guidance), and ``dit_sp.toyworld.evaluate``
reads colour, shape and direction back from the pixels.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dit_sp import toyworld
from pipelines.models import load_pipeline

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "assets" / "toy-wan"


@torch.no_grad()
def evaluate_model(model: str | Path, prompts: list[str], seeds: int, steps: int = 20, guidance: float = 4.0,
                   frames: int = 9, size: int = 32) -> dict[str, float]:  # fmt: skip
    pipe = load_pipeline(str(model), torch.float32)
    pipe.set_progress_bar_config(disable=True)
    hits = {"color": 0, "shape": 0, "direction": 0}
    total = 0
    for seed in range(seeds):
        videos = pipe(prompt=prompts, negative_prompt=[""] * len(prompts), height=size, width=size, num_frames=frames,
                      num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=16,
                      generator=torch.Generator().manual_seed(seed), output_type="pt").frames  # fmt: skip
        for video, prompt in zip(videos, prompts):
            want, seen = toyworld.Attributes.parse(prompt), toyworld.evaluate(video)
            total += 1
            for key in hits:
                hits[key] += int(seen is not None and getattr(seen, key) == getattr(want, key))
    accuracy = {key: value / total for key, value in hits.items()}
    return accuracy | {"faithfulness": sum(accuracy.values()) / 3, "samples": total}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--prompts", default=str(REPO / "assets" / "toy_prompts_heldout.txt"))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.0)
    args = parser.parse_args(argv)
    prompts = [p.strip() for p in Path(args.prompts).read_text().splitlines() if p.strip()]
    result = evaluate_model(args.model, prompts, args.seeds, args.steps, args.guidance)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
