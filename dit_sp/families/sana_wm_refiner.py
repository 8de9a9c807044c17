"""Sana-WM's stage-2 refiner (``SanaWMLTX2RefinerTransformer3DModel``, pipeline ``SanaWMLTX2Refiner``): LTX-2's video
stream alone, refining one block of latent frames a call while its self-attention (``attn1``) attends over
``[sink + recent history + current]`` keys and values kept in a ``SanaWMRefinerKVCache`` carried from call to call
(``kv_cache_mode``: ``capture_pre_rope`` records the current keys before RoPE, ``inject`` prepends the cache,
``inject_and_capture_post_rope`` prepends it and records the current keys after RoPE; the pipeline then moves the
captured keys into the sink or the history and trims the history by whole frames along the token axis).

Split under Ulysses alone: the packed video tokens ``(B, S, C)`` and their per-token timesteps ``(B, S)`` are cut
along S at the root (an uneven tail padded), the output is gathered at ``proj_out``. The text cross-attention
(``attn2``, local queries over the whole text), the feed-forward and the modulation are per token: local. Each
``attn1`` projects, RMS-normalises (over every head's channels: before any exchange) and computes its per-head gate
logits on its own tokens; then ``attend_whole_sequence`` gives every rank the whole sequence of its head group, where
diffusers' own ``SanaWMLTX2RefinerAttnProcessor`` runs as it is, with the rotary tables (``video_rotary_emb`` and the
cache's ``sink_pe``, whole on every rank: ``(B, S, H * D)`` interleaved or ``(B, H, S, D / 2)`` split) cut to the
group's heads. So every capture and inject mode sees the whole sequence of its heads, and the cache a split model
fills holds, per layer, that rank's head group ``(B, S_cache, h * D)``, whole in the sequence (1/U of it per rank):
the pipeline's own cache handling (whole frames along the token axis) runs unchanged on every rank. The gate and the
output projection run on the rank's tokens again. A ring would leave a rank one block of the cache's keys: refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.head_group import HeadGroupAttention, replace_stock_processors

if TYPE_CHECKING:
    import torch

REFINER = "SanaWMLTX2RefinerTransformer3DModel"

CFG_REFUSAL = (
    "SanaWMLTX2RefinerTransformer3DModel's calls are unguided and each reads and fills a key/value cache carried "
    "from call to call, which dit-sp's guidance pair cannot split; use cfg=1"
)


def refiner_plan(model: torch.nn.Module) -> dict:
    """The packed video tokens ``(B, S, C)`` and per-token timesteps ``(B, S)`` split along S, gathered at
    ``proj_out``; the rotary tables stay whole (cut per head group in the self-attention)."""
    cp_input, cp_output = context_parallel_types()
    return {
        "": {
            "hidden_states": cp_input(split_dim=1, expected_dims=3),
            "timestep": cp_input(split_dim=1, expected_dims=2),
        },
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _heads_of(table: tuple[torch.Tensor, torch.Tensor] | None, heads: slice, head_dim: int) -> Any:
    """A rotary ``(cos, sin)`` table cut to the heads ``heads``: ``(B, S, H * D)`` (interleaved) along channels,
    ``(B, H, S, D / 2)`` (split) along heads."""
    if table is None:
        return None
    if table[0].ndim == 4:
        return tuple(t[:, heads] for t in table)
    return tuple(t[..., heads.start * head_dim : heads.stop * head_dim] for t in table)


class RefinerSequenceParallelProcessor:
    """The refiner's ``attn1`` with its sequence split under Ulysses: projections, norms and gate logits on this
    rank's tokens ``(B, S_local, C)``, the stock processor (cache capture, RoPE, cache injection, attention) on the
    whole sequence of this rank's head group, the gate and output projection on this rank's tokens again."""

    def __init__(self, stock: Any, ctx: Any):
        self.stock, self.ctx = stock, ctx

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        sink_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_cache: Any = None,
        kv_cache_mode: str | None = None,
    ) -> torch.Tensor:
        """The stock processor's signature (``SanaWMLTX2Attention.forward`` passes the keyword arguments it names);
        ``hidden_states`` ``(B, S_local, C)``, the rotary tables whole; returns ``(B, S_local, C)``."""
        import torch
        import torch.nn.functional as F

        from dit_sp.attention import attend_whole_sequence, head_group

        parallel = self.ctx.parallel
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        query = attn.norm_q(attn.to_q(hidden_states))  # RMS over every head's channels: before the exchange
        key = attn.norm_k(attn.to_k(hidden_states))
        value = attn.to_v(hidden_states)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        heads = head_group(attn.heads, parallel)
        real = heads.stop - heads.start
        kwargs = {
            "query_rotary_emb": _heads_of(query_rotary_emb, heads, attn.head_dim),
            "sink_rotary_emb": _heads_of(sink_rotary_emb, heads, attn.head_dim),
            "kv_cache": kv_cache,
            "kv_cache_mode": kv_cache_mode,
        }

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # (B, S, H_pad / U, D)
            group = HeadGroupAttention(*(x[:, :, :real] for x in (q, k, v)))
            group.rope_type, group.to_gate_logits = attn.rope_type, None
            out = self.stock(group, q[:, :, :real].flatten(2), **kwargs)  # (B, S, h * D)
            return F.pad(out.unflatten(2, (real, -1)), (0, 0, 0, q.shape[2] - real))

        out = attend_whole_sequence(attend, [query, key, value], parallel, self.ctx.seq_len).type_as(query)
        if gate_logits is not None:
            out = out * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)
        return attn.to_out[1](attn.to_out[0](out.flatten(2)))


def refiner_hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Every block's ``attn1`` processor replaced by ``RefinerSequenceParallelProcessor`` over its own."""
    if ctx.parallel.cfg > 1:
        raise ConfigError(CFG_REFUSAL)
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2RefinerAttnProcessor

    attentions = {f"transformer_blocks.{i}.attn1": block.attn1 for i, block in enumerate(model.transformer_blocks)}
    return [replace_stock_processors(REFINER, attentions, SanaWMLTX2RefinerAttnProcessor,
                                     lambda stock: RefinerSequenceParallelProcessor(stock, ctx))]  # fmt: skip
