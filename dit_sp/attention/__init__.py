"""Attention: local kernels returning (out, lse), ring, Ulysses and their USP composition."""

from dit_sp.attention.kernels import KERNELS, AttentionKernel, get_kernel
from dit_sp.attention.ring import RingAttention, RingSpec, ring_attention
from dit_sp.attention.usp import usp_attention

__all__ = [
    "KERNELS",
    "AttentionKernel",
    "RingAttention",
    "RingSpec",
    "get_kernel",
    "ring_attention",
    "usp_attention",
]
