"""NABLA sparse self-attention (Kandinsky 5's ``attention_type: nabla``, Kandinsky 6 SR's) split under Ulysses.

NABLA flattens the token grid in fractal order (``8 x 8`` spatial neighbourhoods, 64 consecutive tokens each) and,
per head, takes the 64-token blocks' mean queries and keys to a softmax map over key blocks; each query block keeps
the key blocks carrying the top share of its row's mass, OR a static sliding-tile prior (``sta_mask``, the same for
every head), and flex attention runs with that ``BlockMask``. Nothing mixes heads, so one head's mask needs that
head's whole sequence only: ``attend_whole_sequence`` gives each rank the whole fractal-ordered sequence of its head
group, where it builds exactly the one-process masks of its heads. A ring rank would hold one block of keys, and a
row's top share needs every key block's score: Ulysses alone (``ring > 1`` raises ``LayoutRefused``).

The families differ in three model-specific steps, named by ``NablaOps``: the rotary embedding, the mask builder
(its threshold's key in ``sparse_params``) and the attention call. Each is looked up in the diffusers module at call
time, where the stock processor finds it too.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dit_sp.errors import LayoutRefused

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


@dataclass(frozen=True)
class NablaOps:
    """A family's NABLA steps, by name in its diffusers module (``module``)."""

    module: str
    """The diffusers module whose functions the stock processor calls."""
    mask: str
    """Its mask builder ``(query, key, sta_mask, thr=...) -> BlockMask``."""
    heads_first: bool
    """Whether the mask builder takes ``(B, h, S, D)`` (else ``(B, S, h, D)``, transposing itself)."""
    threshold: str
    """The key of the mass share to keep in ``sparse_params``."""
    rotary: Any
    """``(x (B, S, h, D), rope) -> x`` rotated as the stock processor rotates (per token)."""
    ring_refusal: str
    """Why a ring is refused (one line)."""

    def attend(self, query: Tensor, key: Tensor, value: Tensor, sparse_params: dict[str, Any]) -> Tensor:
        """``(B, S, h, D)`` each, the whole fractal-ordered sequence of some heads: the stock mask and flex attention
        (the names the stock processor calls, from its module, so that a test's stand-in reaches both)."""
        from diffusers.models.attention_dispatch import AttentionBackendName

        stock = sys.modules.get(self.module)  # what compiled blocks trace (importlib.import_module is a graph break)
        if stock is None:
            stock = importlib.import_module(self.module)
        q, k = (query.transpose(1, 2), key.transpose(1, 2)) if self.heads_first else (query, key)
        mask = getattr(stock, self.mask)(q, k, sparse_params["sta_mask"], thr=sparse_params[self.threshold])
        return stock.dispatch_attention_fn(query, key, value, attn_mask=mask, backend=AttentionBackendName.FLEX)


class SequenceParallelNablaProcessor:
    """A NABLA self-attention on this rank's tokens ``(B, S_local, C)`` (in fractal order): projections, RMS norms
    and rotary embedding per token, as the stock processor; NABLA's mask and flex attention on the whole sequence of
    this rank's head group (``attend_whole_sequence``); the output projection per token."""

    def __init__(self, ctx: Any, ops: NablaOps):
        self.ctx = ctx  # the model's dit_sp.sp.context.SequenceContext
        self.ops = ops

    def __call__(self, attn: Any, hidden_states: Tensor, rotary_emb: Tensor, sparse_params: dict[str, Any]) -> Tensor:
        from dit_sp.attention import attend_whole_sequence

        parallel = self.ctx.parallel
        if parallel.ring > 1:  # attend_whole_sequence refuses it too: this says why, as parallelize would
            raise LayoutRefused(f"{self.ops.ring_refusal} (got ring {parallel.ring})")
        heads = attn.num_heads
        query, key, value = (layer(hidden_states).unflatten(-1, (heads, -1))
                             for layer in (attn.to_query, attn.to_key, attn.to_value))  # fmt: skip
        query = self.ops.rotary(attn.query_norm(query.float()).type_as(query), rotary_emb)
        key = self.ops.rotary(attn.key_norm(key.float()).type_as(key), rotary_emb)
        out = attend_whole_sequence(lambda q, k, v: self.ops.attend(q, k, v, sparse_params), [query, key, value],
                                    parallel, self.ctx.seq_len)  # fmt: skip
        return attn.out_layer(out.flatten(2, 3))
