"""Kandinsky 5 video (``Kandinsky5Transformer3DModel``; text-to-video, image-to-video).

Latents are channels-last, ``(B, F, H, W, C)``. The text runs through its own encoder blocks first (text only,
replicated on every rank, local). The visual decoder blocks attend over the video (``self_attention``, through USP)
and cross-attend to the text (``cross_attention``: local queries against replicated keys, no communication). The
video tokens and their rotary table are flattened inside the model's forward, in front of the first visual block, so
the plan splits the tokens where the first block takes them, the rotary table (``(B, S, 1, D/2, 2, 2)``, the same
full table for every block) where each block's self-attention takes it, and gathers after the last block (the output
layer unflattens the whole video). diffusers ships no ``_cp_plan`` for this model.

Step caches: diffusers' metadata for the visual blocks names their video argument ``visual_embed``, which its
first-block hooks do not read; the family registers it again so that they do (``block_outputs`` with argument names).
The pipelines call once per guidance branch outside diffusers' cache contexts: each call's branch is named by its
prompt tensor (``cache_branches``).

NABLA sparse attention (``attention_type: nabla``, the 10 s checkpoints: the pipelines then pass ``sparse_params``)
flattens the tokens in fractal order (64-token ``8 x 8`` neighbourhoods, ``fractal_flatten``) in the model's forward,
in front of the first visual block, where the plan splits them: each rank holds whole NABLA blocks in that order (the
rotary table is flattened alike before each self-attention takes it). A self-attention call with ``sparse_params``
runs on ``dit_sp.families.nabla.SequenceParallelNablaProcessor`` (shared with Kandinsky 6 SR: the per-head mask and
flex attention on the whole sequence of each rank's head group, exactly the one-process masks of its heads), one
without them on the routed stock processor; so NABLA splits under Ulysses alone (``NABLA_RING_REFUSAL``; the dense
mode keeps its ring). The stock model needs diffusers' flex attention backend for NABLA on one process too (the
default backend fails on NABLA's ``BlockMask``): ``prepare_pipeline`` puts a NABLA checkpoint's visual self-attention
on it; the split one always uses flex attention for NABLA. In both modes the text leaves the text blocks with its
gradient averaged over the group (``_hooks``), so that the text blocks' bfloat16 rounding sees the whole gradient.

Its VAE is HunyuanVideo's (``AutoencoderKLHunyuanVideo``), split by the HunyuanVideo family's VAE plan. Guidance runs
as two calls per step, conditional first (``guidance_scale``; the stock pipeline brings its own negative prompt).

GRPO (``Kandinsky5Policy``) trains text-to-video and image-to-video: the transformer masks no text token, so each
prompt's Qwen2.5-VL tokens are kept at their own length (as the pipeline encodes one prompt) and samples of different
text lengths run in separate transformer calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls, ModelFamily, Undo, generation_defaults, no_grad
from dit_sp.families.hunyuan_video import hunyuan_video_vae_factors
from dit_sp.families.image_vae import AUTOENCODER_KL_VAE
from dit_sp.families.nabla import NablaOps, SequenceParallelNablaProcessor
from dit_sp.families.policy import FirstFrameImagePolicy

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class Kandinsky5Policy(FirstFrameImagePolicy):
    """Kandinsky 5 text-to-video (``Kandinsky5T2VPipeline``; flow matching, velocity prediction, timestep ``1000 s``):
    the last Qwen2.5-VL hidden state of the templated prompt (after the template's ``prompt_template_encode_start_idx``
    tokens) and CLIP's pooled embedding, as the pipeline encodes one prompt. The transformer takes no text mask, so
    padding would change the velocity: each prompt is encoded alone, its tokens are stored zero-padded to
    ``max_sequence_length`` with their count, and ``_forward`` runs the samples of each text length in one call with
    the text cut to that length (guidance's two branches are two calls when their lengths differ, as in the
    pipeline). Latents are ``(B, C, F, H, W)`` here and channels-last ``(B, F, H, W, C)`` for the transformer, with a
    ``visual_cond`` model's all-zero image latents and mask in channels (text-to-video), the pipeline's rotary
    positions and resolution-dependent rotary scale, and a NABLA checkpoint's ``sparse_params`` (the pipeline's
    ``get_sparse_params``: ``None`` for a dense one). Guidance is classifier-free guidance on the velocity.

    Image-to-video (``Kandinsky5I2VPipeline``, a ``FirstFrameImagePolicy``): the image's latents (drawn from the VAE's
    posterior by the pipeline's ``prepare_latents`` at ``policy.IMAGE_SEED``, scaled) are the first latent frame, never
    stepped; the transformer sees it in front at the step's timestep (the pipeline gives every token the same one),
    with a ``visual_cond`` model's zero latents and a mask of ones on that frame in channels. The policy's latents are
    the frames after it; ``clean`` puts the image frame back and applies the pipeline's ``normalize_first_frame`` (the
    first 4 latent frames moved to the statistics of the next ones), as the pipeline does before decoding.
    Conditioning is then ``((text, lengths, pooled), image_frame)``, the frame ``(B, C, 1, H, W)``.

    Text-to-image (``Kandinsky5T2IPipeline``, ``image``): the same with one latent frame of an image VAE
    (``AutoencoderKL``, x8 in space), rotary scale 1 and no sparse attention (as that pipeline calls its transformer);
    the decode is ``(B, 1, C, H, W)``, one frame. The pipeline moves a size off its ``resolutions`` to the nearest of
    them, so other sizes are refused in one line.

    Image editing (``Kandinsky5I2IPipeline``, ``edit``): text-to-image with the source image's latents (drawn by the
    pipeline's ``prepare_latents`` at ``policy.IMAGE_SEED``) and a mask of ones in channels, clean throughout; the
    Qwen2.5-VL encoder reads the image inside the prompt's template, the negative prompt's too (``prompt_reads_image``,
    ``encode_pairs``). Conditioning is ``((text, lengths, pooled), image_latents)``, the latents ``(B, C, 1, H, W)``."""

    NORMALIZED_FRAMES = 4
    """The latent frames ``Kandinsky5I2VPipeline.normalize_first_frame`` normalizes to the statistics of those after
    them (so the pipeline needs at least one more: fewer give NaN latents)."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        self.height, self.width = kwargs["height"], kwargs["width"]
        self.image = type(pipe).__name__ in IMAGE_PIPELINES
        self.edit = type(pipe).__name__ == EDIT_PIPELINE  # image editing
        sizes = [tuple(size) for size in getattr(pipe, "resolutions", [])]
        if self.image and (self.width, self.height) not in sizes:
            raise ConfigError(f"{type(pipe).__name__} samples at its resolutions alone (width x height: "
                              f"{', '.join(f'{w}x{h}' for w, h in sizes)}) and moves {self.width}x{self.height} to the "
                              "nearest; set sample.width and sample.height to one of them")  # fmt: skip

    @classmethod
    def prompt_reads_image(cls, pipeline: str | None) -> bool:
        return pipeline == EDIT_PIPELINE

    @classmethod
    def image_first_frame(cls, pipeline: type) -> bool:
        return pipeline.__name__ != EDIT_PIPELINE and super().image_first_frame(pipeline)

    @property
    def takes_images(self) -> bool:
        return self.edit or self.image_in_front

    def _compression(self, pipe: Any) -> tuple[int, int]:
        return getattr(pipe, "vae_scale_factor_temporal", 1), pipe.vae_scale_factor_spatial  # image pipelines: 1

    def _channels(self, transformer: torch.nn.Module) -> int:
        return transformer.config.out_visual_dim

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        super().check_settings(pipeline, frames, temporal)
        latent_frames, least = (frames - 1) // temporal + 1, cls.NORMALIZED_FRAMES + 1
        if pipeline.__name__ == "Kandinsky5I2VPipeline" and latent_frames < least:
            raise ConfigError(f"frames {frames}: Kandinsky5I2VPipeline normalizes its first {cls.NORMALIZED_FRAMES} "
                              f"latent frames to the statistics of the ones after them, and {latent_frames} latent "
                              f"frames leave none (NaN latents); set sample.frames to {(least - 1) * temporal + 1} or "
                              "more")  # fmt: skip

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_frame,)`` ``(1, C, 1, H, W)``: the first frame of the pipeline's ``prepare_latents`` (which draws
        the noise, then the image's posterior sample, from its generator); editing: the source image's latents, its
        channels after the noise's."""
        import torch

        (channels, _, height, width), spatial = self.shape, self._compression(self.pipe)[1]
        frames = () if self.edit else (self.pixel_frames,)  # editing: (1, 1, H, W, 2C + 1), noise, image, mask
        latents = self.pipe.prepare_latents(image, 1, channels, height * spatial, width * spatial, *frames,
                                            torch.float32, self.device, self.image_generator())  # fmt: skip
        part = latents[..., channels : 2 * channels] if self.edit else latents[:, :1, :, :, :channels]
        return (part.permute(0, 4, 1, 2, 3),)

    def clean(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        """The image frame in front and the pipeline's ``normalize_first_frame`` applied (image-to-video), to each
        video alone, as the pipeline does to one video a call (a batch of them would share the reference statistics:
        its ``reference.mean()`` spans the batch, which would make a video's decode depend on its batch-mates)."""
        import torch

        latents = super().clean(latents, cond)
        if cond is None or not self.image_in_front:
            return latents
        normalize = self.pipe.normalize_first_frame
        return torch.cat([normalize(video.permute(0, 2, 3, 4, 1)).permute(0, 4, 1, 2, 3) for video in latents.split(1)])

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        negative = [self.negative_prompt] * len(prompts)
        return self._texts(prompts), self._texts(negative) if self.guided else None

    @no_grad
    def _encode_pairs(self, prompts: list[str], images: list[Any]) -> tuple[Any, Any | None]:
        """Editing: the prompts and the negative prompt, each with its sample's source image (as the pipeline)."""
        negative = [self.negative_prompt] * len(prompts)
        return self._texts(prompts, images), self._texts(negative, images) if self.guided else None

    def _texts(self, texts: list[str], images: list[Any] | None = None) -> tuple[Tensor, ...]:
        """``(tokens, lengths, pooled)``: each text encoded alone (with its image when given: editing), its tokens
        zero-padded to ``max_sequence_length`` ``(B, L, D)``, their counts ``(B,)`` and CLIP's ``(B, D2)``."""
        import torch

        tokens, pooled, lengths = [], [], []
        for i, text in enumerate(texts):  # one at a time: a batch would pad the shorter ones, padding is not masked
            image = {} if images is None else {"image": images[i]}
            try:
                embeds, clip, _ = self.pipe.encode_prompt(prompt=[text], max_sequence_length=self.max_sequence_length,
                                                          device=self.device, **image)  # fmt: skip
            except ValueError as e:  # the stock pipeline's truncation cut the image's tokens out of the template
                if "image_pad" not in str(e):
                    raise
                raise ConfigError(f"max_sequence_length {self.max_sequence_length} cannot hold the source image's "
                                  f"tokens and the prompt {text!r} ({EDIT_PIPELINE} reads the image in the prompt's "
                                  "template); raise sample.max_sequence_length (default 1024)") from e  # fmt: skip
            padded = embeds.new_zeros(1, self.max_sequence_length, embeds.shape[-1])
            padded[:, : embeds.shape[1]] = embeds
            tokens.append(padded)
            pooled.append(clip)
            lengths.append(embeds.shape[1])
        return torch.cat(tokens), torch.tensor(lengths, device=self.device), torch.cat(pooled)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Tensor, ...]) -> Tensor:
        import torch

        image = cond[1].to(hidden.dtype) if isinstance(cond[0], tuple) else None
        text, lengths, pooled = cond[0] if image is not None else cond
        front = image is not None and not self.edit
        if front:  # the clean image frame in front
            hidden = torch.cat([image, hidden], dim=2)
        x = hidden.permute(0, 2, 3, 4, 1)  # (B, F, H, W, C)
        if self.edit:  # the source image's latents and a mask of ones
            x = torch.cat([x, image.permute(0, 2, 3, 4, 1), torch.ones_like(x[..., :1])], dim=-1)
        elif model.config.visual_cond:  # zero latents; the mask is one on the image's frame (none in text-to-video)
            mask = x.new_zeros(*x.shape[:-1], 1)
            if image is not None:
                mask[:, :1] = 1
            x = torch.cat([x, torch.zeros_like(x), mask], dim=-1)
        frames, spatial = x.shape[1], self.pipe.vae_scale_factor_spatial
        rope = [torch.arange(frames, device=x.device), torch.arange(self.height // spatial // 2, device=x.device),
                torch.arange(self.width // spatial // 2, device=x.device)]  # fmt: skip
        scale = (1.0, 1.0, 1.0) if self.image else self.pipe._get_scale_factor(self.height, self.width)
        sparse = None if self.image else self.pipe.get_sparse_params(x, x.device)  # NABLA's; dense: None
        parts, order = [], []
        for length in lengths.unique().tolist():
            index = (lengths == length).nonzero().flatten()
            out = model(hidden_states=x[index], encoder_hidden_states=text[index, :length].to(x.dtype),
                        pooled_projections=pooled[index].to(x.dtype), timestep=timestep[index].to(x.dtype),
                        visual_rope_pos=rope, text_rope_pos=torch.arange(length, device=x.device), scale_factor=scale,
                        sparse_params=sparse, return_dict=True).sample  # fmt: skip
            parts.append(out)
            order.append(index)
        out = torch.cat(parts)[torch.cat(order).argsort()].permute(0, 4, 1, 2, 3)  # back in the batch's order
        return out[:, :, 1:] if front else out

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor

    @no_grad
    def decode(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        """``(B, F, C, H, W)`` in [0, 1]; text-to-image: the image VAE's decode of the one latent frame ``(B, C, 1,
        H, W)`` as ``(B, 1, C, H, W)``."""
        if not self.image:
            return super().decode(latents, cond)
        vae = self.pipe.vae
        image = vae.decode(self._unscale(latents[:, :, 0]).to(vae.dtype), return_dict=False)[0]  # (B, C, H, W)
        return ((image.float() + 1) / 2).clamp(0, 1)[:, None]


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    blocks = len(model.visual_transformer_blocks)
    # every block takes the same full rotary table: split it where each block's self-attention takes it
    plan: dict[str, Any] = {f"visual_transformer_blocks.{i}.self_attention": {
        "rotary_emb": cp_input(split_dim=1, expected_dims=6)} for i in range(blocks)}  # fmt: skip
    plan["visual_transformer_blocks.0"] = {"visual_embed": cp_input(split_dim=1, expected_dims=3)}
    plan[f"visual_transformer_blocks.{blocks - 1}"] = cp_output(gather_dim=1, expected_dims=3)
    return plan


NABLA_RING_REFUSAL = (
    "Kandinsky 5's NABLA sparse attention (attention_type 'nabla') keeps, per head and query block, the key blocks "
    "with the top share of a softmax over every key block, so it splits exactly under Ulysses alone (each rank holds "
    "the whole sequence of its heads); a ring rank would hold one block of keys: use ring 1"
)
"""Why a ring is refused for NABLA (one line; ``parallelize`` and every call add the layout), read from the
transformer's config (``ModelFamily.ring_refused_by``: ``generate``, the GRPO preflight and the memory planner refuse
it before loading); the dense mode keeps it."""


def _rotary(x: Tensor, rope: Tensor) -> Tensor:
    """The stock processor's rotation of ``(B, S, h, D)`` by ``(B, S, 1, D/2, 2, 2)`` (a closure in its call, so
    restated): per token, rounded through bfloat16 as the stock one rounds it, back in ``x``'s dtype."""
    import torch

    pairs = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
    return (rope * pairs).sum(dim=-1).reshape(*x.shape).to(torch.bfloat16).type_as(x)


NABLA = NablaOps(module="diffusers.models.transformers.transformer_kandinsky", mask="nablaT_v2", heads_first=False,
                 threshold="P", rotary=_rotary, ring_refusal=NABLA_RING_REFUSAL)  # fmt: skip
"""Kandinsky 5's NABLA steps (``dit_sp.families.nabla``): its module's ``nablaT_v2`` with ``sparse_params['P']``."""


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Each visual block's self-attention picks its processor per call (an instance ``forward``): with
    ``sparse_params`` (NABLA), ``SequenceParallelNablaProcessor``; without, the module's own forward and processor
    (the routed stock one, ``attention_modules``): the pipelines decide per call (``get_sparse_params``), so it must
    too. And the text tokens ``(B, L, C)`` leave the text blocks with their gradient averaged over the group: each
    rank's cross-attention gives a part of it, and the text blocks' rotary embedding rounds the queries' and keys'
    gradients to bfloat16, which a part would round otherwise than the whole (the mean of ``sp`` ranks, ``sp`` a
    power of 2, rounds as the whole does, then scaled)."""
    processor = SequenceParallelNablaProcessor(ctx, NABLA)
    handles = []
    if ctx.parallel.sp > 1 and len(model.text_transformer_blocks):

        def average(module: torch.nn.Module, args: Any, output: Tensor) -> Tensor:
            import torch

            from dit_sp.parallel.comm import average_gradient  # torch: not at import (the registry is read by --help)

            if not torch.is_grad_enabled():
                return output
            return average_gradient(output, ctx.parallel.sp_group)

        handles.append(model.text_transformer_blocks[-1].register_forward_hook(average))
    undo = []
    for block in model.visual_transformer_blocks:
        attention = block.self_attention

        def forward(hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                    sparse_params: dict[str, Any] | None = None, rotary_emb: Tensor | None = None,
                    _attention: Any = attention, **kwargs: Any) -> Tensor:  # fmt: skip
            if sparse_params is None:
                return type(_attention).forward(_attention, hidden_states, encoder_hidden_states, sparse_params,
                                                rotary_emb, **kwargs)  # fmt: skip
            return processor(_attention, hidden_states, rotary_emb, sparse_params)

        attention.forward = forward
        undo.append(lambda attention=attention: delattr(attention, "forward"))
    return [*handles, Undo(lambda: [fn() for fn in undo])]


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[Tensor, bool]:
    """TeaCache's probe: the time embedding the visual blocks modulate with (``time_embed``, ``(B, C)``: whole on every
    rank)."""
    return block_argument(meta, "time_embed", args, kwargs), False


def _ring_refused_by(config: Any) -> str:
    """A NABLA checkpoint's ring refusal, from its transformer's config (``ModelFamily.ring_refused_by``)."""
    return NABLA_RING_REFUSAL if config.get("attention_type", "regular") == "nabla" else ""


def _check(model: torch.nn.Module) -> None:
    if len(model.visual_transformer_blocks) < 2:
        raise NotImplementedError(
            "Kandinsky 5 with one visual block: the split (at the first block) and the gather (after the last) "
            "need two blocks; use num_visual_blocks >= 2"
        )


def _prepare(pipe: Any) -> None:
    """A NABLA checkpoint's visual self-attention on diffusers' flex backend: the stock processor's NABLA block mask
    runs nowhere else (the default backend fails on it), on one process too."""
    transformer = pipe.transformer
    if transformer.config.get("attention_type", "regular") == "nabla":
        for block in transformer.visual_transformer_blocks:
            block.self_attention.set_attention_backend("flex")


I2V_LATENT_FRAMES = 5
"""Latent frames Kandinsky 5's image-to-video pipeline needs at least: it renormalises the first 4 against the ones
after them (``normalize_first_frame``), and with none after them the statistics are NaN (so is the video)."""


def _image_vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return 1, 8  # the image pipelines' AutoencoderKL: no frames to compress (the pipelines fix x8 in space)


NABLA_TILE = 8
"""NABLA's neighbourhoods are ``8 x 8`` tokens (``fractal_flatten``): the token grid's sides are multiples of it."""


def _shape_check(config: Any, settings: dict[str, Any], name: Any, vae: tuple[int, int]) -> None:
    if "in_visual_dim" not in config:  # another family's model
        return
    if config.get("attention_type", "regular") == "nabla":
        from dit_sp.families.shape import check_multiple

        for key, patch in (("height", config.patch_size[1]), ("width", config.patch_size[2])):
            why = f"NABLA's {NABLA_TILE} x {NABLA_TILE} token neighbourhoods, VAE x{vae[1]}, patch x{patch}"
            check_multiple(settings, key, vae[1] * patch * NABLA_TILE, name, why)
    if vae[0] == 1:  # an image pipeline (its VAE compresses no frames): one frame
        if settings["frames"] != 1:
            raise ConfigError(f"{name('frames')} {settings['frames']}: Kandinsky 5's image pipelines make one image; "
                              f"use {name('frames')} 1")  # fmt: skip
        return
    if not settings.get("image"):  # text-to-video
        return
    temporal, frames = vae[0], settings["frames"]
    if (frames - 1) // temporal + 1 < I2V_LATENT_FRAMES:
        smallest = (I2V_LATENT_FRAMES - 1) * temporal + 1
        raise ConfigError(f"{name('frames')} {frames}: Kandinsky 5 image-to-video renormalises its first 4 latent "
                          f"frames against the ones after them, so it needs {I2V_LATENT_FRAMES} or more (VAE "
                          f"x{temporal}); "
                          f"the smallest allowed is {name('frames')} {smallest}")  # fmt: skip


_CONFIG = {"in_visual_dim": 16, "in_text_dim": 3584, "in_text_dim2": 768, "out_visual_dim": 16,
           "patch_size": [1, 2, 2], "visual_cond": True}  # fmt: skip
_QWEN25_VL_7B, _CLIP_L, _VAE = 8.29e9, 123e6, 246e6  # the text encoders, HunyuanVideo's VAE


_FLUX_VAE = 84e6  # the image models' VAE (FLUX.1's AutoencoderKL)


def _architecture(config: dict[str, Any], vae: float = _VAE) -> dict[str, Any]:
    return {"transformers": {"transformer": ("Kandinsky5Transformer3DModel", _CONFIG | config)},
            "text_encoders": _QWEN25_VL_7B + _CLIP_L, "vae": vae, "compression": (4, 8), "text_tokens": 512,
            "joint": False}  # fmt: skip


_ARCHITECTURES = {
    # Kandinsky 5.0 Video Lite (2B) and Pro (19B): their transformer configs (the meta-device counts are 2.01e9 and
    # 1.93e10 parameters)
    "kandinsky5-t2v-lite": _architecture({"time_dim": 512, "model_dim": 1792, "ff_dim": 7168, "num_text_blocks": 2,
                                          "num_visual_blocks": 32, "axes_dims": [16, 24, 24]}),
    # Kandinsky 5.0 Video Lite 10 s (sft-10s): the Lite transformer with NABLA sparse attention (its converted
    # config's attention_* settings): Ulysses alone, the planner never picks or advises a ring for it
    "kandinsky5-t2v-lite-10s": _architecture({"time_dim": 512, "model_dim": 1792, "ff_dim": 7168,
                                              "num_text_blocks": 2, "num_visual_blocks": 32, "axes_dims": [16, 24, 24],
                                              "attention_type": "nabla", "attention_P": 0.9, "attention_wT": 11,
                                              "attention_wW": 3, "attention_wH": 3, "attention_add_sta": True,
                                              "attention_method": "topcdf"}),
    "kandinsky5-t2v-pro": _architecture({"time_dim": 1024, "model_dim": 4096, "ff_dim": 16384, "num_text_blocks": 4,
                                         "num_visual_blocks": 60, "axes_dims": [32, 48, 48]}),
    # Kandinsky 5.0 I2V Pro: the Pro transformer (visual_cond: the image's latents and mask in channels too)
    "kandinsky5-i2v-pro": _architecture({"time_dim": 1024, "model_dim": 4096, "ff_dim": 16384, "num_text_blocks": 4,
                                         "num_visual_blocks": 60, "axes_dims": [32, 48, 48]}),
    # Kandinsky 5.0 Image Lite text-to-image (6B): its transformer config (the meta-device count is 6.02e9), one frame
    # of FLUX.1's VAE
    "kandinsky5-t2i-lite": _architecture({"time_dim": 512, "model_dim": 2560, "ff_dim": 10240, "num_text_blocks": 2,
                                          "num_visual_blocks": 50, "axes_dims": [32, 48, 48], "visual_cond": False},
                                         vae=_FLUX_VAE),
    # Kandinsky 5.0 Image Lite image-to-image (editing): the same transformer, the input image's latents and their mask
    # in channels too (visual_cond, the original's instruct_type "channel")
    "kandinsky5-i2i-lite": _architecture({"time_dim": 512, "model_dim": 2560, "ff_dim": 10240, "num_text_blocks": 2,
                                          "num_visual_blocks": 50, "axes_dims": [32, 48, 48], "visual_cond": True},
                                         vae=_FLUX_VAE),
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

PIPELINES = ("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline")
IMAGE_PIPELINES = ("Kandinsky5T2IPipeline", "Kandinsky5I2IPipeline")  # one frame, an image VAE (AutoencoderKL)
EDIT_PIPELINE = "Kandinsky5I2IPipeline"

KANDINSKY5 = ModelFamily(
    name="kandinsky5",
    # diffusers' metadata names visual_embed, which its first-block hooks do not read: registered again as ours
    block_outputs={"Kandinsky5TransformerDecoderBlock": (0, None, "visual_embed", "encoder_hidden_states")},
    cache_branches=BranchCalls(),  # its pipelines call per guidance branch outside diffusers' cache contexts
    teacache_probe=_teacache_probe,
    class_names=("Kandinsky5Transformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("visual_transformer_blocks.*.self_attention",),
    cfg_mode="sequential",
    channels_last=True,
    check=_check,
    ring_refused_by=_ring_refused_by,
    shape_check=_shape_check,
    prepare_pipeline=_prepare,
    vae=AUTOENCODER_KL_VAE,  # the image pipelines' (the video ones' is HunyuanVideo's, split by that family's plan)
    tiny_models=("tiny-kandinsky5", "tiny-kandinsky5-i2v", "tiny-kandinsky5-t2i", "tiny-kandinsky5-i2i"),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(121, 512, 768, 50, 5.0, 512) | {"fps": 24})
    | dict.fromkeys(IMAGE_PIPELINES, generation_defaults(1, 1024, 1024, 50, 3.5, 512)),
    vae_factors=dict.fromkeys(PIPELINES, hunyuan_video_vae_factors)
    | dict.fromkeys(IMAGE_PIPELINES, _image_vae_factors),
    architectures=_ARCHITECTURES,
    pipelines=("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline", "Kandinsky5T2IPipeline", "Kandinsky5I2IPipeline"),
    policy=Kandinsky5Policy,
)
