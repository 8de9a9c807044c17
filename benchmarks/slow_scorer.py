"""A stand-in for a reward model on another machine: brightness after a pause per video (a model's time
grows with the videos it scores), served by ``python -m pipelines.reward_server --reward
slow_scorer:brightness_after_pause`` in bench_grpo."""

import os
import time


def brightness_after_pause(videos, prompts):
    time.sleep(float(os.environ.get("SLOW_SCORER_SECONDS", "0.05")) * videos.shape[0])
    return videos.flatten(1).mean(1)
