"""Worker-side checks of ``attend_whole_sequence`` against one process: a per-head decayed scan (a recurrent,
non-SDPA attention with a per-head parameter) run whole, then under Ulysses layouts (run in spawned ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, gather_sequence, init_parallel, shard_sequence
from dit_sp.attention import attend_whole_sequence, head_group

BATCH, SEQ, HEADS, DIM = 2, 61, 6, 8


def decayed_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``out_t = sum_{s <= t} decay_h^(t-s) (q_t . k_s) v_s`` per head: ``(B, S, h, D)`` each, ``decay (h,)``.
    Padding heads (zeros) get ``decay`` zero-padded: their outputs are zero either way."""
    steps = torch.arange(q.shape[1], dtype=q.dtype)
    lag = steps[:, None] - steps[None, :]
    weights = torch.where(lag >= 0, decay[:, None, None] ** lag.clamp(min=0), 0.0)  # (h, S, S)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * weights
    return torch.einsum("bhts,bshd->bthd", scores, v)


def _inputs(seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(BATCH, SEQ, HEADS, DIM, generator=g, dtype=torch.float64) for _ in range(3)]
    return qkv, torch.rand(HEADS, generator=g, dtype=torch.float64), torch.randn(BATCH, SEQ, HEADS, DIM, generator=g)


def check(layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, float] | str]:
    """Max errors (output, q/k/v and decay gradients) per layout, or a ring layout's refusal."""
    results: dict[str, dict[str, float] | str] = {}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        qkv, decay, grad = _inputs(parallel.dp_seed(7))
        whole = [x.clone().requires_grad_() for x in qkv]
        whole_decay = decay.clone().requires_grad_()
        decayed_scan(*whole, whole_decay).backward(grad.double())

        shards = [shard_sequence(x, parallel).requires_grad_() for x in qkv]
        local_decay = decay.clone().requires_grad_()

        def attend(q, k, v, decay=local_decay, parallel=parallel):
            own = decay[head_group(HEADS, parallel)]
            return decayed_scan(q, k, v, torch.cat([own, own.new_zeros(q.shape[2] - own.shape[0])]))

        name = f"dp{dp}-r{ring}-u{ulysses}"
        try:
            out = attend_whole_sequence(attend, shards, parallel, seq_len=SEQ)
        except NotImplementedError as error:
            results[name] = str(error)
            continue
        (out * shard_sequence(grad.double(), parallel)).sum().backward()
        decay_grad = local_decay.grad.clone()
        dist.all_reduce(decay_grad, group=parallel.sp_group)  # each rank's heads' share of the replicated parameter
        errors = {"out": gather_sequence(out.detach(), parallel, seq_len=SEQ) - decayed_scan(*qkv, decay),
                  "decay": decay_grad - whole_decay.grad}  # fmt: skip
        for label, x, ref in zip("qkv", shards, whole):
            errors[f"d{label}"] = gather_sequence(x.grad, parallel, seq_len=SEQ) - ref.grad
        worst = torch.tensor([errors[k].abs().max().item() for k in sorted(errors)], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        results[name] = dict(zip(sorted(errors), worst.tolist()))
    return results
