"""Cosmos 3 (``Cosmos3OmniTransformer``; text-to-video, image-to-video and video-to-video, with sound and actions).

One packed sequence per call, without a batch dimension: ``[und (the prompt's tokens, a causal prefix of und_len),
gen (video patches, then sound and action tokens)]``, ``(S, C)``. Every layer is per token except attention
(``Cosmos3AttnProcessor``), which runs two pathways with grouped-query attention (fewer key/value heads than query
heads): the und tokens attend causally to the und tokens; the gen tokens attend, non-causally, to
``[und keys ; gen keys]``. So the und prefix (the short prompt) stays whole on every rank and its causal attention
runs there unsplit, while the gen tokens and their rotary tables are split over the SP group, where the model's own
context-parallel seams cut them (``_cp_shard_fn`` before the decoder stack, ``_cp_gather_fn`` after it; uneven
lengths padded as everywhere). Inside each processor call, the gen pathway's attention goes to ``usp_attention`` with
the und tokens as joint tokens in front: the key/value heads repeated to the query heads (exactly what
``enable_gqa`` computes), the und queries (taken from the causal call just before) as the joint queries, whose
outputs are dropped: their output gradient is zero, so they add nothing to any gradient. The und stream is computed
on every rank from this rank's gen queries' gradients only, so its gradients (and those of the und projections, the
token embedding) are per-rank partials whose sum over the SP group is the full gradient, as for any replicated text.
Cost beyond the halved gen work: every rank repeats the und stream, the und queries ride along the gen attention
(``und_len`` extra queries over the whole gen sequence), and the key/value heads travel repeated to the query heads.

The stock pipeline masks the conditional prediction before it makes the unconditional call (and the two branches
pack prompts of different lengths), so CFG parallelism is refused.

Step caches: the layers' two streams are registered with the argument names diffusers' hooks honour (``gen_seq`` the
hidden states, ``und_seq`` the encoder stream: ``block_outputs``), and the caches read the tokens along dimension 0
(``cache_token_dim``: the packed ``(S, C)``), so a decision counts this rank's real gen tokens only (the und prefix is
another stream, the last shard's padding is left out) and its sums reduced over the SP group are one process's. The
pipeline calls each guidance branch in its own cache context (``cond``, ``uncond``: a state each, whatever their
packed lengths); ``BranchCalls`` names a call outside one by its ``input_ids`` tensor, and tells a new schedule by
``vision_timesteps``. TeaCache compares the first layer's normalized gen input (``_teacache_probe``).

GRPO (``Cosmos3Policy``) trains text- and image-to-video with sound and action generation off: one transformer call
per sample and guidance branch, packed by the pipeline's own segment helpers; the guardrail is not run on rollouts.
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls, ModelFamily, Undo, generation_defaults, no_grad
from dit_sp.families.policy import FirstFrameImagePolicy

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


def _gen_attention(ctx: Any, und_query: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scale: float | None) -> torch.Tensor:  # fmt: skip
    """The gen pathway's attention, ``(1, H, L, D)`` queries of this rank's gen shard over the keys and values
    ``(1, H_kv, und_len + L, D)`` (und in front): USP over the whole gen sequence, the und tokens joint."""
    import torch

    from dit_sp.attention import usp_attention

    und_len = und_query.shape[2]
    if key.shape[2] != und_len + ctx.local_len or query.shape[2] != ctx.local_len:
        raise RuntimeError(
            f"Cosmos 3's gen attention over {query.shape[2]} queries and {key.shape[2]} keys does not fit this rank's "
            f"{ctx.local_len} gen tokens behind {und_len} und tokens; is the gen sequence really split?"
        )
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: key head j serves query heads j*groups...
    key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    out = usp_attention(*(x.transpose(1, 2) for x in (torch.cat([und_query, query], 2), key, value)), ctx.parallel,
                        seq_len=ctx.seq_len, joint_len=und_len, joint_position="front", scale=scale,
                        kernel=ctx.kernel)  # fmt: skip
    return out[:, und_len:].transpose(1, 2)


@functools.cache
def _route_class() -> type:
    """A ``TorchFunctionMode`` for one processor call: the causal (und) SDPA runs as it is, whole, and its queries
    are kept; the next, non-causal (gen) SDPA goes to ``_gen_attention``."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class RouteCosmos3Attention(TorchFunctionMode):
        def __init__(self, ctx: Any):
            super().__init__()
            self.ctx, self.und_query, self.routed = ctx, None, 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is not F.scaled_dot_product_attention:
                return func(*args, **kwargs)
            return self.attention(*args, **kwargs)

        def attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                      enable_gqa=False):  # fmt: skip
            if attn_mask is not None or dropout_p:
                raise NotImplementedError("Cosmos 3's sequence-parallel attention takes no mask and no dropout")
            if is_causal:  # und over und: whole on every rank
                if self.und_query is not None:
                    raise RuntimeError("Cosmos 3's attention processor made two causal attention calls in one call")
                self.und_query = query
                return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                                      enable_gqa=enable_gqa)  # fmt: skip
            if self.und_query is None:
                raise RuntimeError("Cosmos 3's gen attention came before its causal und attention; dit-sp routes the "
                                   "order of diffusers 0.42's Cosmos3AttnProcessor only")  # fmt: skip
            self.routed += 1
            return _gen_attention(self.ctx, self.und_query, query, key, value, scale)

    return RouteCosmos3Attention


@functools.cache
def _processor_class(stock: type) -> type:
    """A subclass of the stock processor whose call routes its attention (``_route_class``); compiled blocks run it
    eagerly (a graph break around attention: its collectives and mode stay out of the graph)."""
    import torch

    route_class = _route_class()

    class SequenceParallelProcessor(stock):
        @torch.compiler.disable
        def __call__(self, attn, *args, **kwargs):
            route = route_class(self._dit_sp_context)
            with route:
                out = super().__call__(attn, *args, **kwargs)
            if route.routed != 1:
                raise RuntimeError(
                    f"{stock.__name__} routed {route.routed} gen attention calls, not 1: it attended some other way "
                    "than diffusers' native SDPA; use the native attention backend"
                )
            return out

    SequenceParallelProcessor.__name__ = SequenceParallelProcessor.__qualname__ = f"SequenceParallel{stock.__name__}"
    return SequenceParallelProcessor


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """The gen tokens and their rotary tables split at the model's shard seam, gathered at its gather seam; each
    layer's attention processor routed (``_processor_class``)."""
    from dit_sp._compat import set_context_parallel_seams, use_native_attention
    from dit_sp.parallel.comm import gather_sequence, shard_sequence

    def shard(und_seq, gen_seq, rotary_emb):  # (S, C) sequences, (S, head_dim) rotary tables
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        ctx.record_seq_len(gen_seq.shape[0])
        cos_gen, sin_gen, gen_seq = (shard_sequence(x, ctx.parallel, dim=0) for x in (cos_gen, sin_gen, gen_seq))
        return und_seq, gen_seq, (cos_und, sin_und, cos_gen, sin_gen)

    def gather(und_out, gen_out):
        return und_out, gather_sequence(gen_out, ctx.parallel, dim=0, seq_len=ctx.seq_len, grad=ctx.gather_grad)

    undo = [set_context_parallel_seams(model, shard, gather)]
    for layer in model.layers:
        attention, stock = layer.self_attn, layer.self_attn.processor
        processor = copy.copy(stock)
        processor.__class__ = _processor_class(type(stock))
        processor._dit_sp_context = ctx
        use_native_attention(processor)  # the stock call must reach torch SDPA
        attention.processor = processor
        undo.append(lambda attention=attention, stock=stock: setattr(attention, "processor", stock))
    return [Undo(lambda: [fn() for fn in reversed(undo)])]


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """TeaCache's probe: what the first layer's gen attention reads, its normalized gen tokens
    ``input_layernorm_moe_gen(gen_seq)``, ``(S_local, C)``: the latents' patches with the timestep embedding the model
    added to the noisy ones (the layers have no timestep modulation of their own)."""
    from dit_sp._compat import block_argument

    return block.input_layernorm_moe_gen(block_argument(meta, "hidden_states", args, kwargs)), True


class Cosmos3Policy(FirstFrameImagePolicy):
    """Cosmos 3 text-to-video (``Cosmos3OmniPipeline``, sound and action generation off: ``enable_sound=False``, no
    ``action``; flow matching, velocity prediction at timestep ``1000 s``, which the transformer scales by its
    ``timestep_scale``). The transformer takes one sample's packed sequence per call, ``[prompt tokens (und) ; video
    patches (gen)]`` without a batch dimension, so ``_forward`` calls it once per sample and guidance branch, each
    call packed by the pipeline's own ``_prepare_text_segment`` / ``_prepare_vision_segment`` (its mRoPE positions,
    at the pipeline's default ``fps``), as the pipeline packs its conditional and unconditional calls.

    Conditioning (per branch): ``(ids, lengths)``, the token ids ``(B, max_sequence_length)`` of
    ``tokenize_prompt`` (the pipeline's system prompt, chat template, duration and resolution templates of this video
    and its special tokens; the inverse templates for the negative prompt), zero-padded, and their counts ``(B,)``.
    There is no text encoder: the transformer embeds the ids itself. Guidance is the pipeline's, ``uncond + w (cond -
    uncond)``. Latents are normalised by the Wan VAE's ``latents_mean`` / ``latents_std``. Decoding skips the
    pipeline's guardrail (its safety checker's prompt and video checks), as Cosmos-Predict2.5's policy does.

    Image-to-video (the same class, with an image per prompt; ``use_images``): the image's latents (the pipeline's
    resize-and-crop and ``_encode_video``: the VAE's mode, normalised) are the clean first latent frame, whose tokens
    get no timestep embedding and no prediction (the pipeline's ``condition_frame_indexes``); the policy's latents are
    the frames after it. Conditioning is then ``((ids, lengths), image_frame)``, the frame ``(B, C, 1, H, W)``."""

    PACKINGS = 16
    """How many calls' static packed inputs ``_packing`` keeps (least recently used dropped)."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        import inspect

        self.frames, self.height, self.width = kwargs["frames"], kwargs["height"], kwargs["width"]
        self.fps = float(inspect.signature(type(pipe).__call__).parameters["fps"].default)
        """The frame rate of the duration template and the mRoPE positions: the pipeline's default (24)."""
        self._image_to_video = False
        self._segments: dict[tuple[Any, ...], dict[str, Any]] = {}
        super().__init__(pipe, transformer, **kwargs)

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        """Nothing before loading: the same class runs text-to-video (any frames) and image-to-video, whose single
        latent frame is refused when the run's images are known (``use_images``)."""

    def use_images(self, images: bool) -> None:
        if images and self.shape[1] < 2:
            least = self._compression(self.pipe)[0] + 1
            raise ConfigError(f"frames {self.frames}: Cosmos3OmniPipeline keeps the first latent frame the image's and "
                              "samples the frames after it, and these frames are that one alone (nothing to sample or "
                              f"train); set sample.frames to {least} or more")  # fmt: skip
        self._image_to_video = images

    @property
    def image_in_front(self) -> bool:
        return self._image_to_video

    def _channels(self, transformer: torch.nn.Module) -> int:
        return transformer.config.latent_channel

    def encode(self, prompts: list[str], images: list[str] | None = None) -> tuple[Any, Any | None]:
        """The token ids, always from the tokenizer (no stored embeddings: there is no encoder to drop, and the ids
        depend on the video's frames, size and frame rate, which the stored embeddings' keys do not hold)."""
        embeddings, self.embeddings = self.embeddings, None
        try:
            return super().encode(prompts, images)
        finally:
            self.embeddings = embeddings

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        import torch

        pairs = [self.pipe.tokenize_prompt(prompt, self.negative_prompt, num_frames=self.frames, height=self.height,
                                           width=self.width, fps=self.fps) for prompt in prompts]  # fmt: skip

        def padded(ids: list[list[int]]) -> tuple[Tensor, Tensor]:
            longest = max(len(one) for one in ids)
            if longest > self.max_sequence_length:
                raise ConfigError(f"max_sequence_length {self.max_sequence_length}: Cosmos 3 conditions on the whole "
                                  f"templated prompt ({longest} tokens here: its chat template, duration and "
                                  "resolution templates included; the pipeline cuts none), so set "
                                  f"sample.max_sequence_length to {longest} or more")  # fmt: skip
            out = torch.zeros(len(ids), self.max_sequence_length, dtype=torch.long)
            for row, one in zip(out, ids):
                row[: len(one)] = torch.tensor(one)
            return out.to(self.device), torch.tensor([len(one) for one in ids], device=self.device)

        positive = padded([cond for cond, _ in pairs])
        return positive, padded([uncond for _, uncond in pairs]) if self.guided else None

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_frame,)`` ``(1, C, 1, H, W)``: the pipeline's preprocessing of the image (resized to cover the
        frame, centre-cropped) encoded alone by its ``_encode_video``. Wan's causal VAE encodes the first frame of a
        video alone, so this is the first latent frame of the pipeline's encoding of the image repeated over every
        frame."""
        import torch

        from dit_sp._compat import cosmos3_conditioning_image

        pixels = cosmos3_conditioning_image(image, height=self.height, width=self.width)
        with torch.no_grad():
            return (self.pipe._encode_video(pixels.to(self.device).unsqueeze(2)).float(),)

    def _packing(self, ids: tuple[int, ...], latents: Tensor, image: bool) -> dict[str, Any]:
        """The static part of one call's packed inputs (the pipeline's ``cond_packed_static``), for the prompt ``ids``
        and latents of ``latents``'s shape (one sample, ``(1, C, F, H, W)``). The last ``PACKINGS`` are kept (a GRPO
        group's prompt and the negative prompt recur in every step; a run's thousands of prompts would hold each one's
        position tables on the device)."""
        import torch

        key = (ids, image, tuple(latents.shape))
        if key in self._segments:
            self._segments[key] = self._segments.pop(key)  # the most recently used last
        else:
            while len(self._segments) >= self.PACKINGS:
                self._segments.pop(next(iter(self._segments)))
            pipe, device = self.pipe, latents.device
            text = pipe._prepare_text_segment(list(ids), device=device)
            vision = pipe._prepare_vision_segment(latents, has_image_condition=image,
                                                  mrope_offset=text["vision_start_temporal_offset"],
                                                  vision_fps=self.fps, curr=text["und_len"], device=device,
                                                  condition_frame_indexes=[0] if image else [])  # fmt: skip
            self._segments[key] = {
                **text, **vision, "position_ids": torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], 1),
                "sequence_length": text["und_len"] + vision["num_vision_tokens"],
            }  # fmt: skip
        return self._segments[key]

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Any, ...]) -> Tensor:
        import torch

        image = cond[1].to(hidden.dtype) if isinstance(cond[0], tuple) else None
        ids, lengths = cond[0] if image is not None else cond
        if image is not None:  # the clean image frame in front
            hidden = torch.cat([image, hidden], dim=2)
        names = ("input_ids", "text_indexes", "position_ids", "und_len", "sequence_length", "vision_token_shapes",
                 "vision_sequence_indexes", "vision_mse_loss_indexes", "vision_noisy_frame_indexes")  # fmt: skip
        outs = []
        for i, length in enumerate(lengths.tolist()):  # one sample (and branch) a call
            latents = hidden[i : i + 1]
            packed = self._packing(tuple(ids[i, :length].tolist()), latents, image is not None)
            steps = torch.full((packed["num_noisy_vision_tokens"],), timestep[i].item(), device=hidden.device)
            (velocity,), _, _ = model(**{name: packed[name] for name in names}, vision_tokens=[latents],
                                      vision_timesteps=steps, return_dict=False)  # fmt: skip
            outs.append(velocity)
        out = torch.cat(outs)
        return out if image is None else out[:, :, 1:]

    def _unscale(self, latents: Tensor) -> Tensor:
        pipe = self.pipe
        inv_std, mean = (
            x.to(latents).view(1, -1, 1, 1, 1) for x in (pipe._vae_latents_inv_std, pipe._vae_latents_mean)
        )
        return latents / inv_std + mean  # the pipeline keeps 1 / std


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


_NANO = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 12288, "latent_channel": 48, "latent_patch_size": 2,
         "patch_latent_dim": 192, "rope_axes_dim": [24, 20, 20], "vocab_size": 151936}  # fmt: skip


def _architecture(config: dict[str, Any]) -> dict[str, Any]:
    # no text encoder (the transformer embeds the prompt's tokens itself); Wan 2.2's VAE (x16 in space, 705e6); the
    # und prefix counted as joint tokens (whole on every rank): an upsampled JSON prompt of about 512 tokens
    return {"transformers": {"transformer": ("Cosmos3OmniTransformer", config)}, "text_encoders": 0.0,
            "vae": 705e6, "compression": (4, 16), "text_tokens": 512, "joint": True}  # fmt: skip


_ARCHITECTURES = {
    # nvidia/Cosmos3-Nano (16B: two towers of Qwen3-VL-8B's text model, diffusers' defaults; 1.52e10 counted on meta)
    # and nvidia/Cosmos3-Super (64B: two of Qwen3-VL-32B's; 6.40e10 counted on meta)
    "cosmos3-nano": _architecture(_NANO),
    "cosmos3-super": _architecture(
        _NANO | {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64, "intermediate_size": 25600}
    ),
}
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

MODULAR_PIPELINES = ("Cosmos3DistilledModularPipeline",)
"""Modular Diffusers pipelines of the Cosmos 3 transformer that ``generate`` runs from a repository
(``dit_sp.zoo.modular``): the distilled one (``Cosmos3DistilledBlocks``: one transformer call a step, no guidance, the
steps fixed by the index's ``distilled_sigmas``, which give ``generate``'s default steps), whose calls are the omni
blocks' own, so the family's seams split its generation tokens as for ``Cosmos3OmniPipeline``."""
MODULAR_DEFAULTS = {
    # the omni pipeline's size and rate; the steps are the index's distilled_sigmas (dit_sp.zoo.model_defaults); the
    # guidance is baked into the weights (the blocks refuse a guidance_scale other than 1)
    "Cosmos3DistilledModularPipeline": generation_defaults(189, 720, 1280, 4, 1.0, 512) | {"fps": 24},
}
DISTILLED_POLICY_REFUSED = (
    "it is a few-step distilled sampler on a fixed sigma schedule (distilled_sigmas), with guidance baked into the "
    "weights, not the many-step Euler ODE that the policy's SDE wraps"
)
"""Why GRPO does not train ``Cosmos3DistilledModularPipeline``."""

COSMOS3 = ModelFamily(
    name="cosmos3",
    class_names=("Cosmos3OmniTransformer",),
    plan=lambda model: {},  # the model's own seams split and gather (``_hooks``)
    hooks=_hooks,
    attention_modules=(),
    cfg_mode="sequential",
    cfg_refused=(
        "the Cosmos 3 pipeline masks the conditional prediction before it makes the unconditional call (and the two "
        "branches pack prompts of different lengths), so the two guidance branches cannot run at once on two "
        "process groups; use cfg=1"
    ),
    block_outputs={"Cosmos3VLTextMoTDecoderLayer": (1, 0, "gen_seq", "und_seq")},
    cache_token_dim=0,
    cache_branches=BranchCalls(prompt="input_ids", timestep="vision_timesteps"),
    teacache_probe=_teacache_probe,
    compile_note=(
        "its attention runs eagerly (dit-sp wraps its routed Cosmos3AttnProcessor in "
        "torch.compiler.disable: the und/gen attention pair and its collectives stay out of the graph)"
    ),
    tiny_models=("tiny-cosmos3",),
    modular_pipelines=MODULAR_PIPELINES,
    modular_fixed={
        "Cosmos3DistilledModularPipeline": {
            "steps": "its schedule is the index's distilled_sigmas",
            "guidance": "guidance is distilled into its weights (one transformer call a step)",
            "max_sequence_length": "its blocks take no text length",
        }
    },
    checkpoint_defaults={"Cosmos3OmniPipeline": generation_defaults(189, 720, 1280, 35, 6.0, 512) | {"fps": 24}}
    | MODULAR_DEFAULTS,
    vae_factors={"Cosmos3OmniPipeline": _vae_factors},
    architectures=_ARCHITECTURES,
    pipelines=("Cosmos3OmniPipeline",),
    policy=Cosmos3Policy,
    policy_refused={"Cosmos3DistilledModularPipeline": DISTILLED_POLICY_REFUSED},
)
