"""Wan Animate (``WanAnimateTransformer3DModel``; ``WanAnimatePipeline``: a reference image animated by pose and
face videos).

Wan 2.1 I2V's blocks (self-attention ``attn1`` through USP; cross-attention to the text and CLIP image tokens local)
with three additions, all but the last before the sequence is split:

- the pose video's latents are patch-embedded and added to the video tokens of every frame but the first (the
  reference frame, whose latents sit in front of the segment's in time); the reference and the previous segment's
  frames enter as channels of the input, as in Wan I2V;
- a motion encoder and a face encoder turn the face video into ``N`` motion tokens per latent frame
  ``(B, T, N, C)``, computed whole on every rank;
- every ``inject_face_latents_blocks``-th block is followed by a face adapter: each video token attends to the
  motion tokens of its own latent frame. The stock processor finds a token's frame by reshaping the sequence into
  ``(T, tokens per frame)``, which a rank's shard does not hold. The sequence is frames-major, so a rank's shard
  ``[start, start + L)`` covers whole frames plus parts of at most two: a hook puts the shard into a zero-filled
  buffer of those whole frames, hands the adapter the motion tokens of exactly these frames, and takes the shard's
  rows back out of its output. The adapter is token-wise given the frame (its queries are the video tokens, its
  keys the frame's motion tokens), so this is exact for any split, even or not; the buffer's filler rows cost at
  most two frames of adapter work per rank, and a split on frame boundaries (frames divisible by the SP degree)
  costs none.

The rotary tables are split with the tokens (as Wan's plan does). diffusers ships no ``_cp_plan`` for this model.

Step caches: the blocks are this module's own copy of Wan's block class (``block_outputs``), and the face adapters
are declared as added between the blocks (``cache_between_blocks``): on a skipped step those inside the cached
residual add nothing (``dit_sp.cache.between``); the shard hooks above still run around them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe
from dit_sp.families.wan import WAN, wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = cp_input(split_dim=1, expected_dims=4, split_output=True)  # (1, S, 1, D) cos and sin
    return {
        "rope": {0: rope, 1: rope},
        "blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def frame_window(seq_len: int, frames: int, local_len: int, sp_rank: int) -> tuple[int, int, int, int]:
    """Where a rank's shard of a frames-major sequence lies among the frames: ``(first, last, offset, valid)``:
    the frames ``first..last`` (inclusive) that its real tokens touch, the shard's offset in the first of them, and
    its real (not padding) tokens. ``seq_len`` tokens of ``frames`` frames, ``local_len`` tokens per rank."""
    if seq_len % frames:
        raise ValueError(f"Wan Animate's face adapter takes {frames} motion frames, and {seq_len} video tokens are "
                         "not a whole number of tokens per frame: give latents of as many frames as the face "
                         "video's")  # fmt: skip
    per_frame = seq_len // frames
    start = sp_rank * local_len
    valid = max(0, min(local_len, seq_len - start))
    if valid == 0:  # a shard of padding only (more ranks than tokens): the last frame stands in
        return frames - 1, frames - 1, 0, 0
    first, last = start // per_frame, (start + valid - 1) // per_frame
    return first, last, start - first * per_frame, valid


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Each face adapter gets this rank's whole frames of video tokens and their motion tokens (see the module's
    docstring); its output is cut back to the shard."""
    import torch

    windows: list[tuple[int, int, int]] = []  # (offset, valid, local length) of the adapter call in progress

    def to_frames(adapter, args, kwargs):
        args, kwargs = list(args), dict(kwargs)
        hidden = args[0] if args else kwargs["hidden_states"]  # (B, L, C): this rank's shard
        motion = args[1] if len(args) > 1 else kwargs["encoder_hidden_states"]  # (B, T, N, C): every frame's
        first, last, offset, valid = frame_window(ctx.seq_len, motion.shape[1], hidden.shape[1], ctx.parallel.sp_rank)
        per_frame = ctx.seq_len // motion.shape[1]
        length = (last - first + 1) * per_frame
        windows.append((offset, valid, hidden.shape[1]))
        if (offset, valid, hidden.shape[1]) != (0, length, length):  # not exactly whole frames (or padding rows)
            batch, channels = hidden.shape[0], hidden.shape[2]
            before, after = (hidden.new_zeros(batch, n, channels) for n in (offset, length - offset - valid))
            hidden = torch.cat([before, hidden[:, :valid], after], 1)
        motion = motion[:, first : last + 1]
        for index, (name, value) in enumerate((("hidden_states", hidden), ("encoder_hidden_states", motion))):
            if len(args) > index:
                args[index] = value
            else:
                kwargs[name] = value
        return tuple(args), kwargs

    def to_shard(adapter, args, kwargs, output):
        offset, valid, local = windows.pop()
        out = output[:, offset : offset + valid]
        if valid < local:  # the padding rows of an uneven sequence's last shard
            out = torch.cat([out, out.new_zeros(out.shape[0], local - valid, out.shape[2])], 1)
        return out

    handles = []
    for adapter in model.face_adapter:
        handles.append(adapter.register_forward_pre_hook(to_frames, with_kwargs=True))
        handles.append(adapter.register_forward_hook(to_shard, with_kwargs=True))
    return handles


_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40, "in_channels": 36, "latent_channels": 16,
        "image_dim": 1280, "added_kv_proj_dim": 5120}  # fmt: skip
_ARCHITECTURES = {
    # Wan2.2-Animate-14B: Wan 2.1 I2V 14B's transformer, the pose embedding, the motion and face encoders and 8 face
    # adapters (diffusers' defaults); UMT5-XXL, Wan 2.1's VAE (and a CLIP ViT-H image encoder, 0.63e9, not counted)
    "wan2.2-animate-14b": wan_architecture({"transformer": _14B}, "WanAnimateTransformer3DModel"),
}
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

PIPELINE = "WanAnimatePipeline"

WAN_ANIMATE = ModelFamily(
    name="wan_animate",
    # its face adapters add to the hidden states after every inject_face_latents_blocks-th block: a skipped step's
    # cached residual holds them (dit_sp.cache.between)
    cache_between_blocks=("face_adapter",),
    block_outputs={"WanTransformerBlock": (0, None)},  # its own copy of Wan's block class, returning the video alone
    teacache_probe=timestep_probe,  # Wan's: the blocks' timestep modulation, (B, 6, C)
    class_names=("WanAnimateTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    shape_check=WAN.shape_check,
    tiny_models=("tiny-wan-animate",),
    # the pipeline's own defaults (one 77-frame segment, 720 x 1280, 20 steps, no guidance) and its example's 30 fps
    checkpoint_defaults={PIPELINE: generation_defaults(77, 720, 1280, 20, 1.0, 512) | {"fps": 30}},
    vae_factors={PIPELINE: wan_vae_factors},
    architectures=_ARCHITECTURES,
    policy_refused={
        "WanAnimatePipeline": (
            "every sample needs a pose video and a face video driving its reference image (and, to replace a "
            "person, a background and a mask video), which a GRPO prompt file (a prompt and at most one "
            "image) cannot supply; long videos are generated segment by segment on the previous segment's "
            "frames"
        ),
    },
)
