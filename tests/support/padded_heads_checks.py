"""Worker-side measurements of Ulysses with padded heads: the live tensor bytes of ``usp_attention`` alone and of a
parallelized Wan transformer's forward (no grad) and forward + backward, with its output against one process."""

from __future__ import annotations

import os

import torch
from live_bytes import LiveBytes

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.attention import usp_attention


def padded_layout_peaks(spec: dict, frames: int, size: int, attention_heads: tuple[int, ...], local_len: int) -> dict:
    """On Ulysses ``WORLD_SIZE``: ``attention``: the peak live bytes of one ``usp_attention`` (no grad) on
    ``(1, local_len, H, 64)`` q, k and v for each ``H`` of ``attention_heads``; ``sampling`` and ``training``: the
    peak live bytes of a ``WanTransformer3DModel`` (``spec``) forward without grad, and of a forward + backward (the
    gradients allocated by a first pass), on ``frames x size x size`` latents; ``error``: its output's largest
    difference from the same model on one process."""
    from diffusers import WanTransformer3DModel

    world = int(os.environ["WORLD_SIZE"])
    parallel = init_parallel(ParallelConfig.for_world(world, ulysses=world))
    out: dict = {"attention": {}}
    for heads in attention_heads:
        q, k, v = (torch.randn(1, local_len, heads, 64) for _ in range(3))
        with torch.no_grad(), LiveBytes() as live:
            usp_attention(q, k, v, parallel, seq_len=local_len * world)
        out["attention"][heads] = live.peak
    torch.manual_seed(0)
    model = WanTransformer3DModel(**spec)
    hidden, text = torch.randn(1, spec["in_channels"], frames, size, size), torch.randn(1, 16, spec["text_dim"])

    def call() -> torch.Tensor:
        return model(hidden_states=hidden, timestep=torch.tensor([500.0]), encoder_hidden_states=text,
                     return_dict=False)[0]  # fmt: skip

    with torch.no_grad():
        reference = call()
    handle = parallelize(model, parallel)
    with torch.no_grad(), LiveBytes() as live:
        split = call()
    out["sampling"], out["error"] = live.peak, (split - reference).abs().max().item()
    call().square().mean().backward()
    with LiveBytes() as live:
        call().square().mean().backward()
    out["training"] = live.peak
    handle.undo()
    return out
