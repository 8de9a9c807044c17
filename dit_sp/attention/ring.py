"""Ring attention: each rank keeps its queries and the key/value blocks travel around the ring.

Layout ``(B, S, H, D)`` throughout. Forward merges per-block ``(out, lse)`` in fp32 while the next
block is in flight. Backward re-runs the kernel's backward per block with the *global* ``out``/``lse``,
accumulates ``dq`` at home and sends each block's ``dk``/``dv`` accumulator along with the block, so it
arrives back at its owner after the last hop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dit_sp.attention.kernels import AttentionKernel, lse_dtype
from dit_sp.parallel.comm import RingComm
from dit_sp.parallel.state import ParallelState

Tensor = torch.Tensor


@dataclass(frozen=True)
class RingSpec:
    """The non-tensor arguments of one ring attention call."""

    parallel: ParallelState
    kernel: AttentionKernel
    scale: float
    block_valid: tuple[int, ...]
    """Number of real (unpadded) keys at the start of each ring rank's block, by ring rank."""
    joint_valid: tuple[int, ...] | None = None
    """Per batch element, the number of real joint keys (the rest is padding); ``None``: all real."""

    def joint_groups(self, batch: int, joint_len: int) -> list[tuple[slice | Tensor, int]]:
        """``(batch index, real joint keys)`` groups; a single group when every element agrees."""
        valid = self.joint_valid or (joint_len,) * batch
        if len(set(valid)) == 1:
            return [(slice(None), valid[0])] if valid[0] else []
        groups: dict[int, list[int]] = {}
        for b, n in enumerate(valid):
            groups.setdefault(n, []).append(b)
        return [(torch.tensor(index), n) for n, index in groups.items() if n]


def merge_block(
    out: Tensor | None, lse: Tensor | None, block_out: Tensor, block_lse: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Fold one block's ``(out (B,S,H,D), lse (B,H,S))`` into the running pair, in ``dtype``; the first
    block (``out is None``) starts it."""
    block_out, block_lse = block_out.to(dtype), block_lse.to(dtype)
    if out is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    weight = lambda x: (x - new_lse).exp().transpose(1, 2).unsqueeze(-1)  # (B, S, H, 1)
    return out * weight(lse) + block_out * weight(block_lse), new_lse


def _block_keys(
    kv: tuple[Tensor, Tensor], valid: int, joint_kv: tuple[Tensor, Tensor] | None, joint_n: int = 0
) -> tuple[Tensor, Tensor]:
    """Keys and values of one visiting block: its real keys, plus the first ``joint_n`` joint ones."""
    k, v = kv[0][:, :valid], kv[1][:, :valid]
    if joint_kv is not None and joint_n:
        k, v = torch.cat([k, joint_kv[0][:, :joint_n]], 1), torch.cat([v, joint_kv[1][:, :joint_n]], 1)
    return k, v


def _uniform_joint(spec: RingSpec, q: Tensor, joint_k: Tensor | None) -> tuple[list, int]:
    """The joint key groups, and the joint key count when one group spans the batch (else 0): joint keys
    shared by the whole batch join the own block in one kernel call."""
    groups = spec.joint_groups(q.shape[0], 0 if joint_k is None else joint_k.shape[1])
    return groups, groups[0][1] if groups and isinstance(groups[0][0], slice) else 0


def _receive_buffers(kv: tuple[Tensor, Tensor], ring: int) -> list[tuple[Tensor, Tensor]]:
    """Where the visiting blocks arrive: step ``s`` receives into set ``s % 2`` while attending to the block
    that arrived in the other one (or, at step 0, to this rank's own k/v, which are never written)."""
    return [tuple(torch.empty_like(x) for x in kv) for _ in range(min(ring - 1, 2))]


class RingAttention(torch.autograd.Function):
    """Non-causal attention of this rank's ``q`` over every ring rank's ``k``/``v`` block (+ joint k/v).

    ``q``: ``(B, Sq, H, D)``; ``k``, ``v``: ``(B, Sk, H, D)``, equal ``Sk`` on every ring rank;
    ``joint_k``, ``joint_v``: ``(B, T, H, D)`` or ``None``, the same on every rank and attended once.
    Returns ``(B, Sq, H, D)``. Keys and values travel as they are (two messages per hop, no stacked copy),
    double buffered.
    """

    @staticmethod
    def forward(ctx, spec: RingSpec, q: Tensor, k: Tensor, v: Tensor, joint_k: Tensor | None, joint_v: Tensor | None):
        parallel, kernel = spec.parallel, spec.kernel
        joint_kv = None if joint_k is None else (joint_k, joint_v)
        groups, uniform_joint = _uniform_joint(spec, q, joint_k)
        comm = RingComm(parallel) if parallel.ring > 1 else None
        kv = (k.contiguous(), v.contiguous())
        buffers = _receive_buffers(kv, parallel.ring)
        dtype = lse_dtype(q.dtype)
        out = lse = None
        for step in range(parallel.ring):
            if comm and step + 1 < parallel.ring:
                comm.step(kv, buffers[step % 2])
            block = (parallel.ring_rank - step) % parallel.ring
            bk, bv = _block_keys(kv, spec.block_valid[block], joint_kv if step == 0 else None, uniform_joint)
            if bk.shape[1]:
                out, lse = merge_block(out, lse, *kernel.forward(q, bk, bv, spec.scale), dtype)
            if step == 0 and joint_kv is not None and not uniform_joint:
                if out is None:  # no video key in the own block: start from nothing attended
                    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
                    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -torch.inf, dtype=dtype, device=q.device)
                for index, n in groups:  # joint keys with per-sample padding
                    o, o_lse = kernel.forward(q[index], joint_k[index, :n], joint_v[index, :n], spec.scale)
                    out[index], lse[index] = merge_block(out[index], lse[index], o, o_lse, dtype)
            if comm and step + 1 < parallel.ring:
                kv = comm.wait()
        if out is None:
            raise RuntimeError("ring attention over no keys at all: every block is empty and there are no joint keys")
        out = out.to(q.dtype)
        ctx.spec = spec
        ctx.has_joint = joint_kv is not None
        ctx.save_for_backward(q, k, v, joint_k, joint_v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        spec: RingSpec = ctx.spec
        parallel, kernel = spec.parallel, spec.kernel
        q, k, v, joint_k, joint_v, out, lse = ctx.saved_tensors
        joint_kv = (joint_k, joint_v) if ctx.has_joint else None
        groups, uniform_joint = _uniform_joint(spec, q, joint_k if ctx.has_joint else None)
        acc_dtype = lse_dtype(q.dtype)
        kv_comm = RingComm(parallel, tag=0) if parallel.ring > 1 else None
        dkv_comm = RingComm(parallel, tag=1) if parallel.ring > 1 else None
        kv = (k.contiguous(), v.contiguous())
        buffers = _receive_buffers(kv, parallel.ring)
        dq = torch.zeros_like(q, dtype=acc_dtype)
        djoint = None if joint_kv is None else torch.zeros((2, *joint_k.shape), dtype=acc_dtype, device=q.device)
        dkv = None
        for step in range(parallel.ring):
            last = step + 1 == parallel.ring
            if kv_comm and not last:
                kv_comm.step(kv, buffers[step % 2])
            block = (parallel.ring_rank - step) % parallel.ring
            valid = spec.block_valid[block]
            bk, bv = _block_keys(kv, valid, joint_kv if step == 0 else None, uniform_joint)
            grads = kernel.backward(dout, q, bk, bv, out, lse, spec.scale) if bk.shape[1] else None
            # The accumulator of this block arrives from the previous rank (first step: start one).
            dkv = torch.zeros((2, *k.shape), dtype=acc_dtype, device=k.device) if step == 0 else dkv_comm.wait()
            if grads is not None:
                dq_b, dk_b, dv_b = grads
                dq += dq_b
                dkv[0, :, :valid] += dk_b[:, :valid]
                dkv[1, :, :valid] += dv_b[:, :valid]
                if step == 0 and uniform_joint:
                    djoint[0, :, :uniform_joint] = dk_b[:, valid:]
                    djoint[1, :, :uniform_joint] = dv_b[:, valid:]
            if step == 0 and joint_kv is not None and not uniform_joint:
                for index, n in groups:
                    dq_j, dk_j, dv_j = kernel.backward(
                        dout[index], q[index], joint_k[index, :n], joint_v[index, :n], out[index], lse[index],
                        spec.scale,
                    )  # fmt: skip
                    dq[index] += dq_j
                    djoint[0, index, :n], djoint[1, index, :n] = dk_j.to(acc_dtype), dv_j.to(acc_dtype)
            if dkv_comm:
                dkv_comm.step(dkv)  # after the last hop it reaches its owner
            if kv_comm and not last:
                kv = kv_comm.wait()
        if dkv_comm:
            dkv = dkv_comm.wait()
        dk, dv = dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        djk, djv = (None, None) if djoint is None else (djoint[0].to(k.dtype), djoint[1].to(v.dtype))
        return None, dq.to(q.dtype), dk, dv, djk, djv


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: RingSpec,
    joint_k: Tensor | None = None,
    joint_v: Tensor | None = None,
) -> Tensor:
    """Differentiable ring attention; see ``RingAttention`` for layouts."""
    return RingAttention.apply(spec, q, k, v, joint_k, joint_v)
