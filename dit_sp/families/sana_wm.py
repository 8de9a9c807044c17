"""Sana-WM (``SanaWMTransformer3DModel``, pipeline ``SanaWMPipeline``: a camera-controlled world model).

Each block attends through a main branch and a camera branch (UCPE: per-ray 4x4 transforms of each token), summed
before a shared output gate: in three of every four blocks both are a bidirectional gated-delta-rule linear attention
(a per-head state scan over the frames, once forwards and once backwards), in every ``softmax_every_n``-th a softmax
attention (``F.scaled_dot_product_attention`` in bf16). Then cross-attention to the text and a feed-forward of
convolutions within each frame plus a (3, 1) convolution over the frames.

The split is by whole latent frames, as Sana-Video's (``dit_sp.families.sana_video``): the latents
``(B, C, F, H, W)``, the per-frame timesteps ``(B, 1, F)`` and the Plucker embeddings ``(B, C, F, H, W)`` are cut
along F at the root, ``ceil(F / sp)`` frames a rank, the last ranks padded with zero frames. Then, on a rank:

- everything before and after the attention proper is per token or per frame (projections, the RMS norms over all
  channels, the kernel, ``beta`` per token and head, the gate from each frame's mean token, the modulation): local;
- the temporal short convolutions on q/k/v (kernel k, run forwards and backwards: they reach k - 1 frames each way)
  and the feed-forward's (3, 1) convolution get that many frames of each neighbour rank (``halo``; padded frames
  zeroed first, so the last real frame sees zeros after it, as in one process);
- the attention proper (the four parameter-free branch modules: ``SanaWMBidirectionalGDNAttention``,
  ``SanaWMBidirectionalGDNCamAttention``, ``SanaWMSoftmaxAttention``, ``SanaWMSoftmaxCamAttention``) runs stock over
  the WHOLE sequence of this rank's Ulysses head group (``dit_sp.attention.attend_whole_sequence``: q, k, v and
  ``beta`` in one all-to-all; the per-frame decay, fp32, all-gathered), the padded frames (all at the end) cut off:
  the scans see every frame of their heads, in order, exactly as in one process. The rotary table and the camera's
  ray transforms are the whole video's on every rank (the rotary module is asked for all F frames; the camera
  conditions ``(B, F, 20)`` are left whole, so the model builds every frame's transforms);
- the output is gathered along F.

Step caches: each block (``SanaVideoMSCamCtrlBlock``) takes the video as ``x`` and returns it alone; the family
registers that with diffusers' block registry (``block_outputs`` with the argument's name). Nothing runs between the
blocks. The pipeline batches both guidance branches into its one call a step, outside any cache context (one context,
``cfg_mode="batched"``). The decisions count each rank's real frames only (the last rank's padding left out). TeaCache's
probe: the per-frame timestep modulation. The refiner's blocks have no diffusers block metadata and read and write its
key/value cache: refused in one line.

Ulysses alone: a ring would hold one block of the scan's frames at a time (refused in one line at ``parallelize``).

The stage-2 refiner (``SanaWMLTX2RefinerTransformer3DModel``, same family) has its own plan and hooks in
``dit_sp.families.sana_wm_refiner``: its video tokens split, its key/value cache kept per Ulysses head group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.ltx import ltx_vae_factors
from dit_sp.families.sana_video import frame_halo_hooks, gather_frames, rank_frames
from dit_sp.families.sana_wm_refiner import REFINER, refiner_hooks, refiner_plan

if TYPE_CHECKING:
    import torch

    from dit_sp.parallel.state import ParallelState

RING_REFUSAL = (
    "SanaWMTransformer3DModel's gated-delta-rule attention scans each head's state over every frame in order, and "
    "its refiner's self-attention (SanaWMLTX2RefinerTransformer3DModel) prepends a key/value cache of whole frames: "
    "only Ulysses splits them exactly (each rank then holds the whole sequence of its heads); use ring 1"
)
"""Why a ring cannot split Sana-WM (``ModelFamily.ring_refused``; ``parallelize`` adds the layout it was given)."""


def _plan(model: torch.nn.Module) -> dict:
    if type(model).__name__ == REFINER:
        return refiner_plan(model)
    cp_input, _ = context_parallel_types()
    frames = cp_input(split_dim=2, expected_dims=5)  # (B, C, F, H, W): whole frames per rank
    per_frame = cp_input(split_dim=2, expected_dims=3)  # (B, 1, F) timesteps
    return {"": {"hidden_states": frames, "timestep": per_frame, "chunk_plucker": frames}}


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """TeaCache's probe: the per-frame timestep modulation the blocks take (``t``, ``(B, 1, F_local, 6 C)``, split by
    frames as the video), as ``(B, F_local, 6 C)``."""
    return block_argument(meta, "t", args, kwargs).flatten(1, 2), True


def _layout_check(model: torch.nn.Module, parallel: ParallelState) -> None:
    refiner = type(model).__name__ == REFINER
    heads = model.transformer_blocks[0].attn1.heads if refiner else model.blocks[0].attn.heads
    group = -(-heads // parallel.ulysses)
    if (parallel.ulysses - 1) * group >= heads:  # the last head group would hold padding only
        raise NotImplementedError(
            f"Ulysses {parallel.ulysses} over {type(model).__name__}'s {heads} heads ({group} a rank) leaves the "
            "last rank no head to scan: use a Ulysses degree that leaves every rank a head (one that divides the heads)"
        )


def _check_call(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Arguments that would need a split dit-sp does not do (the pipeline passes neither)."""
    data_info = kwargs.get("data_info") or {}
    if data_info.get("image_vae_embeds") is not None:
        raise NotImplementedError(
            "SanaWMTransformer3DModel's data_info['image_vae_embeds'] is not split by frames by dit-sp: concatenate "
            "it to hidden_states in channels before the call"
        )
    if kwargs.get("frame_valid_mask") is not None:
        raise NotImplementedError(
            "SanaWMTransformer3DModel's frame_valid_mask is not split by dit-sp: pass the valid frames only, or run "
            "the call on one process per sample (dp)"
        )


def _short_conv_hooks(conv: torch.nn.Module, ctx: Any) -> list[Any]:
    """``SanaWMTemporalShortConvolution`` (input ``(B, F_local * S, C)`` and its frame count; kernel k run forwards
    and backwards, zero padded: it reaches ``k - 1`` frames each way) on this rank's frames exactly: padded frames
    zeroed, ``k - 1`` frames of each neighbour around them, their outputs dropped."""
    import torch

    from dit_sp.parallel.comm import halo

    width = conv.kernel_size - 1

    def before(module, args):
        x, frames = args
        if frames < width:
            raise ValueError(
                f"SANA-WM's temporal short convolution reaches {width} frames each way, and a rank holds {frames} "
                f"latent frames ({ctx.seq_len} over {ctx.parallel.sp} ranks): use fewer ranks or more frames"
            )
        x = x.unflatten(1, (frames, -1))  # (B, F_local, S, C)
        real = rank_frames(ctx)[1]
        if real < frames:
            x = x * (torch.arange(frames, device=x.device) < real).to(x.dtype)[:, None, None]
        return halo(x, ctx.parallel.sp_group, dim=1, width=width).flatten(1, 2), frames + 2 * width

    def after(module, args, output):
        per_frame = output.shape[1] // args[1]
        return output.narrow(1, width * per_frame, output.shape[1] - 2 * width * per_frame)

    return [conv.register_forward_pre_hook(before), conv.register_forward_hook(after)]


def _whole_sequence(
    ctx: Any, tensors: list[torch.Tensor], run: Callable[[list[torch.Tensor], slice], torch.Tensor]
) -> torch.Tensor:
    """``run`` over the whole sequence of this rank's head group.

    Args:
        tensors: this rank's per-token tensors ``(B, F_local * S, H, D_i)``, one dtype (sent in one all-to-all).
        run: takes them whole ``(B, F * S, h, D_i)`` for the real heads ``heads`` of this rank's group (the padded
            frames cut off) and returns ``(B, F * S, h * D_out)``.

    Returns:
        This rank's output ``(B, F_local * S, H * D_out)``.
    """
    import torch
    import torch.nn.functional as F

    from dit_sp.attention import attend_whole_sequence, head_group

    parallel, frames = ctx.parallel, ctx.seq_len
    batch, local, heads = tensors[0].shape[:3]
    per_frame = local // -(-frames // parallel.sp)
    sizes = [t.shape[-1] for t in tensors]
    group = head_group(heads, parallel)
    real = group.stop - group.start

    def attend(packed: torch.Tensor) -> torch.Tensor:  # (B, sp * F_local * S, H_pad / U, sum D_i)
        tokens = frames * per_frame
        parts = [part.contiguous() for part in packed[:, :tokens, :real].split(sizes, -1)]
        out = run(parts, group).unflatten(-1, (real, -1))
        return F.pad(out, (0, 0, 0, packed.shape[2] - real, 0, packed.shape[1] - tokens))

    packed = torch.cat(tensors, -1) if len(tensors) > 1 else tensors[0]
    return attend_whole_sequence(attend, [packed], parallel, local * parallel.sp).flatten(2)


def _per_token(gate: torch.Tensor, local: int) -> torch.Tensor:
    """``beta`` ``(B, H, F_local, S)`` as a per-token tensor ``(B, F_local * S, H, 1)``."""
    return gate.permute(0, 2, 3, 1).reshape(gate.shape[0], local, gate.shape[1], 1)


def _whole_decay(ctx: Any, decay: torch.Tensor) -> torch.Tensor:
    """The per-frame decay ``(B, H, F_local)`` (fp32, kept so: not packed with the tokens) of every rank:
    ``(B, H, F)``. The all-gather's adjoint sums each rank's gradient of a rank's frames back to it."""
    from dit_sp.parallel.comm import all_gather

    whole = all_gather(decay.contiguous(), ctx.parallel.ulysses_group, dim=2, grad="sum")
    return whole[:, :, : ctx.seq_len]


def _unmasked(**masks: Any) -> None:
    if any(mask is not None for mask in masks.values()):  # the model's frame_valid_mask, refused at the call
        raise NotImplementedError("SANA-WM's frame masks are not split by dit-sp")


def _gdn(module: torch.nn.Module, ctx: Any) -> Callable[..., torch.Tensor]:
    """``SanaWMBidirectionalGDNAttention.forward`` over the whole sequence of this rank's heads."""

    def forward(query, key, value, beta, decay, recall_gate, num_frames, rotary_emb=None, **masks):
        _unmasked(**masks)
        whole_decay = _whole_decay(ctx, decay)

        def run(parts, heads):
            q, k, v, b = parts
            b = b.squeeze(-1).unflatten(1, (ctx.seq_len, -1)).permute(0, 3, 1, 2)  # (B, h, F, S)
            return type(module).forward(module, q, k, v, b, whole_decay[:, heads], recall_gate, ctx.seq_len,
                                        rotary_emb=rotary_emb)  # fmt: skip

        return _whole_sequence(ctx, [query, key, value, _per_token(beta, query.shape[1])], run)

    return forward


def _gdn_camera(module: torch.nn.Module, ctx: Any) -> Callable[..., torch.Tensor]:
    """``SanaWMBidirectionalGDNCamAttention.forward`` over the whole sequence of this rank's heads (the ray
    transforms are the whole video's)."""

    def forward(query, key, value, ray_transforms, beta, decay, num_frames, **masks):
        _unmasked(**masks)
        whole_decay = _whole_decay(ctx, decay)

        def run(parts, heads):
            q, k, v, b = parts
            b = b.squeeze(-1).unflatten(1, (ctx.seq_len, -1)).permute(0, 3, 1, 2)
            return type(module).forward(module, q, k, v, ray_transforms, b, whole_decay[:, heads], ctx.seq_len)

        return _whole_sequence(ctx, [query, key, value, _per_token(beta, query.shape[1])], run)

    return forward


def _softmax(module: torch.nn.Module, ctx: Any) -> Callable[..., torch.Tensor]:
    """``SanaWMSoftmaxAttention.forward`` (rotary table) or ``SanaWMSoftmaxCamAttention.forward`` (ray transforms)
    over the whole sequence of this rank's heads."""

    def forward(query, key, value, *args, token_valid_mask=None, **kwargs):
        _unmasked(token_valid_mask=token_valid_mask)
        run = lambda parts, heads: type(module).forward(module, *parts, *args, **kwargs)
        return _whole_sequence(ctx, [query, key, value], run)

    return forward


_BRANCHES = {
    "SanaWMBidirectionalGDNAttention": _gdn,
    "SanaWMBidirectionalGDNCamAttention": _gdn_camera,
    "SanaWMSoftmaxAttention": _softmax,
    "SanaWMSoftmaxCamAttention": _softmax,
}
"""The parameter-free branch modules (the attention proper) and what runs them over the whole sequence."""


class _Forward:
    """A removable handle that takes back an instance-level ``forward``."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    if type(model).__name__ == REFINER:
        return refiner_hooks(model, ctx)

    def rope(module, args):  # the whole video's table on every rank: the scans run over every frame
        return ((ctx.seq_len, *args[0][1:]),)

    def raymap(module, args, output):  # the whole video's ray-map embedding (B, F * S, C): this rank's frames
        import torch.nn.functional as F

        local = -(-ctx.seq_len // ctx.parallel.sp)
        per_frame = output.shape[1] // ctx.seq_len
        padded = F.pad(output, (0, 0, 0, (local * ctx.parallel.sp - ctx.seq_len) * per_frame))
        return padded.narrow(1, ctx.parallel.sp_rank * local * per_frame, local * per_frame)

    handles = [model.register_forward_pre_hook(_check_call, with_kwargs=True)]
    handles.append(model.raymap_embedder.register_forward_hook(raymap))
    if getattr(model, "rope", None) is not None:
        handles.append(model.rope.register_forward_pre_hook(rope))
    for block in model.blocks:
        for conv in ("conv_q", "conv_k", "conv_v", "conv_q_cam", "conv_k_cam", "conv_v_cam"):
            if getattr(block.attn, conv, None) is not None:
                handles += _short_conv_hooks(getattr(block.attn, conv), ctx)
        if hasattr(block.mlp, "t_conv"):
            handles += frame_halo_hooks(block.mlp.t_conv, ctx)
        for branch in (block.attn.attn, block.attn.cam_attn):
            branch.forward = _BRANCHES[type(branch).__name__](branch, ctx)
            handles.append(_Forward(branch))
    return [*handles, model.register_forward_hook(gather_frames(ctx))]


def _check(model: torch.nn.Module) -> None:
    if type(model).__name__ == REFINER:
        return
    kinds = {type(b.attn.attn).__name__ for b in model.blocks} | {type(b.attn.cam_attn).__name__ for b in model.blocks}
    if unknown := kinds - set(_BRANCHES):
        raise NotImplementedError(f"SanaWMTransformer3DModel with attention {sorted(unknown)} is not split by dit-sp")
    if model.config.ffn_type not in ("GLUMBConvTemp", "mlp"):
        raise NotImplementedError(f"SanaWMTransformer3DModel's ffn_type {model.config.ffn_type!r} is not split")


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    """LTX-2's VAE (``AutoencoderKLLTX2Video``), read as LTX-2's pipelines read it."""
    return ltx_vae_factors(vae, scaling=(True, True, True, True))  # AutoencoderKLLTX2Video's default scaling


_ARCHITECTURES = {
    # SANA-WM bidirectional (Efficient-Large-Model/SANA-WM_bidirectional): diffusers' defaults are its transformer
    # (2.66e9 parameters counted on meta, the camera branch included); Gemma 2 2B's text states, LTX-2's video VAE
    "sana-wm_bidirectional": {"transformers": {"transformer": ("SanaWMTransformer3DModel", {
        "in_channels": 128, "num_layers": 20, "hidden_size": 2240, "num_attention_heads": 20, "linear_head_dim": 112,
        "patch_size": [1, 1, 1], "mlp_ratio": 3.0, "caption_channels": 2304})},
        "text_encoders": 2.61e9, "vae": 1.28e9, "compression": (8, 32), "text_tokens": 300, "joint": False},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""

SANA_WM = ModelFamily(
    name="sana_wm",
    class_names=("SanaWMTransformer3DModel", REFINER),
    plan=_plan,
    hooks=_hooks,
    attention_modules=(),  # its attention is run by the hooks' branch forwards; the cross-attention is local
    cfg_mode="batched",
    cfg_batched_args=(
        "hidden_states",
        "timestep",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "mask",
        "camera_conditions",
        "chunk_plucker",
    ),  # fmt: skip
    check=_check,
    layout_check=_layout_check,
    ring_refused=RING_REFUSAL,
    block_outputs={"SanaVideoMSCamCtrlBlock": (0, None, "x")},  # each block takes the video as x, returns it alone
    teacache_probe=_teacache_probe,
    tiny_models=("tiny-sana-wm",),
    checkpoint_defaults={"SanaWMPipeline": generation_defaults(161, 704, 1280, 60, 5.0, 300)},
    vae_factors={"SanaWMPipeline": _vae_factors},
    refiners={"SanaWMPipeline": "SanaWMLTX2Refiner"},  # generate --refine: stage 2 on stage 1's latents
    architectures=_ARCHITECTURES,
    policy_refused={
        "SanaWMPipeline": (
            "a camera-controlled world model: every sample needs its first-frame image and a camera "
            "trajectory (c2w poses or an action, exactly one of them required), which a GRPO prompt file (a "
            "prompt and at most one image) cannot supply"
        ),
    },
)
