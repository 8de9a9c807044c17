"""GRPO policies: a diffusers text-to-video pipeline seen as what ``dit_sp.rl.grpo`` needs.

Each model family's file subclasses ``DiffusersPolicy``, which holds what the families share: the latent
shape, the reference model of the KL term, classifier-free guidance as one batch of both branches (the
same batch in rollout and training, so their numerics agree), the choice of expert of a two-expert model
(Wan 2.2 A14B) and decoding to ``(B, F, C, H, W)`` in [0, 1].
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.families.family import no_grad
from dit_sp.families.shape import check_latent_shape

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


IMAGE_SEED = 0
"""The seed of the generator an image-to-video pipeline that samples its VAE's posterior (CogVideoX, LTX-Video; not
its mode) draws the image's latents with: the policy encodes each image once at this seed, the same on every rank
and layout (``DiffusersPolicy.image_generator``)."""


class DiffusersPolicy:
    """A pipeline's text conditioning, the guided velocity of its (parallelized, sharded) transformer and
    its VAE. Subclasses say how to encode prompts, call the transformer and undo the latent scaling.

    A pipeline with a ``boundary_ratio`` (Wan 2.2 A14B) has two experts: ``transformer`` runs the noise
    levels at or above the boundary, ``transformer_2`` those below it, with guidance ``guidance_2``
    (default ``guidance``), as the stock pipeline does. ``reference`` / ``reference_2``: each expert's
    reference model of the KL term (None: the expert itself)."""

    images_need_text_encoders: bool = False
    """Whether part of an image's conditioning comes from the pipeline's text encoders (``_encoder_image_parts``;
    Motif-Video I2V's SigLIP tokens, from the vision tower inside its T5Gemma2 encoder). A trainer then computes it
    while it has the encoders loaded for the prompts (``encoder_image_parts``) and keeps it on disk with their
    embeddings (``dit_sp.rl.embeddings.PromptEmbeddings``), so that the encoders can be dropped; the policy reads it
    from there (``embeddings``)."""

    @classmethod
    def prompt_reads_image(cls, pipeline: str | None) -> bool:
        """Whether the pipeline class named ``pipeline`` encodes each prompt with its sample's image (Kandinsky 5
        I2I's Qwen2.5-VL reads the image inside the prompt's template, the negative prompt's too): its text
        conditioning is then a (prompt, image) pair's (``encode_pairs``), which a trainer computes while it has the
        encoders loaded and keeps on disk keyed by both (``dit_sp.rl.embeddings.PromptEmbeddings.compute_pairs``);
        False by default (a prompt's embeddings are the prompt's alone)."""
        return False

    conditions_with_vae: bool = False
    """Whether the conditioning runs the VAE on every rank, images or not (Wan VACE's zero context): every rank of
    a trainer then loads the VAE (``policy_loads_vae``)."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, *, frames: int, height: int, width: int,
                 guidance: float, negative_prompt: str = "", max_sequence_length: int = 32,
                 embedded_guidance: float | None = None, reference: torch.nn.Module | None = None,
                 transformer_2: torch.nn.Module | None = None, guidance_2: float | None = None,
                 device: torch.device | None = None):  # fmt: skip
        # the families with a policy add no limit of their own (the trainer checks every rule before loading)
        import torch

        check_latent_shape(pipe, {"frames": frames, "height": height, "width": width,
                           "max_sequence_length": max_sequence_length}, flags=False)  # fmt: skip
        if embedded_guidance is not None:
            raise ConfigError(f"embedded_guidance is a HunyuanVideo setting; {type(pipe).__name__} has none")
        self.boundary: float | None = getattr(pipe, "config", {}).get("boundary_ratio")
        if (self.boundary is None) != (transformer_2 is None):
            raise ConfigError(f"{type(pipe).__name__}: a second expert (transformer_2) runs below the pipeline's "
                              f"boundary_ratio, and this one has boundary_ratio {self.boundary} and "
                              f"{'no' if transformer_2 is None else 'a'} second expert")  # fmt: skip
        if guidance_2 is not None and self.boundary is None:
            raise ConfigError("guidance_2 is the guidance of Wan 2.2 A14B's low-noise expert; "
                              f"{type(pipe).__name__} has one transformer: use guidance")  # fmt: skip
        if guidance_2 is not None and not guidance > 1:
            raise ConfigError(f"guidance_2 {guidance_2} is the low-noise expert's classifier-free guidance, and "
                              f"guidance {guidance} turns guidance off for both experts; use guidance > 1 or drop "
                              "guidance_2")  # fmt: skip
        self.pipe, self.transformer, self.reference = pipe, transformer, reference
        self.forwards = 0
        """Samples the transformers were evaluated on (each guidance branch counts): what a step costs."""
        self.transformer_2, self.reference_2 = transformer_2, None
        self.train_timesteps = pipe.scheduler.config.num_train_timesteps if self.boundary is not None else 1000
        self.guidance, self.negative_prompt, self.max_sequence_length = guidance, negative_prompt, max_sequence_length
        self.guidance_2 = guidance if guidance_2 is None else guidance_2
        self.trained_experts: tuple[str, ...] = ("transformer", "transformer_2")
        """The experts being trained; steps where another one runs train nothing."""
        self.device = device or torch.device("cpu")
        self.embeddings: Any | None = None
        temporal, spatial = self._compression(pipe)
        channels = self._channels(transformer)  # image-to-video models take more (the image's) than they give
        self.shape = (channels, (frames - 1) // temporal + 1, height // spatial, width // spatial)
        self.check_settings(type(pipe), frames, temporal)

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        """Refuses in one line the settings this policy cannot train, from the pipeline class and the VAE's temporal
        compression alone, so that the trainer's preflight refuses them before anything loads
        (``dit_sp.rl.preflight.check_policy``); none by default."""

    def _compression(self, pipe: Any) -> tuple[int, int]:
        """``(temporal, spatial)`` compression of the pipeline's VAE."""
        return pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial

    def _channels(self, transformer: torch.nn.Module) -> int:
        """Latent channels the transformer predicts."""
        return transformer.config.out_channels

    def _guide(self, uncond: Tensor, cond: Tensor, guidance: float) -> Tensor:
        """The guided velocity of the two branches' velocities, as the pipeline combines them."""
        return uncond + guidance * (cond - uncond)

    @property
    def guided(self) -> bool:
        return self.guidance > 1

    def latent_shape(self) -> tuple[int, ...]:
        return self.shape

    @property
    def takes_images(self) -> bool:
        """Whether the pipeline is image-to-video: each prompt then comes with its conditioning image."""
        return False

    def use_images(self, images: bool) -> None:
        """Told whether the run's prompts come with images, before the trainer checks ``takes_images`` against that: a
        pipeline class that samples with or without an image (Cosmos 3) takes the run's mode; the others have one
        mode (``takes_images``) and ignore it."""

    def encode(self, prompts: list[str], images: list[str] | None = None) -> tuple[Any, Any | None]:
        """``(positive, negative)`` conditioning, each as ``_forward`` takes it; negative is None unguided.
        The text part is read from ``self.embeddings`` (``dit_sp.rl.embeddings.PromptEmbeddings``) when it
        is set: then the text encoders may be gone. ``images``: each prompt's conditioning image (a path),
        for an image-to-video pipeline (collective over a split VAE's group: it encodes them); one whose prompt encoder
        reads the image (``prompt_reads_image``) reads or encodes the text of each (prompt, image) pair."""
        if not self.takes_images:
            if images is not None and any(image is not None for image in images):
                raise ConfigError(f"{type(self.pipe).__name__} is text-to-video: its prompts take no image")
            return self.embeddings.read(prompts, self.device) if self.embeddings is not None else self._encode(prompts)
        if images is None or any(image is None for image in images):
            raise ConfigError(f"{type(self.pipe).__name__} is image-to-video: every prompt needs an image "
                              "(a JSONL prompt file with an 'image' per line)")  # fmt: skip
        stored = self.embeddings
        if not self.prompt_reads_image(type(self.pipe).__name__):
            text = stored.read(prompts, self.device) if stored is not None else self._encode(prompts)
        else:  # the text of each (prompt, image) pair
            pairs = (prompts, images)
            text = stored.read_pairs(*pairs, self.device) if stored is not None else self.encode_pairs(*pairs)
        return self._with_images(text, images)

    @no_grad
    def encode_pairs(self, prompts: list[str], images: list[str]) -> tuple[Any, Any | None]:
        """The text conditioning ``(positive, negative)`` of each prompt with its image (the path ``images[i]``), from
        the text encoders, for a pipeline whose prompt encoder reads the image (``prompt_reads_image``)."""
        return self._encode_pairs(prompts, [_read_image(path) for path in images])

    def _encode_pairs(self, prompts: list[str], images: list[Any]) -> tuple[Any, Any | None]:
        """``encode_pairs`` of PIL images: what ``_encode`` returns, each prompt encoded with its image."""
        raise NotImplementedError

    def _with_images(self, text: tuple[Any, Any | None], images: list[str]) -> tuple[Any, Any | None]:
        """The text conditioning ``(positive, negative)`` joined with each sample's image conditioning: each branch
        becomes ``(text, *parts)``, ``parts`` the family's ``_image_parts`` of each sample's image, stacked on the
        batch (each image encoded once, cached by path; both branches share them)."""
        import torch

        unique = {path: self._image_condition(path) for path in dict.fromkeys(images)}
        per_sample = tuple(torch.cat([unique[path][i] for path in images]).to(self.device)
                           for i in range(len(unique[images[0]])))  # fmt: skip
        positive, negative = text
        return (positive, *per_sample), None if negative is None else (negative, *per_sample)

    @no_grad
    def _image_condition(self, path: str) -> tuple[Tensor, ...]:
        """``_image_parts`` of the image at ``path`` (RGB), batch 1, cached on the CPU (a run may see thousands) by
        path: read once, the first time a sample uses it; then its text-encoder parts (``images_need_text_encoders``),
        read from the embeddings' files on each use when the trainer keeps them there. Every rank of a sample meets
        the same paths in the same order, so hits and misses (and the collectives a miss's encoding runs) agree; a key
        read from the file again would let a file rewritten mid-run split the ranks between a hit and an encoding, a
        hang."""
        cache = self.__dict__.setdefault("_image_cache", {})
        stored = self.images_need_text_encoders and self.embeddings is not None
        if path not in cache:
            image = _read_image(path)
            parts = self._image_parts(image)
            if self.images_need_text_encoders and not stored:  # the text encoders are loaded: computed once here
                parts += self._encoder_image_parts(image)
            cache[path] = tuple(part.cpu() for part in parts)
        if stored:  # read per use from the prompts' embeddings' directory, as theirs (not held in memory)
            return cache[path] + tuple(part.cpu() for part in self.embeddings.read_image(path, "cpu"))
        return cache[path]

    @no_grad
    def encoder_image_parts(self, path: str) -> tuple[Tensor, ...]:
        """``_encoder_image_parts`` of the image at ``path`` (batch 1, on the CPU), from the text encoders, which must
        be loaded (collective over a sharded encoder's group)."""
        return tuple(part.cpu() for part in self._encoder_image_parts(_read_image(path)))

    def _encoder_image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """The conditioning tensors (batch 1) of one PIL image that the pipeline's text encoders compute
        (``images_need_text_encoders``), joined after ``_image_parts``; none by default."""
        return ()

    def check_images(self, images: list[str]) -> None:
        """Each image's size checked (``check_image_size``, from the file's header alone) before anything is sampled:
        a trainer's every rank checks all the run's images, so a refusal comes on every rank at once, not in one
        data-parallel group's first rollout with that image while the others wait in a collective."""
        from PIL import Image

        for path in dict.fromkeys(images):
            with Image.open(path) as file:
                self.check_image_size(*file.size)

    def check_image_size(self, width: int, height: int) -> Any:
        """Refuses, in one line, an image of this size that the pipeline would sample at another size than the
        policy's (HunyuanVideo-1.5 I2V's aspect-ratio buckets); others take any size (resized to the policy's)."""
        return None

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """The conditioning tensors (batch 1) an image-to-video family derives from one PIL image."""
        raise NotImplementedError

    def _pixels(self, image: Any) -> Tensor:
        """``image`` as the pipeline's ``video_processor`` preprocesses it at the policy's size: ``(1, 3, H, W)``
        fp32 in [-1, 1] on the policy's device."""
        import torch

        _, _, height, width = self.shape
        spatial = self._compression(self.pipe)[1]
        pixels = self.pipe.video_processor.preprocess(image, height=height * spatial, width=width * spatial)
        return pixels.to(self.device, torch.float32)

    def image_generator(self) -> torch.Generator:
        """A generator at ``IMAGE_SEED`` on the policy's device, for a pipeline that samples its image latents."""
        import torch

        return torch.Generator(self.device).manual_seed(IMAGE_SEED)

    @property
    def pixel_frames(self) -> int:
        """The video frames the policy's latent frames decode to."""
        return (self.shape[1] - 1) * self._compression(self.pipe)[0] + 1

    def clean(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        """The sampled latents as the pipeline returns them (Wan 2.2 TI2V: the first frame is the image's)."""
        return latents

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[Any, Any | None]:
        """What ``encode`` returns, from the pipeline's text encoders: by default the pipeline's own
        ``encode_prompt`` (Wan, CogVideoX: ``(positive, negative)`` embeddings, negative None without guidance;
        EasyAnimate's also returns their masks, which its transformer takes no part of)."""
        positive, negative, *_ = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.guided,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return positive, negative if self.guided else None

    @no_grad
    def _masked_text(self, prompts: list[str]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        """``((embeds, mask), (negative, negative_mask) or None)`` from a pipeline's ``encode_prompt`` that returns
        ``(embeds, mask, negative, negative_mask)``, embeds ``(B, L, D)`` and masks ``(B, L)`` (LTX-Video, Mochi)."""
        embeds, mask, negative, negative_mask = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.guided,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return (embeds, mask), (negative, negative_mask) if self.guided else None

    def text_settings(self) -> dict[str, Any]:
        """What, beside the model and the prompt, the conditioning depends on."""
        return {"policy": type(self).__name__, "max_sequence_length": self.max_sequence_length,
                "negative_prompt": self.negative_prompt if self.guided else None}  # fmt: skip

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Any) -> Tensor:
        raise NotImplementedError

    def _concat(self, negative: Any, positive: Any) -> Any:
        """The two branches' conditioning as one batch (negative first)."""
        import torch

        if isinstance(positive, torch.Tensor):
            return torch.cat([negative, positive])
        return type(positive)(self._concat(n, p) for n, p in zip(negative, positive))

    def expert_at(self, s: float) -> str:
        """The transformer the stock pipeline runs at noise level ``s``: ``transformer_2`` below a two-expert
        pipeline's boundary (timestep < ``boundary_ratio * num_train_timesteps``), else ``transformer``."""
        if self.boundary is not None and s * 1000.0 < self.boundary * self.train_timesteps:
            return "transformer_2"
        return "transformer"

    def trains(self, s: float) -> bool:
        return self.expert_at(s) in self.trained_experts

    def _timestep(self, s: float) -> float:
        """The timestep ``_forward`` gets at noise level ``s`` (computed in float64 before the transformer's
        float32): ``1000 s``, the flow-matching pipelines'."""
        return s * 1000.0

    def velocity(self, x: Tensor, s: float, cond: tuple[Any, Any | None], *, reference: bool = False) -> Tensor:
        """Guided velocity ``(B, C, F, H, W)`` fp32 at noise level ``s`` (timestep ``_timestep(s)``), of the expert
        that runs at ``s`` (or its reference model)."""
        import torch

        low_noise = self.expert_at(s) == "transformer_2"
        model, ref = (self.transformer_2, self.reference_2) if low_noise else (self.transformer, self.reference)
        model = ref if reference and ref is not None else model
        guidance = self.guidance_2 if low_noise else self.guidance
        positive, negative = cond
        hidden = torch.cat([x, x]) if self.guided else x
        self.forwards += hidden.shape[0]
        branches = self._concat(negative, positive) if self.guided else positive
        timestep = torch.full((hidden.shape[0],), self._timestep(s), device=x.device)
        dtype = next(model.parameters()).dtype
        out = self._forward(model, hidden.to(dtype), timestep, branches).float()
        if not self.guided:
            return out
        uncond, cond_v = out.chunk(2)
        return self._guide(uncond, cond_v, guidance)

    def _unscale(self, latents: Tensor) -> Tensor:
        raise NotImplementedError

    @no_grad
    def decode(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        """``(B, F, C, H, W)`` in [0, 1] of sampled latents ``(B, C, F, H, W)`` (``cond``: their conditioning,
        which an image-to-video model's latents may take their first frame from)."""
        vae = self.pipe.vae
        latents = self.clean(latents, cond)
        video = vae.decode(self._unscale(latents).to(vae.dtype), return_dict=False)[0]  # (B, C, F, H, W) in [-1, 1]
        return ((video.float() + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)


class FirstFrameImagePolicy(DiffusersPolicy):
    """A policy whose image-to-video pipeline (one whose ``prepare_latents`` takes the ``image``: LTX-Video I2V,
    Sana-Video I2V) keeps the image's latents as the first latent frame, clean throughout (its tokens get timestep
    0), and steps only the frames after it. The policy's latents are then those noised frames alone,
    ``(B, C, F - 1, H, W)``: the SDE, its log-probabilities and the KL cover only them. Its conditioning is
    ``(text, image_frame)`` per branch, the frame ``(B, C, 1, H, W)`` (the family's ``_image_parts``); the family's
    ``_forward`` puts the frame in front and returns the velocity of the frames after it; ``clean`` puts it back
    for decoding. The text-to-video pipelines of the same policy class are unaffected."""

    @classmethod
    def image_first_frame(cls, pipeline: type) -> bool:
        """Whether ``pipeline`` keeps an image as its clean first latent frame: its ``prepare_latents`` takes the
        ``image`` (a family whose pipeline takes it otherwise says so here)."""
        return "image" in inspect.signature(pipeline.prepare_latents).parameters

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        if cls.image_first_frame(pipeline) and (frames - 1) // temporal + 1 < 2:
            raise ConfigError(f"frames {frames}: {pipeline.__name__} keeps the first latent frame the image's and "
                              "samples the frames after it, and these frames are that one alone (nothing to sample or "
                              f"train); set sample.frames to {temporal + 1} or more")  # fmt: skip

    @property
    def image_in_front(self) -> bool:
        """Whether this run keeps an image as the clean first latent frame: the class's ``image_first_frame`` (a
        policy whose one class samples both modes answers per run)."""
        return self.image_first_frame(type(self.pipe))

    @property
    def takes_images(self) -> bool:
        return self.image_in_front

    def latent_shape(self) -> tuple[int, ...]:
        channels, frames, height, width = self.shape
        return (channels, frames - 1, height, width) if self.image_in_front else self.shape

    def clean(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        """The noised frames with the image frame in front (image-to-video), as the pipeline's latents."""
        import torch

        if cond is None or not self.image_in_front:
            return latents
        return torch.cat([cond[0][1].to(latents), latents], dim=2)


def _read_image(path: str) -> Any:
    """The image at ``path`` as an RGB PIL image."""
    from PIL import Image

    with Image.open(path) as file:
        return file.convert("RGB")
