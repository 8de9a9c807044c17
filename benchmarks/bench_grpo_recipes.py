"""Cheaper GRPO rollouts on the shipped toy model, side by side: the current recipe (``grpo_toy``: a fixed SDE
window on steps [0, 2) of 10) against MixGRPO's sliding window (with MixGRPO-Flash's coarser ODE tail) and
branching rollouts (a group's shared start evaluated once; with and without the coarse tail), and the current
and the one-step branched recipes on half the samples per step. Every recipe
runs the same seeds on 2 processes (Ulysses 2), in stages of ``--every`` steps (``--resume`` continues a
run exactly); each stage's export is scored by ``eval_toy``'s measurement: held-out prompts, ODE sampling
without guidance, paired against the base model on the same noise. Reported against the wall-clock time
of the training steps (``seconds`` in the metrics, summed) and against the transformer forwards.

    python benchmarks/bench_grpo_recipes.py                      # 7 recipes x 40 steps, about 100 minutes
    python benchmarks/bench_grpo_recipes.py --recipes current branch-1+tail branch-1+tail-half current-half --every 5
    python benchmarks/bench_grpo_recipes.py --recipes current branch --steps 20 --every 10 --seeds 16
    python benchmarks/bench_grpo_recipes.py --recipes branch-1+tail-half nft --steps 10 --every 5 --train-seeds 2

DiffusionNFT (``nft``: ``algorithm: nft``, docs/nft.md) runs beside them on the same prompts, samples per step,
LoRA and learning rate. With ``--train-seeds N`` every recipe trains N times (run seeds 0..N-1) and the report
adds each recipe's mean gain over those runs with a 95% t-interval across them (the run-to-run spread, which
the paired interval of one run does not show).

Results are kept in ``--out`` (``benchmarks/outputs/grpo_recipes``): a finished stage is not re-run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dit_sp.io.bundled import asset_path
from dit_sp.toy.model import paired_gain, sample_scores, summarize

# Every recipe decodes and scores its rollouts split by samples, 32 videos per VAE call (the fastest for
# many small videos).
COMMON = ["vae_split=samples", "vae_batch=32", "eval_every=0", "checkpoint_every=0"]
HALF = ["grpo.prompts_per_step=8"]
RECIPES = {
    "current": [],
    "sliding": ["grpo.sde_window=null", "grpo.sliding_window={size: 2, every: 10, stride: 1}", "grpo.tail_steps=4"],
    "branch": ["grpo.branch=true"],
    "branch+tail": ["grpo.branch=true", "grpo.tail_steps=4"],
    "branch-1+tail": ["grpo.sde_window=[0, 1]", "grpo.branch=true", "grpo.tail_steps=4"],
    "current-half": HALF,
    "branch-1+tail-half": ["grpo.sde_window=[0, 1]", "grpo.branch=true", "grpo.tail_steps=4", *HALF],
    # DiffusionNFT: ODE rollouts (10 steps) from a noise per sample, 2 of the 10 levels trained per iteration,
    # no GRPO window or KL; the same LoRA, learning rate and advantages as the GRPO recipes
    "nft": [
        "algorithm=nft",
        "grpo.same_noise_per_group=false",
        "grpo.sde_window=null",
        "grpo.kl_coef=0",
        "grpo.train_fraction=0.2",
        *HALF,
    ],
}
DESCRIPTIONS = {
    "current": "fixed window [0, 2) of 10 steps",
    "sliding": "sliding window (2 steps, +1 every 10 iterations), ODE tail in 4 steps",
    "branch": "fixed window, branching (step 0 once per group)",
    "branch+tail": "branching, ODE tail in 4 steps",
    "branch-1+tail": "window [0, 1) branched (one SDE step, trained once per group), ODE tail in 4 steps",
    "current-half": "the current recipe on half the samples per step (8 prompts x 16)",
    "branch-1+tail-half": "branch-1+tail on half the samples per step (8 prompts x 16)",
    "nft": "DiffusionNFT, ODE rollouts, 2 of 10 levels trained, 8 prompts x 16",
}


def run_name(recipe: str, seed: int) -> str:
    """A recipe's run directory: its name (run seed 0, as before there were several), or ``NAME-sSEED``."""
    return recipe if seed == 0 else f"{recipe}-s{seed}"


def train_stage(recipe: str, steps: int, out: Path, seed: int = 0) -> None:
    name = run_name(recipe, seed)
    run = out / name
    cmd = [sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_toy", "--ulysses", "2",
           "--output-dir", str(run), "--max-steps", str(steps)]  # fmt: skip
    cmd += ["--resume"] if (run / "checkpoints").is_dir() else ["--overwrite"]
    for setting in COMMON + RECIPES[recipe] + ([f"seed={seed}"] if seed else []):
        cmd += ["--set", setting]
    subprocess.run(cmd, check=True, env=os.environ | {"TQDM_DISABLE": "1"})
    shutil.copytree(run / "final", out / f"{name}-{steps}", dirs_exist_ok=True)


def run_totals(run: Path, steps: int) -> tuple[float, float, float]:
    """Summed step seconds, transformer forwards and seconds outside decoding and scoring (rollouts and
    updates) of a run's first ``steps`` iterations."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = {row["step"]: row for row in rows}  # a resumed run rewrites no step; keep the last of each
    seconds = sum(rows[s]["seconds"] for s in range(steps))
    forwards = sum(rows[s]["transformer_forwards"] for s in range(steps))
    model = sum(rows[s]["seconds/sample"] + rows[s]["seconds/train"] for s in range(steps))
    return seconds, forwards, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="evaluate every N steps")
    parser.add_argument("--seeds", type=int, default=64, help="eval seeds per held-out prompt")
    parser.add_argument("--train-seeds", type=int, default=1, help="training runs per recipe (run seeds 0..N-1)")
    parser.add_argument("--target", type=float, default=7.5, help="paired gain, points, whose time is compared")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/outputs/grpo_recipes"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if results.get("seeds") != args.seeds:
        results = {"seeds": args.seeds, "rows": {}}
    prompts = [p.strip() for p in asset_path("toy_prompts_heldout.txt").read_text().splitlines() if p.strip()]
    base = sample_scores("toy-wan", prompts, args.seeds, guidance=1.0)
    for recipe in args.recipes:
        for seed in range(args.train_seeds):
            name = run_name(recipe, seed)
            for steps in range(args.every, args.steps + 1, args.every):
                key = f"{name}-{steps}"
                if key in results["rows"]:
                    continue
                train_stage(recipe, steps, args.out, seed)
                scores = sample_scores(args.out / key, prompts, args.seeds, guidance=1.0)
                seconds, forwards, model_seconds = run_totals(args.out / name, steps)
                gain = paired_gain(scores, base)
                results["rows"][key] = {"recipe": recipe, "seed": seed, "steps": steps, "seconds": seconds,
                                        "forwards": forwards, "model_seconds": model_seconds,
                                        "faithfulness": summarize(scores)["faithfulness"]} | gain  # fmt: skip
                results_path.write_text(json.dumps(results, indent=1))
                print(json.dumps(results["rows"][key]), flush=True)
    first = {k: r for k, r in results["rows"].items() if r.get("seed", 0) == 0}
    report(first, args.recipes, summarize(base)["faithfulness"], len(base), args.target)
    if args.train_seeds > 1:
        report_over_seeds(results["rows"], args.recipes, args.train_seeds)


def report(rows: dict, recipes: list[str], base: float, samples: int, target: float) -> None:
    print(f"\nheld-out faithfulness without guidance, {samples} paired samples; base model {100 * base:.1f}%")
    reference = {r["steps"]: r for r in rows.values() if r["recipe"] == "current"}
    print("| recipe | steps | step time (s) | vs current | transformer forwards | vs current | faithfulness "
          "| paired gain, points (95% CI) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for recipe in recipes:
        for row in sorted((r for r in rows.values() if r["recipe"] == recipe), key=lambda r: r["steps"]):
            ref = reference.get(row["steps"])
            ratio = {k: f"{row[k] / ref[k]:.2f}" if ref else "" for k in ("seconds", "forwards")}
            low, high = (100 * x for x in row["gain_ci95"])
            print(f"| {recipe}: {DESCRIPTIONS[recipe]} | {row['steps']} | {row['seconds']:.0f} | {ratio['seconds']} "
                  f"| {row['forwards']:.0f} | {ratio['forwards']} | {100 * row['faithfulness']:.1f}% "
                  f"| {100 * row['gain']:+.1f} [{low:+.1f}, {high:+.1f}] |")  # fmt: skip
    ordered = sorted(rows.values(), key=lambda r: r["steps"])
    reached = {recipe: next((r for r in ordered if r["recipe"] == recipe and 100 * r["gain"] >= target), None)
               for recipe in recipes}  # fmt: skip
    print(f"\nfirst evaluated step with a gain of at least +{target} points:")
    for recipe, row in reached.items():
        if row is None:
            print(f"  {recipe}: not reached")
            continue
        current = reached.get("current")
        versus = f" ({row['seconds'] / current['seconds']:.2f}x the current recipe's time)" if current else ""
        print(f"  {recipe}: step {row['steps']}, {row['seconds']:.0f} s of steps{versus}")


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond)."""


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% t-interval (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, T95.get(len(values) - 1, 1.96) * sd / math.sqrt(len(values))


def report_over_seeds(rows: dict, recipes: list[str], seeds: int) -> None:
    """Each recipe's paired gain and step time, mean +- 95% t-interval over its ``seeds`` training runs."""
    print(f"\nover {seeds} training runs per recipe (run seeds 0..{seeds - 1}): mean +- 95% t-interval")
    print("| recipe | steps | step time (s) | paired gain, points |")
    print("|---|---|---|---|")
    for recipe in recipes:
        for steps in sorted({r["steps"] for r in rows.values() if r["recipe"] == recipe}):
            runs = [r for r in rows.values() if r["recipe"] == recipe and r["steps"] == steps]
            if len(runs) < seeds:
                continue
            gain, gain_half = mean_interval([100 * r["gain"] for r in runs])
            time, time_half = mean_interval([r["seconds"] for r in runs])
            print(
                f"| {recipe}: {DESCRIPTIONS[recipe]} | {steps} | {time:.0f} +- {time_half:.0f} "
                f"| {gain:+.1f} +- {gain_half:.1f} |"
            )


if __name__ == "__main__":
    main()
