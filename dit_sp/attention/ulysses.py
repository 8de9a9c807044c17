"""Ulysses: trade sequence shards for head shards with one all-to-all over the Ulysses group.

``(B, S/N, H, D)`` on each of the ``N = ring*ulysses`` ranks becomes ``(B, S/R, H/U, D)``: the rank
then holds every head group ``ulysses_rank`` token of its ring block, so attention over the ring
needs no further Ulysses traffic. Heads that ``U`` does not divide are zero-padded (a zero head
attends uniformly to zero values: its output is zero and it is dropped again on the way back).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dit_sp.parallel.comm import all_gather, all_to_all
from dit_sp.parallel.state import ParallelState

Tensor = torch.Tensor


def padded_heads(heads: int, parallel: ParallelState) -> int:
    return -(-heads // parallel.ulysses) * parallel.ulysses


def pad_heads(x: Tensor, parallel: ParallelState, head_dim: int = -2) -> Tensor:
    """Zero-pad the head dimension of ``x`` to a multiple of the Ulysses degree."""
    pad = padded_heads(x.shape[head_dim], parallel) - x.shape[head_dim]
    if not pad:
        return x
    head_dim %= x.dim()
    return F.pad(x, [0, 0] * (x.dim() - head_dim - 1) + [0, pad])


def scatter_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """``(..., B, S_local, H_pad, D)`` -> ``(..., B, U*S_local, H_pad/U, D)``: gather the sequence of
    the Ulysses group (in rank order) and keep head group ``ulysses_rank``. Leading dims (e.g. a
    stacked q/k/v) ride along in the same single collective."""
    return all_to_all(x, parallel.ulysses_group, scatter_dim=-2, gather_dim=-3)


def gather_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """Inverse of ``scatter_heads``: ``(B, U*S_local, H_pad/U, D)`` -> ``(B, S_local, H_pad, D)``."""
    return all_to_all(x, parallel.ulysses_group, scatter_dim=-3, gather_dim=-2)


def local_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """This rank's head group of a replicated, head-padded ``(B, T, H_pad, D)`` tensor (no traffic)."""
    group = x.shape[-2] // parallel.ulysses
    return x.narrow(-2, parallel.ulysses_rank * group, group)


def all_heads(x: Tensor, parallel: ParallelState) -> Tensor:
    """Every head group of a ``(B, T, H_pad/U, D)`` tensor computed per rank -> ``(B, T, H_pad, D)`` on
    every rank. Backward sums the copies' gradients (exact adjoint of the replication)."""
    return all_gather(x, parallel.ulysses_group, dim=-2, grad="sum")
