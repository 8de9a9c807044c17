"""Scoring a long clip's rollouts holds one decode chunk's frames at a time: each chunk is decoded and scored
before the next is decoded, and the rewards are those of scoring the whole batch at once."""

from __future__ import annotations

import torch

from dit_sp.parallel.state import single_process_state
from dit_sp.rl.rewards import WeightedReward
from dit_sp.rl.scoring import score_videos


class RecordingPolicy:
    """Decodes latents ``(B, C, F, H, W)`` to frames ``(B, F, 3, H, W)`` (a fixed function of them) and records
    each decode's batch size in ``events``."""

    def __init__(self, events: list[tuple[str, int]]):
        self.events = events

    def decode(self, latents: torch.Tensor, cond: object) -> torch.Tensor:
        self.events.append(("decode", latents.shape[0]))
        return torch.sigmoid(latents[:, :3].transpose(1, 2))


def test_each_chunk_is_scored_before_the_next_is_decoded_with_the_whole_batchs_rewards():
    events: list[tuple[str, int]] = []

    def brightness(videos: torch.Tensor, prompts: list[str], images: list[str] | None = None) -> torch.Tensor:
        events.append(("score", videos.shape[0]))
        return videos.mean(dim=(1, 2, 3, 4))

    reward = WeightedReward([("reward", 1.0, brightness)])
    final = torch.randn(5, 4, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    prompts = [f"prompt {i}" for i in range(5)]
    parallel = single_process_state()
    whole = score_videos(RecordingPolicy(events), final, None, prompts, None, reward, parallel)
    assert events == [("decode", 5), ("score", 5)]
    events.clear()
    chunked = score_videos(RecordingPolicy(events), final, None, prompts, None, reward, parallel, chunk=2)
    assert events == [("decode", 2), ("score", 2), ("decode", 2), ("score", 2), ("decode", 1), ("score", 1)]
    assert chunked.shape == (2, 5)  # the weighted reward, then its one part
    torch.testing.assert_close(chunked, whole, atol=1e-7, rtol=0)
