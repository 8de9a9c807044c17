"""Group-relative advantages (GRPO): each sample's reward against the other samples of its prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.distributed as dist

Tensor = torch.Tensor


def gather_across(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """Concatenate a ``(N, ...)`` tensor of every rank of ``group`` (rank order); no autograd."""
    if group is None or dist.get_world_size(group) == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def group_advantages(
    rewards: Tensor,
    prompt_ids: Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    std: Literal["group", "global"] = "group",
    eps: float = 1e-4,
    clip: float = 5.0,
    past: Mapping[int, list[float]] | None = None,
) -> Tensor:
    """Advantages ``(r - mean_group) / (std + eps)`` clipped to ``+-clip``, for this rank's samples.

    ``rewards``: ``(N,)`` this rank's rewards, NaN for samples whose reward failed (their advantage is NaN:
    ``grpo_loss`` leaves them out, and they do not count in the statistics). ``prompt_ids``: ``(N,)`` integer id of each
    sample's prompt; samples of one prompt may live on several data-parallel ranks of ``group``: rewards
    are gathered and matched by id. ``std="global"`` uses the standard deviation over all samples.
    ``past``: per prompt id, rewards of earlier iterations that join its group's mean and std
    (``PromptStats``).
    """
    if rewards.shape != prompt_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and prompt_ids {tuple(prompt_ids.shape)} must be (N,)")
    if std not in ("group", "global"):
        raise ValueError(f"std must be 'group' or 'global', got {std!r}")
    rewards = rewards.double()
    all_rewards = gather_across(rewards, group)
    all_ids = gather_across(prompt_ids.long().to(rewards.device), group)
    valid = ~torch.isnan(all_rewards)
    advantages = torch.zeros_like(rewards)
    global_std = all_rewards[valid].std(unbiased=False) if valid.any() else torch.tensor(0.0, dtype=torch.float64)
    for pid in prompt_ids.unique():
        members = (all_ids == pid) & valid
        if not members.any():
            continue
        group_rewards = all_rewards[members]
        if past is not None and past.get(int(pid)):
            earlier = torch.tensor(past[int(pid)], dtype=group_rewards.dtype, device=group_rewards.device)
            group_rewards = torch.cat([earlier, group_rewards])
        scale = group_rewards.std(unbiased=False) if std == "group" else global_std
        mine = (prompt_ids == pid) & ~torch.isnan(rewards)
        if scale + eps > 0:  # identical rewards (a group of one, or no spread) carry no signal
            advantages[mine] = (rewards[mine] - group_rewards.mean()) / (scale + eps)
    advantages[torch.isnan(rewards)] = float("nan")
    return advantages.clamp(-clip, clip).float()


class PromptStats:
    """Flow-GRPO's per-prompt reward statistics: a prompt's advantage is measured against its rewards of the
    last ``history`` iterations it was drawn in as well as this one's, so a small group's mean and spread
    are less noisy. Every rank holds the same statistics (they are updated from rewards gathered over the
    data-parallel group); ``state_dict`` goes into checkpoints, so a resumed run continues them exactly."""

    def __init__(self, history: int):
        if history < 1:
            raise ValueError(f"history must be >= 1 iteration, got {history}")
        self.history = history
        self.rewards: dict[int, list[list[float]]] = {}
        """Per prompt id, its valid rewards of each iteration it was drawn in, oldest first."""

    def advantages(
        self,
        rewards: Tensor,
        prompt_ids: Tensor,
        *,
        group: dist.ProcessGroup | None = None,
        std: Literal["group", "global"] = "group",
        eps: float = 1e-4,
        clip: float = 5.0,
    ) -> Tensor:
        """``group_advantages`` with each prompt's rewards of its last ``history`` iterations joining its
        group; then this iteration's rewards are recorded."""
        past = {pid: [r for rows in kept[-self.history :] for r in rows] for pid, kept in self.rewards.items()}
        advantages = group_advantages(rewards, prompt_ids, group=group, std=std, eps=eps, clip=clip, past=past)
        all_rewards = gather_across(rewards.double(), group).cpu()
        all_ids = gather_across(prompt_ids.long().to(rewards.device), group).cpu()
        valid = ~torch.isnan(all_rewards)
        for pid in all_ids.unique().tolist():
            kept = self.rewards.setdefault(pid, [])
            kept.append(all_rewards[(all_ids == pid) & valid].tolist())
            del kept[: -(self.history + 1)]  # the past `history` iterations, and this one
        return advantages

    def state_dict(self) -> dict:
        return {
            "history": self.history,
            "rewards": {pid: [list(r) for r in rows] for pid, rows in self.rewards.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.history = state["history"]
        self.rewards = {int(pid): [list(r) for r in rows] for pid, rows in state["rewards"].items()}
