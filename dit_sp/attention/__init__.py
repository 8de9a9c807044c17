"""Attention: local kernels returning (out, lse), ring, Ulysses and their USP composition."""

from dit_sp.attention.kernels import KERNELS, AttentionKernel, get_kernel
from dit_sp.attention.ring import RingAttention, RingSpec, ring_attention
from dit_sp.attention.ulysses import attend_whole_sequence, head_group
from dit_sp.attention.usp import usp_attention

__all__ = [
    "KERNELS",
    "AttentionKernel",
    "RingAttention",
    "RingSpec",
    "attend_whole_sequence",
    "get_kernel",
    "head_group",
    "ring_attention",
    "usp_attention",
]
