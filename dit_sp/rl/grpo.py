"""One GRPO iteration: roll out groups of samples with the SDE, score them, update the policy.

Everything a sequence-parallel group shares is made identical on its ranks by construction: prompts,
initial noise and every SDE noise draw come from per-sample seeds (independent of the rank layout),
trained timesteps from the step's seed, and rewards are scored once per sample (on the group's first
rank, or each rank its share of the samples) and shared. Rollout and training run the same batch, so
before the first update the recomputed log-probabilities equal the sampled ones bit for bit (ratio
exactly 1).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist

from dit_sp.errors import ConfigError
from dit_sp.parallel.state import ParallelState
from dit_sp.rl.advantages import gather_across
from dit_sp.rl.loss import LossStats, grpo_loss, kl_to_reference
from dit_sp.rl.rewards import WeightedReward
from dit_sp.rl.rollout import Trajectory, branched_trajectory, sample_trajectory, shared_velocity
from dit_sp.rl.schedule import shifted_sigmas, shifted_sigmas_between
from dit_sp.rl.sde import SDEConfig, Transition

Tensor = torch.Tensor
Split = Literal["rows", "samples"] | None
"""How the SP ranks share a decode (``TrainConfig.vae_split``); None: the first rank decodes alone."""


class Policy(Protocol):
    """What GRPO needs from a model family: conditioning, guided velocity, decoding."""

    def encode(self, prompts: list[str], images: list[str] | None = None) -> Any:
        """The conditioning of a batch: its prompts and, for an image-to-video model, their images."""
        ...

    def velocity(self, x: Tensor, s: float, cond: Any, *, reference: bool = False) -> Tensor: ...

    def trains(self, s: float) -> bool:
        """Whether the model that runs at noise level ``s`` is trained (not a frozen expert)."""
        ...

    def decode(self, latents: Tensor, cond: Any = None) -> Tensor:
        """``(B, F, C, H, W)`` floats in [0, 1] of sampled latents (``cond``: the batch's conditioning)."""
        ...

    def latent_shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class SlidingWindow:
    """MixGRPO's sliding SDE window: ``size`` stochastic (and trained) steps, starting at step 0 and moved
    ``stride`` steps later every ``every`` iterations, until it holds the last steps. Early in training the
    high-noise steps (where the layout forms) are optimised, later the detail; the steps outside it are ODE
    steps, which cost no training."""

    size: int = 2
    every: int = 10
    stride: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or self.every < 1 or self.stride < 1:
            raise ConfigError(f"sliding_window: size, every and stride must be >= 1, got {self.size}, {self.every}, "
                              f"{self.stride}")  # fmt: skip


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 8
    """Denoising steps of a rollout."""
    shift: float = 3.0
    sde: SDEConfig = field(default_factory=SDEConfig)
    group_size: int = 4
    """Samples per prompt (G)."""
    prompts_per_step: int = 2
    """Prompts of one iteration (over all data-parallel ranks): ``prompts_per_step * group_size`` samples."""
    same_noise_per_group: bool = True
    train_fraction: float = 0.6
    """Fraction of the rollout's steps trained on each iteration (chosen at random; of a two-expert model's
    steps, among those whose expert is trained)."""
    sde_window: tuple[int, int] | None = None
    """Steps ``[start, end)``: the only stochastic steps of a rollout (the others are ODE steps), and the
    only trained ones, instead of a random fraction of an all-SDE rollout. With the same initial noise per
    group, the reward differences within a group then come from the window's noise alone."""
    sliding_window: SlidingWindow | None = None
    """An SDE window that moves over the training (``SlidingWindow``), instead of the fixed ``sde_window``."""
    tail_steps: int | None = None
    """ODE steps after the SDE window (MixGRPO-Flash's cheaper tail): the schedule from the window's end to 0
    re-spaced into this many steps, so a rollout costs ``window end + tail_steps`` model evaluations instead
    of ``steps``. The window's steps, and so the log-probabilities and what trains, are the schedule's own;
    only the deterministic part after them is coarser. None: the schedule's own steps."""
    clip_range: float = 1e-3
    """PPO clip range of the ratio (1e-4 in DanceGRPO; 1e-3 for Wan)."""
    kl_coef: float = 0.0
    """Weight of the closed-form KL to the reference model (the adapters off, or a frozen sharded copy)."""
    micro_batch: int | None = None
    """Samples per transformer forward in rollouts and training (gradients accumulate over them), so that
    activation memory follows the micro-batch, not the samples per step; ``None``: this rank's whole batch.
    The step equals the one-batch step up to float rounding."""
    adv_std: Literal["group", "global"] = "group"
    """Advantage scale: each prompt group's reward std, or the std over all samples of the iteration."""
    adv_clip: float = 5.0
    branch: bool = False
    """Branching rollouts (Flow-GRPO-Fast / BranchGRPO style): a group's samples, which start from the same
    noise (``same_noise_per_group``), share their ODE steps before the first stochastic step and the velocity
    there, computed once per group, and branch with their own noise at that step; training evaluates the
    branch step once per group too. Saves ``(G - 1) / G`` of the model evaluations up to the branch."""
    ratio_norm: bool = False
    """Ratio normalisation against the clipping bias (after GRPO-Guard): a Gaussian transition's log-ratio
    is ``mean(e*d)/std^2 - mean(d^2)/(2 std^2)`` (``d``: the change of the mean, ``e``: the sampled noise times
    ``std``), whose second term pulls the ratio below 1 on every step, so the clip range acts lopsided. With
    this on, that term is added back (the rollout keeps its means), leaving a log-ratio centred on 0; the
    gradient at the rollout's weights is unchanged, and the ratio is still exactly 1 before the first update."""
    overlap_rewards: bool = False
    """Score each micro-batch (``micro_batch``) in a background thread while the next one samples: a remote
    reward (or any reward that waits) overlaps the rollout. Same numbers as without."""
    stat_tracking: int = 0
    """Per-prompt reward statistics (Flow-GRPO): a prompt's advantages use its rewards of this many past
    iterations it was drawn in, and this one's (``PromptStats``); 0: this iteration's group only."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.group_size < 1 or self.prompts_per_step < 1:
            raise ConfigError(
                f"steps, group_size and prompts_per_step must be >= 1, got {self.steps}, {self.group_size} and "
                f"{self.prompts_per_step}"
            )
        if self.shift <= 0 or self.clip_range <= 0 or self.kl_coef < 0 or self.adv_clip <= 0:
            raise ConfigError(
                f"shift, clip_range and adv_clip must be > 0 and kl_coef >= 0, got shift={self.shift}, "
                f"clip_range={self.clip_range}, adv_clip={self.adv_clip}, kl_coef={self.kl_coef}"
            )
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ConfigError(f"micro_batch must be >= 1 (or null: the whole batch), got {self.micro_batch}")
        if self.branch and not self.same_noise_per_group:
            raise ConfigError("grpo.branch shares a group's start, so its samples need the same initial noise: "
                              "set same_noise_per_group: true or drop branch")  # fmt: skip
        if self.stat_tracking < 0:
            raise ConfigError(f"stat_tracking must be >= 0 iterations (0: off), got {self.stat_tracking}")
        if self.adv_std not in ("group", "global"):
            raise ConfigError(f"adv_std must be 'group' or 'global', got {self.adv_std!r}")
        if not 0 < self.train_fraction <= 1:
            raise ConfigError(f"train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.sde_window is not None and not 0 <= self.sde_window[0] < self.sde_window[1] <= self.steps:
            raise ConfigError(f"sde_window {self.sde_window} must satisfy 0 <= start < end <= steps={self.steps}")
        if self.sliding_window is not None:
            if self.sde_window is not None:
                raise ConfigError("sde_window (fixed) and sliding_window (moving) exclude each other: give one")
            if self.sliding_window.size > self.steps:
                raise ConfigError(f"sliding_window size {self.sliding_window.size} is more than steps={self.steps}")
        if self.tail_steps is not None:
            if self.tail_steps < 1:
                raise ConfigError(f"tail_steps must be >= 1 (or null: the schedule's own), got {self.tail_steps}")
            if self.sde_window is None and self.sliding_window is None:
                raise ConfigError("tail_steps re-spaces the ODE steps after the SDE window, and there is none: "
                                  "give grpo.sde_window or grpo.sliding_window, or drop tail_steps")  # fmt: skip
        if self.sde.kind == "ode":
            raise ConfigError("GRPO needs a stochastic sampler: sde.kind 'dance' or 'flow'")


def sde_window_at(config: GRPOConfig, step: int) -> tuple[int, int] | None:
    """The SDE window of iteration ``step``: the fixed ``sde_window``, the sliding window's place, or None
    (every step stochastic)."""
    window = config.sliding_window
    if window is None:
        return config.sde_window
    start = min(step // window.every * window.stride, config.steps - window.size)
    return (start, start + window.size)


def rollout_sigmas(config: GRPOConfig, window: tuple[int, int] | None) -> list[float]:
    """The noise levels of a rollout with SDE ``window``: the shifted schedule of ``config.steps``, its part
    after the window re-spaced into ``config.tail_steps`` steps when that is fewer (same shift, same last
    non-zero level, then 0)."""
    sigmas = shifted_sigmas(config.steps, config.shift)
    if config.tail_steps is None or window is None or config.steps - window[1] <= config.tail_steps:
        return sigmas
    end = window[1]
    tail = shifted_sigmas_between(sigmas[end], sigmas[-2], config.tail_steps, config.shift)
    return sigmas[:end] + tail + [0.0]


@dataclass
class Batch:
    """This rank's samples of one iteration."""

    prompts: list[str]
    prompt_ids: Tensor
    sample_seeds: list[int]
    noise_seeds: list[int]
    images: list[str] | None = None
    """Each sample's conditioning image (image-to-video), or None."""
    window: tuple[int, int] | None = None
    """The iteration's SDE window (``sde_window_at``)."""


def seed_for(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    return random.Random(str(parts)).getrandbits(63)


def check_split(config: GRPOConfig, dp: int) -> None:
    """An iteration's ``prompts_per_step * group_size`` samples must split evenly over the dp ranks."""
    total = config.prompts_per_step * config.group_size
    if total % dp:
        raise ConfigError(
            f"{config.prompts_per_step} prompts x group size {config.group_size} = {total} samples cannot be split "
            f"evenly over dp={dp} ranks; make grpo.prompts_per_step * grpo.group_size a multiple of dp"
        )


def make_batch(prompts: list[str], step: int, seed: int, config: GRPOConfig, parallel: ParallelState,
               images: list[str | None] | None = None) -> Batch:  # fmt: skip
    """This dp rank's share of the iteration's ``prompts_per_step * group_size`` samples (``images``: each
    prompt's conditioning image, for an image-to-video model)."""
    check_split(config, parallel.dp)
    prompts_per_step = config.prompts_per_step
    total = prompts_per_step * config.group_size
    order = random.Random(seed_for(seed, step // max(1, len(prompts) // prompts_per_step))).sample(
        range(len(prompts)), len(prompts)
    )
    start = (step * prompts_per_step) % len(prompts)
    chosen = [order[(start + i) % len(prompts)] for i in range(prompts_per_step)]
    samples = [(pid, k) for pid in chosen for k in range(config.group_size)]
    per_rank = total // parallel.dp
    mine = samples[parallel.dp_rank * per_rank : (parallel.dp_rank + 1) * per_rank]
    return Batch(
        prompts=[prompts[pid] for pid, _ in mine],
        prompt_ids=torch.tensor([pid for pid, _ in mine]),
        sample_seeds=[seed_for(seed, step, pid, k) for pid, k in mine],
        noise_seeds=[seed_for(seed, step, pid, 0 if config.same_noise_per_group else k) for pid, k in mine],
        images=[images[pid] for pid, _ in mine] if images is not None and any(images) else None,
        window=sde_window_at(config, step),
    )


def _per_sample_noise(seeds: list[int], shape: tuple[int, ...], device, leading: int = 0) -> Tensor:
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        out.append(torch.randn((leading, *shape) if leading else shape, generator=g))
    return torch.stack(out, dim=1 if leading else 0).to(device)


def trained_steps(config: GRPOConfig, step_seed: int, eligible: list[int] | None = None,
                  window: tuple[int, int] | None = None) -> list[int]:  # fmt: skip
    """The steps whose transitions train this iteration: the SDE ``window``'s (the trajectory's), or a
    random ``train_fraction`` of all; of the ``eligible`` steps only (those whose model is trained: not a
    frozen expert's)."""
    candidates = list(range(*window) if window is not None else range(config.steps))
    if eligible is not None:
        candidates = [t for t in candidates if t in eligible]
    if window is not None or not candidates:
        return candidates
    count = max(1, round(config.train_fraction * len(candidates)))
    return sorted(random.Random(step_seed).sample(candidates, count))


def select(cond: Any, index: slice) -> Any:
    """The samples ``index`` of a batch's conditioning (tensors, nested tuples of them, or None)."""
    if isinstance(cond, Tensor):
        return cond[index]
    if isinstance(cond, (tuple, list)):
        return type(cond)(select(part, index) for part in cond)
    return cond


def micro_batches(size: int, config: GRPOConfig) -> list[slice]:
    """The micro-batches of a batch of ``size`` samples."""
    step = config.micro_batch or size
    return [slice(start, min(start + step, size)) for start in range(0, size, step)]


def rollout(policy: Policy, batch: Batch, config: GRPOConfig, parallel: ParallelState,
            after_part: Callable[[slice, Trajectory, Any], None] | None = None) -> tuple[Trajectory, Any]:  # fmt: skip
    """The batch's trajectories, micro-batch by micro-batch (``after_part(part, trajectory, cond)`` after
    each: e.g. sending it to be scored while the next one samples), and its conditioning."""
    cond = policy.encode(batch.prompts, batch.images)
    shape = policy.latent_shape()
    sigmas = rollout_sigmas(config, batch.window)
    init = _per_sample_noise(batch.noise_seeds, shape, parallel.device)
    step_noise = _per_sample_noise(batch.sample_seeds, shape, parallel.device, leading=config.steps)
    window = range(*batch.window) if batch.window else None
    # a group: the same initial noise and prompt (so the same start and conditioning)
    keys = torch.tensor([seed_for(n, pid) for n, pid in zip(batch.noise_seeds, batch.prompt_ids.tolist())])
    parts = []
    with torch.no_grad():
        for part in micro_batches(len(batch.prompts), config):
            c = select(cond, part)
            if config.branch:
                velocity = lambda x, s, index, c=c: policy.velocity(x, s, c if index is None else select(c, index))
                traj = branched_trajectory(velocity, init[part], sigmas, config.sde, keys[part],
                                           step_noise=step_noise[:, part], sde_steps=window,
                                           keep_means=config.ratio_norm)  # fmt: skip
            else:
                traj = sample_trajectory(lambda x, s, c=c: policy.velocity(x, s, c), init[part], sigmas, config.sde,
                                         step_noise=step_noise[:, part], sde_steps=window,
                                         keep_means=config.ratio_norm)  # fmt: skip
            parts.append(traj)
            if after_part is not None:
                after_part(part, traj, c)
    return Trajectory.concat(parts), cond


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
    decoded by ``decode_videos`` and scored on the first rank, and the scores broadcast."""
    local = _videos_to_score(policy, final, cond, prompts, images, parallel, split, chunk)
    return _share_scores(None if local is None else score_batch(reward, *local), final.shape[0], reward, parallel,
                         split)  # fmt: skip


def _videos_to_score(policy: Policy, final: Tensor, cond: Any, prompts: list[str], images: list[str] | None,
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


def _share_scores(mine: Tensor | None, size: int, reward: WeightedReward, parallel: ParallelState,
                  split: Split) -> Tensor:  # fmt: skip
    """The ``(1 + parts, size)`` scores on every SP rank from what ``_videos_to_score`` gave this one to score
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


def rollout_scored(
    policy: Policy,
    batch: Batch,
    reward: WeightedReward,
    config: GRPOConfig,
    parallel: ParallelState,
    *,
    split_decode: Split = None,
    decode_chunk: int | None = None,
) -> tuple[Trajectory, Any, Tensor, dict[str, Tensor], float]:
    """``rollout`` then ``rewards_of``, overlapped: each micro-batch is decoded when it is sampled and scored
    in a background thread while the next one samples (a reward server works while this process does).
    Returns the trajectories, conditioning, rewards, their parts, and the seconds spent waiting for scores
    after the last micro-batch. The numbers are ``rollout`` + ``rewards_of``'s."""
    from concurrent.futures import ThreadPoolExecutor

    scored = []  # (micro-batch size, future of this rank's scores or None)
    with ThreadPoolExecutor(1, thread_name_prefix="reward") as pool:

        def after_part(part: slice, traj: Trajectory, cond: Any) -> None:
            prompts, images = batch.prompts[part], None if batch.images is None else batch.images[part]
            local = _videos_to_score(policy, traj.final, cond, prompts, images, parallel, split_decode, decode_chunk)
            scored.append((len(prompts), None if local is None else pool.submit(score_batch, reward, *local)))

        traj, cond = rollout(policy, batch, config, parallel, after_part)
        waited = time.perf_counter()
        results = [(size, None if job is None else job.result()) for size, job in scored]
        waited = time.perf_counter() - waited
    values = torch.cat([_share_scores(mine, size, reward, parallel, split_decode) for size, mine in results], 1)
    return traj, cond, values[0], dict(zip([n for n, _, _ in reward.parts], values[1:])), waited


def drift_free_log_prob(step: Transition, old_mean: Tensor) -> Tensor:
    """``step.log_prob`` plus ``mean((mean - old_mean)^2) / (2 std^2)``, ``(B,)``: against the sampled
    log-probability, a log-ratio without the term that pulls every step's ratio below 1
    (``GRPOConfig.ratio_norm``); equal to ``step.log_prob`` where the mean has not moved."""
    drift = (step.mean - old_mean.to(step.mean.dtype)) ** 2
    return step.log_prob + drift.flatten(1).mean(1) / (2.0 * step.std * step.std)


def _velocity_at(policy: Policy, traj: Trajectory, t: int, cond: Any, *, reference: bool = False) -> Tensor:
    """The velocity at step ``t`` of ``traj``'s states; a branch point once per group, as the rollout did."""
    x, s = traj.latents[t], traj.sigmas[t]
    if traj.branch_keys is None or t != traj.branch_step:
        return policy.velocity(x, s, cond, reference=reference)
    velocity = lambda z, level, index: policy.velocity(z, level, select(cond, index), reference=reference)  # noqa: E731
    return shared_velocity(velocity, x, s, traj.branch_keys)


def accumulate_gradients(
    policy: Policy, traj: Trajectory, cond: Any, advantages: Tensor, config: GRPOConfig, step_seed: int
) -> dict[str, float]:
    """Backward of the GRPO loss, averaged over the trained steps (gradients accumulate in ``.grad``)."""
    eligible = [t for t in range(len(traj.sigmas) - 1) if policy.trains(traj.sigmas[t])]
    steps = trained_steps(config, step_seed, eligible, traj.window)
    totals: dict[str, float] = {}
    adv = advantages.to(traj.latents.device)
    size = adv.shape[0]
    for t in steps:
        for part in micro_batches(size, config):
            # the loss is a mean over the batch: each micro-batch's mean counts with its share of the samples
            share = (part.stop - part.start) / size
            sub, part_cond = traj.select(part), select(cond, part)
            step = sub.transition(t, _velocity_at(policy, sub, t, part_cond), config.sde)
            log_prob = drift_free_log_prob(step, sub.means[t]) if config.ratio_norm else step.log_prob
            kl = None
            if config.kl_coef:
                with torch.no_grad():
                    reference = sub.transition(t, _velocity_at(policy, sub, t, part_cond, reference=True), config.sde)
                kl = kl_to_reference(step.mean, reference.mean, step.std)
            loss, stats = grpo_loss(log_prob, sub.log_probs[t], adv[part], clip_range=config.clip_range, kl=kl,
                                    kl_coef=config.kl_coef)  # fmt: skip
            (loss * share / len(steps)).backward()
            _accumulate(totals, stats, share, len(steps))
    return totals | {"trained_steps": float(len(steps))}


def _accumulate(totals: dict[str, float], stats: LossStats, share: float, steps: int) -> None:
    """Running statistics of a step's micro-batches: means over the samples (each micro-batch with its
    ``share`` of them) and the ``steps`` trained steps, the extremes of the ratio, the samples masked."""
    for key, value in vars(stats).items():
        if key == "ratio_min":
            totals[key] = min(totals.get(key, math.inf), value)
        elif key == "ratio_max":
            totals[key] = max(totals.get(key, -math.inf), value)
        else:
            totals[key] = totals.get(key, 0.0) + (value if key == "masked" else value * share) / steps


def _state_for_every_weight(optimizer: torch.optim.Optimizer) -> None:
    """Give a weight that had no gradient yet (a two-expert model's expert that ran at none of the trained
    steps) the state AdamW would start it with. Its update is still skipped while it gets no gradient (no
    momentum, no weight decay), and then starts as from fresh; but every checkpoint holds the same optimizer
    keys, so resuming is exact whenever it was saved."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and not optimizer.state[p]:
                optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip
                if group.get("amsgrad"):
                    optimizer.state[p]["max_exp_avg_sq"] = torch.zeros_like(p)


def train_on_rollout(
    policy: Policy,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    traj: Trajectory,
    cond: Any,
    advantages: Tensor,
    config: GRPOConfig,
    step_seed: int,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One policy update from a rollout: accumulate the loss over the trained steps, clip, step.

    A non-finite loss (on any rank) or gradient norm, or a step in which no sample got a reward, skips the
    update on every rank alike (``skipped`` is 1 in the returned statistics): non-finite numbers never reach
    the weights or the optimizer state.
    """
    optimizer.zero_grad(set_to_none=True)
    stats = accumulate_gradients(policy, traj, cond, advantages, config, step_seed)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    device = next(model.parameters()).device
    finite = torch.tensor([float(math.isfinite(stats["loss"]) and math.isfinite(grad_norm))], device=device)
    scored = torch.tensor([float(torch.isfinite(advantages).any())], device=device)
    if dist.is_initialized():  # the gradient norm is global already; the loss is per rank
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        dist.all_reduce(scored, op=dist.ReduceOp.MAX)
    if finite.item() and scored.item():  # no sample scored (a reward server down): no update, not even Adam's
        optimizer.step()
        _state_for_every_weight(optimizer)
    else:
        optimizer.zero_grad(set_to_none=True)
    return stats | {"grad_norm": grad_norm, "skipped": float(not (finite.item() and scored.item()))}
