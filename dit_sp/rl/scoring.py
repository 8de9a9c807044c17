"""Decoding sampled latents and scoring them: the rewards of a batch, the same on every rank of the SP
group (scored once per sample, on the group's first rank or each rank its share of the samples, and shared).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist

from dit_sp.parallel.state import ParallelState
from dit_sp.rl.advantages import gather_across
from dit_sp.rl.batch import Batch, select
from dit_sp.rl.policy import Policy
from dit_sp.rl.rewards import WeightedReward
from dit_sp.rl.rollout import Trajectory

Tensor = torch.Tensor


Split = Literal["rows", "samples"] | None
"""How the SP ranks share a decode (``TrainConfig.vae_split``); None: the first rank decodes alone."""


def decode_videos(policy: Policy, final: Tensor, cond: Any, parallel: ParallelState, *,
                  split: Split = None, chunk: int | None = None) -> Tensor | None:  # fmt: skip
    """``(B, F, C, H, W)`` frames of the sampled latents ``final`` on the SP group's first rank (None on the
    others), decoded ``chunk`` videos per VAE call (None: all at once; a decode's activations are a step's
    largest at high resolution, and many small videos decode faster in moderate chunks). ``split``: None,
    the first rank decodes alone; ``"rows"``, every SP rank decodes its rows of each frame
    (``parallelize_vae(..., gather_to=0)``: a collective); ``"samples"``, every SP rank decodes whole
    videos, its share of the batch, gathered on the first (no halo exchange: faster for many small videos)."""
    first = parallel.sp_rank == 0
    if split == "samples" and parallel.sp > 1:
        mine = _decode(policy, final, cond, _my_share(final.shape[0], parallel), chunk).contiguous()
        gathered = [torch.empty_like(mine) for _ in range(parallel.sp)] if first else None
        dist.gather(mine, gathered, dst=dist.get_global_rank(parallel.sp_group, 0), group=parallel.sp_group)
        return torch.cat(gathered)[: final.shape[0]] if first else None
    if first or (split == "rows" and parallel.sp > 1):
        return _decode(policy, final, cond, torch.arange(final.shape[0]), chunk)
    return None


def score_videos(policy: Policy, final: Tensor, cond: Any, prompts: list[str], images: list[str] | None,
                 reward: WeightedReward, parallel: ParallelState, *, split: Split = None,
                 chunk: int | None = None) -> Tensor:  # fmt: skip
    """``(1 + parts, B)`` rewards (``score_batch``) of the sampled latents ``final``, the same on every rank
    of the SP group, so every peer trains on the same. ``split="samples"``: each SP rank decodes and scores
    its own share of the batch and the scores are gathered (no frames travel); otherwise the videos are
    decoded by ``decode_videos`` ``chunk`` at a time and each chunk scored on the first rank before the next
    is decoded (the first rank holds one chunk's frames, not the batch's: a long clip's frames are as large
    as its activations), and the scores broadcast."""
    size = final.shape[0]
    if split == "samples" and parallel.sp > 1:
        local = videos_to_score(policy, final, cond, prompts, images, parallel, split, chunk)
        return share_scores(None if local is None else score_batch(reward, *local), size, reward, parallel, split)
    scored = []
    for rows in torch.arange(size).split(chunk or size):
        picked = rows.tolist()
        videos = decode_videos(policy, final[rows.to(final.device)], select(cond, rows), parallel, split=split)
        if videos is not None:
            scored.append(score_batch(reward, videos, [prompts[i] for i in picked],
                                      None if images is None else [images[i] for i in picked]))  # fmt: skip
        del videos
    return share_scores(torch.cat(scored, 1) if scored else None, size, reward, parallel, split)


def videos_to_score(policy: Policy, final: Tensor, cond: Any, prompts: list[str], images: list[str] | None,
                     parallel: ParallelState, split: Split,
                     chunk: int | None) -> tuple[Tensor, list[str], list[str] | None] | None:  # fmt: skip
    """The videos this SP rank scores, with their prompts and images: its share of the batch with the split
    by samples, else the whole batch on the first rank (None on the others)."""
    if split == "samples" and parallel.sp > 1:
        rows = _my_share(final.shape[0], parallel)
        picked = rows.tolist()
        return (_decode(policy, final, cond, rows, chunk), [prompts[i] for i in picked],
                None if images is None else [images[i] for i in picked])  # fmt: skip
    videos = decode_videos(policy, final, cond, parallel, split=split, chunk=chunk)
    return (videos, prompts, images) if parallel.sp_rank == 0 else None


def share_scores(mine: Tensor | None, size: int, reward: WeightedReward, parallel: ParallelState,
                  split: Split) -> Tensor:  # fmt: skip
    """The ``(1 + parts, size)`` scores on every SP rank from what ``videos_to_score`` gave this one to score
    (``mine``, None where it scored nothing): the shares gathered, or the first rank's broadcast."""
    if split == "samples" and parallel.sp > 1:
        return gather_across(mine.t().to(parallel.device), parallel.sp_group)[:size].t().cpu()
    values = mine if mine is not None else torch.full((len(reward.parts) + 1, size), float("nan"))
    return share_over_sp(values, parallel)


def _my_share(size: int, parallel: ParallelState) -> Tensor:
    """The samples of a batch of ``size`` that this SP rank decodes in a split by samples: as many on every
    rank (the last repeats the batch's last sample), so that the gathers are even."""
    share = -(-size // parallel.sp)
    return torch.arange(parallel.sp_rank * share, (parallel.sp_rank + 1) * share).clamp(max=size - 1)


def _decode(policy: Policy, final: Tensor, cond: Any, rows: Tensor, chunk: int | None) -> Tensor:
    step = chunk or rows.numel()
    with torch.no_grad():
        parts = [rows[start : start + step] for start in range(0, rows.numel(), step)]
        return torch.cat([policy.decode(final[part.to(final.device)], select(cond, part)) for part in parts])


def rewards_of(policy: Policy, traj: Trajectory, batch: Batch, reward: WeightedReward, parallel: ParallelState, *,
               split_decode: Split = None, decode_chunk: int | None = None,
               cond: Any = None) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """The batch's rewards and each part's, the same on every rank of the SP group (``score_videos``)."""
    values = score_videos(policy, traj.final, cond, batch.prompts, batch.images, reward, parallel,
                          split=split_decode, chunk=decode_chunk)  # fmt: skip
    return values[0], dict(zip([name for name, _, _ in reward.parts], values[1:]))


def score_batch(reward: WeightedReward, videos: Tensor, prompts: list[str], images: list[str] | None) -> Tensor:
    """``(1 + parts, B)``: the weighted reward, then each part's."""
    parts = reward.components(videos.float().cpu(), prompts, images)
    total = sum(w * parts[n] for n, w, _ in reward.parts)
    return torch.stack([total, *parts.values()])


def share_over_sp(values: Tensor, parallel: ParallelState) -> Tensor:
    """The SP group's first rank's ``values`` on all its ranks."""
    if parallel.sp_group is not None and parallel.sp > 1:
        values = values.to(parallel.device)
        dist.broadcast(values, src=dist.get_global_rank(parallel.sp_group, 0), group=parallel.sp_group)
        values = values.cpu()
    return values
