"""Worker-side checks that dit-sp fails loudly instead of silently (run in spawned ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from dit_sp import ParallelConfig, gather_sequence, init_parallel, parallelize, shard_sequence, usp_attention
from dit_sp.families import family_of
from dit_sp.sp.guidance import GuidancePair
from dit_sp.zoo import build_tiny


class ManualSoftmaxProcessor(WanAttnProcessor):
    """Wan attention computed by hand, ``softmax(q k^T) v``: no SDPA call that dit-sp could route."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        q, k, v = attn.to_q(hidden_states), attn.to_k(source), attn.to_v(source)
        q, k, v = (x.unflatten(-1, (attn.heads, -1)).transpose(1, 2) for x in (q, k, v))
        weights = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)
        return attn.to_out[0]((weights @ v).transpose(1, 2).flatten(2))


def wan_inputs(seed: int = 7) -> dict:
    """Inputs of the tiny Wan transformer: 9 video tokens, uneven over 2 ranks."""
    g = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(1, 4, 1, 6, 6, generator=g), "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, 8, 16, generator=g), "return_dict": False}  # fmt: skip


def with_manual_attention(model: torch.nn.Module) -> torch.nn.Module:
    for name, module in model.named_modules():
        if name.endswith("attn1"):
            module.processor = ManualSoftmaxProcessor()
    return model


def _error(fn) -> str:
    """The message of the exception ``fn()`` raises ('' if none)."""
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def check_loud_failures() -> dict:
    """On 2 ranks: an unrouted processor raises; seq_len mistakes raise; the cfg placeholder is NaN."""
    results = {}
    parallel = init_parallel(ParallelConfig(ulysses=2))
    model = with_manual_attention(build_tiny("tiny-wan", "transformer").float())
    with torch.no_grad(), parallelize(model, parallel):
        results["unrouted"] = _error(lambda: model(**wan_inputs()))

    # An uneven sequence (5 tokens over 2 ranks: the second shard ends in a zero token).
    full = torch.randn(3, 1, 5, 2, 4, generator=torch.Generator().manual_seed(0))
    q, k, v = (shard_sequence(x, parallel) for x in full)
    results["no_seq_len"] = _error(lambda: usp_attention(q, k, v, parallel))
    results["shard_len_as_seq_len"] = _error(lambda: usp_attention(q, k, v, parallel, seq_len=q.shape[1]))
    results["gather_no_seq_len"] = _error(lambda: gather_sequence(q, parallel))
    out = gather_sequence(usp_attention(q, k, v, parallel, seq_len=5), parallel, seq_len=5)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in full)).transpose(1, 2)
    results["padded_error"] = (out - ref).abs().max().item()  # the groups still work after the errors

    # cfg=2: the first (conditional) call of a sequential pipeline returns a placeholder that reads NaN.
    cfg = init_parallel(ParallelConfig(cfg=2))
    model = build_tiny("tiny-wan", "transformer").float()
    guidance = GuidancePair(cfg, family_of(model))
    cond, uncond = wan_inputs(1), wan_inputs(2)
    with torch.no_grad():
        (placeholder,) = guidance.sequential(model, model.forward, (), cond)
        results["placeholder_all_nan"] = bool(placeholder.isnan().all())
        (uncond_out,) = guidance.sequential(model, model.forward, (), uncond)
        results["cond_error"] = (placeholder - model(**cond)[0]).abs().max().item()
        results["uncond_error"] = (uncond_out - model(**uncond)[0]).abs().max().item()
    return results
