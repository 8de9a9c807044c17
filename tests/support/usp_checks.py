"""Worker-side checks of usp_attention against a single-process SDPA reference (run in spawned ranks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dit_sp import ParallelConfig, gather_sequence, init_parallel, shard_sequence, usp_attention


@dataclass(frozen=True)
class Case:
    seq: int
    heads: int
    joint: int = 0
    position: str = "front"
    dtype: torch.dtype = torch.float32
    batch: int = 2
    head_dim: int = 16
    kernel: str | None = None
    joint_valid: tuple[int, ...] | None = None
    mask: str | None = None
    """A mask over the whole sequence (``whole_mask``): ``"block_causal"``, ``"per_head"`` or ``"additive"``."""
    streams: int = 1
    """Split sequences of ``seq`` tokens attended together, each rank's shards of them side by side (no joint)."""

    @property
    def name(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        j = f"-joint{self.joint}{self.position}" if self.joint else ""
        k = f"-{self.kernel}" if self.kernel else ""
        jv = "-valid" + "_".join(map(str, self.joint_valid)) if self.joint_valid else ""
        m = f"-{self.mask}" if self.mask else ""
        n = f"x{self.streams}" if self.streams > 1 else ""
        return f"S{self.seq}{n}-H{self.heads}{j}{jv}{m}-{dt}{k}"


def whole_mask(case: Case) -> torch.Tensor | None:
    """The case's mask over the whole sequence, the same on every rank: block-causal frames of 8 tokens
    ``(1, 1, S, S)`` (SkyReels-V2's diffusion forcing), a random boolean one per sample and head
    ``(B, H, S, S)`` (the diagonal kept, so no query attends to nothing), or a random additive one ``(1, 1, S, S)``."""
    if case.mask is None:
        return None
    g = torch.Generator().manual_seed(99)
    if case.mask == "block_causal":
        block = torch.arange(case.seq) // 8
        return (block[:, None] >= block[None, :])[None, None]
    if case.mask == "per_head":
        keep = torch.rand(case.batch, case.heads, case.seq, case.seq, generator=g) < 0.5
        return keep | torch.eye(case.seq, dtype=torch.bool)
    if case.mask == "additive":
        return torch.randn(1, 1, case.seq, case.seq, generator=g).to(case.dtype)
    raise ValueError(case.mask)


def reference(case: Case, seed: int):
    """Full-sequence tensors, their SDPA output and gradients of ``sum(out * grad_out)``."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randn(case.batch, n, case.heads, case.head_dim, generator=g).to(case.dtype)
    video = [rand(case.seq * case.streams) for _ in range(3)]  # the streams one after the other
    joint = [rand(case.joint) for _ in range(3)]
    grad_video, grad_joint = rand(case.seq * case.streams), rand(case.joint)
    full = [
        (torch.cat([j, x], 1) if case.position == "front" else torch.cat([x, j], 1)).double().requires_grad_()
        for x, j in zip(video, joint)
    ]
    mask = whole_mask(case)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    if case.joint_valid is not None:  # per-sample real joint keys; the rest is padding
        real_joint = torch.arange(case.joint) < torch.tensor(case.joint_valid).unsqueeze(1)
        video_keys = torch.ones(case.batch, case.seq, dtype=torch.bool)
        parts = [real_joint, video_keys] if case.position == "front" else [video_keys, real_joint]
        mask = torch.cat(parts, 1)[:, None, None]
    out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in full), attn_mask=mask).transpose(1, 2)
    grad_full = (
        torch.cat([grad_joint, grad_video], 1) if case.position == "front" else torch.cat([grad_video, grad_joint], 1)
    )
    out.backward(grad_full.double())
    return video, joint, grad_video, grad_joint, out.detach(), [x.grad for x in full]


def _split(x: torch.Tensor, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """(video, joint) parts of a tensor holding both."""
    if case.position == "front":
        return x[:, case.joint :], x[:, : case.joint]
    return x[:, : x.shape[1] - case.joint], x[:, x.shape[1] - case.joint :]


def _shard(x: torch.Tensor, case: Case, parallel) -> torch.Tensor:
    """This rank's shards of the case's streams ``(B, streams*S, ...)``, side by side."""
    return torch.cat([shard_sequence(part, parallel) for part in x.chunk(case.streams, 1)], 1)


def _gather(x: torch.Tensor, case: Case, parallel) -> torch.Tensor:
    """Inverse of ``_shard``: the whole streams, one after the other."""
    return torch.cat([gather_sequence(part, parallel, seq_len=case.seq) for part in x.chunk(case.streams, 1)], 1)


def run_case(case: Case, parallel) -> dict[str, float]:
    """Max abs errors of output and q/k/v/joint gradients vs. the reference, for one layout."""
    video, joint, grad_video, grad_joint, ref_out, ref_grads = reference(case, seed=parallel.dp_seed(1234))
    local = []
    for x, j in zip(video, joint):
        shard = _shard(x, case, parallel)
        local.append(
            (torch.cat([j, shard], 1) if case.position == "front" else torch.cat([shard, j], 1)).requires_grad_()
        )
    out = usp_attention(*local, parallel, seq_len=case.seq, joint_len=case.joint, joint_position=case.position,
                        joint_valid=case.joint_valid, kernel=case.kernel, mask=whole_mask(case),
                        streams=case.streams)  # fmt: skip
    out_video, out_joint = _split(out, case)
    # Every rank holds the joint output: count it once over the SP group, as the reference does.
    loss = (out_video.float() * _shard(grad_video, case, parallel).float()).sum()
    loss = loss + (out_joint.float() * grad_joint.float()).sum() / parallel.sp
    loss.backward()

    ref_video, ref_joint = _split(ref_out, case)
    errors = {"out": (_gather(out_video.detach(), case, parallel).double() - ref_video).abs().max()}
    if case.joint:
        errors["out_joint"] = (out_joint.detach().double() - ref_joint).abs().max()
    for name, x, ref in zip("qkv", local, ref_grads):
        grad_video_part, grad_joint_part = _split(x.grad, case)
        ref_video_part, ref_joint_part = _split(ref, case)
        full = _gather(grad_video_part, case, parallel)
        errors[f"d{name}"] = (full.double() - ref_video_part).abs().max()
        if case.joint:
            summed = grad_joint_part.double()
            if parallel.sp_group is not None:
                dist.all_reduce(summed, group=parallel.sp_group)
            errors[f"d{name}_joint"] = (summed - ref_joint_part).abs().max()
    scale = max(ref_out.abs().max().item(), max(r.abs().max().item() for r in ref_grads))
    return {k: float(v) for k, v in errors.items()} | {"scale": scale}


def check_layouts(layouts: list[tuple[int, int, int]], cases: list[Case]) -> dict[str, dict[str, float]]:
    """Run every case under every ``(dp, ring, ulysses)`` layout in this world; errors keyed by name. A case
    with a whole-sequence mask on a ring records the refusal's message instead (``{"refusal": ...}``)."""
    torch.manual_seed(0)
    results = {}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        for case in cases:
            if case.mask and ring > 1:
                try:
                    run_case(case, parallel)
                    refusal = None
                except NotImplementedError as error:
                    refusal = str(error)
                results[f"dp{dp}-r{ring}-u{ulysses}/{case.name}"] = {"refusal": refusal}
                continue
            errors = run_case(case, parallel)
            # Report the worst rank so that every rank's shard is checked.
            worst = torch.tensor([errors[k] for k in sorted(errors)], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX) if dist.is_initialized() else None
            results[f"dp{dp}-r{ring}-u{ulysses}/{case.name}"] = dict(zip(sorted(errors), worst.tolist()))
    return results
