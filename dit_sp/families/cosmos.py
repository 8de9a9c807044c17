"""Cosmos 1, 2 and 2.5 (``CosmosTransformer3DModel``; text-to-world, video-to-world, Cosmos 2.5's image context).

Each block attends over the video (``attn1``, through USP) and cross-attends to the text (``attn2``; Cosmos 2.5
also to image tokens): local queries against replicated keys, no communication. The model computes its rotary
tables, its learnable positional embedding and, with per-frame timesteps (video-to-world's conditioning frames,
``timestep`` of shape ``(B, 1, T, 1, 1)``), its per-token modulation for the whole video and hands them to every
block: the plan splits the rotary tables and the positional embedding where their modules return them, the video
tokens at the first block, the per-token modulation (and Cosmos-Transfer2.5's ControlNet residual, added to the
block's output) where each block and the output norm take it, and gathers at ``proj_out``. diffusers ships no
``_cp_plan`` for this model.

The stock Cosmos 2 / 2.5 pipelines compute with the conditional prediction before they make the unconditional call,
so the two branches cannot run at once on two process groups: CFG parallelism is refused for them.
Cosmos-Transfer2.5's ControlNet (``CosmosControlNetModel``) is split as the transformer is (``CONTROLNET``: its
control and base tokens at its first block), its residuals gathered whole and split again where the transformer's
blocks take them. The ControlNet and the transformer's padding-mask channel (``concat_padding_mask``) resize a mask
with torchvision: where it is missing, ``prepare_pipeline`` puts torch's nearest interpolation in its place.

Cosmos 1's wavelet VAE (``AutoencoderKLCosmos``) decodes and encodes with each frame's rows split over a sample's
processes (``COSMOS_VAE``); Cosmos 2 / 2.5 ship Wan's VAE, split by the Wan family's plan.

Step caches: the blocks return the video alone (``block_outputs``); the stock pipelines call once per guidance branch
outside diffusers' cache contexts, so each call's branch is named by its prompt tensor (``cache_branches``). TeaCache
compares the blocks' ``embedded_timestep`` (per token with per-frame timesteps). Cosmos-Transfer2.5's ControlNet
residuals are added inside the blocks, so a skipped step reuses the last computed step's; the ControlNet runs every
step, uncached (a cache on it alone is refused: ``CONTROLNET``), and the branches' prompts, ``(text, image context)``
tuples, name them.

GRPO (``Cosmos25Policy``) trains Cosmos-Predict2.5 text-to-world: its velocity is already the flow-matching one, at
the timestep ``s`` itself (not ``1000 s``); its guidance is ``cond + w (cond - uncond)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types, install_cosmos_resize
from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls, ModelFamily, generation_defaults
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.vae import Padding, VAEPlan

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class Cosmos25Policy(DiffusersPolicy):
    """Cosmos-Predict2.5 text-to-world (``Cosmos2_5_PredictBasePipeline``; flow matching, velocity prediction): the
    normalised hidden states of every Qwen2.5-VL layer, concatenated, of the chat-formatted prompt padded to
    ``max_sequence_length`` tokens (unmasked: padding is part of the conditioning, as in the pipeline). The
    transformer takes the noise, text-to-world's all-zero condition-mask channel, an all-zero padding mask and the
    noise level ``s`` as its timestep (the pipeline passes the scheduler's sigma); its output is ``v = eps - x0``
    (the UniPC scheduler's ``flow_prediction``). Guidance is the pipeline's: ``cond + guidance (cond - uncond)``, on
    for guidance > 1. Latents are normalised by the Wan VAE's ``latents_mean`` / ``latents_std``. Decoding skips the
    pipeline's safety checker (the guardrail's video check)."""

    def encode(self, prompts: list[str], images: list[str] | None = None) -> tuple[Any, Any | None]:
        if images is not None and any(image is not None for image in images):
            raise ConfigError("Cosmos-Predict2.5 GRPO trains text-to-world only: image- and video-to-world condition "
                              "frames are not part of its policy; give prompts without images")  # fmt: skip
        return super().encode(prompts)

    def _guide(self, uncond: Tensor, cond: Tensor, guidance: float) -> Tensor:
        return cond + guidance * (cond - uncond)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor) -> Tensor:
        batch, _, frames, height, width = hidden.shape
        condition_mask = hidden.new_zeros(batch, 1, frames, height, width)  # text-to-world: no frame is given
        padding_mask = hidden.new_zeros(1, 1, height * self._spatial, width * self._spatial)
        return model(hidden_states=hidden, condition_mask=condition_mask, timestep=timestep / 1000.0,
                     encoder_hidden_states=cond.to(hidden.dtype), padding_mask=padding_mask,
                     return_dict=False)[0]  # fmt: skip

    def _compression(self, pipe: Any) -> tuple[int, int]:
        self._spatial = pipe.vae_scale_factor_spatial
        return pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial

    def _unscale(self, latents: Tensor) -> Tensor:
        pipe = self.pipe
        std, mean = pipe.latents_std.to(latents.device), pipe.latents_mean.to(latents.device)
        return latents / std + mean  # the pipeline keeps 1 / std in latents_std


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    per_token = cp_input(split_dim=1, expected_dims=3)  # per-frame timesteps' modulation, (B, S, C); else (B, C)
    modulation = {"embedded_timestep": per_token, "temb": per_token}
    # Cosmos-Transfer2.5: a ControlNet's residual for a block, (B, S, C) per token as the block's hidden states
    per_block = modulation | {"controlnet_residual": cp_input(split_dim=1, expected_dims=3)}
    plan: dict[str, Any] = {f"transformer_blocks.{i}": dict(per_block) for i in range(len(model.transformer_blocks))}
    plan["transformer_blocks.0"]["hidden_states"] = cp_input(split_dim=1, expected_dims=3)
    plan["rope"] = {i: cp_input(split_dim=0, expected_dims=2, split_output=True) for i in (0, 1)}
    if model.learnable_pos_embed is not None:
        plan["learnable_pos_embed"] = {0: cp_input(split_dim=1, expected_dims=3, split_output=True)}
    plan["norm_out"] = dict(modulation)
    plan["proj_out"] = cp_output(gather_dim=1, expected_dims=3)
    return plan


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[Tensor, bool]:
    """TeaCache's probe: the timestep embedding the blocks modulate with (``embedded_timestep``), ``(B, C)``, or per
    token ``(B, S_local, C)`` with per-frame timesteps (video-to-world's conditioning frames: split as the video)."""
    embedded = block_argument(meta, "embedded_timestep", args, kwargs)
    return embedded, embedded.dim() == 3


def _controlnet_plan(model: torch.nn.Module) -> dict:
    """Cosmos-Transfer2.5's ControlNet: its control tokens and the base latents' tokens split at the first block (the
    one that adds them), its rotary tables, positional embedding and per-token modulation as the transformer's, and
    each block's residual (its ``after_proj``) gathered whole, which the transformer's plan splits where its blocks
    take it (``controlnet_residual``)."""
    cp_input, cp_output = context_parallel_types()
    per_token = cp_input(split_dim=1, expected_dims=3)
    plan: dict[str, Any] = {f"control_blocks.{i}": {"embedded_timestep": per_token, "temb": per_token}
                            for i in range(len(model.control_blocks))}  # fmt: skip
    plan["control_blocks.0"] |= {"hidden_states": per_token, "latents": per_token}
    plan["control_blocks.*.after_proj"] = cp_output(gather_dim=1, expected_dims=3)
    plan["rope"] = {i: cp_input(split_dim=0, expected_dims=2, split_output=True) for i in (0, 1)}
    if model.learnable_pos_embed is not None:
        plan["learnable_pos_embed"] = {0: cp_input(split_dim=1, expected_dims=3, split_output=True)}
    return plan


CONTROLNET = ModelFamily(
    name="cosmos-controlnet",
    class_names=("CosmosControlNetModel",),
    plan=_controlnet_plan,
    attention_modules=("control_blocks.*.attn1",),
    step_cache_refused=(
        "a ControlNet returns a residual per block (for the transformer's blocks to add), not one stream a cached "
        "residual could stand for; cache the pipeline, whose transformer takes the cache (the ControlNet runs every "
        "step)"
    ),
)
"""How ``parallelize`` splits a Cosmos pipeline's ControlNet (``ModelFamily.controlnet``)."""


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    # Cosmos 1's AutoencoderKLCosmos; Cosmos 2 / 2.5 ship Wan's VAE
    if "temporal_compression_ratio" in vae:
        return vae["temporal_compression_ratio"], vae.get("spatial_compression_ratio", 8)
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


_T5_11B_ENCODER, _COSMOS_VAE = 4.76e9, 105.7e6  # AutoencoderKLCosmos (CV8x8x8): 105.65e6 counted on meta


_QWEN25_VL_7B, _WAN_VAE = 8.29e9, 127e6  # Cosmos 2.5's text encoder (Cosmos-Reason1-7B); Cosmos 2 / 2.5's VAE


def _architecture(config: dict[str, Any], text: float = _T5_11B_ENCODER, wan_vae: bool = False) -> dict[str, Any]:
    vae, compression = (_WAN_VAE, (4, 8)) if wan_vae else (_COSMOS_VAE, (8, 8))
    return {"transformers": {"transformer": ("CosmosTransformer3DModel", config)}, "text_encoders": text,
            "vae": vae, "compression": compression, "text_tokens": 512, "joint": False}  # fmt: skip


_7B = {"in_channels": 16, "out_channels": 16, "num_attention_heads": 32, "attention_head_dim": 128, "num_layers": 28,
       "mlp_ratio": 4.0, "text_embed_dim": 1024, "adaln_lora_dim": 256, "max_size": [128, 240, 240],
       "patch_size": [1, 2, 2], "rope_scale": [2.0, 1.0, 1.0], "concat_padding_mask": True,
       "extra_pos_embed_type": "learnable"}  # fmt: skip

_V2W_2B = _7B | {"in_channels": 17, "num_attention_heads": 16, "rope_scale": [1.0, 3.0, 3.0],
                 "extra_pos_embed_type": None}  # fmt: skip

_TEXT_PROJECTION = {"use_crossattn_projection": True, "crossattn_proj_in_channels": 100352,
                    "encoder_hidden_states_channels": 1024}  # fmt: skip
_PREDICT25_2B = _V2W_2B | _TEXT_PROJECTION
_TRANSFER_IMAGE_CONTEXT = {"img_context_dim_in": 1152, "img_context_dim_out": 2048, "img_context_num_tokens": 256}
_TRANSFER_CONTROLNET = {"n_controlnet_blocks": 4, "model_channels": 2048, "in_channels": 130, "latent_channels": 18,
                        "num_attention_heads": 16, "attention_head_dim": 128, "mlp_ratio": 4.0, "text_embed_dim": 1024,
                        "adaln_lora_dim": 256, "patch_size": [1, 2, 2], "max_size": [128, 240, 240],
                        "rope_scale": [1.0, 3.0, 3.0], "extra_pos_embed_type": None, "img_context_dim_in": 1152,
                        "img_context_dim_out": 2048} | _TEXT_PROJECTION  # fmt: skip

_ARCHITECTURES = {
    # Cosmos-1.0-Diffusion-7B / 14B-Text2World (diffusers' defaults are the 7B; counted on meta: 7.24e9, 1.43e10)
    "cosmos1-7b-text2world": _architecture(_7B),
    "cosmos1-14b-text2world": _architecture(_7B | {"num_attention_heads": 40, "num_layers": 36}),
    # Cosmos-Predict2-2B / 14B-Video2World (the condition-mask channel, no learnable positional embedding) and
    # Cosmos-Predict2.5-2B (Qwen2.5-VL text: all 28 layers' 3584-d states, projected to 1024), as diffusers' conversion
    # script configures them; counted on meta: 1.96e9, 1.42e10, 2.06e9
    "cosmos-predict2-2b-video2world": _architecture(_V2W_2B, wan_vae=True),
    "cosmos-predict2-14b-video2world": _architecture(
        _V2W_2B | {"num_attention_heads": 40, "num_layers": 36, "rope_scale": [20 / 24, 2.0, 2.0]}, wan_vae=True
    ),
    "cosmos-predict2.5-2b": _architecture(_PREDICT25_2B, text=_QWEN25_VL_7B, wan_vae=True),
    # Cosmos-Transfer2.5-2B (general: edge, depth, seg, blur ControlNets of one shape), as diffusers' conversion script
    # configures it: Predict2.5-2B's transformer with image-context keys and values in every block and a residual
    # after every 7th, and a 4-block ControlNet of the same width (its own copies of the embeddings and the 100352 ->
    # 1024 text projection); counted on meta: 2.41e9 + 0.47e9
    "cosmos-transfer2.5-2b": _architecture(
        _PREDICT25_2B | _TRANSFER_IMAGE_CONTEXT | {"controlnet_block_every_n": 7}, text=_QWEN25_VL_7B, wan_vae=True
    )
    | {"controlnet": ("CosmosControlNetModel", _TRANSFER_CONTROLNET)},
}
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``); an architecture's ``controlnet``
runs whole beside the split transformer (``dit_sp.memory.sampling``)."""


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """Cosmos 1's causal convolutions pad their input's rows in ``forward`` (``F.pad`` by ``spatial_pad``, in their
    ``pad_mode``) and their convolution pads nothing; a spatial downsampler pads one zero row below before its
    strided convolution (its average pool over 2 x 2 pixels never reaches that row: each rank's rows are even)."""
    padded: dict[torch.nn.Module, Padding] = {}
    for module in part.modules():
        kind = type(module).__name__
        if kind == "CosmosCausalConv3d" and (module.spatial_pad[2] or module.spatial_pad[3]):
            padded[module] = (module.spatial_pad[2], module.spatial_pad[3], module.pad_mode)
        elif kind == "CosmosDownsample3d" and module.spatial_downsample:
            top, bottom, mode = padded.get(module.conv1, (0, 0, "constant"))
            padded[module.conv1] = (top, bottom + 1, mode)
    return padded


def _vae_spatial_attentions(part: torch.nn.Module) -> list[torch.nn.Module]:
    # a CosmosCausalAttention attends over a frame's pixels (the spatial processor) or over a pixel's frames (the
    # temporal one, with the frame-causal mask: per pixel, it runs on each rank's own rows)
    return [module for module in part.modules() if type(module).__name__ == "CosmosCausalAttention"
            and type(module.processor).__name__.startswith("CosmosSpatialAttention")]  # fmt: skip


def _vae_patching(part: torch.nn.Module) -> int:
    # the encoder's Haar wavelet patching (or rearrange): log2(p) steps, each halving the rows in pairs (the step's
    # reflected row below the last is never read: each rank's rows are a multiple of p); the decoder's inverse
    # doubles each row, local too
    patch_embed = getattr(part, "patch_embed", None)
    return patch_embed.patch_size if patch_embed is not None else 1


COSMOS_VAE = VAEPlan(
    class_names=("AutoencoderKLCosmos",),
    padded_inputs=_vae_padded_inputs,
    whole_frame_of=_vae_spatial_attentions,
    downsampling=_vae_patching,
)
"""Cosmos 1's wavelet VAE split by rows: its convolutions with halos, its per-frame group norms with the whole frame's
statistics, its spatial attention on gathered frames; the Haar steps, the temporal attention (per pixel), the
nearest upsampling and the causal frame padding are local to each rank's rows. (Cosmos 2 / 2.5 use Wan's VAE.)"""


def _prepare(pipe: Any) -> None:
    # the ControlNet (always) and the transformer (with concat_padding_mask) resize a padding mask with torchvision,
    # which this toolkit does not install: torch's nearest interpolation stands in, where it is missing
    install_cosmos_resize()


COSMOS1_NOT_TRAINED = (
    "Cosmos 1 is an EDM model (x = x0 + sigma eps, the flow process rescaled: x / (1 + sigma) at s = sigma / (1 + "
    "sigma)) whose noisiest level sigma_max 80 is flow noise level 0.9877, not pure noise (1.0), where GRPO's "
    "trajectories start, so no flow-matching velocity policy is its sampler (its guardrail is not run either)"
)
"""Why GRPO has no Cosmos 1 text-to-world policy (``ModelFamily.policy_refused``)."""

PIPELINES = ("CosmosTextToWorldPipeline", "CosmosVideoToWorldPipeline", "Cosmos2VideoToWorldPipeline",
             "Cosmos2_5_PredictBasePipeline")  # fmt: skip

COSMOS = ModelFamily(
    name="cosmos",
    class_names=("CosmosTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    cfg_mode="sequential",
    prepare_pipeline=_prepare,
    controlnet=CONTROLNET,
    vae=COSMOS_VAE,
    cfg_refused=(
        "the Cosmos pipelines compute with the conditional prediction before they make the unconditional call, so "
        "the two guidance branches cannot run at once on two process groups; use cfg=1"
    ),
    tiny_models=(
        "tiny-cosmos1-t2w",
        "tiny-cosmos1-v2w",
        "tiny-cosmos2-v2w",
        "tiny-cosmos2-t2i",
        "tiny-cosmos2.5",
        "tiny-cosmos2.5-transfer",
    ),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(93, 704, 1280, 35, 7.0, 512) | {"fps": 16})
    | {"Cosmos2TextToImagePipeline": generation_defaults(1, 768, 1360, 35, 7.0, 512)}  # one image
    # Cosmos-Transfer2.5: its call's defaults (36 steps, guidance 3; its chunk of 93 frames)
    | {"Cosmos2_5_TransferPipeline": generation_defaults(93, 704, 1280, 36, 3.0, 512)},
    vae_factors=dict.fromkeys((*PIPELINES, "Cosmos2TextToImagePipeline", "Cosmos2_5_TransferPipeline"), _vae_factors),
    architectures=_ARCHITECTURES,
    pipelines=("Cosmos2_5_PredictBasePipeline",),
    policy=Cosmos25Policy,
    policy_refused={
        "CosmosTextToWorldPipeline": COSMOS1_NOT_TRAINED,
        "Cosmos2TextToImagePipeline": (
            "it generates one image, and its sampler starts at sigma_max 80 (EDM preconditioning of a flow "
            "model: flow noise level 80 / 81 = 0.9877), not at pure noise, where GRPO's trajectories start"
        ),
        "Cosmos2VideoToWorldPipeline": (
            "its sampler starts at sigma_max 80 (EDM preconditioning of a flow model: flow noise level 80 / "
            "81 = 0.9877), not at pure noise, where GRPO's trajectories start, and its condition frames come "
            "from a given image or video"
        ),
        "Cosmos2_5_TransferPipeline": (
            "every sample needs control videos (edge, depth, segmentation or blur, through its controlnet), "
            "which a GRPO prompt file (a prompt and at most one image) cannot supply"
        ),
        "CosmosVideoToWorldPipeline": (
            "Cosmos 1 is an EDM model whose sampler starts at sigma_max 80 (flow noise level 0.9877), not at "
            "pure noise, where GRPO's trajectories start, and its condition frames come from a given image or"
            " video"
        ),
    },
    block_outputs={"CosmosTransformerBlock": (0, None)},  # the transformer's blocks return the video alone
    teacache_probe=_teacache_probe,
    cache_branches=BranchCalls(),  # its pipelines call per guidance branch outside diffusers' cache contexts
)
