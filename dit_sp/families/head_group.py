"""A stand-in for a diffusers attention module, for running its stock processor's per-head part on one Ulysses head
group's whole sequence (inside ``dit_sp.attention.attend_whole_sequence``): AnyFlow FAR's, Wan-Animate-2's and
Sana-WM's refiner's processors, whose KV caches, rotary tables and flex block masks are applied per head, as the stock
code applies them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class HeadGroupAttention:
    """What a stock processor reads of its attention module, for q, k, v ``(B, S, h, D)`` already projected and
    normalised (on the token shards, before the all-to-all): ``to_q``/``to_k``/``to_v`` hand them back flattened
    ``(B, S, h * D)`` whatever they are given, the norms and the output projection are the identity, ``heads`` is
    ``h``."""

    fused_projections = False
    is_cross_attention = False
    norm_q = norm_k = staticmethod(_identity)
    to_out = (_identity, _identity)

    def __init__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        self.heads = query.shape[2]
        self.to_q, self.to_k, self.to_v = (lambda _, x=x: x.flatten(2) for x in (query, key, value))
