"""What the NABLA checks (Kandinsky 5's and 6 SR's) put in place of a diffusers transformer module's functions while
inside: the masks recorded, and flex attention made differentiable on CPU."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask


@contextlib.contextmanager
def _replaced(module_name: str, name: str, make: Any) -> Iterator[None]:
    """``module.name`` replaced by ``make(stock)`` while inside."""
    module = importlib.import_module(module_name)
    stock = getattr(module, name)
    setattr(module, name, make(stock))
    try:
        yield
    finally:
        setattr(module, name, stock)


def recorded_masks(module_name: str, builder: str, masks: list[torch.Tensor]) -> contextlib.AbstractContextManager:
    """Record each NABLA mask built (``(B, h, blocks, blocks)``, dense) by the module's mask ``builder`` (which the
    stock processor and dit-sp's both call) while inside."""

    def make(stock: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            mask = stock(*args, **kwargs)
            masks.append(mask.to_dense().clone())
            return mask

        return record

    return _replaced(module_name, builder, make)


def dense_block_attention(module_name: str) -> contextlib.AbstractContextManager:
    """The module's ``dispatch_attention_fn`` as SDPA, a ``BlockMask`` made dense (blocks of ``BLOCK_SIZE`` tokens):
    differentiable on CPU, where torch's flex attention has no backward. Both runs of a comparison use it. It applies
    the mask's block sparsity, which the compiled flex kernel does and eager flex does not: NABLA's ``BlockMask`` has
    no ``mask_mod``, and eager flex attention (on CPU) applies only a ``mask_mod``, attending to every key."""

    def make(stock: Any) -> Any:
        def dense(query, key, value, attn_mask=None, **options):  # (B, S, h, D); the backend named
            if isinstance(attn_mask, BlockMask):
                size = attn_mask.BLOCK_SIZE[0]
                blocks = attn_mask.to_dense().bool().repeat_interleave(size, -2).repeat_interleave(size, -1)
                attn_mask = blocks[..., : query.shape[1], : key.shape[1]]
            out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (query, key, value)), attn_mask=attn_mask)
            return out.transpose(1, 2)

        return dense

    return _replaced(module_name, "dispatch_attention_fn", make)
