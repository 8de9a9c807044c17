"""Rewards: one interface, ``reward(videos, prompts) -> Tensor[B]``, with ``videos`` ``(B, F, C, H, W)``
floats in [0, 1].

Built in: pixel rewards that need no weights (``brightness``, ``saturation``, ``temporal_smoothness``),
``faithfulness`` to the prompt in the synthetic shape world (and its smooth ``dense_faithfulness``; both
live in ``dit_sp.toy.world`` and are registered here by reference), and CLIP-family models from local
paths: ``clip_score`` (text-video cosine similarity), ``pickscore`` (a preference-tuned CLIP's scaled
similarity), ``hps`` (an open_clip HPS checkpoint) and ``aesthetic`` (an aesthetic head on CLIP image
features), frames subsampled, and ``vlm_score`` (a chat vision-language model's expected rating of the
video). A user reward is named ``package.module:function``.
``remote`` scores with a reward server (``dit_sp.rl.rewards.remote``). ``build_reward`` combines several with
weights; ``score`` isolates failures: a sample whose reward raises or is not finite gets NaN (and so no
gradient), the run goes on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.rl.rewards.remote import RewardUnavailable

Tensor = torch.Tensor
RewardFn = Callable[[Tensor, list[str]], Tensor]
log = logging.getLogger(__name__)


def brightness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Mean pixel value."""
    return videos.flatten(1).mean(1)


def saturation(videos: Tensor, prompts: list[str]) -> Tensor:
    """Mean HSV saturation ``(max - min) / max`` over pixels."""
    high, low = videos.amax(2), videos.amin(2)
    return ((high - low) / high.clamp_min(1e-6)).flatten(1).mean(1)


def temporal_smoothness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Minus the mean absolute change between consecutive frames."""
    if videos.shape[1] < 2:
        return torch.zeros(videos.shape[0], device=videos.device)
    return -(videos[:, 1:] - videos[:, :-1]).abs().flatten(1).mean(1)


class ClipScore:
    """Cosine similarity of CLIP text and (frame-averaged) image embeddings, from a local checkpoint
    directory holding a ``CLIPModel`` and its tokenizer. Nothing is downloaded."""

    def __init__(self, path: str, frames: int = 4, device: str | None = None):
        from transformers import AutoTokenizer, CLIPModel

        if not Path(path, "config.json").is_file():
            raise MissingFileError(f"clip_score: {path} holds no CLIP checkpoint (config.json missing)")
        self.model = CLIPModel.from_pretrained(path, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.frames = frames
        if device:
            self.model.to(device)
        size = self.model.config.vision_config.image_size
        self.size = (size, size)
        self.mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
        self.std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)

    def frame_embeddings(self, videos: Tensor) -> Tensor:
        """``(B, frames, D)``: unit CLIP image embeddings of ``frames`` frames spread over each video."""
        device = next(self.model.parameters()).device
        b, f = videos.shape[:2]
        index = torch.linspace(0, f - 1, min(self.frames, f)).round().long()
        frames = videos[:, index].flatten(0, 1).float().to(device)
        frames = F.interpolate(frames, size=self.size, mode="bilinear", align_corners=False)
        frames = (frames - self.mean.to(device)) / self.std.to(device)
        image = self.model.get_image_features(pixel_values=frames)
        image = getattr(image, "pooler_output", image)  # transformers versions differ
        return F.normalize(image, dim=-1).view(b, len(index), -1)

    def text_embeddings(self, prompts: list[str]) -> Tensor:
        """``(B, D)``: unit CLIP text embeddings."""
        device = next(self.model.parameters()).device
        tokens = self.tokenizer(prompts, padding=True, truncation=True, return_tensors="pt").to(device)
        text = self.model.get_text_features(**tokens)
        return F.normalize(getattr(text, "pooler_output", text), dim=-1)

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        image = F.normalize(self.frame_embeddings(videos).mean(1), dim=-1)
        return (image * self.text_embeddings(prompts)).sum(-1).cpu()


class PickScore(ClipScore):
    """PickScore-style preference: a preference-tuned ``CLIPModel`` checkpoint (e.g. yuvalkirstain/PickScore_v1
    with its processor's tokenizer, downloaded beforehand) scores ``logit_scale * cos(text, image)`` per
    frame, averaged over the frames."""

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        per_frame = (self.frame_embeddings(videos) * self.text_embeddings(prompts).unsqueeze(1)).sum(-1)
        return (self.model.logit_scale.exp() * per_frame).mean(1).cpu()


def open_clip_to_transformers(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An open_clip CLIP state dict (e.g. an HPS checkpoint) as the state dict of transformers'
    ``CLIPModel``: the fused ``in_proj`` attention weights split into q, k, v, and the projections
    transposed. Raises ``ConfigError`` naming any key it does not know."""
    block = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
             "attn.out_proj": "self_attn.out_proj"}  # fmt: skip
    fixed = {"logit_scale": "logit_scale", "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
             "positional_embedding": "text_model.embeddings.position_embedding.weight",
             "visual.class_embedding": "vision_model.embeddings.class_embedding",
             "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
             "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight"}  # fmt: skip
    norms = {"ln_final": "text_model.final_layer_norm", "visual.ln_pre": "vision_model.pre_layrnorm",
             "visual.ln_post": "vision_model.post_layernorm"}  # fmt: skip
    fixed |= {f"{a}.{kind}": f"{b}.{kind}" for a, b in norms.items() for kind in ("weight", "bias")}
    resblock = re.compile(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+)\.(weight|bias|in_proj_weight|in_proj_bias)")
    out, unknown = {}, []
    for key, value in state.items():
        match = resblock.fullmatch(key)
        if key in fixed:
            out[fixed[key]] = value
        elif key in ("text_projection", "visual.proj"):
            out["text_projection.weight" if key == "text_projection" else "visual_projection.weight"] = value.t()
        elif key == "attn_mask":
            continue  # a buffer (the causal mask)
        elif match:
            tower = "vision_model" if match.group(1) else "text_model"
            prefix, name, kind = f"{tower}.encoder.layers.{match.group(2)}", match.group(3), match.group(4)
            if kind.startswith("in_proj"):
                for part, chunk in zip("qkv", value.chunk(3)):
                    out[f"{prefix}.self_attn.{part}_proj.{kind.removeprefix('in_proj_')}"] = chunk
            elif name in block:
                out[f"{prefix}.{block[name]}.{kind}"] = value
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(f"not an open_clip CLIP state dict: unknown keys {unknown[:5]}")
    return out


class HPSScore(ClipScore):
    """HPS-style preference (HPSv2): an open_clip CLIP checkpoint (e.g. ``HPS_v2_compressed.pt``) loaded
    into the transformers CLIP architecture at ``path`` (its ``config.json`` and tokenizer, e.g.
    CLIP-ViT-H-14 for HPSv2); the reward is the text-image cosine similarity per frame, averaged."""

    def __init__(self, path: str, weights: str, frames: int = 4, device: str | None = None):
        super().__init__(path, frames, None)
        if not Path(weights).is_file():
            raise MissingFileError(f"hps: weights {weights} do not exist (an open_clip checkpoint)")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        state = {k.removeprefix("module."): v for k, v in state.items()}
        missing, unexpected = self.model.load_state_dict(open_clip_to_transformers(state), strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise ConfigError(f"hps: {weights} does not fit the CLIP architecture at {path}: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")  # fmt: skip
        if device:
            self.model.to(device)

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        return (self.frame_embeddings(videos) * self.text_embeddings(prompts).unsqueeze(1)).sum(-1).mean(1).cpu()


class AestheticScore(ClipScore):
    """An aesthetic head on CLIP image features (the LAION aesthetic predictor's format: a stack of linear
    layers over unit CLIP ViT-L/14 image embeddings, e.g. ``sac+logos+ava1-l14-linearMSE.pth``): the mean
    predicted score of the video's frames. ``path``: the CLIP checkpoint directory; ``head``: the head's
    state dict (``.pth``/``.pt`` read without pickle, or ``.safetensors``)."""

    def __init__(self, path: str, head: str, frames: int = 4, device: str | None = None):
        super().__init__(path, frames, device)
        if not Path(head).is_file():
            raise MissingFileError(f"aesthetic: head {head} does not exist (the aesthetic MLP's state dict)")
        if head.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(head)
        else:
            state = torch.load(head, map_location="cpu", weights_only=True)
        weights = sorted((k for k, v in state.items() if k.endswith("weight") and v.dim() == 2),
                         key=lambda k: [int(part) if part.isdigit() else part for part in k.split(".")])  # fmt: skip
        if not weights:
            raise ConfigError(f"aesthetic: {head} holds no linear layers")
        device = next(self.model.parameters()).device
        self.layers = [(state[k].float().to(device), state[k[: -len("weight")] + "bias"].float().to(device))
                       for k in weights]  # fmt: skip
        if self.layers[0][0].shape[1] != self.model.config.projection_dim:
            width, clip = self.layers[0][0].shape[1], self.model.config.projection_dim
            raise ConfigError(f"aesthetic: the head takes {width}-dim features, the CLIP model gives {clip}; pair "
                              "the head with its CLIP model")  # fmt: skip

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        x = self.frame_embeddings(videos)
        for weight, bias in self.layers:  # the LAION head has no nonlinearity (its dropouts are off in eval)
            x = F.linear(x, weight, bias)
        return x.squeeze(-1).mean(1).cpu()


BUILTIN: dict[str, RewardFn | type | str] = {
    "brightness": brightness,
    "saturation": saturation,
    "temporal_smoothness": temporal_smoothness,
    "clip_score": ClipScore,
    "pickscore": PickScore,
    "aesthetic": AestheticScore,
    "hps": HPSScore,
    "vlm_score": "dit_sp.rl.rewards.registry:VLMScore",
    # The synthetic shape world's prompt faithfulness (and its smooth version for RL), by reference: the
    # registry does not depend on the toy world.
    "faithfulness": "dit_sp.toy.world:faithfulness",
    "dense_faithfulness": "dit_sp.toy.world:dense_faithfulness",
    # any of these behind an HTTP server (python -m pipelines.reward_server), scored from the trainer
    "remote": "dit_sp.rl.rewards.remote:RemoteReward",
}
"""Rewards by name: a reward function, a class constructed with the entry's options, or a
``module:function`` reference imported when used."""


def _import(reference: str, name: str) -> Any:
    module, _, attr = reference.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"reward {name!r}: cannot import {attr} from {module} ({e})") from e


def _lookup(name: str) -> Any:
    """The registered function or class of a reward name (imported if given by reference)."""
    if ":" in name:
        return _import(name, name)
    if name in BUILTIN:
        found = BUILTIN[name]
        return _import(found, name) if isinstance(found, str) else found
    raise ConfigError(f"unknown reward {name!r}; built-in rewards: {sorted(BUILTIN)}, or 'package.module:function'")


def _entries(spec: str | Mapping[str, Any] | list) -> list[tuple[str, float, dict[str, Any]]]:
    """``(name, weight, options)`` of each part of a reward config value."""
    if isinstance(spec, str):
        spec = [{"name": spec}]
    elif isinstance(spec, Mapping):
        spec = [{"name": name, "weight": weight} for name, weight in spec.items()]
    elif not isinstance(spec, list):
        raise ConfigError(f"reward: expected a name, a mapping of names to weights or a list, got {spec!r}")
    entries = []
    for item in spec:
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"reward entry {item!r} has no 'name'")
        item = dict(item)
        name, weight = item.pop("name"), item.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError(f"reward {name!r}: weight must be a number, got {weight!r}")
        entries.append((name, float(weight), item))
    if not entries:
        raise ConfigError("no reward given")
    return entries


def check_reward(spec: str | Mapping[str, Any] | list) -> None:
    """The config value names known rewards with numeric weights; nothing is built (no model loads)."""
    for name, _, _ in _entries(spec):
        _lookup(name)


class WeightedReward:
    """``sum_i weight_i * reward_i``; ``components`` also reports each part (for metrics)."""

    def __init__(self, parts: list[tuple[str, float, RewardFn]]):
        self.parts = parts

    def components(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> dict[str, Tensor]:
        """Each part's rewards; ``images`` (the conditioning image of each video) go to the parts that take
        an ``images`` argument."""
        return {name: score(fn, videos, prompts, images) for name, _, fn in self.parts}

    def __call__(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
        parts = self.components(videos, prompts, images).values()
        return sum(weight * part for (_, weight, _), part in zip(self.parts, parts))


def build_reward(spec: str | Mapping[str, Any] | list) -> WeightedReward:
    """A reward from a config value: a name; ``{name: weight, ...}``; or a list of
    ``{"name": ..., "weight": ..., **options}`` (options go to the reward's constructor)."""
    parts = []
    for name, weight, options in _entries(spec):
        found = _lookup(name)
        # A class (e.g. a reward model) is constructed with the options; a plain function with options is
        # a factory that returns the reward.
        parts.append((name, weight, found(**options) if isinstance(found, type) or options else found))
    return WeightedReward(parts)


def _takes_images(fn: RewardFn) -> bool:
    try:
        return "images" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


def score(fn: RewardFn, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
    """``fn`` on the batch, falling back to one sample at a time if it raises; NaN marks samples
    whose reward failed or is not finite (they are reported, not trained on). A reward with an ``images``
    argument also gets each video's conditioning image (a path; image-to-video)."""
    extra = (lambda part: {"images": images[part]}) if images is not None and _takes_images(fn) else (lambda _: {})
    try:
        rewards = torch.as_tensor(fn(videos, prompts, **extra(slice(None))), dtype=torch.float32).reshape(-1).cpu()
        if rewards.numel() != videos.shape[0]:
            raise ValueError(f"returned {rewards.numel()} values for {videos.shape[0]} videos")
    except RewardUnavailable as e:  # a server that is down: asking it once per sample would only wait longer
        log.warning("%s; the batch's %d samples get no reward", e, videos.shape[0])
        return torch.full((videos.shape[0],), float("nan"))
    except Exception as batch_error:  # noqa: BLE001 - isolate the failing samples
        log.warning("reward %s failed on the batch (%s); scoring samples one by one", fn, batch_error)
        rewards = torch.full((videos.shape[0],), float("nan"))
        for i in range(videos.shape[0]):
            try:
                one = slice(i, i + 1)
                rewards[i] = float(torch.as_tensor(fn(videos[one], prompts[one], **extra(one))).reshape(-1)[0])
            except Exception as e:  # noqa: BLE001
                log.warning("reward %s failed for sample %d (%r): %s; it gets no gradient", fn, i, prompts[i], e)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        log.warning("reward %s gave no finite value for samples %s", fn, bad.nonzero().flatten().tolist())
        rewards[bad] = float("nan")
    return rewards


class VLMScore:
    """A vision-language model asked to rate each video (VideoAlign / UnifiedReward style): a local chat VLM
    checkpoint (e.g. Qwen2-VL / Qwen2.5-VL Instruct, with its tokenizer and image processor) sees ``frames``
    frames spread over the video and ``question`` (``{prompt}`` filled in); the reward is the expected rating
    under its next-token distribution over the ``scale`` tokens (``"1"`` ... ``"5"``), so it is smooth where
    a sampled answer would be a step function. Nothing is downloaded.
    """

    def __init__(self, path: str, frames: int = 4, scale: tuple[str, ...] = ("1", "2", "3", "4", "5"),
                 question: str = ("How well does this video show '{prompt}'? Rate it from 1 (not at all) to 5 "
                                  "(perfectly). Answer with one digit."), device: str | None = None):  # fmt: skip
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        if not Path(path, "config.json").is_file():
            raise MissingFileError(f"vlm_score: {path} holds no model (config.json missing)")
        self.model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.images = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        if device:
            self.model.to(device)
        self.frames, self.question = frames, question
        ids = [self.tokenizer.convert_tokens_to_ids(token) for token in scale]
        if any(i is None or i == self.tokenizer.unk_token_id for i in ids):
            raise ConfigError(f"vlm_score: the tokenizer of {path} has no single token for each of {list(scale)}")
        self.scale_ids = torch.tensor(ids)
        self.values = torch.arange(1, len(scale) + 1, dtype=torch.float32)
        config = self.model.config
        self.image_token = self.tokenizer.convert_ids_to_tokens(config.image_token_id)
        self.merge = getattr(self.images, "merge_size", 1) ** 2
        self.takes_token_types = "mm_token_type_ids" in inspect.signature(self.model.forward).parameters

    @torch.no_grad()
    def __call__(self, videos: Tensor, prompts: list[str]) -> Tensor:
        return torch.stack([self._rate(video, prompt) for video, prompt in zip(videos, prompts)])

    def _rate(self, video: Tensor, prompt: str) -> Tensor:
        """``video`` ``(F, C, H, W)`` in [0, 1]: the expected rating."""
        from PIL import Image

        device = next(self.model.parameters()).device
        index = torch.linspace(0, video.shape[0] - 1, min(self.frames, video.shape[0])).round().long()
        frames = [Image.fromarray((f.permute(1, 2, 0).clamp(0, 1) * 255).round().byte().numpy()) for f in video[index]]
        content = [{"type": "image"} for _ in frames] + [{"type": "text", "text": self.question.format(prompt=prompt)}]
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                  tokenize=False)  # fmt: skip
        vision = self.images(images=frames, return_tensors="pt")
        counts = (vision["image_grid_thw"].prod(-1) // self.merge).tolist()  # the tokens each image becomes
        pieces = text.split(self.image_token)
        if len(pieces) != len(frames) + 1:
            raise ConfigError(f"vlm_score: the chat template placed {len(pieces) - 1} image tokens for {len(frames)} "
                              "frames; use the model's own chat template")  # fmt: skip
        text = pieces[0] + "".join(self.image_token * n + piece for n, piece in zip(counts, pieces[1:]))
        tokens = self.tokenizer([text], return_tensors="pt").to(device)
        inputs = dict(tokens, pixel_values=vision["pixel_values"].to(device),
                      image_grid_thw=vision["image_grid_thw"].to(device))  # fmt: skip
        if self.takes_token_types:  # which positions are image tokens (Qwen2-VL's M-RoPE), as its processor gives
            inputs["mm_token_type_ids"] = (tokens["input_ids"] == self.model.config.image_token_id).long()
        out = self.model(**inputs)
        probs = out.logits[0, -1, self.scale_ids.to(device)].float().softmax(-1).cpu()
        return (probs * self.values).sum()
