"""Worker-side checks of the communication primitives (run in spawned ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, gather_sequence, init_parallel, shard_sequence
from dit_sp.attention import ulysses
from dit_sp.parallel.comm import RingComm, all_to_all


def _full(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def check_comm(ring: int, uly: int) -> dict[str, float]:
    """Max abs errors of each primitive against independent expectations built from full tensors."""
    world = dist.get_world_size() if dist.is_initialized() else int(__import__("os").environ["WORLD_SIZE"])
    bad_config_error = ""
    try:
        init_parallel(ParallelConfig(ring=world + 1))
    except ValueError as e:
        bad_config_error = str(e)
    p = init_parallel(ParallelConfig(ring=ring, ulysses=uly))
    errors: dict[str, float] = {
        "bad_config_message": float(f"dp*cfg*ring*ulysses = {world + 1} processes" not in bad_config_error),
        "rank_layout": float(p.rank != p.ring_rank * uly + p.ulysses_rank or p.sp_rank != p.rank),
        "dp_seed": float(p.dp_seed(7) != 7),
    }

    # Ulysses all-to-all: (B, S/N, H, D) -> (B, S/R, H/U, D), forward and backward.
    full, weight = _full(0, 2, 8 * p.sp, 4 * uly, 3), _full(1, 2, 8 * p.sp, 4 * uly, 3)
    x = shard_sequence(full, p).clone().requires_grad_()
    (out,) = ulysses.scatter_heads([x], p)
    block = slice(p.ring_rank * 8 * uly, (p.ring_rank + 1) * 8 * uly)
    heads = slice(p.ulysses_rank * 4, (p.ulysses_rank + 1) * 4)
    errors["a2a_forward"] = (out - full[:, block, heads]).abs().max().item()
    (out * weight[:, block, heads]).sum().backward()
    # Every rank holds the heads of its ring block: the sequence shard's gradient covers all heads.
    errors["a2a_backward"] = (x.grad - shard_sequence(weight, p)).abs().max().item()
    errors["a2a_roundtrip"] = (ulysses.gather_heads(out.detach(), p) - x.detach()).abs().max().item()

    # The public all_to_all primitive: the same exchange, forward and backward.
    y = x.detach().clone().requires_grad_()
    out = all_to_all(y, p.ulysses_group, scatter_dim=-2, gather_dim=-3)
    errors["a2a_public_forward"] = (out - full[:, block, heads]).abs().max().item()
    (out * weight[:, block, heads]).sum().backward()
    errors["a2a_public_backward"] = (y.grad - shard_sequence(weight, p)).abs().max().item()

    # q, k, v in one exchange, with heads that U does not divide (zero-padded on the way, dropped back).
    n_heads, group = 4 * uly - 1, 4
    fulls = [_full(10 + i, 2, 8 * p.sp, n_heads, 3) for i in range(3)]
    padded = [torch.nn.functional.pad(f, (0, 0, 0, 4 * uly - n_heads)) for f in fulls]
    heads = slice(p.ulysses_rank * group, (p.ulysses_rank + 1) * group)
    xs = [shard_sequence(f, p).clone().requires_grad_() for f in fulls]
    outs = ulysses.scatter_heads(xs, p)
    errors["packed_forward"] = max((o - f[:, block, heads]).abs().max().item() for o, f in zip(outs, padded))
    weights = [_full(20 + i, 2, 8 * p.sp, 4 * uly, 3) for i in range(3)]
    sum((o * w[:, block, heads]).sum() for o, w in zip(outs, weights)).backward()
    errors["packed_backward"] = max(
        (x.grad - shard_sequence(w[:, :, :n_heads], p)).abs().max().item() for x, w in zip(xs, weights)
    )
    # gather_heads: forward back to the sequence shard, backward (zeros for the padding heads)
    leaf = outs[1].detach().clone().requires_grad_()
    back = ulysses.gather_heads(leaf, p, n_heads)
    errors["packed_roundtrip"] = (back - xs[1].detach()).abs().max().item()
    (back * shard_sequence(weights[1][:, :, :n_heads], p)).sum().backward()
    expected = torch.nn.functional.pad(weights[1][:, :, :n_heads], (0, 0, 0, 4 * uly - n_heads))[:, block, heads]
    errors["gather_heads_backward"] = (leaf.grad - expected).abs().max().item()

    # shard_sequence: even and uneven lengths, zero padding on the last shard only, a tensor of its own when
    # autograd records it (a view would keep the whole sequence alive until backward), and the partial
    # gradient (zeros outside the shard).
    for name, seq in (("even", 4 * p.sp), ("uneven", 4 * p.sp - 3)):
        full = _full(3, 2, seq, 3).requires_grad_()
        shard = shard_sequence(full, p)
        length = -(-seq // p.sp)
        padded = torch.nn.functional.pad(full.detach(), (0, 0, 0, length * p.sp - seq))
        errors[f"shard_{name}_values"] = (
            (shard - padded[:, p.sp_rank * length : (p.sp_rank + 1) * length]).abs().max().item()
        )
        errors[f"shard_{name}_owns_storage"] = float(
            shard.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
        )
        weight = _full(4, 2, length, 3)
        (shard * weight).sum().backward()
        expected = torch.zeros_like(padded)
        expected[:, p.sp_rank * length : (p.sp_rank + 1) * length] = weight
        errors[f"shard_{name}_backward"] = (full.grad - expected[:, :seq]).abs().max().item()

    # gather_sequence with an uneven length, both backward modes.
    seq = 4 * p.sp - 1
    full = _full(2, 2, seq, 3)
    for mode in ("sum", "slice"):
        x = shard_sequence(full, p).clone().requires_grad_()
        gathered = gather_sequence(x, p, seq_len=seq, grad=mode)
        errors[f"gather_{mode}_forward"] = (gathered - full).abs().max().item()
        (gathered * _full(100 + p.sp_rank, 2, seq, 3)).sum().backward()  # a different loss per rank
        if mode == "sum":
            expected = sum(_full(100 + r, 2, seq, 3) for r in range(p.sp))
        else:
            expected = _full(100 + p.sp_rank, 2, seq, 3)
        errors[f"gather_{mode}_backward"] = (x.grad - shard_sequence(expected, p)).abs().max().item()
    errors["gather_padding_zero_grad"] = float(p.sp_rank == p.sp - 1 and x.grad[:, -1].abs().max().item() != 0)

    # Ring exchange: each rank receives its predecessor's tensor.
    if ring > 1:
        comm = RingComm(p)
        comm.step(torch.full((3,), float(p.ring_rank)))
        got = comm.wait()
        errors["ring_exchange"] = (got - float((p.ring_rank - 1) % ring)).abs().max().item()
        # several tensors in one step (a block's keys and values): each arrives in its own buffer
        prev = float((p.ring_rank - 1) % ring)
        comm.step((torch.full((3,), float(p.ring_rank)), torch.full((2, 5), 10.0 + p.ring_rank)))
        keys, values = comm.wait()
        errors["ring_exchange"] += (keys - prev).abs().max().item() + (values - 10.0 - prev).abs().max().item()
    return errors
