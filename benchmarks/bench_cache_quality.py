"""Quality against saving for the step caches, on the shipped toy model: paired prompt faithfulness of
cached vs uncached sampling (same noise, held-out prompts, ``dit_sp.toy.world`` reads the attributes back
from the pixels) and the fraction of transformer block evaluations skipped, per policy and threshold.

    python benchmarks/bench_cache_quality.py                      # 64 seeds x 8 held-out prompts = 512 samples
    python benchmarks/bench_cache_quality.py --seeds 8 --caches first_block:0.1 teacache:0.2
"""

from __future__ import annotations

import argparse
import time

from dit_sp.cache import CacheSpec
from dit_sp.io.bundled import asset_path
from dit_sp.toy.model import cached_sample_scores, paired_gain, sample_scores, summarize

CACHES = ["first_block:0.08", "first_block:0.12", "first_block:0.2", "teacache:0.1", "teacache:0.2", "teacache:0.3"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy-wan")
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--caches", nargs="+", default=CACHES)
    parser.add_argument("--coefficients", type=float, nargs="+", help="TeaCache's polynomial, highest power first")
    args = parser.parse_args()
    prompts = [p.strip() for p in asset_path("toy_prompts_heldout.txt").read_text().splitlines() if p.strip()]
    start = time.perf_counter()
    baseline = sample_scores(args.model, prompts, args.seeds, args.steps)
    base_seconds = time.perf_counter() - start
    print(f"{args.model}, {len(baseline)} samples ({args.seeds} seeds x {len(prompts)} held-out prompts), "
          f"{args.steps} steps, guidance 4")  # fmt: skip
    print(f"uncached: faithfulness {summarize(baseline)['faithfulness']:.3f} in {base_seconds:.0f} s")
    print("| cache | blocks skipped | faithfulness | change vs uncached (95% CI), points | wall vs uncached |")
    print("|---|---|---|---|---|")
    for cache in args.caches:
        cache = CacheSpec.parse(cache, args.coefficients if cache.startswith("tea") else None)
        start = time.perf_counter()
        scores, saved = cached_sample_scores(args.model, prompts, args.seeds, cache, args.steps)
        seconds = time.perf_counter() - start
        gain = paired_gain(scores, baseline)
        low, high = (100 * x for x in gain["gain_ci95"])
        print(f"| {cache} | {saved:.0%} | {summarize(scores)['faithfulness']:.3f} | {100 * gain['gain']:+.1f} "
              f"[{low:+.1f}, {high:+.1f}] | {seconds / base_seconds:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
