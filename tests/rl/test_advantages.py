"""Group advantages, per-prompt statistics and groups spanning data-parallel ranks."""

from __future__ import annotations

import pytest
import torch

from dit_sp import spawn
from dit_sp.rl import (
    group_advantages,
)
from dit_sp.rl.advantages import PromptStats


def test_group_advantages():
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0, float("nan"), 2.0])
    ids = torch.tensor([0, 0, 1, 1, 1, 2])
    adv = group_advantages(rewards, ids, eps=0.0, clip=5.0)
    torch.testing.assert_close(adv[:2], torch.tensor([-1.0, 1.0]))
    assert adv[2] == 0 and adv[3] == 0  # equal rewards: no signal (std 0 -> 0/eps = 0)
    assert torch.isnan(adv[4])  # failed reward: masked out of the loss
    assert adv[5] == 0  # a group of one
    clipped = group_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), eps=0.0, clip=1.5)
    assert clipped.max() == 1.5
    glob = group_advantages(torch.tensor([1.0, 3.0, 10.0, 20.0]), torch.tensor([0, 0, 1, 1]), std="global", eps=0.0)
    torch.testing.assert_close(
        glob[:2], torch.tensor([-1.0, 1.0]) / torch.tensor([1.0, 3.0, 10.0, 20.0]).std(unbiased=False)
    )


def test_per_prompt_statistics_track_past_iterations_and_restore():
    stats = PromptStats(history=1)
    first = stats.advantages(torch.tensor([1.0, 3.0, 0.0, 2.0]), torch.tensor([0, 0, 1, 1]), eps=0.0)
    assert torch.equal(first, group_advantages(torch.tensor([1.0, 3.0, 0.0, 2.0]), torch.tensor([0, 0, 1, 1]), eps=0.0))
    second = stats.advantages(torch.tensor([5.0, float("nan"), 7.0]), torch.tensor([0, 0, 0]), eps=0.0)
    tracked = torch.tensor([1.0, 3.0, 5.0, 7.0])  # last iteration's and this one's valid rewards of prompt 0
    expected = (torch.tensor([5.0, 7.0]) - tracked.mean()) / tracked.std(unbiased=False)
    torch.testing.assert_close(second[[0, 2]], expected)
    assert torch.isnan(second[1])
    stats.advantages(torch.tensor([4.0]), torch.tensor([0]), eps=0.0)
    assert stats.rewards[0] == [[5.0, 7.0], [4.0]]  # history 1: the oldest iteration dropped
    restored = PromptStats(history=5)
    restored.load_state_dict(stats.state_dict())
    again = [s.advantages(torch.tensor([2.0, 6.0]), torch.tensor([1, 1]), eps=0.0) for s in (stats, restored)]
    assert torch.equal(again[0], again[1]) and restored.history == 1


def _dp_advantages() -> list[float]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # prompt 7 has samples on both ranks; prompt rank+10 only locally
    rewards = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([3.0, 4.0])
    ids = torch.tensor([7, 7]) if rank == 0 else torch.tensor([7, 11])
    return group_advantages(rewards, ids, group=dist.group.WORLD, eps=0.0).tolist()


def test_groups_spanning_data_parallel_ranks():
    rank0, rank1 = spawn(_dp_advantages, 2, timeout=120)
    std = torch.tensor([1.0, 2.0, 3.0]).std(unbiased=False).item()
    assert rank0 == pytest.approx([-1 / std, 0.0])
    assert rank1 == pytest.approx([1 / std, 0.0])
